// The elementwise family (ops/elementwise.hpp): each primitive's VJP beside its kernel and
// rule, and the public functions of both views, which bind the primitives.

#include "shard/ops/elementwise.hpp"

#include <cmath>
#include <numbers>

#include "shard/core/trace.hpp"
#include "shard/ops/ops.hpp"

namespace shard {

namespace detail {

const FactorRule& elementwise_rule(int arity) {
  static const FactorRule one("...->..."), two("...,...->..."), three("...,...,...->...");
  return arity == 1 ? one : arity == 2 ? two : three;
}

}  // namespace detail

namespace prim {

namespace {

template <ArrayLike X>
using Cts = Cotangents<X>;

/// A VJP of one operand: f(ct, kept) where kept is the operand (or the result) the rule reads
/// (kept in the closure without a copy or a move).
template <ArrayLike X, typename F>
KernelVjp<X, X> one(const X& residual, F f) {
  return
      [kept = detail::keep(residual), f](const X& ct, const VjpNeed&) { return cotangents<X>(f(ct, kept)); };
}

}  // namespace

template <ArrayLike X>
KernelVjp<X, X> Binary::vjp(const VjpNeed& need, const X& out, const X& a, const X& b) const {
  using T = elem_t<X>;
  using detail::keep;
  using detail::unbroadcast;
  const Shape as = a.shape(), bs = b.shape();
  switch (op) {
    case BinaryOp::kAdd:
    case BinaryOp::kSub:
      return [as, bs, sub = op == BinaryOp::kSub](const X& ct, const VjpNeed& n) {
        Cts<X> r(2);
        if (n[0]) r[0] = unbroadcast(ct, as);
        if (n[1]) r[1] = unbroadcast(sub ? -ct : ct.alias(), bs);
        return r;
      };
    case BinaryOp::kMul:
      return [as, bs, ak = need[1] ? std::optional<X>(keep(a)) : std::nullopt,
              bk = need[0] ? std::optional<X>(keep(b)) : std::nullopt](const X& ct, const VjpNeed& n) {
        Cts<X> r(2);
        if (n[0]) r[0] = unbroadcast(ct * *bk, as);
        if (n[1]) r[1] = unbroadcast(ct * *ak, bs);
        return r;
      };
    case BinaryOp::kDiv:
      return [as, bs, bk = keep(b), ok = need[1] ? std::optional<X>(keep(out)) : std::nullopt](
                 const X& ct, const VjpNeed& n) {
        Cts<X> r(2);
        const X q = ct / bk;
        if (n[0]) r[0] = unbroadcast(q, as);
        if (n[1]) r[1] = unbroadcast(-(q * *ok), bs);
        return r;
      };
    case BinaryOp::kMax:
    case BinaryOp::kMin:
      return [as, bs, ak = keep(a), bk = keep(b), mx = op == BinaryOp::kMax](const X& ct, const VjpNeed& n) {
        Cts<X> r(2);
        const X w = detail::wins(ak, bk, mx);
        if (n[0]) r[0] = unbroadcast(ct * w, as);
        if (n[1]) r[1] = unbroadcast(ct * (T(1) - w), bs);
        return r;
      };
    case BinaryOp::kPow:
      return [as, bs, ak = keep(a), bk = keep(b), ok = keep(out)](const X& ct, const VjpNeed& n) {
        Cts<X> r(2);
        if (n[0]) r[0] = unbroadcast(where(equal(bk, T(0)), T(0), ct * bk * pow(ak, bk - T(1))), as);
        if (n[1]) r[1] = unbroadcast(ct * ok * log(where(equal(ak, T(0)), T(1), ak)), bs);
        return r;
      };
    case BinaryOp::kMod:
      return [as, bs, ak = keep(a), bk = keep(b)](const X& ct, const VjpNeed& n) {
        Cts<X> r(2);
        if (n[0]) r[0] = unbroadcast(ct, as);
        if (n[1]) r[1] = unbroadcast(-(ct * floor(ak / bk)), bs);
        return r;
      };
    case BinaryOp::kFloorDiv:  // piecewise constant: zero
      return nullptr;
    default:
      detail::raise_not_differentiable(name(), "it is not defined for floating arrays");
  }
}

template <Dtype S>
template <ArrayLike X>
KernelVjp<X, X> BinaryScalar<S>::vjp(const VjpNeed&, const X& out, const X& a) const {
  using T = elem_t<X>;
  using detail::keep;
  const bool sf = scalar_first;
  const T c = s;
  switch (op) {
    case BinaryOp::kAdd:
      return [](const X& ct, const VjpNeed&) { return cotangents<X>(ct.alias()); };
    case BinaryOp::kSub:
      return [sf](const X& ct, const VjpNeed&) { return cotangents<X>(sf ? -ct : ct.alias()); };
    case BinaryOp::kMul:
      return [c](const X& ct, const VjpNeed&) { return cotangents<X>(ct * c); };
    case BinaryOp::kDiv:
      if (!sf) return [c](const X& ct, const VjpNeed&) { return cotangents<X>(ct / c); };
      return [ak = keep(a), ok = keep(out)](const X& ct, const VjpNeed&) {
        return cotangents<X>(-(ct * ok / ak));
      };
    case BinaryOp::kMax:
    case BinaryOp::kMin:
      return one(a, [c, mx = op == BinaryOp::kMax](const X& ct, const X& ak) {
        return ct * detail::wins(ak, c, mx);
      });
    case BinaryOp::kPow:
      if (!sf)
        return one(a, [c](const X& ct, const X& ak) {
          return c == T(0) ? zeros_like(ak) : ct * (c * pow(ak, c - T(1)));
        });
      return one(out, [c](const X& ct, const X& ok) {
        return c == T(0) ? zeros_like(ok) : ct * ok * static_cast<T>(std::log(c));
      });
    case BinaryOp::kMod:
      if (!sf) return [](const X& ct, const VjpNeed&) { return cotangents<X>(ct.alias()); };
      return one(a, [c](const X& ct, const X& ak) { return -(ct * floor(c / ak)); });
    case BinaryOp::kFloorDiv:
      return nullptr;
    default:
      detail::raise_not_differentiable(name(), "it is not defined for floating arrays");
  }
}

template <ArrayLike X>
KernelVjp<X, X> Unary::vjp(const VjpNeed&, const X& out, const X& x) const {
  using T = elem_t<X>;
  using detail::keep;
  auto with_x = [&](auto f) { return one(x, f); };
  auto with_y = [&](auto f) { return one(out, f); };
  switch (op) {
    case UnaryOp::kNeg:
      return [](const X& ct, const VjpNeed&) { return cotangents<X>(-ct); };
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
      return [xk = keep(x), yk = keep(out)](const X& ct, const VjpNeed&) {
        return cotangents<X>(ct * yk * T(-0.5) / xk);
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
        if constexpr (detail::is_tensor_v<X>) {
          if (!detail::traced(ct, x) && !ct.batch() && !x.batch())
            return detail::gelu_vjp(x, ct);  // one pass
        }
        return ct * unary(x, UnaryOp::kGeluGrad);
      });
    case UnaryOp::kGeluGrad:
      detail::raise_not_differentiable(
          "gelu_grad",
          "gelu's second derivative is not implemented (differentiate the "
          "composed formula, e.g. gelu(x, false) or the tanh expression, instead)");
    case UnaryOp::kSign:
    case UnaryOp::kFloor:
    case UnaryOp::kCeil:
    case UnaryOp::kRound:  // piecewise constant: zero
      return nullptr;
    default:
      detail::raise_not_differentiable(name(), "it is not defined for floating arrays");
  }
}

template <ArrayLike X, ArrayLike C>
KernelVjp<X, X> Where::vjp(const VjpNeed&, const X&, const X& a, const X& b, const C& cond) const {
  using T = elem_t<X>;
  return [as = a.shape(), bs = b.shape(), ck = detail::keep(cond)](const X& ct, const VjpNeed& n) {
    Cts<X> r(2);
    if (n[0]) r[0] = detail::unbroadcast(where(ck, ct, T(0)), as);
    if (n[1]) r[1] = detail::unbroadcast(where(ck, T(0), ct), bs);
    return r;
  };
}

namespace {

/// z = alpha * x + y over n contiguous elements: one read of x and y, one write of z.
template <typename T>
void axpy_contiguous(std::int64_t n, T alpha, const T* __restrict x, const T* __restrict y, T* __restrict z) {
  for (std::int64_t k = 0; k < n; ++k) z[k] = static_cast<T>(alpha * x[k] + y[k]);
}

}  // namespace

template <Dtype S>
Tensor<S> Axpy<S>::kernel(const Tensor<S>& x, const Tensor<S>& y) const {
  if (x.shape() == y.shape()) {
    Tensor<S> z(x.shape());
    axpy_contiguous(z.size(), alpha, x.data(), y.data(), z.data());
    return z;
  }
  return detail::binary_kernel(detail::binary_kernel(x, alpha, BinaryOp::kMul, true), y, BinaryOp::kAdd);
}

template <Dtype S>
template <ArrayLike X>
KernelVjp<X, X> Axpy<S>::vjp(const VjpNeed&, const X&, const X& x, const X& y) const {
  return [alpha = alpha, xs = x.shape(), ys = y.shape()](const X& ct, const VjpNeed& n) {
    Cts<X> r(2);
    if (n[0]) r[0] = detail::unbroadcast(ct * alpha, xs);
    if (n[1]) r[1] = detail::unbroadcast(ct, ys);
    return r;
  };
}

}  // namespace prim

