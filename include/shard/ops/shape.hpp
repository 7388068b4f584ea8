#pragma once
/// \file The shape and indexing family of the op table: reshape, expand_dims, squeeze,
/// transpose, broadcast_to, slice, concatenate, stack, take and take_along_axis, each a
/// primitive (core/primitive.hpp) with its Tensor kernel, its sharded form and its VJP side by
/// side. The public functions of both views (core/tensor_ops.hpp, ops/ops.hpp) bind them
/// (array/driver.hpp). Their layout rules are not factor rules (a reshape merges and splits
/// dims, a slice moves elements between devices), so each gives `sharded()`: the Tensor kernel
/// on every block plus the data movement its layout needs (src/ops/ops_shape.cpp).

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "shard/array/detail/node_meta.hpp"
#include "shard/array/driver.hpp"
#include "shard/array/sharded_array.hpp"
#include "shard/core/index.hpp"
#include "shard/core/primitive.hpp"
#include "shard/core/tensor.hpp"
#include "shard/core/tensor_ops.hpp"
#include "shard/core/trace.hpp"
#include "shard/ops/batching.hpp"

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
  /// Batching: each example reshaped, the batch dim kept first.
  template <ArrayLike X>
  BatchOut<X> batch(const shard::source_location& where, std::int64_t size, const BatchArg<X>& a) const {
    Shape to = result_shape(a.shape());
    to.insert(to.begin(), size);
    return {detail::reshaped_view(detail::batch_first(a), to, where), 0};
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
  template <ArrayLike X>
  BatchOut<X> batch(const shard::source_location& where, std::int64_t, const BatchArg<X>& a) const {
    X x = detail::batch_first(a);
    Shape to = x.shape();
    to.insert(to.begin() + detail::past_batch(axis, a.rank() + 1, name()), 1);
    return {detail::reshaped_view(x, to, where), 0};
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
  /// Batching: the example's dims named explicitly (Dims() would also drop a batch of 1).
  template <ArrayLike X>
  BatchOut<X> batch(const shard::source_location& where, std::int64_t, const BatchArg<X>& a) const {
    const Shape s = a.shape();
    std::vector<int> d;
    if (dims.is_all()) {
      for (int k = 0; k < static_cast<int>(s.size()); ++k)
        if (s[k] == 1) d.push_back(k + 1);
    } else {
      for (int k : dims.resolve(static_cast<int>(s.size()), name())) d.push_back(k + 1);
    }
    X x = detail::batch_first(a);
    if (d.empty()) return {std::move(x), 0};
    if constexpr (detail::is_tensor_v<X>) {
      Shape to;
      for (int k = 0; k < x.ndim(); ++k)
        if (std::find(d.begin(), d.end(), k) == d.end()) to.push_back(x.shape()[k]);
      return {detail::reshaped_view(x, to, where), 0};
    } else {
      return {squeeze(x, Dims(d), where), 0};  // a sharded size-1 dim is gathered first
    }
  }
};

/// Permutes the dims (reverses them when perm is empty); spec entries move with their dims.
struct Transpose : Primitive {
  std::vector<int> perm;
  static constexpr bool kernel_validates = true;
  static constexpr bool linear_local = true;
  const char* name() const { return "transpose"; }
  /// Every parameter (jit's common subexpressions: array/detail/trace_primitive.hpp).
  std::string cse_key() const { return params_text(); }  // "perm:" alone: reversed
  std::string params_text() const {
    std::string t = "perm:";
    for (int d : perm) t += " " + std::to_string(d);
    return t;
  }
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
  /// Batching: the batch dim stays where it is; the example's dims are permuted around it.
  template <ArrayLike X>
  BatchOut<X> batch(const shard::source_location& where, std::int64_t, const BatchArg<X>& a) const {
    const int r = a.rank();
    std::vector<int> p(perm);
    if (p.empty())
      for (int k = r - 1; k >= 0; --k) p.push_back(k);
    if (static_cast<int>(p.size()) != r)
      raise<ShapeError>(located(name(), where), ": perm has ", p.size(), " entries for an array of rank ", r);
    std::vector<int> full{0};
    for (int k : p) full.push_back(resolve_dim(k, r, name()) + 1);
    X x = detail::batch_first(a);
    // A permutation that only moves size-1 dims keeps the elements' order: a reshape (a view).
    int last = -1;
    bool in_order = true;
    for (int k : full)
      if (x.shape()[static_cast<std::size_t>(k)] != 1) {
        in_order = in_order && k > last;
        last = k;
      }
    if (in_order) {
      Shape to;
      for (int k : full) to.push_back(x.shape()[static_cast<std::size_t>(k)]);
      return {detail::reshaped_view(x, to, where), 0};
    }
    return {transpose(x, full, where), 0};
  }
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
  template <ArrayLike X>
  BatchOut<X> batch(const shard::source_location& where, std::int64_t size, const BatchArg<X>& a) const {
    Shape to = shape;
    to.insert(to.begin(), size);
    return {broadcast_to(detail::batch_first_rank(a, static_cast<int>(shape.size())), to, where), 0};
  }
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
  /// Batching: the whole batch dim, then the example's index.
  template <ArrayLike X>
  BatchOut<X> batch(const shard::source_location& where, std::int64_t, const BatchArg<X>& a) const {
    std::vector<Index> full{Slice()};
    full.insert(full.end(), index.begin(), index.end());
    return {slice(detail::batch_first(a), full, where), 0};
  }
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
  /// Batching: every operand with the batch dim first (ops/batching.hpp), joined past it.
  template <ArrayLike X>
  X batch_list(const shard::source_location& where, int rank, const std::vector<X>& xs) const {
    return concatenate(xs, detail::past_batch(axis, rank, name()), where);
  }
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
  template <ArrayLike X>
  X batch_list(const shard::source_location& where, int rank, const std::vector<X>& xs) const {
    return stack(xs, detail::past_batch(axis, rank + 1, name()), where);
  }
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
  /// Batching (ops/batching.hpp's take_batch): an unbatched table indexed by batched indices is
  /// one take (the batch dim lands at `axis`); batched tables shift `axis` past the batch dim,
  /// and with batched indices too the table's batch is merged into `axis` with offsets.
  template <ArrayLike X, ArrayLike I>
  BatchOut<X> batch(const shard::source_location& where, std::int64_t size, const BatchArg<X>& x,
                    const BatchArg<I>& indices) const {
    return detail::take_batch(*this, where, size, x, indices);
  }
};

/// The transpose of slice (SliceOp's VJP): ct placed at `index` of an array of `shape` (and,
/// for ShardedArrays, `sharding`), zeros elsewhere. A primitive, so a VJP under vmap batches.
struct SliceTranspose : Primitive {
  Shape shape;
  std::shared_ptr<const NamedSharding> sharding;  ///< shared: jit keeps the primitive
  std::vector<Index> index;
  static constexpr bool kernel_validates = true;
  const char* name() const { return "slice_transpose"; }
  template <Dtype T>
  Tensor<T> kernel(const Tensor<T>& ct) const {
    return detail::slice_transpose(ct, detail::NodeMeta<Tensor<T>>(shape), index);
  }
  template <Dtype T>
  ShardedArray<T> sharded(const ShardedArray<T>& ct) const {
    return detail::slice_transpose(ct, detail::NodeMeta<ShardedArray<T>>(shape, *sharding), index);
  }
  template <ArrayLike X>
  KernelVjp<X, X> vjp(const VjpNeed&, const X&, const X&) const {
    return [index = index](const X& c, const VjpNeed&) { return cotangents<X>(slice(c, index)); };
  }
  /// Batching: the batch dim first, then the example's index.
  template <ArrayLike X>
  BatchOut<X> batch(const shard::source_location& where, std::int64_t size, const BatchArg<X>& ct) const {
    Shape s = shape;
    s.insert(s.begin(), size);
    std::vector<Index> full{Slice()};
    full.insert(full.end(), index.begin(), index.end());
    if constexpr (detail::is_sharded_v<X>) {
      const NamedSharding sh = detail::with_batch_entry(*sharding);
      return {detail::bind_at(SliceTranspose{{}, s, std::make_shared<const NamedSharding>(sh), full}, where,
                              detail::batch_first(ct)),
              0};
    } else {
      return {detail::bind_at(SliceTranspose{{}, s, nullptr, full}, where, detail::batch_first(ct)), 0};
    }
  }
};

/// The transpose of take / take_along_axis (Take's VJP) for an operand of `shape` (and
/// `sharding`): ct's rows scatter-added back. Operands (ct, indices).
struct TakeTranspose : Primitive {
  Shape shape;
  std::shared_ptr<const NamedSharding> sharding;  ///< shared: jit keeps the primitive
  int axis;
  bool along;
  static constexpr bool kernel_validates = true;
  const char* name() const { return along ? "take_along_axis_transpose" : "take_transpose"; }
  template <Dtype T, Dtype I>
  Tensor<T> kernel(const Tensor<T>& ct, const Tensor<I>& indices) const {
    const detail::NodeMeta<Tensor<T>> m(shape);
    return along ? detail::take_along_axis_transpose(ct, indices, m, axis)
                 : detail::take_transpose(ct, indices, m, axis);
  }
  template <Dtype T, Dtype I>
  ShardedArray<T> sharded(const ShardedArray<T>& ct, const ShardedArray<I>& indices) const {
    const detail::NodeMeta<ShardedArray<T>> m(shape, *sharding);
    return along ? detail::take_along_axis_transpose(ct, indices, m, axis)
                 : detail::take_transpose(ct, indices, m, axis);
  }
  template <ArrayLike X, ArrayLike I>
  KernelVjp<X, X> vjp(const VjpNeed&, const X&, const X&, const I& indices) const {
    return [ik = detail::keep(indices), axis = axis, along = along](const X& c, const VjpNeed&) {
      return cotangents<X>(along ? take_along_axis(c, ik, axis) : take(c, ik, axis));
    };
  }
  template <ArrayLike X, ArrayLike I>
  BatchOut<X> batch(const shard::source_location& where, std::int64_t size, const BatchArg<X>& ct,
                    const BatchArg<I>& indices) const {
    return detail::take_transpose_batch(*this, where, size, ct, indices);
  }
};

}  // namespace prim

}  // namespace shard
