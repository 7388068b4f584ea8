#pragma once
/// \file The shape and indexing family of the op table: reshape, expand_dims, squeeze,
/// transpose, broadcast_to, slice, concatenate, stack, take and take_along_axis, each a
/// primitive (core/primitive.hpp) with its Tensor kernel, its sharded form and its VJP side by
/// side. The public functions of both views (core/tensor_ops.hpp, ops/ops.hpp) bind them
/// (array/driver.hpp). Their layout rules are not factor rules (a reshape merges and splits
/// dims, a slice moves elements between devices), so each gives `sharded()`: the Tensor kernel
/// on every block plus the data movement its layout needs (src/ops/ops_shape.cpp).

#include <cstdint>
#include <vector>

#include "shard/array/driver.hpp"
#include "shard/array/sharded_array.hpp"
#include "shard/core/index.hpp"
#include "shard/core/primitive.hpp"
#include "shard/core/tensor.hpp"
#include "shard/core/tensor_ops.hpp"
#include "shard/core/trace.hpp"

namespace shard {

namespace detail {

// The sharded forms (src/ops/ops_shape.cpp); the Tensor kernels are core/tensor_ops.hpp's.
template <Dtype T>
ShardedArray<T> transpose_sharded(const ShardedArray<T>& a, std::vector<int> perm);
template <Dtype T>
ShardedArray<T> reshape_sharded(const ShardedArray<T>& a, const Shape& shape);
template <Dtype T>
ShardedArray<T> expand_dims_sharded(const ShardedArray<T>& a, int axis);
template <Dtype T>
ShardedArray<T> squeeze_sharded(const ShardedArray<T>& a, const Dims& dims);
template <Dtype T>
ShardedArray<T> slice_sharded(const ShardedArray<T>& a, const std::vector<Index>& index);
template <Dtype T>
ShardedArray<T> concatenate_sharded(const std::vector<ShardedArray<T>>& xs, int axis);
template <Dtype T>
ShardedArray<T> stack_sharded(const std::vector<ShardedArray<T>>& xs, int axis);
template <Dtype T, Dtype I>
ShardedArray<T> take_sharded(const ShardedArray<T>& x, const ShardedArray<I>& indices, int axis);
template <Dtype T, Dtype I>
ShardedArray<T> take_along_axis_sharded(const ShardedArray<T>& x, const ShardedArray<I>& indices, int axis);

}  // namespace detail

namespace prim {

/// The ops that keep the elements in order and change the shape (reshape, expand_dims,
/// squeeze; Self gives result_shape()): linear and local, the cotangent reshaped back.
template <typename Self>
struct ReshapeLike : Primitive {
  static constexpr bool kernel_validates = true;
  static constexpr bool linear_local = true;
  template <Dtype T>
  Tensor<T> kernel(const Tensor<T>& x) const {
    return Tensor<T>(x).reshaped(self().result_shape(x.shape()));
  }
  /// Inside a differentiated function the result shares x's memory (as autodiff's residuals
  /// do; an in-place op on either copies first): no copy for the reshapes of a body.
  template <Dtype T>
  Tensor<T> view(const Tensor<T>& x) const {
    if (!x.owns_memory()) return kernel(x);  // a borrow: the result must own its memory
    Tensor<T> v = x.alias();
    v.set_ad(nullptr);
    return std::move(v).reshaped(self().result_shape(x.shape()));
  }
  template <ArrayLike X>
  KernelVjp<X, X> vjp(const VjpNeed&, const X&, const X& x) const {
    return [s = x.shape()](const X& ct, const VjpNeed&) {
      if constexpr (detail::is_tensor_v<X>) {
        if (!ct.ad() && ct.owns_memory()) {  // a plain cotangent: its memory, reshaped
          X v = ct.alias();
          return cotangents<X>(std::move(v).reshaped(s));
        }
      }
      return cotangents<X>(reshape(ct, s));
    };
  }

