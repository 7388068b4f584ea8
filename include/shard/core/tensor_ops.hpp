#pragma once
/// \file The local op set on Tensor: numpy / jax.numpy operations on one process's memory.
/// Nothing here communicates; every function is safe to call from several device threads at
/// once (shard_map bodies). The operators and the promoting front end (`x + y`, `exp`, `sum`,
/// `where`, `softmax`, `matmul`, ...) are in array_ops.hpp and shared with ShardedArray;
/// below are the kernels they call (same-dtype operands) and the shape, indexing and creation
/// functions (swapaxes, moveaxis and one_hot, composed of these, are shape_ops.hpp's, shared
/// too). ShardedArray's ops (ops.hpp) run these kernels on each block.

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <source_location>
#include <type_traits>
#include <vector>

#include "shard/error.hpp"  // shard::source_location
#include "shard/core/array_ops.hpp"
#include "shard/core/index.hpp"
#include "shard/core/shape_ops.hpp"
#include "shard/core/tensor.hpp"

namespace shard {

/// numpy's broadcast of two shapes; ShapeError naming both when they do not broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b);

// ---------------------------------------------------------------- kernels (same dtype)

/// Elementwise `a op b` with numpy broadcasting. ValueError for ops a dtype has no meaning
/// for (subtracting bools, bitwise ops on floats).
template <Dtype T>
Tensor<T> binary(const Tensor<T>& a, const Tensor<T>& b, BinaryOp op);
/// `a op s` (or `s op a` when scalar_first), without materialising the scalar.
template <Dtype T>
Tensor<T> binary(const Tensor<T>& a, T s, BinaryOp op, bool scalar_first = false);
template <Dtype T>
Tensor<bool> compare(const Tensor<T>& a, const Tensor<T>& b, CompareOp op);
template <Dtype T>
Tensor<bool> compare(const Tensor<T>& a, T s, CompareOp op, bool scalar_first = false);
template <Dtype T>
Tensor<T> unary(const Tensor<T>& x, UnaryOp op);
namespace detail {
// The elementwise primitives' local kernels (src/core/tensor_elementwise.cpp; the primitives
// are in ops/elementwise.hpp, and the functions above bind them).
template <Dtype T>
Tensor<T> binary_kernel(const Tensor<T>& a, const Tensor<T>& b, BinaryOp op);
template <Dtype T>
Tensor<T> binary_kernel(const Tensor<T>& a, T s, BinaryOp op, bool scalar_first);
template <Dtype T>
Tensor<bool> compare_kernel(const Tensor<T>& a, const Tensor<T>& b, CompareOp op);
template <Dtype T>
Tensor<bool> compare_kernel(const Tensor<T>& a, T s, CompareOp op, bool scalar_first);
template <Dtype T>
Tensor<T> unary_kernel(const Tensor<T>& x, UnaryOp op);
template <Dtype T>
Tensor<T> where_kernel(const Tensor<bool>& cond, const Tensor<T>& a, const Tensor<T>& b);
// The same kernels on n contiguous elements of operands of one shape (no broadcasting): what
// jit's fusion runs on tiles of a chain of elementwise ops (jit/fuse.hpp).
template <Dtype T>
void binary_span(BinaryOp op, std::int64_t n, const T* a, const T* b, T* out);
template <Dtype T>
void binary_scalar_span(BinaryOp op, std::int64_t n, const T* a, T s, bool scalar_first, T* out);
template <Dtype T>
void compare_span(CompareOp op, std::int64_t n, const T* a, const T* b, bool* out);
template <Dtype T>
void compare_scalar_span(CompareOp op, std::int64_t n, const T* a, T s, bool scalar_first, bool* out);
template <Dtype T>
void unary_span(UnaryOp op, std::int64_t n, const T* x, T* out);
template <Dtype T>
void where_span(std::int64_t n, const bool* cond, const T* a, const T* b, T* out);
// The reduce family's (src/core/tensor_reduce.cpp; ops/reduce.hpp).
template <Dtype T>
Tensor<T> reduce_kernel(const Tensor<T>& x, ReduceKind kind, const Dims& dims, bool keepdims);
template <Dtype T>
Tensor<T> prefix_sum_kernel(const Tensor<T>& x, int axis, bool reverse);
template <Dtype T>
Tensor<std::int64_t> arg_reduce_kernel(const Tensor<T>& x, int axis, bool keepdims, bool want_max);
/// The sum of the products of a's and b's elements (arrays of one size): vdot's kernel.
template <Dtype T>
Tensor<T> vdot_kernel(const Tensor<T>& a, const Tensor<T>& b);
/// numpy's matmul (1-D operands promoted, batch dims broadcast): matmul's kernel.
template <Dtype T>
Tensor<T> matmul_kernel(const Tensor<T>& a, const Tensor<T>& b);
// The shape family's kernels (the primitives are ops/shape.hpp's).
/// The result shapes of reshape (one dim may be -1), expand_dims and squeeze (errors name the op).
Shape resolve_reshape(const Shape& from, Shape to);
Shape expand_dims_shape(const Shape& from, int axis);
Shape squeeze_shape(const Shape& from, const Dims& dims);
template <Dtype T>
Tensor<T> transpose_kernel(const Tensor<T>& x, std::vector<int> perm);
template <Dtype T>
Tensor<T> broadcast_to_kernel(const Tensor<T>& x, const Shape& shape);
template <Dtype T>
Tensor<T> slice_kernel(const Tensor<T>& x, const std::vector<Index>& index);
template <Dtype T>
Tensor<T> concatenate_kernel(const std::vector<Tensor<T>>& xs, int axis);
template <Dtype T>
Tensor<T> stack_kernel(const std::vector<Tensor<T>>& xs, int axis);
template <Dtype T, Dtype I>
Tensor<T> take_kernel(const Tensor<T>& x, const Tensor<I>& indices, int axis);
template <Dtype T, Dtype I>
Tensor<T> take_along_axis_kernel(const Tensor<T>& x, const Tensor<I>& indices, int axis);
}  // namespace detail
/// In place: x = x op y, y broadcast to x's shape (ShapeError otherwise).
template <Dtype T>
void binary_inplace(Tensor<T>& x, const Tensor<T>& y, BinaryOp op);
template <Dtype T>
Tensor<T> where(const Tensor<bool>& cond, const Tensor<T>& a, const Tensor<T>& b);
/// Reduces `dims` (every dim for Dims()); keepdims keeps them with size 1. Floating sums and
/// means accumulate pairwise (float32 in float64); max/min propagate nan. ValueError for
/// max/min over zero elements (numpy's "zero-size array ... has no identity").
template <Dtype T>
Tensor<T> reduce(const Tensor<T>& x, ReduceKind kind, const Dims& dims = {}, bool keepdims = false);
/// Inclusive prefix sums along `axis` (lax.cumsum; from the end when reverse), same dtype:
/// what shard::cumsum runs. Floating sums run in float64; integers wrap. ValueError for bool.
template <Dtype T>
Tensor<T> prefix_sum(const Tensor<T>& x, int axis, bool reverse = false);
/// Index of the first largest (smallest) element along `axis`; nan counts as largest.
template <Dtype T>
Tensor<std::int64_t> argmax(const Tensor<T>& x, int axis, bool keepdims = false);
template <Dtype T>
Tensor<std::int64_t> argmin(const Tensor<T>& x, int axis, bool keepdims = false);
/// Over the flattened array (axis=None): a 0-d index.
template <Dtype T>
Tensor<std::int64_t> argmax(const Tensor<T>& x);
template <Dtype T>
Tensor<std::int64_t> argmin(const Tensor<T>& x);
template <Dtype T>
Tensor<T> matmul(const Tensor<T>& a, const Tensor<T>& b, shard::source_location where = shard::source_location::current());
template <Dtype T>
Tensor<T> dot(const Tensor<T>& a, const Tensor<T>& b);
template <Dtype T>
Tensor<T> vdot(const Tensor<T>& a, const Tensor<T>& b);

/// Every element converted (bool: non-zero is true; floating to integer truncates toward zero and
/// saturates as JAX does: values past the integer's range give its max or min, nan gives 0). A
/// primitive of the elementwise family (ops/elementwise.hpp).
template <Dtype U, Dtype T>
Tensor<U> astype(const Tensor<T>& x);

namespace detail {
/// astype's kernel.
/// float32 <-> bfloat16 on n contiguous elements, vectorised (tensor_elementwise.cpp); the same
/// bits as bfloat16's constructor and conversion.
void float_to_bfloat16_span(std::int64_t n, const float* in, bfloat16* out);
void bfloat16_to_float_span(std::int64_t n, const bfloat16* in, float* out);
template <Dtype U, Dtype T>
void astype_span(std::int64_t n, const T* in, U* o) {
  if constexpr (std::is_same_v<U, bfloat16> && std::is_same_v<T, float>) {
    float_to_bfloat16_span(n, in, o);
    return;
  } else if constexpr (std::is_same_v<U, float> && std::is_same_v<T, bfloat16>) {
    bfloat16_to_float_span(n, in, o);
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<U, bool>) {
      o[i] = in[i] != T(0);
    } else if constexpr (std::is_integral_v<U> && is_floating_v<T>) {
      // (a plain cast of an out-of-range or nan value is undefined: x86 gives MIN for all)
      const auto v = static_cast<double>(in[i]);
      constexpr auto hi = static_cast<double>(std::numeric_limits<U>::max());
      constexpr auto lo = static_cast<double>(std::numeric_limits<U>::min());
      o[i] = v != v ? U(0) : v >= hi ? std::numeric_limits<U>::max() : v <= lo ? std::numeric_limits<U>::min() : static_cast<U>(v);
    } else {
      o[i] = static_cast<U>(in[i]);
    }
  }
}
template <Dtype U, Dtype T>
Tensor<U> astype_kernel(const Tensor<T>& x) {
  Tensor<U> out(x.shape());
  astype_span(x.size(), x.data(), out.data());
  return out;
}
}  // namespace detail

