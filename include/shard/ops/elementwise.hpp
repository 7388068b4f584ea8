#pragma once
/// \file The elementwise family of the op table: binary ops, comparisons, unary math, where
/// and axpy, each a primitive (core/primitive.hpp) with its kernel, sharding rule and VJP side
/// by side; `shard::binary`, `unary`, `compare`, `where` and `axpy` of both views bind them
/// (array/driver.hpp). Their sharding rule is numpy broadcasting, "...,...->...": the result
/// follows the first committed operand with the result's shape, the others line up with it
/// (ops.hpp documents the rule). Their batching rule is the same broadcasting with the batch dim
/// first (detail::batch_elementwise, ops/batching.hpp).

#include <optional>
#include <string>
#include <vector>

#include "shard/array/driver.hpp"
#include "shard/core/array_ops.hpp"
#include "shard/core/primitive.hpp"
#include "shard/core/tensor_ops.hpp"
#include "shard/ops/batching.hpp"

namespace shard {

namespace detail {

/// The sum of ct over the dims numpy broadcast `shape` along (leading dims and size-1 dims):
/// the transpose of a broadcast, what every broadcasting op's VJP applies.
template <ArrayLike X>
X unbroadcast(const X& ct, const Shape& shape) {
  if (ct.shape() == shape) return ct.alias();
  const int lead = ct.ndim() - static_cast<int>(shape.size());
  std::vector<int> dims;
  for (int d = 0; d < lead; ++d) dims.push_back(d);
  for (int d = 0; d < static_cast<int>(shape.size()); ++d)
    if (shape[d] == 1 && ct.shape()[lead + d] != 1) dims.push_back(lead + d);
  if (dims.empty()) return reshape(ct, shape);
  return reshape(reduce(ct, ReduceKind::kSum, Dims(dims), true), shape);
}

/// d max(a, b) / da as JAX computes it: 1 where a wins, 1/2 at ties.
template <ArrayLike X, typename Y>
X wins(const X& a, const Y& b, bool want_max) {
  using T = elem_t<X>;
  const auto strict = want_max ? greater(a, b) : less(a, b);
  return where(strict, T(1), where(equal(a, b), T(0.5), T(0)));
}

/// "...,...->...", "...->..." and "...,...,...->...".
const FactorRule& elementwise_rule(int arity);

}  // namespace detail

/// x summed over the dims numpy broadcasting added to reach x's shape from `shape` (leading
/// dims and size-1 dims): the transpose of broadcast_to, what a broadcasting VJP returns.
template <ArrayLike X>
X sum_to_shape(const X& x, const Shape& shape) {
  return detail::unbroadcast(x, shape);
}

/// The primitives (jax.lax's `*_p`).
namespace prim {

struct Binary : Primitive {
  BinaryOp op;
  static constexpr bool kernel_validates = true;
  const char* name() const { return detail::binary_op_name(op); }
  static const FactorRule& rule() { return detail::elementwise_rule(2); }
  template <typename... A>
  auto batch(const shard::source_location& where, std::int64_t, const A&... a) const {
    return detail::batch_elementwise(*this, where, a...);
  }
  template <Dtype T>
  Tensor<T> kernel(const Tensor<T>& a, const Tensor<T>& b) const {
    return detail::binary_kernel(a, b, op);
  }
  /// The kernel on n contiguous elements (jit's fusion: jit/fuse.hpp).
  template <Dtype T>
  void span(std::int64_t n, const T* a, const T* b, T* out) const {
    detail::binary_span(op, n, a, b, out);
  }
  template <ArrayLike X>
  KernelVjp<X, X> vjp(const VjpNeed& need, const X& out, const X& a, const X& b) const;
};

/// `a op s` (`s op a` when scalar_first).
template <Dtype S>
struct BinaryScalar : Primitive {
  BinaryOp op;
  S s;
  bool scalar_first;
  static constexpr bool kernel_validates = true;
  const char* name() const { return detail::binary_op_name(op); }
  /// What jit's printed program shows of the parameters.
  std::string params_text() const {
    return (scalar_first ? "scalar first: " : "scalar: ") + std::to_string(static_cast<double>(s));
  }
  static const FactorRule& rule() { return detail::elementwise_rule(1); }
  template <typename... A>
  auto batch(const shard::source_location& where, std::int64_t, const A&... a) const {
    return detail::batch_elementwise(*this, where, a...);
  }
  Tensor<S> kernel(const Tensor<S>& a) const { return detail::binary_kernel(a, s, op, scalar_first); }
  void span(std::int64_t n, const S* a, S* out) const {
    detail::binary_scalar_span(op, n, a, s, scalar_first, out);
  }
  template <ArrayLike X>
  KernelVjp<X, X> vjp(const VjpNeed& need, const X& out, const X& a) const;
};

struct Compare : Primitive {
  CompareOp op;
  static constexpr bool kernel_validates = true;
  const char* name() const { return "compare"; }
  static const FactorRule& rule() { return detail::elementwise_rule(2); }
  template <typename... A>
  auto batch(const shard::source_location& where, std::int64_t, const A&... a) const {
    return detail::batch_elementwise(*this, where, a...);
  }
  template <Dtype T>
  Tensor<bool> kernel(const Tensor<T>& a, const Tensor<T>& b) const {
    return detail::compare_kernel(a, b, op);
  }
  template <Dtype T>
  void span(std::int64_t n, const T* a, const T* b, bool* out) const {
    detail::compare_span(op, n, a, b, out);
  }
};

template <Dtype S>
struct CompareScalar : Primitive {
  CompareOp op;
  S s;
  bool scalar_first;
  static constexpr bool kernel_validates = true;
  const char* name() const { return "compare"; }
  std::string params_text() const {
    return (scalar_first ? "scalar first: " : "scalar: ") + std::to_string(static_cast<double>(s));
  }
  static const FactorRule& rule() { return detail::elementwise_rule(1); }
  template <typename... A>
  auto batch(const shard::source_location& where, std::int64_t, const A&... a) const {
    return detail::batch_elementwise(*this, where, a...);
  }
  Tensor<bool> kernel(const Tensor<S>& a) const { return detail::compare_kernel(a, s, op, scalar_first); }
  void span(std::int64_t n, const S* a, bool* out) const {
    detail::compare_scalar_span(op, n, a, s, scalar_first, out);
  }
};

struct Unary : Primitive {
  UnaryOp op;
  static constexpr bool kernel_validates = true;
  const char* name() const { return detail::unary_op_name(op); }
  static const FactorRule& rule() { return detail::elementwise_rule(1); }
  template <typename... A>
  auto batch(const shard::source_location& where, std::int64_t, const A&... a) const {
    return detail::batch_elementwise(*this, where, a...);
  }
  template <Dtype T>
  Tensor<T> kernel(const Tensor<T>& x) const {
    return detail::unary_kernel(x, op);
  }
  template <Dtype T>
  void span(std::int64_t n, const T* x, T* out) const {
    detail::unary_span(op, n, x, out);
  }
  template <ArrayLike X>
  KernelVjp<X, X> vjp(const VjpNeed& need, const X& out, const X& x) const;
};

/// where(cond, a, b), bound with the operands in the order (a, b, cond): the result follows a,
/// then b, then cond, so the values decide its sharding.
struct Where : Primitive {
  static constexpr bool kernel_validates = true;
  const char* name() const { return "where"; }
  static const FactorRule& rule() { return detail::elementwise_rule(3); }
  template <typename... A>
  auto batch(const shard::source_location& where, std::int64_t, const A&... a) const {
    return detail::batch_elementwise(*this, where, a...);
  }
  template <Dtype T>
  Tensor<T> kernel(const Tensor<T>& a, const Tensor<T>& b, const Tensor<bool>& cond) const {
    return detail::where_kernel(cond, a, b);
  }
  template <Dtype T>
  void span(std::int64_t n, const T* a, const T* b, const bool* cond, T* out) const {
    detail::where_span(n, cond, a, b, out);
  }
  template <ArrayLike X, ArrayLike C>
  KernelVjp<X, X> vjp(const VjpNeed& need, const X& out, const X& a, const X& b, const C& cond) const;
};

/// Every element converted to U (astype): the cotangent converted back.
template <Dtype U>
struct Astype : Primitive {
  static constexpr bool kernel_validates = true;
  /// Linear and local: in a differentiated shard_map body the cotangent parts that vary over axes
  /// the value does not pass through to the operand's node (a bfloat16 copy of an invariant
  /// float32 parameter has its gradient summed once, in float32, with the parameters' bucketed
  /// and overlapped reduction, instead of a blocking psum at the cast).
  static constexpr bool linear_local = true;
  const char* name() const { return "astype"; }
  static const FactorRule& rule() { return detail::elementwise_rule(1); }
  template <typename... A>
  auto batch(const shard::source_location& where, std::int64_t, const A&... a) const {
    return detail::batch_elementwise(*this, where, a...);
  }
  template <Dtype T>
  Tensor<U> kernel(const Tensor<T>& x) const {
    return detail::astype_kernel<U>(x);
  }
  template <Dtype T>
  void span(std::int64_t n, const T* x, U* out) const {
    detail::astype_span(n, x, out);
  }
  template <ArrayLike X>
  KernelVjp<rebind_t<X, U>, X> vjp(const VjpNeed&, const rebind_t<X, U>&, const X&) const {
    return [](const rebind_t<X, U>& ct, const VjpNeed&) { return cotangents<X>(astype<elem_t<X>>(ct)); };
  }
};

/// alpha * x + y in one pass over memory.
template <Dtype S>
struct Axpy : Primitive {
  S alpha;
  static constexpr bool kernel_validates = true;
  const char* name() const { return "axpy"; }
  static const FactorRule& rule() { return detail::elementwise_rule(2); }
  template <typename... A>
  auto batch(const shard::source_location& where, std::int64_t, const A&... a) const {
    return detail::batch_elementwise(*this, where, a...);
  }
  Tensor<S> kernel(const Tensor<S>& x, const Tensor<S>& y) const;
  void span(std::int64_t n, const S* x, const S* y, S* z) const {
    for (std::int64_t k = 0; k < n; ++k) z[k] = static_cast<S>(alpha * x[k] + y[k]);
  }
  template <ArrayLike X>
  KernelVjp<X, X> vjp(const VjpNeed& need, const X& out, const X& x, const X& y) const;
};

}  // namespace prim

}  // namespace shard
