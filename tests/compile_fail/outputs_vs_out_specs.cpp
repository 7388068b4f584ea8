// expect-error: shard_map: the body returns a different number of values than there are out_specs
// Three outputs for two out_specs.
#include <tuple>

#include "shard/shard.hpp"

void slip(const shard::Mesh& mesh, const shard::ShardedArray<float>& x) {
  using shard::P;
  auto f = shard::shard_map(mesh, P("a"), {P("a"), P("a")},
                            [](const shard::Tensor<float>& b) { return std::make_tuple(b, b, b); });
  (void)f(x);
}