// ---------------------------------------------------------------- shape and indexing

/// The same elements in another shape; one dim may be -1 (inferred). ShapeError if the sizes differ.
template <Dtype T>
Tensor<T> reshape(const Tensor<T>& x, Shape shape, shard::source_location where);
template <Dtype T>
Tensor<T> reshape(Tensor<T>&& x, Shape shape);
/// Permutes the dims (reverses them when perm is empty).
template <Dtype T>
Tensor<T> transpose(const Tensor<T>& x, std::vector<int> perm = {}, shard::source_location where = shard::source_location::current());
/// A new dim of size 1 at `axis` (of the result).
template <Dtype T>
Tensor<T> expand_dims(const Tensor<T>& x, int axis, shard::source_location where = shard::source_location::current());
/// Drops size-1 dims (all of them for Dims()); ShapeError for a listed dim of another size.
template <Dtype T>
Tensor<T> squeeze(const Tensor<T>& x, const Dims& dims = {}, shard::source_location where = shard::source_location::current());
/// numpy's broadcast_to (a copy).
template <Dtype T>
Tensor<T> broadcast_to(const Tensor<T>& x, const Shape& shape, shard::source_location where = shard::source_location::current());
/// numpy's basic indexing: x[i], x[a:b:c, ...] (a copy).
template <Dtype T>
Tensor<T> slice(const Tensor<T>& x, const std::vector<Index>& index, shard::source_location where = shard::source_location::current());
/// Joins along an existing `axis` (shapes must agree elsewhere).
template <Dtype T>
Tensor<T> concatenate(const std::vector<Tensor<T>>& xs, int axis = 0, shard::source_location where = shard::source_location::current());
/// Joins along a new `axis` (all shapes equal).
template <Dtype T>
Tensor<T> stack(const std::vector<Tensor<T>>& xs, int axis = 0, shard::source_location where = shard::source_location::current());
/// numpy's take: x.shape[:axis] + indices.shape + x.shape[axis+1:], elements x[.., idx, ..];
/// negative indices count from the end; ShapeError naming the index when out of range.
template <Dtype T, Dtype I>
Tensor<T> take(const Tensor<T>& x, const Tensor<I>& indices, int axis = 0, shard::source_location where = shard::source_location::current());
/// numpy's take_along_axis: indices of x's rank, broadcasting on the other dims.
template <Dtype T, Dtype I>
Tensor<T> take_along_axis(const Tensor<T>& x, const Tensor<I>& indices, int axis, shard::source_location where = shard::source_location::current());
// ---------------------------------------------------------------- creation

