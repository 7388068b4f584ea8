#pragma once
// The shape rules both views' primitive kernels share (internal): the Tensor kernel and the
// ShardedArray kernel of an op check their operands' shapes here, so the two raise the same
// error with the same words.

#include <vector>

#include "shard/core/box.hpp"
#include "shard/core/index.hpp"

namespace shard::detail {

/// squeeze's: the dims it drops, ascending: every size-1 dim for Dims(), else the listed ones,
/// each of which must have size 1 (ShapeError naming the dim otherwise).
std::vector<int> squeezed_dims(const Shape& shape, const Dims& dims);

}  // namespace shard::detail
