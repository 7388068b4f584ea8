// expect-error: grad: the function must return a 0-d Tensor or ShardedArray
// A loss that returns a C++ number instead of a 0-d array.
#include "shard/shard.hpp"

void slip(const shard::ShardedArray<float>& w) {
  auto loss = [](const shard::ShardedArray<float>& p) { return shard::sum(p * p).item(); };
  (void)shard::grad(loss)(w);
}