namespace {
constexpr shard::source_location kLibrary{};  // the public functions below have no caller's line yet
}  // namespace

// ---------------------------------------------------------------- the public functions, both views

template <Dtype T>
Tensor<T> binary(const Tensor<T>& a, const Tensor<T>& b, BinaryOp op) {
  return detail::bind_at(prim::Binary{{}, op}, kLibrary, a, b);
}
template <Dtype T>
ShardedArray<T> binary(const ShardedArray<T>& a, const ShardedArray<T>& b, BinaryOp op) {
  return detail::bind_at(prim::Binary{{}, op}, kLibrary, a, b);
}
template <Dtype T>
Tensor<T> binary(const Tensor<T>& a, T s, BinaryOp op, bool scalar_first) {
  return detail::bind_at(prim::BinaryScalar<T>{{}, op, s, scalar_first}, kLibrary, a);
}
template <Dtype T>
ShardedArray<T> binary(const ShardedArray<T>& a, T s, BinaryOp op, bool scalar_first) {
  return detail::bind_at(prim::BinaryScalar<T>{{}, op, s, scalar_first}, kLibrary, a);
}
template <Dtype T>
Tensor<bool> compare(const Tensor<T>& a, const Tensor<T>& b, CompareOp op) {
  return detail::bind_at(prim::Compare{{}, op}, kLibrary, a, b);
}
template <Dtype T>
ShardedArray<bool> compare(const ShardedArray<T>& a, const ShardedArray<T>& b, CompareOp op) {
  return detail::bind_at(prim::Compare{{}, op}, kLibrary, a, b);
}
template <Dtype T>
Tensor<bool> compare(const Tensor<T>& a, T s, CompareOp op, bool scalar_first) {
  return detail::bind_at(prim::CompareScalar<T>{{}, op, s, scalar_first}, kLibrary, a);
}
template <Dtype T>
ShardedArray<bool> compare(const ShardedArray<T>& a, T s, CompareOp op, bool scalar_first) {
  return detail::bind_at(prim::CompareScalar<T>{{}, op, s, scalar_first}, kLibrary, a);
}
template <Dtype T>
Tensor<T> unary(const Tensor<T>& x, UnaryOp op) {
  return detail::bind_at(prim::Unary{{}, op}, kLibrary, x);
}
template <Dtype T>
ShardedArray<T> unary(const ShardedArray<T>& x, UnaryOp op) {
  return detail::bind_at(prim::Unary{{}, op}, kLibrary, x);
}
template <Dtype T>
Tensor<T> where(const Tensor<bool>& cond, const Tensor<T>& a, const Tensor<T>& b) {
  return detail::bind_at(prim::Where{}, kLibrary, a, b, cond);
}
template <Dtype T>
ShardedArray<T> where(const ShardedArray<bool>& cond, const ShardedArray<T>& a, const ShardedArray<T>& b) {
  return detail::bind_at(prim::Where{}, kLibrary, a, b, cond);
}
template <Dtype T>
ShardedArray<T> axpy(T alpha, const ShardedArray<T>& x, const ShardedArray<T>& y) {
  return detail::bind_at(prim::Axpy<T>{{}, alpha}, kLibrary, x, y);
}

