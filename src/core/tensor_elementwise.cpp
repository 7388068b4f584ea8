// Elementwise kernels of the local op set: binary ops and comparisons with numpy
// broadcasting, unary math, where. Each op is a functor chosen once per call; the loops run
// it over contiguous runs (both operands, or one of them scalar, in the innermost loop), so
// the compiler vectorises the common cases. These are the elementwise primitives' kernels
// (ops/elementwise.hpp); the public functions of both views bind the primitives.

#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/tensor_kernels.hpp"
#include "shard/core/tensor_ops.hpp"
#include "shard/core/trace.hpp"
#include "shard/error.hpp"

namespace shard {

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  const std::size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const std::int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1)
      raise<ShapeError>("shapes ", to_string(a), " and ", to_string(b), " do not broadcast (dim ", i, ": ",
                        da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

namespace {

// The loops below are also compiled for AVX2 and picked at load time (an ifunc): comparisons,
// max/min with nan checks and selects ran at 0.6-0.8 of the triad with SSE2's 2-wide doubles
// and reach the triad with AVX2. No FMA clone: a fused multiply-add would round differently
// on different machines.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define SHARD_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SHARD_SIMD_CLONES
#endif

const char* op_name(BinaryOp op) { return detail::binary_op_name(op); }
const char* op_name(UnaryOp op) { return detail::unary_op_name(op); }

// ---------------------------------------------------------------- loops

template <typename R, typename A, typename B, typename F>
SHARD_SIMD_CLONES void loop_vv(std::int64_t n, const A* __restrict a, const B* __restrict b, R* __restrict o,
                               F f) {
  for (std::int64_t i = 0; i < n; ++i) o[i] = f(a[i], b[i]);
}
template <typename R, typename A, typename B, typename F>
SHARD_SIMD_CLONES void loop_vs(std::int64_t n, const A* __restrict a, B b, R* __restrict o, F f) {
  for (std::int64_t i = 0; i < n; ++i) o[i] = f(a[i], b);
}
template <typename R, typename A, typename B, typename F>
SHARD_SIMD_CLONES void loop_sv(std::int64_t n, A a, const B* __restrict b, R* __restrict o, F f) {
  for (std::int64_t i = 0; i < n; ++i) o[i] = f(a, b[i]);
}

/// Where a kernel writes elements of type R: bool outputs as bytes (GCC has no vector type for
/// bool, so loops writing bool would not vectorise).
template <typename R>
auto* out_ptr(Tensor<R>& t) {
  if constexpr (std::is_same_v<R, bool>)
    return reinterpret_cast<unsigned char*>(t.data());
  else
    return t.data();
}

/// out = f(a, b) elementwise, a and b broadcast to out's shape.
template <typename R, typename T, typename F>
void zip_into(const Tensor<T>& a, const Tensor<T>& b, Tensor<R>& out, F f) {
  const T* pa = a.data();
  const T* pb = b.data();
  auto* po = out_ptr(out);
  const std::int64_t n = out.size();
  if (n == 0) return;
  const bool a_full = a.shape() == out.shape(), b_full = b.shape() == out.shape();
  if (a_full && b_full) return loop_vv(n, pa, pb, po, f);
  if (a_full && b.size() == 1) return loop_vs(n, pa, pb[0], po, f);
  if (b_full && a.size() == 1) return loop_sv(n, pa[0], pb, po, f);
  const std::array<Shape, 2> st{detail::broadcast_strides(a.shape(), out.shape()),
                                detail::broadcast_strides(b.shape(), out.shape())};
  detail::broadcast_rows<2>(out.shape(), st, [&](std::int64_t o, auto off, auto step, std::int64_t len) {
    const T* x = pa + off[0];
    const T* y = pb + off[1];
    if (step[0] == 1 && step[1] == 1)
      loop_vv(len, x, y, po + o, f);
    else if (step[0] == 1 && step[1] == 0)
      loop_vs(len, x, *y, po + o, f);
    else if (step[0] == 0 && step[1] == 1)
      loop_sv(len, *x, y, po + o, f);
    else
      for (std::int64_t k = 0; k < len; ++k) po[o + k] = f(x[k * step[0]], y[k * step[1]]);
  });
}

// ---------------------------------------------------------------- binary functors

template <typename T>
T int_pow(T base, T exp) {
  if (exp < 0) return base == T(1) ? T(1) : base == T(-1) ? (exp % 2 ? T(-1) : T(1)) : T(0);
  T r = 1;
  while (exp) {
    if (exp & 1) r = detail::mul_wrap(r, base);
    base = detail::mul_wrap(base, base);
    exp >>= 1;
  }
  return r;
}

template <typename T>
[[noreturn]] void unsupported(BinaryOp op) {
  raise<ValueError>(op_name(op), " is not defined for ", dtype_name<T>(), " arrays",
                    std::is_same_v<T, bool> ? " (numpy refuses it too; convert with astype first)"
                                            : " (bitwise ops need integer or bool arrays)");
}

/// Calls go(f) with the functor of `op` on T.
template <typename T, typename Go>
auto with_binary(BinaryOp op, Go&& go) {
  if constexpr (std::is_same_v<T, bfloat16>) {
    // bfloat16: float32's functor on the widened operands, its result rounded once.
    return with_binary<float>(op, [&](auto f) {
      return go([f](bfloat16 x, bfloat16 y) { return bfloat16(f(float(x), float(y))); });
    });
  } else if constexpr (std::is_same_v<T, bool>) {
    switch (op) {
      case BinaryOp::kAdd:
      case BinaryOp::kOr:
      case BinaryOp::kMax:
        return go([](bool x, bool y) { return x || y; });
      case BinaryOp::kMul:
      case BinaryOp::kAnd:
      case BinaryOp::kMin:
        return go([](bool x, bool y) { return x && y; });
      case BinaryOp::kXor:
        return go([](bool x, bool y) { return x != y; });
      default:
        unsupported<T>(op);
    }
  } else {
    switch (op) {
      case BinaryOp::kAdd:
        return go([](T x, T y) { return detail::add_wrap(x, y); });  // integers wrap
      case BinaryOp::kSub:
        return go([](T x, T y) { return detail::sub_wrap(x, y); });
      case BinaryOp::kMul:
        return go([](T x, T y) { return detail::mul_wrap(x, y); });
      case BinaryOp::kMax:
        return go([](T x, T y) { return detail::max_nan(x, y); });  // nan propagates
      case BinaryOp::kMin:
        return go([](T x, T y) { return detail::min_nan(x, y); });
      case BinaryOp::kDiv:
        if constexpr (is_floating_v<T>) return go([](T x, T y) { return static_cast<T>(x / y); });
        [[fallthrough]];
      case BinaryOp::kFloorDiv:
        if constexpr (is_floating_v<T>) {
          return go([](T x, T y) { return static_cast<T>(std::floor(x / y)); });
        } else {
          return go([](T x, T y) {
            if (y == 0) return T(0);
            // MIN / -1 overflows (SIGFPE): numpy and JAX wrap, to MIN.
            if (y == T(-1))
              return static_cast<T>(std::make_unsigned_t<T>(0) - static_cast<std::make_unsigned_t<T>>(x));
            T q = static_cast<T>(x / y);
            if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
            return q;
          });
        }
      case BinaryOp::kMod:
        if constexpr (is_floating_v<T>) {
          return go([](T x, T y) {
            T r = static_cast<T>(std::fmod(x, y));
            if (r != 0 && ((r < 0) != (y < 0))) r = static_cast<T>(r + y);
            return r;
          });
        } else {
          return go([](T x, T y) {
            if (y == 0 || y == T(-1)) return T(0);  // MIN % -1 overflows (SIGFPE); every x % -1 is 0
            T r = static_cast<T>(x % y);
            if (r != 0 && ((r < 0) != (y < 0))) r = static_cast<T>(r + y);
            return r;
          });
        }
      case BinaryOp::kPow:
        if constexpr (is_floating_v<T>)
          return go([](T x, T y) { return static_cast<T>(std::pow(x, y)); });
        else
          return go([](T x, T y) { return int_pow(x, y); });
      case BinaryOp::kAnd:
      case BinaryOp::kOr:
      case BinaryOp::kXor:
        if constexpr (std::is_integral_v<T>) {
          if (op == BinaryOp::kAnd) return go([](T x, T y) { return static_cast<T>(x & y); });
          if (op == BinaryOp::kOr) return go([](T x, T y) { return static_cast<T>(x | y); });
          return go([](T x, T y) { return static_cast<T>(x ^ y); });
        }
        unsupported<T>(op);
    }
    unsupported<T>(op);
  }
}

template <typename T, typename Go>
auto with_compare(CompareOp op, Go&& go) {
  switch (op) {
    case CompareOp::kLess:
      return go([](T x, T y) { return x < y; });
    case CompareOp::kLessEqual:
      return go([](T x, T y) { return x <= y; });
    case CompareOp::kGreater:
      return go([](T x, T y) { return x > y; });
    case CompareOp::kGreaterEqual:
      return go([](T x, T y) { return x >= y; });
    case CompareOp::kEqual:
      return go([](T x, T y) { return x == y; });
    default:
      return go([](T x, T y) { return x != y; });
  }
}

/// The same functor with its operands swapped (scalar_first).
template <typename F>
auto swapped(F f) {
  return [f](auto x, auto y) { return f(y, x); };
}

// ---------------------------------------------------------------- unary functors

/// tanh of a float as XLA and Eigen compute it: a rational approximation on [-7.9, 7.9]
/// (odd degree 13 over even degree 6), within 6 ulp of tanh everywhere, and vectorizable
/// (glibc's tanhf is a scalar call through expm1f). Doubles use std::tanh.
template <typename T>
inline T tanh_of(T x) {
  if constexpr (std::is_same_v<T, float>) {
    constexpr float kClamp = 7.90531110763549805f;
    const float c = std::min(std::max(x, -kClamp), kClamp);  // nan stays nan
    const float x2 = c * c;
    float p = -2.76076847742355e-16f;
    p = p * x2 + 2.00018790482477e-13f;
    p = p * x2 - 8.60467152213735e-11f;
    p = p * x2 + 5.12229709037114e-08f;
    p = p * x2 + 1.48572235717979e-05f;
    p = p * x2 + 6.37261928875436e-04f;
    p = p * x2 + 4.89352455891786e-03f;
    float q = 1.19825839466702e-06f;
    q = q * x2 + 1.18534705686654e-04f;
    q = q * x2 + 2.26843463243900e-03f;
    q = q * x2 + 4.89352518554385e-03f;
    const float r = c * p / q;  // computed for every lane (branch-free: the loop vectorizes)
    return std::fabs(c) < 0.0004f ? c : r;
  } else {
    return std::tanh(x);
  }
}

/// jax.nn.gelu(approximate=True): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), and its derivative.
template <typename T>
inline T gelu_of(T x) {
  const T c = static_cast<T>(0.7978845608028654);
  return T(0.5) * x * (T(1) + tanh_of(c * (x + T(0.044715) * x * x * x)));
}
template <typename T>
inline T gelu_grad_of(T x_in) {
  // Past |x| = 10 the derivative is 1 (or 0) to the last bit: clamping keeps x^2 finite (a
  // huge x would make 0 * inf = nan); nan stays nan.
  const T x = std::min(std::max(x_in, T(-10)), T(10));
  const T c = static_cast<T>(0.7978845608028654);
  const T t = tanh_of(c * (x + T(0.044715) * x * x * x));
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * c * (T(1) + T(3 * 0.044715) * x * x);
}

template <typename T, typename Go>
auto with_unary(UnaryOp op, Go&& go) {
  if constexpr (std::is_same_v<T, bfloat16>) {
    // bfloat16: float32's functor on the widened value, its result rounded once.
    return with_unary<float>(op,
                             [&](auto f) { return go([f](bfloat16 x) { return bfloat16(f(float(x))); }); });
  } else if constexpr (std::is_same_v<T, bool>) {
    switch (op) {
      case UnaryOp::kNot:
        return go([](bool x) { return !x; });
      case UnaryOp::kAbs:
      case UnaryOp::kSquare:
      case UnaryOp::kSign:
      case UnaryOp::kRelu:
      case UnaryOp::kFloor:
      case UnaryOp::kCeil:
      case UnaryOp::kRound:
        return go([](bool x) { return x; });
      default:
        raise<ValueError>(op_name(op), " is not defined for bool arrays; convert with astype first");
    }
  } else if constexpr (std::is_integral_v<T>) {
    switch (op) {
      case UnaryOp::kNeg:
        return go([](T x) { return detail::sub_wrap(T(0), x); });  // -MIN is MIN, as numpy's
      case UnaryOp::kAbs:
        return go([](T x) { return x < 0 ? detail::sub_wrap(T(0), x) : x; });
      case UnaryOp::kSquare:
        return go([](T x) { return detail::mul_wrap(x, x); });
      case UnaryOp::kSign:
        return go([](T x) { return static_cast<T>((x > 0) - (x < 0)); });
      case UnaryOp::kRelu:
        return go([](T x) { return x > 0 ? x : T(0); });
      case UnaryOp::kFloor:
      case UnaryOp::kCeil:
      case UnaryOp::kRound:
        return go([](T x) { return x; });
      case UnaryOp::kNot:
        return go([](T x) { return static_cast<T>(~x); });
      default:
        raise<ValueError>(op_name(op), " of a ", dtype_name<T>(),
                          " array: the kernel takes floating arrays (the "
                          "front end, e.g. shard::exp(x), converts integers to floating first)");
    }
  } else {
    switch (op) {
      case UnaryOp::kExp:
        return go([](T x) { return std::exp(x); });
      case UnaryOp::kLog:
        return go([](T x) { return std::log(x); });
      case UnaryOp::kLog1p:
        return go([](T x) { return std::log1p(x); });
      case UnaryOp::kExpm1:
        return go([](T x) { return std::expm1(x); });
      case UnaryOp::kSin:
        return go([](T x) { return std::sin(x); });
      case UnaryOp::kCos:
        return go([](T x) { return std::cos(x); });
      case UnaryOp::kTanh:
        return go([](T x) { return tanh_of(x); });
      case UnaryOp::kGelu:
        return go([](T x) { return gelu_of(x); });
      case UnaryOp::kGeluGrad:
        return go([](T x) { return gelu_grad_of(x); });
      case UnaryOp::kSqrt:
        return go([](T x) { return std::sqrt(x); });
      case UnaryOp::kRsqrt:
        return go([](T x) { return T(1) / std::sqrt(x); });
      case UnaryOp::kErf:
        return go([](T x) { return std::erf(x); });
      case UnaryOp::kSigmoid:
        return go([](T x) { return T(1) / (T(1) + std::exp(-x)); });
      case UnaryOp::kReciprocal:
        return go([](T x) { return T(1) / x; });
      case UnaryOp::kRelu:
        return go([](T x) { return x < T(0) ? T(0) : x; });  // nan passes through
      case UnaryOp::kAbs:
        return go([](T x) { return std::fabs(x); });
      case UnaryOp::kNeg:
        return go([](T x) { return -x; });
      case UnaryOp::kSquare:
        return go([](T x) { return x * x; });
      case UnaryOp::kSign:
        return go([](T x) { return x > T(0) ? T(1) : x < T(0) ? T(-1) : x; });  // 0, -0, nan kept
      case UnaryOp::kFloor:
        return go([](T x) { return std::floor(x); });
      case UnaryOp::kCeil:
        return go([](T x) { return std::ceil(x); });
      case UnaryOp::kRound:
        return go([](T x) { return std::nearbyint(x); });  // half to even, like numpy
      case UnaryOp::kNot:
        raise<ValueError>("logical_not of a ", dtype_name<T>(), " array: the kernel takes bool arrays");
    }
    raise<ValueError>("unknown unary op");
  }
}

}  // namespace

template <Dtype T>
Tensor<T> detail::binary_kernel(const Tensor<T>& a, const Tensor<T>& b, BinaryOp op) {
  Tensor<T> out(broadcast_shapes(a.shape(), b.shape()));
  with_binary<T>(op, [&](auto f) {
    zip_into(a, b, out, f);
    return 0;
  });
  return out;
}

template <Dtype T>
Tensor<T> detail::binary_kernel(const Tensor<T>& a, T s, BinaryOp op, bool scalar_first) {
  Tensor<T> out(a.shape());
  with_binary<T>(op, [&](auto f) {
    if (scalar_first)
      loop_sv(a.size(), s, a.data(), out.data(), f);
    else
      loop_vs(a.size(), a.data(), s, out.data(), f);
    return 0;
  });
  return out;
}

template <Dtype T>
void binary_inplace(Tensor<T>& x, const Tensor<T>& y, BinaryOp op) {
  if (broadcast_shapes(x.shape(), y.shape()) != x.shape())
    raise<ShapeError>(op_name(op), " in place: ", to_string(y.shape()), " does not broadcast to ",
                      to_string(x.shape()));
  if (detail::traced(x, y)) {  // recorded as x = x op y
    x = binary(x, y, op);
    return;
  }
  x.detach_if_aliased();  // an autodiff residual keeps the old values
  with_binary<T>(op, [&](auto f) {
    const std::array<Shape, 1> st{detail::broadcast_strides(y.shape(), x.shape())};
    T* px = x.data();
    const T* py = y.data();
    detail::broadcast_rows<1>(x.shape(), st, [&](std::int64_t o, auto off, auto step, std::int64_t len) {
      T* __restrict xo = px + o;
      const T* __restrict yo = py + off[0];
      if (step[0] == 1) {
        for (std::int64_t k = 0; k < len; ++k) xo[k] = f(xo[k], yo[k]);
      } else {
        const T y0 = yo[0];
        for (std::int64_t k = 0; k < len; ++k) xo[k] = f(xo[k], step[0] == 0 ? y0 : yo[k * step[0]]);
      }
    });
    return 0;
  });
}

template <Dtype T>
Tensor<bool> detail::compare_kernel(const Tensor<T>& a, const Tensor<T>& b, CompareOp op) {
  Tensor<bool> out(broadcast_shapes(a.shape(), b.shape()));
  with_compare<T>(op, [&](auto f) {
    zip_into(a, b, out, f);
    return 0;
  });
  return out;
}

template <Dtype T>
Tensor<bool> detail::compare_kernel(const Tensor<T>& a, T s, CompareOp op, bool scalar_first) {
  Tensor<bool> out(a.shape());
  with_compare<T>(op, [&](auto f) {
    if (scalar_first)
      loop_sv(a.size(), s, a.data(), out_ptr(out), f);
    else
      loop_vs(a.size(), a.data(), s, out_ptr(out), f);
    return 0;
  });
  return out;
}

namespace {
template <typename T, typename F>
SHARD_SIMD_CLONES void loop_v(std::int64_t n, const T* __restrict in, T* __restrict o, F f) {
  for (std::int64_t i = 0; i < n; ++i) o[i] = static_cast<T>(f(in[i]));
}
/// o = c ? s : v (s_first) or c ? v : s, with a scalar s.
template <typename T>
SHARD_SIMD_CLONES void select_svv(std::int64_t n, const unsigned char* __restrict c, T s,
                                  const T* __restrict v, T* __restrict o, bool s_first) {
  if (s_first)
    for (std::int64_t i = 0; i < n; ++i) o[i] = c[i] ? s : v[i];
  else
    for (std::int64_t i = 0; i < n; ++i) o[i] = c[i] ? v[i] : s;
}
template <typename T>
SHARD_SIMD_CLONES void select_vvv(std::int64_t n, const unsigned char* __restrict c, const T* __restrict a,
                                  const T* __restrict b, T* __restrict o) {
  for (std::int64_t i = 0; i < n; ++i) {
    const T x = a[i], y = b[i];  // both read unconditionally: a blend, no branch
    o[i] = c[i] ? x : y;
  }
}
}  // namespace

template <Dtype T>
Tensor<T> detail::unary_kernel(const Tensor<T>& x, UnaryOp op) {
  Tensor<T> out(x.shape());
  with_unary<T>(op, [&](auto f) {
    loop_v(x.size(), x.data(), out.data(), f);
    return 0;
  });
  return out;
}

template <Dtype T>
Tensor<T> detail::where_kernel(const Tensor<bool>& cond, const Tensor<T>& a, const Tensor<T>& b) {
  const Shape shape = broadcast_shapes(cond.shape(), broadcast_shapes(a.shape(), b.shape()));
  Tensor<T> out(shape);
  // The condition read as bytes: GCC has no vector type for bool, and would not vectorise.
  const auto* pc = reinterpret_cast<const unsigned char*>(cond.data());
  const T* pa = a.data();
  const T* pb = b.data();
  T* po = out.data();
  if (cond.shape() == shape && a.shape() == shape && b.shape() == shape) {
    select_vvv(out.size(), pc, pa, pb, po);
    return out;
  }
  if (cond.shape() == shape && (a.shape() == shape || a.size() == 1) &&
      (b.shape() == shape || b.size() == 1)) {
    const bool sa = a.shape() != shape, sb = b.shape() != shape;  // size 1, broadcast
    if (sa && sb) {
      for (std::int64_t i = 0; i < out.size(); ++i) po[i] = pc[i] ? pa[0] : pb[0];
    } else if (sa) {
      select_svv(out.size(), pc, pa[0], pb, po, true);
    } else if (sb) {
      select_svv(out.size(), pc, pb[0], pa, po, false);  // relu'-like masks
    } else {
      select_vvv(out.size(), pc, pa, pb, po);
    }
    return out;
  }
  const std::array<Shape, 3> st{detail::broadcast_strides(cond.shape(), shape),
                                detail::broadcast_strides(a.shape(), shape),
                                detail::broadcast_strides(b.shape(), shape)};
  detail::broadcast_rows<3>(shape, st, [&](std::int64_t o, auto off, auto step, std::int64_t len) {
    for (std::int64_t k = 0; k < len; ++k) {
      const T x = pa[off[1] + k * step[1]], y = pb[off[2] + k * step[2]];
      po[o + k] = pc[off[0] + k * step[0]] ? x : y;
    }
  });
  return out;
}

namespace {
SHARD_SIMD_CLONES void to_bfloat16_bits(std::int64_t n, const float* __restrict in,
                                        std::uint16_t* __restrict out) {
  for (std::int64_t i = 0; i < n; ++i) {
    // bfloat16::round_to_bits without a branch: round to nearest even, a nan kept quiet.
    const auto u = std::bit_cast<std::uint32_t>(in[i]);
    const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const std::uint32_t quiet = (u >> 16) | 0x40u;
    out[i] = static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
  }
}
SHARD_SIMD_CLONES void from_bfloat16_bits(std::int64_t n, const std::uint16_t* __restrict in,
                                          float* __restrict out) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = std::bit_cast<float>(static_cast<std::uint32_t>(in[i]) << 16);
}
}  // namespace

