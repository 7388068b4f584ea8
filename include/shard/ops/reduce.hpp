#pragma once
/// \file The reduce and scan family of the op table: reductions (sum, mean, max, min, prod over
/// dims, keepdims) and prefix sums, each a primitive with its kernel, sharding rule and VJP side
/// by side; `shard::reduce` and `shard::prefix_sum` of both views bind them (array/driver.hpp).
///
/// A reduction's rule is a factor rule with the reduced dims dropped from the result ('1' with
/// keepdims): "abc->ac", "abc->a1c". Each device reduces its block (partial()); one collective
/// over the mesh axes that split a reduced dim combines the partials (psum, pmax, pmin or a
/// product: `closing_kind`); finalize() rounds them. Floating partials cross devices in float64
/// and are rounded once at the end (a mean divides there), so the result does not depend on the
/// mesh beyond float64 rounding.

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "shard/array/detail/node_meta.hpp"
#include "shard/array/driver.hpp"
#include "shard/core/array_ops.hpp"
#include "shard/core/primitive.hpp"
#include "shard/core/tensor_ops.hpp"
#include "shard/ops/batching.hpp"
#include "shard/ops/elementwise.hpp"
#include "shard/ops/ops.hpp"

namespace shard {

namespace detail {

/// x's shape with the reduced dims kept as size 1.
inline Shape keepdims_shape(const Shape& shape, const std::vector<int>& dims) {
  Shape s = shape;
  for (int d : dims) s[d] = 1;
  return s;
}

/// v (keepdims shape of a reduction of the primal) broadcast to the primal's shape and sharding.
template <Dtype T>
Tensor<T> broadcast_like(const Tensor<T>& v, const NodeMeta<Tensor<T>>& m) {
  return broadcast_to(v, m.shape);
}
template <Dtype T>
ShardedArray<T> broadcast_like(const ShardedArray<T>& v, const NodeMeta<ShardedArray<T>>& m) {
  if (v.size() == 1 && v.sharding().is_fully_replicated() && !v.batch())  // the same choice on every rank
    return full<T>(m.shape, v.addressable_shards().empty() ? T(0) : v.addressable_shards()[0].data.flat(0),
                   m.sharding);
  return binary(zeros<T>(m.shape, m.sharding), v, BinaryOp::kAdd);
}

/// The factor rule of a reduction of a rank-`rank` operand over `dims` (cached per signature).
const FactorRule& reduce_rule(int rank, const std::vector<int>& dims, bool keepdims);

}  // namespace detail

namespace prim {

/// reduce(x, kind, dims, keepdims) of a T array; dims resolved (non-negative, sorted).
template <Dtype T>
struct Reduce : Primitive {
  /// The partials that cross devices: float64 for floating arrays.
  using Partial = std::conditional_t<is_floating_v<T>, double, T>;
  ReduceKind kind;
  std::vector<int> dims;
  bool keepdims;
  std::int64_t count;  ///< the elements each result element reduces (a mean divides by it)
  const FactorRule* rule_;
  static constexpr bool kernel_validates = true;

  const char* name() const { return detail::reduce_op_name(kind); }
  std::string params_text() const {
    std::string t = "dims:";
    for (int d : dims) t += " " + std::to_string(d);
    return keepdims ? t + ", keepdims" : t;
  }
  /// jit's common subexpressions: the kind, dims and keepdims (the rule and count follow from them).
  std::string cse_key() const { return std::string(name()) + " " + params_text(); }
  const FactorRule& rule() const { return *rule_; }
  /// The collective that combines partials (a mean's partial sums are summed).
  ReduceKind closing_kind() const { return kind == ReduceKind::kMean ? ReduceKind::kSum : kind; }
  Tensor<T> kernel(const Tensor<T>& x) const { return detail::reduce_kernel(x, kind, Dims(dims), keepdims); }
  Tensor<Partial> partial(const Tensor<T>& block) const;
  Tensor<T> finalize(const Tensor<Partial>& combined) const;
  template <ArrayLike X>
  KernelVjp<X, X> vjp(const VjpNeed& need, const X& out, const X& x) const;
  /// Batching: the same reduction of the physical array over the dims past the batch dim.
  template <ArrayLike X>
  BatchOut<X> batch(const shard::source_location&, std::int64_t, const BatchArg<X>& a) const {
    X x = detail::batch_first(a);
    if (dims.empty()) return {std::move(x), 0};  // a 0-d operand: nothing to reduce
    std::vector<int> d;
    for (int k : dims) d.push_back(k + 1);
    return {reduce(x, kind, Dims(d), keepdims), 0};
  }
};

/// Inclusive prefix sums along `axis` (from the end when reverse). Its rule is the identity;
/// along a split axis the sharded kernel gathers the blocks' totals first (sharded()).
template <Dtype T>
struct PrefixSum : Primitive {
  int axis;
  bool reverse;
  static constexpr bool kernel_validates = true;
  static constexpr bool linear_local = true;  ///< linear, no communication of cotangents
  const char* name() const { return "cumsum"; }
  static const FactorRule& rule() { return detail::elementwise_rule(1); }
  Tensor<T> kernel(const Tensor<T>& x) const { return detail::prefix_sum_kernel(x, axis, reverse); }
  ShardedArray<T> sharded(const ShardedArray<T>& x) const;
  template <ArrayLike X>
  KernelVjp<X, X> vjp(const VjpNeed&, const X&, const X&) const {
    return [axis = axis, reverse = reverse](const X& ct, const VjpNeed&) {
      return cotangents<X>(prefix_sum(ct, axis, !reverse));
    };
  }
  template <ArrayLike X>
  BatchOut<X> batch(const shard::source_location&, std::int64_t, const BatchArg<X>& a) const {
    return {prefix_sum(detail::batch_first(a), detail::past_batch(axis, a.rank(), "cumsum"), reverse), 0};
  }
};

/// argmax / argmin along `axis` (numpy's: the first extreme; nan counts as the extreme), int64,
/// not differentiable (an index: its result only carries the operand's vma). On ShardedArrays
/// two collectives over the axes that split `axis` (sharded()): the extreme of each line, then
/// the smallest global index that reaches it.
template <Dtype T>
struct ArgReduce : Primitive {
  int axis;
  bool keepdims;
  bool want_max;
  static constexpr bool kernel_validates = true;
  const char* name() const { return want_max ? "argmax" : "argmin"; }
  static const FactorRule& rule() { return detail::elementwise_rule(1); }
  Tensor<std::int64_t> kernel(const Tensor<T>& x) const {
    return detail::arg_reduce_kernel(x, axis, keepdims, want_max);
  }
  ShardedArray<std::int64_t> sharded(const ShardedArray<T>& x) const;
  template <ArrayLike X>
  BatchOut<rebind_t<X, std::int64_t>> batch(const shard::source_location&, std::int64_t,
                                            const BatchArg<X>& a) const {
    const int ax = detail::past_batch(axis, a.rank(), name());
    X x = detail::batch_first(a);
    return {want_max ? argmax(x, ax, keepdims) : argmin(x, ax, keepdims), 0};
  }
};

}  // namespace prim

}  // namespace shard
