#pragma once
// Loop machinery of the local kernels (internal): broadcasting strides and a loop nest over an
// output shape with the dims of every operand coalesced, so the innermost loop is as long as
// the layouts allow and runs with unit or zero steps in the common cases.

#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/shape_rules.hpp"  // the shape checks both views' kernels share
#include "shard/core/box.hpp"
#include "shard/core/detail/int_wrap.hpp"
#include "shard/core/tensor_ops.hpp"

namespace shard::detail {

/// Row-major strides of an operand of shape `s` seen from an output of shape `out` (numpy
/// broadcasting: 0 on the dims where the operand has size 1 or is missing).
inline Shape broadcast_strides(const Shape& s, const Shape& out) {
  Shape st(out.size(), 0);
  const Shape own = strides_of(s);
  const std::size_t lead = out.size() - s.size();
  for (std::size_t k = 0; k < s.size(); ++k)
    if (s[k] != 1 || out[k + lead] == 1) st[k + lead] = own[k];
  return st;
}

/// Calls f(out_offset, offsets, steps, n) for every innermost run of n elements of an output
/// of shape `out` (row-major, contiguous), with each operand's offset and innermost step.
/// Adjacent dims are merged where every operand is contiguous across them, and size-1 dims
/// are dropped.
template <std::size_t N, typename F>
void broadcast_rows(const Shape& out, const std::array<Shape, N>& strides, F&& f) {
  const std::int64_t total = num_elements(out);
  if (total == 0) return;
  // Keep dims of size > 1, then merge from the right.
  std::vector<std::int64_t> size;
  std::vector<std::array<std::int64_t, N>> st;
  for (std::size_t d = 0; d < out.size(); ++d) {
    if (out[d] == 1) continue;
    std::array<std::int64_t, N> s{};
    for (std::size_t k = 0; k < N; ++k) s[k] = strides[k][d];
    if (!size.empty()) {
      bool merge = true;
      for (std::size_t k = 0; k < N; ++k) merge = merge && st.back()[k] == s[k] * out[d];
      if (merge) {
        size.back() *= out[d];
        st.back() = s;
        continue;
      }
    }
    size.push_back(out[d]);
    st.push_back(s);
  }
  std::array<std::int64_t, N> off{};
  if (size.empty()) {  // a single element
    f(std::int64_t{0}, off, off, std::int64_t{1});
    return;
  }
  const int rank = static_cast<int>(size.size());
  const std::int64_t inner = size[rank - 1];
  const std::array<std::int64_t, N> step = st[rank - 1];
  std::vector<std::int64_t> idx(static_cast<std::size_t>(rank), 0);
  for (std::int64_t o = 0; o < total; o += inner) {
    f(o, off, step, inner);
    for (int d = rank - 2; d >= 0; --d) {  // odometer over the outer dims, offsets updated incrementally
      ++idx[d];
      for (std::size_t k = 0; k < N; ++k) off[k] += st[d][k];
      if (idx[d] < size[d]) break;
      for (std::size_t k = 0; k < N; ++k) off[k] -= st[d][k] * size[d];
      idx[d] = 0;
    }
  }
}

/// An operation's view of an array of `shape` as [outer, n, inner] around the dims
/// [first, last) (the reduced or concatenated dims).
struct ThreeDims {
  std::int64_t outer = 1, n = 1, inner = 1;
};
inline ThreeDims three_dims(const Shape& shape, int first, int last) {
  ThreeDims t;
  for (int d = 0; d < static_cast<int>(shape.size()); ++d) {
    if (d < first) t.outer *= shape[d];
    else if (d < last) t.n *= shape[d];
    else t.inner *= shape[d];
  }
  return t;
}

/// The pairwise sum of a floating tensor over `dims` (resolved), accumulated and returned in
/// float64: what sharded sums combine across devices before rounding (tensor_reduce.cpp).
template <Dtype T>
Tensor<double> sum_in_double(const Tensor<T>& x, const std::vector<int>& dims, bool keepdims);
/// reduce() without the empty check: max/min over zero elements give the kind's identity
/// (-inf / +inf, or the type's limits), sums 0, products 1 (a device's empty block).
template <Dtype T>
Tensor<T> reduce_or_identity(const Tensor<T>& x, ReduceKind kind, const std::vector<int>& dims, bool keepdims);

/// The accumulator of prefix_sum (cumsum): float64 for floating types, int64 for integers
/// (added with wrap-around, so int32 results wrap as JAX's do).
template <Dtype T>
using scan_acc_t = std::conditional_t<is_floating_v<T>, double, std::int64_t>;
/// The sum of each line of x along dim d (d kept with size 1), accumulated as prefix_sum
/// accumulates: the block totals a sharded cumsum exchanges (tensor_reduce.cpp).
template <Dtype T>
Tensor<scan_acc_t<T>> line_totals(const Tensor<T>& x, int d);
/// prefix_sum(x, d, reverse) with each line's running sum starting at `start` (line_totals'
/// shape; zeros when null): a block's part of a sharded cumsum.
template <Dtype T>
Tensor<T> prefix_sum_from(const Tensor<T>& x, int d, bool reverse, const Tensor<scan_acc_t<T>>* start);

}  // namespace shard::detail
