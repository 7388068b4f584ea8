#pragma once
// The shape rules both views' primitive kernels share (internal): the Tensor kernel and the
// ShardedArray kernel of an op check their operands' shapes here, so the two raise the same
// error with the same words.

#include <cstddef>
#include <vector>

#include "shard/core/box.hpp"
#include "shard/core/index.hpp"

namespace shard::detail {

/// transpose's: ShapeError unless `perm` permutes the dims of `shape`.
void check_permutation(const std::vector<int>& perm, const Shape& shape);

/// concatenate's axis for operands of rank `rank`, resolved; ShapeError for 0-d operands.
int concatenate_axis(int axis, int rank);
/// concatenate's: ShapeError unless operand i (shape `s`) matches operand 0 (shape `first`) on
/// every dim but `a`.
void check_concatenate_operand(const Shape& first, const Shape& s, std::size_t i, int a);
/// stack's: ShapeError unless operand i (shape `s`) has operand 0's shape `first`.
void check_stack_operand(const Shape& first, const Shape& s, std::size_t i);

/// squeeze's: the dims it drops, ascending: every size-1 dim for Dims(), else the listed ones,
/// each of which must have size 1 (ShapeError naming the dim otherwise).
std::vector<int> squeezed_dims(const Shape& shape, const Dims& dims);

/// take_along_axis's result shape along resolved axis `a`: the array's and the indices' shapes
/// broadcast on the other dims (ShapeError when they do not), the indices' size along `a`.
Shape take_along_axis_shape(const Shape& x, const Shape& indices, int a);

}  // namespace shard::detail