void detail::float_to_bfloat16_span(std::int64_t n, const float* in, bfloat16* out) {
  to_bfloat16_bits(n, in, reinterpret_cast<std::uint16_t*>(out));
}
void detail::bfloat16_to_float_span(std::int64_t n, const bfloat16* in, float* out) {
  from_bfloat16_bits(n, reinterpret_cast<const std::uint16_t*>(in), out);
}

template <Dtype T>
void detail::binary_span(BinaryOp op, std::int64_t n, const T* a, const T* b, T* out) {
  with_binary<T>(op, [&](auto f) {
    loop_vv(n, a, b, out, f);
    return 0;
  });
}
template <Dtype T>
void detail::binary_scalar_span(BinaryOp op, std::int64_t n, const T* a, T s, bool scalar_first, T* out) {
  with_binary<T>(op, [&](auto f) {
    if (scalar_first)
      loop_sv(n, s, a, out, f);
    else
      loop_vs(n, a, s, out, f);
    return 0;
  });
}
template <Dtype T>
void detail::compare_span(CompareOp op, std::int64_t n, const T* a, const T* b, bool* out) {
  auto* o = reinterpret_cast<unsigned char*>(out);
  with_compare<T>(op, [&](auto f) {
    loop_vv(n, a, b, o, f);
    return 0;
  });
}
template <Dtype T>
void detail::compare_scalar_span(CompareOp op, std::int64_t n, const T* a, T s, bool scalar_first,
                                 bool* out) {
  auto* o = reinterpret_cast<unsigned char*>(out);
  with_compare<T>(op, [&](auto f) {
    if (scalar_first)
      loop_sv(n, s, a, o, f);
    else
      loop_vs(n, a, s, o, f);
    return 0;
  });
}
template <Dtype T>
void detail::unary_span(UnaryOp op, std::int64_t n, const T* x, T* out) {
  with_unary<T>(op, [&](auto f) {
    loop_v(n, x, out, f);
    return 0;
  });
}
template <Dtype T>
void detail::where_span(std::int64_t n, const bool* cond, const T* a, const T* b, T* out) {
  select_vvv(n, reinterpret_cast<const unsigned char*>(cond), a, b, out);
}

