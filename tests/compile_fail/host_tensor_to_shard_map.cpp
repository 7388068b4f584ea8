// expect-error: shard_map: the arguments must be ShardedArrays
// A host Tensor passed to a mapped function (it must be placed with device_put first).
#include "shard/shard.hpp"

void slip(const shard::Mesh& mesh, const shard::Tensor<float>& host) {
  using shard::P;
  auto f = shard::shard_map(mesh, P("a"), P("a"), [](const shard::Tensor<float>& b) { return b * 2.0f; });
  (void)f(host);
}