template <Dtype U, Dtype T>
Tensor<U> astype(const Tensor<T>& x) {
  return detail::bind_at(prim::Astype<U>{}, kLibrary, x);
}
template <Dtype U, Dtype T>
ShardedArray<U> astype(const ShardedArray<T>& x) {
  return detail::bind_at(prim::Astype<U>{}, kLibrary, x);
}

#define SHARD_INSTANTIATE_ASTYPE(U, T)               \
  template Tensor<U> astype<U, T>(const Tensor<T>&); \
  template ShardedArray<U> astype<U, T>(const ShardedArray<T>&);
SHARD_FOR_EACH_DTYPE_PAIR(ALL, ALL, SHARD_INSTANTIATE_ASTYPE)
#undef SHARD_INSTANTIATE_ASTYPE
#define SHARD_INSTANTIATE_ELEMENTWISE(V, T)                         \
  template V<T> binary<T>(const V<T>&, const V<T>&, BinaryOp);      \
  template V<T> binary<T>(const V<T>&, T, BinaryOp, bool);          \
  template V<bool> compare<T>(const V<T>&, const V<T>&, CompareOp); \
  template V<bool> compare<T>(const V<T>&, T, CompareOp, bool);     \
  template V<T> unary<T>(const V<T>&, UnaryOp);                     \
  template V<T> where<T>(const V<bool>&, const V<T>&, const V<T>&);
#define SHARD_INSTANTIATE_ELEMENTWISE_BOTH(T) \
  SHARD_INSTANTIATE_ELEMENTWISE(Tensor, T)    \
  SHARD_INSTANTIATE_ELEMENTWISE(ShardedArray, T)
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_ELEMENTWISE_BOTH)
#undef SHARD_INSTANTIATE_ELEMENTWISE_BOTH
#undef SHARD_INSTANTIATE_ELEMENTWISE
#define SHARD_INSTANTIATE_AXPY(T) \
  template ShardedArray<T> axpy<T>(T, const ShardedArray<T>&, const ShardedArray<T>&);
SHARD_FOR_EACH_NUMERIC_DTYPE(SHARD_INSTANTIATE_AXPY)
#undef SHARD_INSTANTIATE_AXPY

}  // namespace shard