namespace detail {
template <Dtype T>
Tensor<T> gelu_vjp(const Tensor<T>& x, const Tensor<T>& ct) {
  if (x.shape() != ct.shape())
    raise<ShapeError>("gelu_vjp: cotangent shape ", to_string(ct.shape()), " differs from ",
                      to_string(x.shape()));
  Tensor<T> out(x.shape());
  const T *px = x.data(), *pc = ct.data();
  T* po = out.data();
  using C = compute_t<T>;  // bfloat16 computes in float32 and rounds once
  for (std::int64_t i = 0; i < x.size(); ++i)
    po[i] = static_cast<T>(static_cast<C>(pc[i]) * gelu_grad_of<C>(static_cast<C>(px[i])));
  return out;
}
#define SHARD_INSTANTIATE_GELU_VJP(T) template Tensor<T> gelu_vjp<T>(const Tensor<T>&, const Tensor<T>&);
SHARD_FOR_EACH_FLOAT_DTYPE(SHARD_INSTANTIATE_GELU_VJP)
#undef SHARD_INSTANTIATE_GELU_VJP
}  // namespace detail

#define SHARD_INSTANTIATE_ELEMENTWISE(T)                                                               \
  template Tensor<T> detail::binary_kernel<T>(const Tensor<T>&, const Tensor<T>&, BinaryOp);           \
  template Tensor<T> detail::binary_kernel<T>(const Tensor<T>&, T, BinaryOp, bool);                    \
  template void binary_inplace<T>(Tensor<T>&, const Tensor<T>&, BinaryOp);                             \
  template Tensor<bool> detail::compare_kernel<T>(const Tensor<T>&, const Tensor<T>&, CompareOp);      \
  template Tensor<bool> detail::compare_kernel<T>(const Tensor<T>&, T, CompareOp, bool);               \
  template Tensor<T> detail::unary_kernel<T>(const Tensor<T>&, UnaryOp);                               \
  template Tensor<T> detail::where_kernel<T>(const Tensor<bool>&, const Tensor<T>&, const Tensor<T>&); \
  template void detail::binary_span<T>(BinaryOp, std::int64_t, const T*, const T*, T*);                \
  template void detail::binary_scalar_span<T>(BinaryOp, std::int64_t, const T*, T, bool, T*);          \
  template void detail::compare_span<T>(CompareOp, std::int64_t, const T*, const T*, bool*);           \
  template void detail::compare_scalar_span<T>(CompareOp, std::int64_t, const T*, T, bool, bool*);     \
  template void detail::unary_span<T>(UnaryOp, std::int64_t, const T*, T*);                            \
  template void detail::where_span<T>(std::int64_t, const bool*, const T*, const T*, T*);
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_ELEMENTWISE)
#undef SHARD_INSTANTIATE_ELEMENTWISE

}  // namespace shard
