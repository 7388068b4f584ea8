// expect-error: optimizer init: the parameters must be a tree of ShardedArrays
// Host Tensors given to an optimizer.
#include <vector>

#include "shard/shard.hpp"

void slip(const std::vector<shard::Tensor<float>>& params) {
  const auto opt = shard::optim::adam(1e-3);
  (void)opt.init(params);
}
