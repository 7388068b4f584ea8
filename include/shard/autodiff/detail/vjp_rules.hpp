#pragma once
/// \file The vector-Jacobian products of the op set (internals of autodiff.hpp), written once
/// for both views with the ops themselves: a rule for a ShardedArray op is the same ops on
/// sharded arrays, so the backward pass communicates exactly where the sharding rules say
/// (x P('data', None) @ W gives dW = x^T @ dy, one psum over 'data'). Each record_* function
/// runs the kernel with recording paused and appends a node to the tape; the kernels call them
/// from their first line when an operand is tracked (tape.hpp).

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <numbers>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "shard/autodiff/detail/ad_node.hpp"
#include "shard/autodiff/detail/grad_reduce.hpp"
#include "shard/core/detail/tape.hpp"
#include "shard/core/trace.hpp"
#include "shard/error.hpp"
#include "shard/ops/ops.hpp"
#include "shard/array/reshard.hpp"
#include "shard/core/tensor_ops.hpp"

namespace shard::detail {

// ---------------------------------------------------------------- helpers

/// The sum of ct over the dims numpy broadcast `shape` along (leading dims and size-1 dims).
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

/// v (keepdims shape of a reduction of the primal) broadcast to the primal's shape and sharding.
template <Dtype T>
Tensor<T> broadcast_like(const Tensor<T>& v, const NodeMeta<Tensor<T>>& m) {
  return broadcast_to(v, m.shape);
}
template <Dtype T>
ShardedArray<T> broadcast_like(const ShardedArray<T>& v, const NodeMeta<ShardedArray<T>>& m) {
  if (v.size() == 1 && v.sharding().is_fully_replicated())  // the same choice on every rank
    return full<T>(m.shape, v.addressable_shards().empty() ? T(0) : v.addressable_shards()[0].data[0], m.sharding);
  return binary(zeros<T>(m.shape, m.sharding), v, BinaryOp::kAdd);
}

/// x's shape with the reduced dims kept as size 1.
inline Shape keepdims_shape(const Shape& shape, const std::vector<int>& dims) {
  Shape s = shape;
  for (int d : dims) s[d] = 1;
  return s;
}

// ---------------------------------------------------------------- elementwise

/// d max(a, b) / da as JAX computes it: 1 where a wins, 1/2 at ties.
template <ArrayLike X, typename Y>
X wins(const X& a, const Y& b, bool want_max) {
  using T = elem_t<X>;
  const auto strict = want_max ? greater(a, b) : less(a, b);
  return where(strict, T(1), where(equal(a, b), T(0.5), T(0)));
}

template <ArrayLike X>
X record_binary(Tape& tape, const X& a, const X& b, BinaryOp op) {
  X out = paused([&] { return binary(a, b, op); });
  if constexpr (!FloatDtype<elem_t<X>>) {
    return finish_constant(tape, std::move(out), a, b);
  } else {
    using T = elem_t<X>;
    auto make = [&](auto an, auto bn) -> typename Node<X>::Rule {
      const Shape as = a.shape(), bs = b.shape();
      switch (op) {
        case BinaryOp::kAdd:
          return [an, bn, as, bs](const X& ct, std::uint32_t v) {
            if (an) push(an, unbroadcast(ct, as), v);
            if (bn) push(bn, unbroadcast(ct, bs), v);
          };
        case BinaryOp::kSub:
          return [an, bn, as, bs](const X& ct, std::uint32_t v) {
            if (an) push(an, unbroadcast(ct, as), v);
            if (bn) push(bn, unbroadcast(-ct, bs), v);
          };
        case BinaryOp::kMul:
          return [an, bn, as, bs, ak = bn ? std::optional<X>(keep(a)) : std::nullopt,
                  bk = an ? std::optional<X>(keep(b)) : std::nullopt](const X& ct, std::uint32_t v) {
            if (an) push(an, unbroadcast(ct * *bk, as), v);
            if (bn) push(bn, unbroadcast(ct * *ak, bs), v);
          };
        case BinaryOp::kDiv:
          return [an, bn, as, bs, bk = keep(b), ok = bn ? std::optional<X>(keep(out)) : std::nullopt](
                     const X& ct, std::uint32_t v) {
            const X q = ct / bk;
            if (an) push(an, unbroadcast(q, as), v);
            if (bn) push(bn, unbroadcast(-(q * *ok), bs), v);
          };
        case BinaryOp::kMax:
        case BinaryOp::kMin:
          return [an, bn, as, bs, ak = keep(a), bk = keep(b), mx = op == BinaryOp::kMax](const X& ct, std::uint32_t v) {
            const X w = wins(ak, bk, mx);
            if (an) push(an, unbroadcast(ct * w, as), v);
            if (bn) push(bn, unbroadcast(ct * (T(1) - w), bs), v);
          };
        case BinaryOp::kPow:
          return [an, bn, as, bs, ak = keep(a), bk = keep(b), ok = keep(out)](const X& ct, std::uint32_t v) {
            if (an) push(an, unbroadcast(where(equal(bk, T(0)), T(0), ct * bk * pow(ak, bk - T(1))), as), v);
            if (bn) push(bn, unbroadcast(ct * ok * log(where(equal(ak, T(0)), T(1), ak)), bs), v);
          };
        case BinaryOp::kMod:
          return [an, bn, as, bs, ak = keep(a), bk = keep(b)](const X& ct, std::uint32_t v) {
            if (an) push(an, unbroadcast(ct, as), v);
            if (bn) push(bn, unbroadcast(-(ct * floor(ak / bk)), bs), v);
          };
        case BinaryOp::kFloorDiv:  // piecewise constant: zero
          return nullptr;
        default:
          raise_not_differentiable(binary_op_name(op), "it is not defined for floating arrays");
      }
    };
    return finish(tape, binary_op_name(op), std::move(out), make, a, b);
  }
}

template <ArrayLike X>
X record_binary_scalar(Tape& tape, const X& a, elem_t<X> s, BinaryOp op, bool scalar_first) {
  X out = paused([&] { return binary(a, s, op, scalar_first); });
  if constexpr (!FloatDtype<elem_t<X>>) {
    return finish_constant(tape, std::move(out), a);
  } else {
    using T = elem_t<X>;
    auto make = [&](auto an) -> typename Node<X>::Rule {
      switch (op) {
        case BinaryOp::kAdd:
          return [an](const X& ct, std::uint32_t v) { push(an, ct.alias(), v); };
        case BinaryOp::kSub:
          return [an, scalar_first](const X& ct, std::uint32_t v) { push(an, scalar_first ? -ct : ct.alias(), v); };
        case BinaryOp::kMul:
          return [an, s](const X& ct, std::uint32_t v) { push(an, ct * s, v); };
        case BinaryOp::kDiv:
          if (!scalar_first) return [an, s](const X& ct, std::uint32_t v) { push(an, ct / s, v); };
          return [an, ak = keep(a), ok = keep(out)](const X& ct, std::uint32_t v) { push(an, -(ct * ok / ak), v); };
        case BinaryOp::kMax:
        case BinaryOp::kMin:
          return [an, s, ak = keep(a), mx = op == BinaryOp::kMax](const X& ct, std::uint32_t v) {
            push(an, ct * wins(ak, s, mx), v);
          };
        case BinaryOp::kPow:
          if (!scalar_first)
            return [an, s, ak = keep(a)](const X& ct, std::uint32_t v) {
              push(an, s == T(0) ? zeros_like(ak) : ct * (s * pow(ak, s - T(1))), v);
            };
          return [an, s, ok = keep(out)](const X& ct, std::uint32_t v) {
            push(an, s == T(0) ? zeros_like(ok) : ct * ok * static_cast<T>(std::log(s)), v);
          };
        case BinaryOp::kMod:
          if (!scalar_first) return [an](const X& ct, std::uint32_t v) { push(an, ct.alias(), v); };
          return [an, s, ak = keep(a)](const X& ct, std::uint32_t v) { push(an, -(ct * floor(s / ak)), v); };
        case BinaryOp::kFloorDiv:
          return nullptr;
        default:
          raise_not_differentiable(binary_op_name(op), "it is not defined for floating arrays");
      }
    };
    return finish(tape, binary_op_name(op), std::move(out), make, a);
  }
}

template <ArrayLike X>
X record_unary(Tape& tape, const X& x, UnaryOp op) {
  X out = paused([&] { return unary(x, op); });
  if constexpr (!FloatDtype<elem_t<X>>) {
    return finish_constant(tape, std::move(out), x);
  } else {
    using T = elem_t<X>;
    auto make = [&](auto xn) -> typename Node<X>::Rule {
      using R = typename Node<X>::Rule;
      auto with_x = [&](auto f) -> R {
        return [xn, xk = keep(x), f](const X& ct, std::uint32_t v) { push(xn, f(ct, xk), v); };
      };
      auto with_y = [&](auto f) -> R {
        return [xn, yk = keep(out), f](const X& ct, std::uint32_t v) { push(xn, f(ct, yk), v); };
      };
      switch (op) {
        case UnaryOp::kNeg:
          return [xn](const X& ct, std::uint32_t v) { push(xn, -ct, v); };
        case UnaryOp::kAbs:
          return with_x([](const X& ct, const X& x) { return ct * sign(x); });
        case UnaryOp::kSquare:
          return with_x([](const X& ct, const X& x) { return ct * x * T(2); });
        case UnaryOp::kRelu:
          return with_x([](const X& ct, const X& x) { return where(greater(x, T(0)), ct, T(0)); });
        case UnaryOp::kExp:
          return with_y([](const X& ct, const X& y) { return ct * y; });
        case UnaryOp::kLog:
          return with_x([](const X& ct, const X& x) { return ct / x; });
        case UnaryOp::kLog1p:
          return with_x([](const X& ct, const X& x) { return ct / (x + T(1)); });
        case UnaryOp::kExpm1:
          return with_y([](const X& ct, const X& y) { return ct * (y + T(1)); });
        case UnaryOp::kSqrt:
          return with_y([](const X& ct, const X& y) { return ct * T(0.5) / y; });
        case UnaryOp::kRsqrt:
          return [xn, xk = keep(x), yk = keep(out)](const X& ct, std::uint32_t v) {
            push(xn, ct * yk * T(-0.5) / xk, v);
          };
        case UnaryOp::kSin:
          return with_x([](const X& ct, const X& x) { return ct * cos(x); });
        case UnaryOp::kCos:
          return with_x([](const X& ct, const X& x) { return -(ct * sin(x)); });
        case UnaryOp::kTanh:
          return with_y([](const X& ct, const X& y) { return ct * (T(1) - y * y); });
        case UnaryOp::kSigmoid:
          return with_y([](const X& ct, const X& y) { return ct * y * (T(1) - y); });
        case UnaryOp::kReciprocal:
          return with_y([](const X& ct, const X& y) { return -(ct * y * y); });
        case UnaryOp::kErf:
          return with_x([](const X& ct, const X& x) {
            return ct * exp(-(x * x)) * static_cast<T>(2.0 / std::sqrt(std::numbers::pi));
          });
        case UnaryOp::kGelu:
          return with_x([](const X& ct, const X& x) {
            if constexpr (is_tensor_v<X>) {
              if (!recording_tape_for(ct, x)) return gelu_vjp(x, ct);  // one pass
            }
            return ct * unary(x, UnaryOp::kGeluGrad);
          });
        case UnaryOp::kGeluGrad:
          raise_not_differentiable("gelu_grad", "gelu's second derivative is not implemented (differentiate the "
                                   "composed formula, e.g. gelu(x, false) or the tanh expression, instead)");
        case UnaryOp::kSign:
        case UnaryOp::kFloor:
        case UnaryOp::kCeil:
        case UnaryOp::kRound:  // piecewise constant: zero
          return nullptr;
        default:
          raise_not_differentiable(unary_op_name(op), "it is not defined for floating arrays");
      }
    };
    return finish(tape, unary_op_name(op), std::move(out), make, x);
  }
}

template <ArrayLike X, ArrayLike C>
X record_where(Tape& tape, const C& cond, const X& a, const X& b) {
  X out = paused([&] { return where(cond, a, b); });
  if constexpr (!FloatDtype<elem_t<X>>) {
    return finish_constant(tape, std::move(out), a, b, cond);
  } else {
    using T = elem_t<X>;
    auto make = [&](auto an, auto bn, auto) -> typename Node<X>::Rule {
      return [an, bn, as = a.shape(), bs = b.shape(), ck = keep(cond)](const X& ct, std::uint32_t v) {
        if (an) push(an, unbroadcast(where(ck, ct, T(0)), as), v);
        if (bn) push(bn, unbroadcast(where(ck, T(0), ct), bs), v);
      };
    };
    return finish(tape, "where", std::move(out), make, a, b, cond);  // cond: its vma only
  }
}

template <ArrayLike X>
rebind_t<X, bool> record_compare(Tape& tape, const X& a, const X& b, CompareOp op) {
  return finish_constant(tape, paused([&] { return compare(a, b, op); }), a, b);
}
template <ArrayLike X>
rebind_t<X, bool> record_compare_scalar(Tape& tape, const X& a, elem_t<X> s, CompareOp op, bool scalar_first) {
  return finish_constant(tape, paused([&] { return compare(a, s, op, scalar_first); }), a);
}

template <ArrayLike X>
X record_axpy(Tape& tape, elem_t<X> alpha, const X& x, const X& y) {
  X out = paused([&] { return axpy(alpha, x, y); });
  if constexpr (!FloatDtype<elem_t<X>>) {
    return finish_constant(tape, std::move(out), x, y);
  } else {
    auto make = [&](auto xn, auto yn) -> typename Node<X>::Rule {
      return [xn, yn, alpha, xs = x.shape(), ys = y.shape()](const X& ct, std::uint32_t v) {
        if (xn) push(xn, unbroadcast(ct * alpha, xs), v);
        if (yn) push(yn, unbroadcast(ct, ys), v);
      };
    };
    return finish(tape, "axpy", std::move(out), make, x, y);
  }
}

template <Dtype U, ArrayLike X>
auto record_astype_impl(Tape& tape, const X& x) {
  using T = elem_t<X>;
  auto out = paused([&] { return astype<U>(x); });
  using Out = decltype(out);
  if constexpr (FloatDtype<T> && FloatDtype<U>) {
    auto make = [&](auto xn) -> typename Node<Out>::Rule {
      return [xn](const Out& ct, std::uint32_t v) { push(xn, astype<T>(ct), v); };
    };
    return finish(tape, "astype", std::move(out), make, x);
  } else {
    return finish_constant(tape, std::move(out), x);
  }
}

// ---------------------------------------------------------------- reductions

template <ArrayLike X>
X record_reduce(Tape& tape, const X& x, ReduceKind kind, const Dims& dims_in, bool keepdims) {
  X out = paused([&] { return reduce(x, kind, dims_in, keepdims); });
  if constexpr (!FloatDtype<elem_t<X>>) {
    return finish_constant(tape, std::move(out), x);
  } else {
    using T = elem_t<X>;
    auto make = [&](auto xn) -> typename Node<X>::Rule {
      const std::vector<int> dims = dims_in.resolve(x.ndim(), "reduce");
      const Shape kshape = keepdims_shape(x.shape(), dims);
      std::int64_t count = 1;
      for (int d : dims) count *= x.shape()[d];
      NodeMeta<X> xm(x);
      auto kept = [kshape, keepdims](const X& ct) { return keepdims ? ct.alias() : reshape(ct, kshape); };
      switch (kind) {
        case ReduceKind::kSum:
          return [xn, xm, kept](const X& ct, std::uint32_t v) { push(xn, broadcast_like(kept(ct), xm), v); };
        case ReduceKind::kMean:
          return [xn, xm, kept, count](const X& ct, std::uint32_t v) {
            push(xn, broadcast_like(kept(ct) / static_cast<T>(count), xm), v);
          };
        case ReduceKind::kMax:
        case ReduceKind::kMin:
          return [xn, kept, dims, xk = keep(x), ok = keep(out)](const X& ct, std::uint32_t v) {
            const X hit = astype<T>(equal(xk, kept(ok)));
            const X ties = reduce(hit, ReduceKind::kSum, Dims(dims), true);
            push(xn, hit * (kept(ct) / ties), v);
          };
        case ReduceKind::kProd:
          return [xn, kept, dims, xk = keep(x), ok = keep(out)](const X& ct, std::uint32_t v) {
            // d prod / dx_i = prod of the others: out / x_i where x_i != 0; where x_i is the only
            // zero of its group, the product of the group's non-zeros; 0 with two zeros or more.
            const auto zero = equal(xk, T(0));
            const X nz = where(zero, T(1), xk);
            const X prod_nz = reduce(nz, ReduceKind::kProd, Dims(dims), true);
            const X zeros_in = reduce(astype<T>(zero), ReduceKind::kSum, Dims(dims), true);
            const X others = where(zero, where(equal(zeros_in, T(1)), prod_nz, T(0)), kept(ok) / nz);
            push(xn, others * kept(ct), v);
          };
      }
      return nullptr;
    };
    return finish(tape, reduce_op_name(kind), std::move(out), make, x);
  }
}

/// cumsum (prefix_sum): linear, its transpose the prefix sums of the cotangent in the other
/// direction (lax.cumsum's transpose), sharded like the primal; no communication on a Tensor.
template <ArrayLike X>
X record_prefix_sum(Tape& tape, const X& x, int axis, bool reverse) {
  X out = paused([&] { return prefix_sum(x, axis, reverse); });
  if constexpr (!FloatDtype<elem_t<X>>) {
    return finish_constant(tape, std::move(out), x);
  } else {
    auto make = [&](auto xn) -> typename Node<X>::Rule {
      return [xn, axis, reverse](const X& ct, std::uint32_t v) { push(xn, prefix_sum(ct, axis, !reverse), v); };
    };
    return linear_local(finish(tape, "cumsum", std::move(out), make, x));
  }
}

// ---------------------------------------------------------------- products

/// op(a) @ op(b) for 2-D operands, with the transposes in the gemm (tensor_linalg.cpp, matmul.cpp:
/// the sharded form multiplies the blocks where they lie when the rules need no reshard, and
/// otherwise transposes and calls matmul). `out`: the sharding the result should have (as
/// matmul's; a contraction over mesh axes then ends in a psum_scatter where `out` splits C
/// further over them, instead of a psum and a reshard). `into`: m x n elements the Tensor
/// form writes its product to (the result borrows them).
template <Dtype T>
ShardedArray<T> matmul_t(const ShardedArray<T>& a, bool ta, const ShardedArray<T>& b, bool tb,
                         const NamedSharding* out = nullptr);

/// The cotangents of a and b in numpy's matmul (1-D operands promoted, batch dims broadcast).
/// Only the operand the other's cotangent needs is kept (ak when bn, bk when an).
template <ArrayLike X>
void matmul_transpose(const X& ct, const NodePtr<X>& an, const NodePtr<X>& bn, const std::optional<X>& ak,
                      const std::optional<X>& bk, const Shape& as, const Shape& bs, std::uint32_t v) {
  const bool a1 = as.size() == 1, b1 = bs.size() == 1;
  X c2 = ct.alias();
  if (a1) c2 = expand_dims(c2, c2.ndim() - (b1 ? 0 : 1));
  if (b1) c2 = expand_dims(c2, -1);
  if (!a1 && !b1 && as.size() == 2 && bs.size() == 2) {  // the common case: no transpose copies
    if constexpr (is_sharded_v<X>) {  // each product lands where its node keeps its cotangent
      // A parameter's gradient: its psum over the contracting axes runs behind the rest of the
      // backward pass where it can (grad_reduce.hpp).
      auto product = [&](const NodePtr<X>& n, const X& l, bool tl, const X& r, bool tr) {
        if (n->leaf)
          if (auto take = matmul_t_deferred(l, tl, r, tr, n->meta.sharding)) return n->defer(std::move(take));
        push(n, matmul_t(l, tl, r, tr, &n->meta.sharding), v);
      };
      if (an) product(an, c2, false, *bk, true);
      if (bn) product(bn, *ak, true, c2, false);
    } else {
      if (an) push(an, matmul_t(c2, false, *bk, true), v);
      if (bn) push(bn, matmul_t(*ak, true, c2, false), v);
    }
    return;
  }
  if (an) {
    const X b2 = b1 ? expand_dims(*bk, -1) : bk->alias();
    X da = matmul(c2, swapaxes(b2, -1, -2));
    if (a1) push(an, reshape(da, as), v);
    else push(an, unbroadcast(da, as), v);
  }
  if (bn) {
    const X a2 = a1 ? expand_dims(*ak, 0) : ak->alias();
    X db = matmul(swapaxes(a2, -1, -2), c2);
    if (b1) push(bn, reshape(db, bs), v);
    else push(bn, unbroadcast(db, bs), v);
  }
}

/// matmul and dot (dot of a 0-d operand is a product; otherwise it is matmul for b of up to 2 dims).
template <ArrayLike X>
X record_matmul(Tape& tape, const X& a, const X& b, const char* op, const std::function<X()>& kernel) {
  X out = paused(kernel);
  if constexpr (!FloatDtype<elem_t<X>>) {
    return finish_constant(tape, std::move(out), a, b);
  } else {
    auto make = [&](auto an, auto bn) -> typename Node<X>::Rule {
      if (a.ndim() == 0 || b.ndim() == 0)
        return [an, bn, as = a.shape(), bs = b.shape(), ak = keep(a), bk = keep(b)](const X& ct, std::uint32_t v) {
          if (an) push(an, unbroadcast(ct * bk, as), v);
          if (bn) push(bn, unbroadcast(ct * ak, bs), v);
        };
      return [an, bn, ak = bn ? std::optional<X>(keep(a)) : std::nullopt,
              bk = an ? std::optional<X>(keep(b)) : std::nullopt, as = a.shape(), bs = b.shape()](const X& ct,
                                                                                                   std::uint32_t v) {
        matmul_transpose(ct, an, bn, ak, bk, as, bs, v);
      };
    };
    return finish(tape, op, std::move(out), make, a, b);
  }
}

template <ArrayLike X>
X record_vdot(Tape& tape, const X& a, const X& b) {
  X out = paused([&] { return vdot(a, b); });
  if constexpr (!FloatDtype<elem_t<X>>) {
    return finish_constant(tape, std::move(out), a, b);
  } else {
    auto make = [&](auto an, auto bn) -> typename Node<X>::Rule {
      return [an, bn, ak = keep(a), bk = keep(b)](const X& ct, std::uint32_t v) {
        if (an) push(an, ct * reshape(bk, ak.shape()), v);
        if (bn) push(bn, ct * reshape(ak, bk.shape()), v);
      };
    };
    return finish(tape, "vdot", std::move(out), make, a, b);
  }
}

// ---------------------------------------------------------------- shape ops

/// reshape, expand_dims, squeeze: the cotangent reshaped back.
template <ArrayLike X>
X record_reshape_like(Tape& tape, const X& x, const char* op, const std::function<X()>& kernel) {
  X out = paused(kernel);
  if constexpr (!FloatDtype<elem_t<X>>) {
    return finish_constant(tape, std::move(out), x);
  } else {
    auto make = [&](auto xn) -> typename Node<X>::Rule {
      return [xn, s = x.shape()](const X& ct, std::uint32_t v) {
        if constexpr (is_tensor_v<X>) {
          if (!recording_tape_for(ct) && ct.owns_memory()) {  // the cotangent's memory, reshaped
            X view = ct.alias();
            push(xn, std::move(view).reshaped(s), v);
            return;
          }
        }
        push(xn, reshape(ct, s), v);
      };
    };
    return linear_local(finish(tape, op, std::move(out), make, x));
  }
}

template <ArrayLike X>
X record_transpose(Tape& tape, const X& x, std::vector<int> perm) {
  X out = paused([&] { return transpose(x, perm); });
  if constexpr (!FloatDtype<elem_t<X>>) {
    return finish_constant(tape, std::move(out), x);
  } else {
    auto make = [&](auto xn) -> typename Node<X>::Rule {
      std::vector<int> inv;
      if (!perm.empty()) {
        inv.resize(perm.size());
        for (std::size_t k = 0; k < perm.size(); ++k) inv[static_cast<std::size_t>(perm[k])] = static_cast<int>(k);
      }
      return [xn, inv](const X& ct, std::uint32_t v) { push(xn, transpose(ct, inv), v); };
    };
    return linear_local(finish(tape, "transpose", std::move(out), make, x));
  }
}

template <ArrayLike X>
X record_broadcast_to(Tape& tape, const X& x, const Shape& shape) {
  X out = paused([&] { return broadcast_to(x, shape); });
  if constexpr (!FloatDtype<elem_t<X>>) {
    return finish_constant(tape, std::move(out), x);
  } else {
    auto make = [&](auto xn) -> typename Node<X>::Rule {
      return [xn, s = x.shape()](const X& ct, std::uint32_t v) { push(xn, unbroadcast(ct, s), v); };
    };
    return finish(tape, "broadcast_to", std::move(out), make, x);
  }
}

template <ArrayLike X>
X record_slice(Tape& tape, const X& x, const std::vector<Index>& index) {
  X out = paused([&] { return slice(x, index); });
  if constexpr (!FloatDtype<elem_t<X>>) {
    return finish_constant(tape, std::move(out), x);
  } else {
    auto make = [&](auto xn) -> typename Node<X>::Rule {
      return [xn, xm = NodeMeta<X>(x), index](const X& ct, std::uint32_t v) { push(xn, slice_transpose(ct, xm, index), v); };
    };
    return finish(tape, "slice", std::move(out), make, x);
  }
}

/// A node over a list of inputs (concatenate, stack): `piece(ct, i)` is input i's cotangent.
template <ArrayLike X, typename Piece>
X finish_list(Tape& tape, const char* op, X out, const std::vector<X>& xs, Piece piece) {
  std::uint32_t vma = 0;
  std::vector<NodePtr<X>> nodes;
  bool any = false;
  for (const auto& x : xs) {
    vma |= vma_of(x, tape);
    nodes.push_back(node_of(x, tape));
    any = any || nodes.back();
  }
  if constexpr (FloatDtype<elem_t<X>>) {
    if (any) {
      auto node = std::make_shared<Node<X>>(op, tape, vma, NodeMeta<X>(out));
      node->rule = [nodes, piece](const X& ct, std::uint32_t v) {
        for (std::size_t i = 0; i < nodes.size(); ++i)
          if (nodes[i]) push(nodes[i], piece(ct, i), v);
      };
      tape.append(node);
      out.set_ad(std::make_shared<AdValue>(AdValue{tape.id(), vma, std::move(node)}));
      return out;
    }
  }
  out.set_ad(vma ? std::make_shared<AdValue>(AdValue{tape.id(), vma, nullptr}) : nullptr);
  return out;
}

template <ArrayLike X>
X record_concatenate(Tape& tape, const std::vector<X>& xs, int axis) {
  X out = paused([&] { return concatenate(xs, axis); });
  const int a = resolve_dim(axis, xs.at(0).ndim(), "concatenate");
  std::vector<std::int64_t> offsets{0};
  for (const auto& x : xs) offsets.push_back(offsets.back() + x.shape()[a]);
  return finish_list(tape, "concatenate", std::move(out), xs, [a, offsets](const X& ct, std::size_t i) {
    std::vector<Index> index(static_cast<std::size_t>(a), Index(Slice()));
    index.emplace_back(Slice(offsets[i], offsets[i + 1]));
    return slice(ct, index);
  });
}

template <ArrayLike X>
X record_stack(Tape& tape, const std::vector<X>& xs, int axis) {
  X out = paused([&] { return stack(xs, axis); });
  const int a = resolve_dim(axis, xs.at(0).ndim() + 1, "stack");
  return finish_list(tape, "stack", std::move(out), xs, [a](const X& ct, std::size_t i) {
    std::vector<Index> index(static_cast<std::size_t>(a), Index(Slice()));
    index.emplace_back(static_cast<std::int64_t>(i));
    return slice(ct, index);
  });
}

template <ArrayLike X, ArrayLike I>
X record_take(Tape& tape, const X& x, const I& indices, int axis, bool along) {
  X out = paused([&] { return along ? take_along_axis(x, indices, axis) : take(x, indices, axis); });
  if constexpr (!FloatDtype<elem_t<X>>) {
    return finish_constant(tape, std::move(out), x, indices);
  } else {
    auto make = [&](auto xn, auto) -> typename Node<X>::Rule {
      return [xn, xm = NodeMeta<X>(x), ik = keep(indices), axis, along](const X& ct, std::uint32_t v) {
        push(xn, along ? take_along_axis_transpose(ct, ik, xm, axis) : take_transpose(ct, ik, xm, axis), v);
      };
    };
    return finish(tape, along ? "take_along_axis" : "take", std::move(out), make, x, indices);
  }
}

}  // namespace shard::detail
