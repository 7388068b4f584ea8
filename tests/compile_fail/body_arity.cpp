// expect-error: shard_map: the body cannot be called with one block per in_spec
// Two in_specs for a body of three parameters.
#include "shard/shard.hpp"

void slip(const shard::Mesh& mesh, const shard::ShardedArray<float>& x) {
  using shard::P;
  using T = shard::Tensor<float>;
  auto f = shard::shard_map(mesh, {P("a"), P("a")}, P("a"),
                            [](const T& a, const T& b, const T& c) { return a + b + c; });
  (void)f(x, x);
}