template <Dtype T>
Tensor<T> zeros(const Shape& shape) {
  return Tensor<T>(shape, T(0));
}
template <Dtype T>
Tensor<T> ones(const Shape& shape) {
  return Tensor<T>(shape, T(1));
}
template <Dtype T>
Tensor<T> full(const Shape& shape, T value) {
  return Tensor<T>(shape, value);
}
template <Dtype T>
Tensor<T> zeros_like(const Tensor<T>& x) {
  return Tensor<T>(x.shape(), T(0));
}
template <Dtype T>
Tensor<T> ones_like(const Tensor<T>& x) {
  return Tensor<T>(x.shape(), T(1));
}
template <Dtype T>
Tensor<T> full_like(const Tensor<T>& x, T value) {
  return Tensor<T>(x.shape(), value);
}
/// numpy's arange(start, stop, step): ceil((stop - start) / step) elements.
template <Dtype T>
Tensor<T> arange(T start, T stop, T step = T(1));
/// arange(0, stop).
template <Dtype T>
Tensor<T> arange(T stop) {
  return arange<T>(T(0), stop, T(1));
}

/// The in-class spellings of slice(): x[i] (row i) and x[{1, Slice(2, 5)}].
template <typename T>
Tensor<T> Tensor<T>::operator[](std::int64_t i) const {
  return shard::slice(*this, std::vector<Index>{Index(i)});
}
template <typename T>
Tensor<T> Tensor<T>::operator[](std::initializer_list<Index> index) const {
  return shard::slice(*this, std::vector<Index>(index));
}

}  // namespace shard