 private:
  const Self& self() const { return static_cast<const Self&>(*this); }
};

struct Reshape : ReshapeLike<Reshape> {
  Shape shape;
  const char* name() const { return "reshape"; }
  Shape result_shape(const Shape& from) const { return detail::resolve_reshape(from, shape); }
  template <Dtype T>
  ShardedArray<T> sharded(const ShardedArray<T>& x) const {
    return detail::reshape_sharded(x, shape);
  }
};

struct ExpandDims : ReshapeLike<ExpandDims> {
  int axis;
  const char* name() const { return "expand_dims"; }
  Shape result_shape(const Shape& from) const { return detail::expand_dims_shape(from, axis); }
  template <Dtype T>
  ShardedArray<T> sharded(const ShardedArray<T>& x) const {
    return detail::expand_dims_sharded(x, axis);
  }
};

struct Squeeze : ReshapeLike<Squeeze> {
  Dims dims;
  const char* name() const { return "squeeze"; }
  Shape result_shape(const Shape& from) const { return detail::squeeze_shape(from, dims); }
  template <Dtype T>
  ShardedArray<T> sharded(const ShardedArray<T>& x) const {
    return detail::squeeze_sharded(x, dims);
  }
};

/// Permutes the dims (reverses them when perm is empty); spec entries move with their dims.
struct Transpose : Primitive {
  std::vector<int> perm;
  static constexpr bool kernel_validates = true;
  static constexpr bool linear_local = true;
  const char* name() const { return "transpose"; }
  template <Dtype T>
  Tensor<T> kernel(const Tensor<T>& x) const {
    return detail::transpose_kernel(x, perm);
  }
  template <Dtype T>
  ShardedArray<T> sharded(const ShardedArray<T>& x) const {
    return detail::transpose_sharded(x, perm);
  }
  template <ArrayLike X>
  KernelVjp<X, X> vjp(const VjpNeed& need, const X& out, const X& x) const;
};

/// numpy's broadcast_to (Tensors): the cotangent summed back to x's shape.
struct BroadcastTo : Primitive {
  Shape shape;
  static constexpr bool kernel_validates = true;
  const char* name() const { return "broadcast_to"; }
  template <Dtype T>
  Tensor<T> kernel(const Tensor<T>& x) const {
    return detail::broadcast_to_kernel(x, shape);
  }
  template <ArrayLike X>
  KernelVjp<X, X> vjp(const VjpNeed& need, const X& out, const X& x) const;
};

/// numpy's basic indexing: the cotangent placed at the slice, zeros elsewhere.
struct SliceOp : Primitive {
  std::vector<Index> index;
  static constexpr bool kernel_validates = true;
  const char* name() const { return "slice"; }
  template <Dtype T>
  Tensor<T> kernel(const Tensor<T>& x) const {
    return detail::slice_kernel(x, index);
  }
  template <Dtype T>
  ShardedArray<T> sharded(const ShardedArray<T>& x) const {
    return detail::slice_sharded(x, index);
  }
  template <ArrayLike X>
  KernelVjp<X, X> vjp(const VjpNeed& need, const X& out, const X& x) const;
};

/// Joins a list along an existing axis: each operand's cotangent is its slice of the result's.
struct Concatenate : Primitive {
  int axis;
  const char* name() const { return "concatenate"; }
  template <Dtype T>
  Tensor<T> kernel(const std::vector<Tensor<T>>& xs) const {
    return detail::concatenate_kernel(xs, axis);
  }
  template <Dtype T>
  ShardedArray<T> sharded(const std::vector<ShardedArray<T>>& xs) const {
    return detail::concatenate_sharded(xs, axis);
  }
  template <ArrayLike X>
  KernelVjp<X, X> vjp(const X& out, const std::vector<X>& xs) const;
};

/// Joins a list along a new axis: each operand's cotangent is its index of the result's.
struct Stack : Primitive {
  int axis;
  const char* name() const { return "stack"; }
  template <Dtype T>
  Tensor<T> kernel(const std::vector<Tensor<T>>& xs) const {
    return detail::stack_kernel(xs, axis);
  }
  template <Dtype T>
  ShardedArray<T> sharded(const std::vector<ShardedArray<T>>& xs) const {
    return detail::stack_sharded(xs, axis);
  }
  template <ArrayLike X>
  KernelVjp<X, X> vjp(const X& out, const std::vector<X>& xs) const;
};

/// numpy's take (along = false) and take_along_axis (along = true), operands (x, indices): the
/// cotangent scatter-added back to x's rows; indices get none.
struct Take : Primitive {
  int axis;
  bool along;
  static constexpr bool kernel_validates = true;
  const char* name() const { return along ? "take_along_axis" : "take"; }
  template <Dtype T, Dtype I>
  Tensor<T> kernel(const Tensor<T>& x, const Tensor<I>& indices) const {
    return along ? detail::take_along_axis_kernel(x, indices, axis) : detail::take_kernel(x, indices, axis);
  }
  template <Dtype T, Dtype I>
  ShardedArray<T> sharded(const ShardedArray<T>& x, const ShardedArray<I>& indices) const {
    return along ? detail::take_along_axis_sharded(x, indices, axis) : detail::take_sharded(x, indices, axis);
  }
  template <ArrayLike X, ArrayLike I>
  KernelVjp<X, X> vjp(const VjpNeed& need, const X& out, const X& x, const I& indices) const;
};

}  // namespace prim

}  // namespace shard
