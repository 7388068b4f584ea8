// expect-error: grad: the differentiated arguments hold integer or bool arrays
// Differentiating with respect to an int32 array.
#include "shard/shard.hpp"

void slip(const shard::ShardedArray<std::int32_t>& counts) {
  auto loss = [](const shard::ShardedArray<std::int32_t>& c) { return shard::mean(c); };
  (void)shard::grad(loss)(counts);
}
