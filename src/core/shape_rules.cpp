// The shape rules both views' primitive kernels share (shape_rules.hpp).

#include "core/shape_rules.hpp"

#include <algorithm>

#include "shard/core/tensor_ops.hpp"
#include "shard/error.hpp"

namespace shard::detail {

void check_permutation(const std::vector<int>& perm, const Shape& shape) {
  const int rank = static_cast<int>(shape.size());
  std::vector<int> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  bool ok = static_cast<int>(sorted.size()) == rank;
  for (int k = 0; ok && k < rank; ++k) ok = sorted[k] == k;
  if (!ok)
    raise<ShapeError>("transpose: the permutation does not permute the ", rank, " dims of ",
                      to_string(shape));
}

int concatenate_axis(int axis, int rank) {
  if (rank == 0) raise<ShapeError>("concatenate: zero-dimensional arrays cannot be concatenated");
  return resolve_dim(axis, rank, "concatenate");
}

void check_concatenate_operand(const Shape& first, const Shape& s, std::size_t i, int a) {
  bool ok = s.size() == first.size();
  for (std::size_t d = 0; ok && d < first.size(); ++d) ok = static_cast<int>(d) == a || s[d] == first[d];
  if (!ok)
    raise<ShapeError>("concatenate: array ", i, " has shape ", to_string(s), " but array 0 has ",
                      to_string(first), "; all dims but ", a, " must match");
}

void check_stack_operand(const Shape& first, const Shape& s, std::size_t i) {
  if (s != first)
    raise<ShapeError>("stack: array ", i, " has shape ", to_string(s), " but array 0 has ", to_string(first),
                      "; all arrays must have the same shape");
}

std::vector<int> squeezed_dims(const Shape& shape, const Dims& dims) {
  const int rank = static_cast<int>(shape.size());
  std::vector<int> drop;
  if (dims.is_all()) {
    for (int d = 0; d < rank; ++d)
      if (shape[d] == 1) drop.push_back(d);
    return drop;
  }
  drop = dims.resolve(rank, "squeeze");
  for (int d : drop)
    if (shape[d] != 1)
      raise<ShapeError>("squeeze: dim ", d, " of shape ", to_string(shape), " has size ", shape[d],
                        ", not 1");
  return drop;
}

Shape take_along_axis_shape(const Shape& x, const Shape& indices, int a) {
  Shape xs = x, is = indices;
  xs[a] = is[a] = 1;
  Shape out = broadcast_shapes(xs, is);
  out[a] = indices[a];
  return out;
}

}  // namespace shard::detail
