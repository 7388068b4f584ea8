// The shape family's VJPs and public functions (ops/shape.hpp): both views bind the same
// primitive; the Tensor kernels are src/core/tensor_shape.cpp's, the sharded forms
// src/ops/ops_shape.cpp's.

#include "shard/ops/shape.hpp"

#include <source_location>

#include "shard/array/detail/node_meta.hpp"
#include "shard/ops/elementwise.hpp"
#include "shard/ops/ops.hpp"

namespace shard {

namespace prim {

template <ArrayLike X>
KernelVjp<X, X> Transpose::vjp(const VjpNeed&, const X&, const X&) const {
  std::vector<int> inv;  // empty: a reversal, its own inverse
  if (!perm.empty()) {
    inv.resize(perm.size());
    for (std::size_t k = 0; k < perm.size(); ++k)
      inv[static_cast<std::size_t>(perm[k])] = static_cast<int>(k);
  }
  return [inv = std::move(inv)](const X& ct, const VjpNeed&) { return cotangents<X>(transpose(ct, inv)); };
}

template <ArrayLike X>
KernelVjp<X, X> BroadcastTo::vjp(const VjpNeed&, const X&, const X& x) const {
  return [s = x.shape()](const X& ct, const VjpNeed&) { return cotangents<X>(detail::unbroadcast(ct, s)); };
}

/// The sharding a node keeps of a ShardedArray primal (null for a Tensor).
template <typename X>
std::shared_ptr<const NamedSharding> sharding_of(const detail::NodeMeta<X>& m) {
  if constexpr (detail::is_sharded_v<X>)
    return std::make_shared<const NamedSharding>(m.sharding);
  else
    return nullptr;
}

template <ArrayLike X>
KernelVjp<X, X> SliceOp::vjp(const VjpNeed&, const X&, const X& x) const {
  return [xm = detail::NodeMeta<X>(x), index = index](const X& ct, const VjpNeed&) {
    return cotangents<X>(detail::bind_at(SliceTranspose{{}, xm.shape, sharding_of(xm), index}, {}, ct));
  };
}

template <ArrayLike X>
KernelVjp<X, X> Concatenate::vjp(const X&, const std::vector<X>& xs) const {
  const int a = resolve_dim(axis, xs.at(0).ndim(), "concatenate");
  std::vector<std::int64_t> offsets{0};
  for (const auto& x : xs) offsets.push_back(offsets.back() + x.shape()[a]);
  return [a, offsets = std::move(offsets)](const X& ct, const VjpNeed& need) {
    Cotangents<X> r(offsets.size() - 1);
    std::vector<Index> index(static_cast<std::size_t>(a), Index(Slice()));
    index.emplace_back(Slice());
    for (std::size_t i = 0; i + 1 < offsets.size(); ++i) {
      if (!need[i]) continue;
      index.back() = Index(Slice(offsets[i], offsets[i + 1]));
      r[i] = slice(ct, index);
    }
    return r;
  };
}

template <ArrayLike X>
KernelVjp<X, X> Stack::vjp(const X&, const std::vector<X>& xs) const {
  const int a = resolve_dim(axis, xs.at(0).ndim() + 1, "stack");
  return [a, n = xs.size()](const X& ct, const VjpNeed& need) {
    Cotangents<X> r(n);
    std::vector<Index> index(static_cast<std::size_t>(a), Index(Slice()));
    index.emplace_back(std::int64_t{0});
    for (std::size_t i = 0; i < n; ++i) {
      if (!need[i]) continue;
      index.back() = Index(static_cast<std::int64_t>(i));
      r[i] = slice(ct, index);
    }
    return r;
  };
}

template <ArrayLike X, ArrayLike I>
KernelVjp<X, X> Take::vjp(const VjpNeed&, const X&, const X& x, const I& indices) const {
  return [xm = detail::NodeMeta<X>(x), ik = detail::keep(indices), axis = axis, along = along](
             const X& ct, const VjpNeed&) {
    return cotangents<X>(
        detail::bind_at(TakeTranspose{{}, xm.shape, sharding_of(xm), axis, along}, {}, ct, ik));
  };
}

}  // namespace prim

// ---------------------------------------------------------------- the public functions, both views

template <Dtype T>
Tensor<T> reshape(const Tensor<T>& x, Shape shape, shard::source_location where) {
  const detail::CallScope scope("reshape", where);
  return detail::bind_at(prim::Reshape{{}, std::move(shape)}, where, x);
}
template <Dtype T>
ShardedArray<T> reshape(const ShardedArray<T>& x, Shape shape, shard::source_location where) {
  const detail::CallScope scope("reshape", where);
  return detail::bind_at(prim::Reshape{{}, std::move(shape)}, where, x);
}
template <Dtype T>
Tensor<T> expand_dims(const Tensor<T>& x, int axis, shard::source_location where) {
  const detail::CallScope scope("expand_dims", where);
  return detail::bind_at(prim::ExpandDims{{}, axis}, where, x);
}
template <Dtype T>
ShardedArray<T> expand_dims(const ShardedArray<T>& x, int axis, shard::source_location where) {
  const detail::CallScope scope("expand_dims", where);
  return detail::bind_at(prim::ExpandDims{{}, axis}, where, x);
}
template <Dtype T>
Tensor<T> squeeze(const Tensor<T>& x, const Dims& dims, shard::source_location where) {
  const detail::CallScope scope("squeeze", where);
  return detail::bind_at(prim::Squeeze{{}, dims}, where, x);
}
template <Dtype T>
ShardedArray<T> squeeze(const ShardedArray<T>& x, const Dims& dims, shard::source_location where) {
  const detail::CallScope scope("squeeze", where);
  return detail::bind_at(prim::Squeeze{{}, dims}, where, x);
}
template <Dtype T>
Tensor<T> transpose(const Tensor<T>& x, std::vector<int> perm, shard::source_location where) {
  const detail::CallScope scope("transpose", where);
  return detail::bind_at(prim::Transpose{{}, std::move(perm)}, where, x);
}
template <Dtype T>
ShardedArray<T> transpose(const ShardedArray<T>& x, std::vector<int> perm, shard::source_location where) {
  const detail::CallScope scope("transpose", where);
  return detail::bind_at(prim::Transpose{{}, std::move(perm)}, where, x);
}
template <Dtype T>
Tensor<T> broadcast_to(const Tensor<T>& x, const Shape& shape, shard::source_location where) {
  const detail::CallScope scope("broadcast_to", where);
  return detail::bind_at(prim::BroadcastTo{{}, shape}, where, x);
}
template <Dtype T>
Tensor<T> slice(const Tensor<T>& x, const std::vector<Index>& index, shard::source_location where) {
  const detail::CallScope scope("slice", where);
  return detail::bind_at(prim::SliceOp{{}, index}, where, x);
}
template <Dtype T>
ShardedArray<T> slice(const ShardedArray<T>& x, const std::vector<Index>& index,
                      shard::source_location where) {
  const detail::CallScope scope("slice", where);
  return detail::bind_at(prim::SliceOp{{}, index}, where, x);
}
template <Dtype T>
Tensor<T> concatenate(const std::vector<Tensor<T>>& xs, int axis, shard::source_location where) {
  const detail::CallScope scope("concatenate", where);
  return detail::bind_list_at(prim::Concatenate{{}, axis}, where, xs);
}
template <Dtype T>
ShardedArray<T> concatenate(const std::vector<ShardedArray<T>>& xs, int axis, shard::source_location where) {
  const detail::CallScope scope("concatenate", where);
  return detail::bind_list_at(prim::Concatenate{{}, axis}, where, xs);
}
template <Dtype T>
Tensor<T> stack(const std::vector<Tensor<T>>& xs, int axis, shard::source_location where) {
  const detail::CallScope scope("stack", where);
  return detail::bind_list_at(prim::Stack{{}, axis}, where, xs);
}
template <Dtype T>
ShardedArray<T> stack(const std::vector<ShardedArray<T>>& xs, int axis, shard::source_location where) {
  const detail::CallScope scope("stack", where);
  return detail::bind_list_at(prim::Stack{{}, axis}, where, xs);
}
template <Dtype T, Dtype I>
Tensor<T> take(const Tensor<T>& x, const Tensor<I>& indices, int axis, shard::source_location where) {
  const detail::CallScope scope("take", where);
  return detail::bind_at(prim::Take{{}, axis, false}, where, x, indices);
}
template <Dtype T, Dtype I>
ShardedArray<T> take(const ShardedArray<T>& x, const ShardedArray<I>& indices, int axis,
                     shard::source_location where) {
  const detail::CallScope scope("take", where);
  return detail::bind_at(prim::Take{{}, axis, false}, where, x, indices);
}
template <Dtype T, Dtype I>
Tensor<T> take_along_axis(const Tensor<T>& x, const Tensor<I>& indices, int axis,
                          shard::source_location where) {
  const detail::CallScope scope("take_along_axis", where);
  return detail::bind_at(prim::Take{{}, axis, true}, where, x, indices);
}
template <Dtype T, Dtype I>
ShardedArray<T> take_along_axis(const ShardedArray<T>& x, const ShardedArray<I>& indices, int axis,
                                shard::source_location where) {
  const detail::CallScope scope("take_along_axis", where);
  return detail::bind_at(prim::Take{{}, axis, true}, where, x, indices);
}

#define SHARD_INSTANTIATE_SHAPE(V, T)                                                     \
  template V<T> reshape<T>(const V<T>&, Shape, shard::source_location);                   \
  template V<T> expand_dims<T>(const V<T>&, int, shard::source_location);                 \
  template V<T> squeeze<T>(const V<T>&, const Dims&, shard::source_location);             \
  template V<T> transpose<T>(const V<T>&, std::vector<int>, shard::source_location);      \
  template V<T> slice<T>(const V<T>&, const std::vector<Index>&, shard::source_location); \
  template V<T> concatenate<T>(const std::vector<V<T>>&, int, shard::source_location);    \
  template V<T> stack<T>(const std::vector<V<T>>&, int, shard::source_location);
#define SHARD_INSTANTIATE_SHAPE_BOTH(T)    \
  SHARD_INSTANTIATE_SHAPE(Tensor, T)       \
  SHARD_INSTANTIATE_SHAPE(ShardedArray, T) \
  template Tensor<T> broadcast_to<T>(const Tensor<T>&, const Shape&, shard::source_location);
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_SHAPE_BOTH)
#undef SHARD_INSTANTIATE_SHAPE_BOTH
#undef SHARD_INSTANTIATE_SHAPE
#define SHARD_INSTANTIATE_TAKE(T, I)                                                                         \
  template Tensor<T> take<T, I>(const Tensor<T>&, const Tensor<I>&, int, shard::source_location);            \
  template ShardedArray<T> take<T, I>(const ShardedArray<T>&, const ShardedArray<I>&, int,                   \
                                      shard::source_location);                                               \
  template Tensor<T> take_along_axis<T, I>(const Tensor<T>&, const Tensor<I>&, int, shard::source_location); \
  template ShardedArray<T> take_along_axis<T, I>(const ShardedArray<T>&, const ShardedArray<I>&, int,        \
                                                 shard::source_location);
SHARD_FOR_EACH_DTYPE_PAIR(ALL, INT, SHARD_INSTANTIATE_TAKE)
#undef SHARD_INSTANTIATE_TAKE

}  // namespace shard
