#pragma once
/// \file The op set's front end, written once for both views: operators and named functions
/// with numpy broadcasting and JAX's dtype promotion (dtype.hpp), for `Tensor` (local blocks,
/// tensor_ops.hpp) and `ShardedArray` (global arrays, ops.hpp). Each function here promotes
/// its operands and calls the kernel of the operands' view (`binary`, `unary`, `reduce`, ...),
/// found by argument-dependent lookup, so `x / psum(x, "p")` means the same inside a
/// shard_map body as `x / sum(x)` does on the global array.
///
/// A `Tensor` combined with a `ShardedArray` acts as JAX's uncommitted array: it is taken as
/// replicated on the sharded operand's mesh (every rank must hold the same values) and never
/// moves between ranks.

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <source_location>
#include <type_traits>
#include <vector>

#include "shard/core/dtype.hpp"
#include "shard/core/index.hpp"
#include "shard/error.hpp"

namespace shard {

template <typename T>
class Tensor;
template <typename T>
class ShardedArray;
class Mesh;

namespace detail {
// The bridges from a Tensor to a ShardedArray's view (defined in ops.cpp, documented in ops.hpp).
template <Dtype T>
ShardedArray<T> uncommitted(const Tensor<T>& x, const Mesh& mesh);
template <Dtype T>
ShardedArray<T> uncommitted(Tensor<T>&& x, const Mesh& mesh);
template <Dtype T>
ShardedArray<T> scalar_on(T v, const Mesh& mesh);
}  // namespace detail

/// Op codes shared by both views' kernels.
enum class BinaryOp { kAdd, kSub, kMul, kDiv, kMax, kMin, kPow, kAnd, kOr, kXor, kFloorDiv, kMod };
enum class CompareOp { kLess, kLessEqual, kGreater, kGreaterEqual, kEqual, kNotEqual };
enum class UnaryOp {
  kExp,
  kLog,
  kSin,
  kCos,
  kTanh,
  kRelu,
  kSqrt,
  kAbs,
  kNeg,
  kSquare,  // the first ten as before
  kLog1p,
  kExpm1,
  kRsqrt,
  kSign,
  kSigmoid,
  kReciprocal,
  kFloor,
  kCeil,
  kRound,
  kErf,
  kNot,
  kGelu,      ///< jax.nn.gelu(approximate=True) in one pass (shard::gelu)
  kGeluGrad,  ///< its derivative (gelu's VJP)
};
enum class ReduceKind { kSum, kMean, kMax, kMin, kProd };

namespace detail {
/// The ops' names as numpy spells them (messages, tape nodes; src/core/op_names.cpp).
const char* binary_op_name(BinaryOp op);
const char* unary_op_name(UnaryOp op);
const char* reduce_op_name(ReduceKind kind);
}  // namespace detail

namespace detail {
template <typename X>
inline constexpr bool is_tensor_v = false;
template <typename T>
inline constexpr bool is_tensor_v<Tensor<T>> = true;
template <typename X>
inline constexpr bool is_sharded_v = false;
template <typename T>
inline constexpr bool is_sharded_v<ShardedArray<T>> = true;
}  // namespace detail

/// Tensor<T> or ShardedArray<T>.
template <typename X>
concept ArrayLike =
    detail::is_tensor_v<std::remove_cvref_t<X>> || detail::is_sharded_v<std::remove_cvref_t<X>>;

/// The element type of an array.
template <ArrayLike X>
using elem_t = typename std::remove_cvref_t<X>::value_type;

/// The same view with another element type.
template <ArrayLike X, Dtype U>
using rebind_t = std::conditional_t<detail::is_tensor_v<std::remove_cvref_t<X>>, Tensor<U>, ShardedArray<U>>;

/// The view a combination of X and Y lives in: sharded when either is.
template <ArrayLike X, ArrayLike Y, Dtype U>
using joint_t =
    std::conditional_t<detail::is_sharded_v<X> || detail::is_sharded_v<Y>, ShardedArray<U>, Tensor<U>>;

/// x itself when it already has element type R (no copy), else astype<R>(x).
template <Dtype R, ArrayLike X>
decltype(auto) as_dtype(const X& x) {
  if constexpr (std::is_same_v<elem_t<X>, R>)
    return (x);
  else
    return astype<R>(x);
}

namespace detail {
/// Operands of a binary op in one view: a Tensor meeting a ShardedArray becomes an uncommitted
/// replicated array on its mesh (ops.hpp). Same-view operands pass through by reference.
template <Dtype R, ArrayLike X, ArrayLike Y>
decltype(auto) in_view_of(const X& x, const Y& other) {
  if constexpr (is_tensor_v<X> && is_sharded_v<Y>) {
    if constexpr (std::is_same_v<elem_t<X>, R>)
      return uncommitted(x, other.sharding().mesh());  // a view of x
    else
      return uncommitted(astype<R>(x), other.sharding().mesh());  // owns the converted copy
  } else {
    return as_dtype<R>(x);
  }
}

/// A 0-d array of value v in the view of `like` (replicated when sharded).
template <Dtype R, ArrayLike X>
auto scalar_like(R v, const X& like) {
  if constexpr (is_tensor_v<X>)
    return Tensor<R>(Shape{}, v);
  else
    return scalar_on(v, like.sharding().mesh());
}

template <ArrayLike X, ArrayLike Y>
auto binary_promoted(const X& a, const Y& b, BinaryOp op) {
  using R = promote_t<elem_t<X>, elem_t<Y>>;
  return binary(in_view_of<R>(a, b), in_view_of<R>(b, a), op);
}
template <ArrayLike X, Scalar S>
auto binary_scalar(const X& a, S s, BinaryOp op, bool scalar_first) {
  using R = weak_promote_t<elem_t<X>, S>;
  return binary(as_dtype<R>(a), static_cast<R>(s), op, scalar_first);
}
template <ArrayLike X, ArrayLike Y>
auto compare_promoted(const X& a, const Y& b, CompareOp op) {
  using R = promote_t<elem_t<X>, elem_t<Y>>;
  return compare(in_view_of<R>(a, b), in_view_of<R>(b, a), op);
}
template <ArrayLike X, Scalar S>
auto compare_scalar(const X& a, S s, CompareOp op, bool scalar_first) {
  using R = weak_promote_t<elem_t<X>, S>;
  return compare(as_dtype<R>(a), static_cast<R>(s), op, scalar_first);
}
}  // namespace detail

// ---------------------------------------------------------------- arithmetic

#define SHARD_BINARY_OPERATOR(sym, code)             \
  template <ArrayLike X, ArrayLike Y>                \
  auto operator sym(const X& a, const Y& b) {        \
    return detail::binary_promoted(a, b, code);      \
  }                                                  \
  template <ArrayLike X, Scalar S>                   \
  auto operator sym(const X& a, S s) {               \
    return detail::binary_scalar(a, s, code, false); \
  }                                                  \
  template <ArrayLike X, Scalar S>                   \
  auto operator sym(S s, const X& a) {               \
    return detail::binary_scalar(a, s, code, true);  \
  }
SHARD_BINARY_OPERATOR(+, BinaryOp::kAdd)
SHARD_BINARY_OPERATOR(-, BinaryOp::kSub)
SHARD_BINARY_OPERATOR(*, BinaryOp::kMul)
#undef SHARD_BINARY_OPERATOR

/// True division: integers and bool divide as floating (float_of_t), as in JAX.
template <ArrayLike X, ArrayLike Y>
auto operator/(const X& a, const Y& b) {
  using R = float_of_t<promote_t<elem_t<X>, elem_t<Y>>>;
  return binary(detail::in_view_of<R>(a, b), detail::in_view_of<R>(b, a), BinaryOp::kDiv);
}
template <ArrayLike X, Scalar S>
auto operator/(const X& a, S s) {
  using R = float_of_t<weak_promote_t<elem_t<X>, S>>;
  return binary(as_dtype<R>(a), static_cast<R>(s), BinaryOp::kDiv, false);
}
template <ArrayLike X, Scalar S>
auto operator/(S s, const X& a) {
  using R = float_of_t<weak_promote_t<elem_t<X>, S>>;
  return binary(as_dtype<R>(a), static_cast<R>(s), BinaryOp::kDiv, true);
}
template <ArrayLike X>
auto operator-(const X& a) {
  return unary(a, UnaryOp::kNeg);
}

#define SHARD_BINARY_FUNCTION(name, code)                                                               \
  template <ArrayLike X, ArrayLike Y>                                                                   \
  auto name(const X& a, const Y& b, shard::source_location where = shard::source_location::current()) { \
    const detail::CallScope scope(#name, where);                                                        \
    return detail::binary_promoted(a, b, code);                                                         \
  }                                                                                                     \
  template <ArrayLike X, Scalar S>                                                                      \
  auto name(const X& a, S s, shard::source_location where = shard::source_location::current()) {        \
    const detail::CallScope scope(#name, where);                                                        \
    return detail::binary_scalar(a, s, code, false);                                                    \
  }                                                                                                     \
  template <ArrayLike X, Scalar S>                                                                      \
  auto name(S s, const X& a, shard::source_location where = shard::source_location::current()) {        \
    const detail::CallScope scope(#name, where);                                                        \
    return detail::binary_scalar(a, s, code, true);                                                     \
  }
SHARD_BINARY_FUNCTION(add, BinaryOp::kAdd)
SHARD_BINARY_FUNCTION(subtract, BinaryOp::kSub)
SHARD_BINARY_FUNCTION(multiply, BinaryOp::kMul)
SHARD_BINARY_FUNCTION(maximum, BinaryOp::kMax)
SHARD_BINARY_FUNCTION(minimum, BinaryOp::kMin)
SHARD_BINARY_FUNCTION(power, BinaryOp::kPow)
SHARD_BINARY_FUNCTION(pow, BinaryOp::kPow)
/// numpy's // and %: floor division and the remainder with the divisor's sign (x // 0 is 0
/// for integers).
SHARD_BINARY_FUNCTION(floor_divide, BinaryOp::kFloorDiv)
SHARD_BINARY_FUNCTION(remainder, BinaryOp::kMod)
/// Elementwise and/or/xor: logical on bool, bitwise on integers.
SHARD_BINARY_FUNCTION(logical_and, BinaryOp::kAnd)
SHARD_BINARY_FUNCTION(logical_or, BinaryOp::kOr)
SHARD_BINARY_FUNCTION(logical_xor, BinaryOp::kXor)
#undef SHARD_BINARY_FUNCTION
template <ArrayLike X, ArrayLike Y>
auto divide(const X& a, const Y& b, shard::source_location where = shard::source_location::current()) {
  const detail::CallScope scope("divide", where);
  return a / b;
}
template <ArrayLike X, ArrayLike Y>
auto operator&(const X& a, const Y& b) {
  return logical_and(a, b);
}
template <ArrayLike X, ArrayLike Y>
auto operator|(const X& a, const Y& b) {
  return logical_or(a, b);
}
template <ArrayLike X, ArrayLike Y>
auto operator^(const X& a, const Y& b) {
  return logical_xor(a, b);
}

// ---------------------------------------------------------------- comparisons (bool results)

#define SHARD_COMPARE(sym, name, code)                                                                  \
  template <ArrayLike X, ArrayLike Y>                                                                   \
  auto name(const X& a, const Y& b, shard::source_location where = shard::source_location::current()) { \
    const detail::CallScope scope(#name, where);                                                        \
    return detail::compare_promoted(a, b, code);                                                        \
  }                                                                                                     \
  template <ArrayLike X, Scalar S>                                                                      \
  auto name(const X& a, S s, shard::source_location where = shard::source_location::current()) {        \
    const detail::CallScope scope(#name, where);                                                        \
    return detail::compare_scalar(a, s, code, false);                                                   \
  }                                                                                                     \
  template <ArrayLike X, Scalar S>                                                                      \
  auto name(S s, const X& a, shard::source_location where = shard::source_location::current()) {        \
    const detail::CallScope scope(#name, where);                                                        \
    return detail::compare_scalar(a, s, code, true);                                                    \
  }
SHARD_COMPARE(<, less, CompareOp::kLess)
SHARD_COMPARE(<=, less_equal, CompareOp::kLessEqual)
SHARD_COMPARE(>, greater, CompareOp::kGreater)
SHARD_COMPARE(>=, greater_equal, CompareOp::kGreaterEqual)
/// Elementwise ==, != (Tensor's own == compares whole tensors, like np.array_equal).
SHARD_COMPARE(==, equal, CompareOp::kEqual)
SHARD_COMPARE(!=, not_equal, CompareOp::kNotEqual)
#undef SHARD_COMPARE
#define SHARD_COMPARE_OPERATOR(sym, name)     \
  template <ArrayLike X, ArrayLike Y>         \
  auto operator sym(const X& a, const Y& b) { \
    return name(a, b);                        \
  }                                           \
  template <ArrayLike X, Scalar S>            \
  auto operator sym(const X& a, S s) {        \
    return name(a, s);                        \
  }                                           \
  template <ArrayLike X, Scalar S>            \
  auto operator sym(S s, const X& a) {        \
    return name(s, a);                        \
  }
SHARD_COMPARE_OPERATOR(<, less)
SHARD_COMPARE_OPERATOR(<=, less_equal)
SHARD_COMPARE_OPERATOR(>, greater)
SHARD_COMPARE_OPERATOR(>=, greater_equal)
#undef SHARD_COMPARE_OPERATOR

// ---------------------------------------------------------------- unary math

/// Ops that keep the type (bool only where it means something: abs, square, sign of bool are errors).
#define SHARD_UNARY_SAME(name, code)                                                        \
  template <ArrayLike X>                                                                    \
  auto name(const X& x, shard::source_location where = shard::source_location::current()) { \
    const detail::CallScope scope(#name, where);                                            \
    return unary(x, code);                                                                  \
  }
SHARD_UNARY_SAME(negative, UnaryOp::kNeg)
SHARD_UNARY_SAME(neg, UnaryOp::kNeg)
SHARD_UNARY_SAME(abs, UnaryOp::kAbs)
SHARD_UNARY_SAME(sign, UnaryOp::kSign)
SHARD_UNARY_SAME(square, UnaryOp::kSquare)
SHARD_UNARY_SAME(relu, UnaryOp::kRelu)
SHARD_UNARY_SAME(floor, UnaryOp::kFloor)
SHARD_UNARY_SAME(ceil, UnaryOp::kCeil)
SHARD_UNARY_SAME(round, UnaryOp::kRound)
#undef SHARD_UNARY_SAME
/// Transcendental ops: integers and bool are converted to float_of_t first, as in JAX.
#define SHARD_UNARY_FLOAT(name, code)                                                       \
  template <ArrayLike X>                                                                    \
  auto name(const X& x, shard::source_location where = shard::source_location::current()) { \
    const detail::CallScope scope(#name, where);                                            \
    return unary(as_dtype<float_of_t<elem_t<X>>>(x), code);                                 \
  }
SHARD_UNARY_FLOAT(exp, UnaryOp::kExp)
SHARD_UNARY_FLOAT(log, UnaryOp::kLog)
SHARD_UNARY_FLOAT(log1p, UnaryOp::kLog1p)
SHARD_UNARY_FLOAT(expm1, UnaryOp::kExpm1)
SHARD_UNARY_FLOAT(sqrt, UnaryOp::kSqrt)
SHARD_UNARY_FLOAT(rsqrt, UnaryOp::kRsqrt)
SHARD_UNARY_FLOAT(sin, UnaryOp::kSin)
SHARD_UNARY_FLOAT(cos, UnaryOp::kCos)
SHARD_UNARY_FLOAT(tanh, UnaryOp::kTanh)
SHARD_UNARY_FLOAT(sigmoid, UnaryOp::kSigmoid)
SHARD_UNARY_FLOAT(reciprocal, UnaryOp::kReciprocal)
SHARD_UNARY_FLOAT(erf, UnaryOp::kErf)
#undef SHARD_UNARY_FLOAT
/// Elementwise tests of floating values (integers are always finite and never nan).
template <ArrayLike X>
auto isnan(const X& x, shard::source_location where = shard::source_location::current()) {
  const detail::CallScope scope("isnan", where);
  return not_equal(x, x);
}
template <ArrayLike X>
auto isfinite(const X& x, shard::source_location where = shard::source_location::current()) {
  const detail::CallScope scope("isfinite", where);
  using R = float_of_t<elem_t<X>>;
  return less(abs(as_dtype<R>(x)), std::numeric_limits<R>::infinity());
}
/// Logical not of a bool array (any other type is compared with 0 first).
template <ArrayLike X>
auto logical_not(const X& x, shard::source_location where = shard::source_location::current()) {
  const detail::CallScope scope("logical_not", where);
  return unary(as_dtype<bool>(x), UnaryOp::kNot);
}
template <ArrayLike X>
auto operator~(const X& x) {
  return logical_not(x);
}
template <ArrayLike X>
auto operator!(const X& x) {
  return logical_not(x);
}

// ---------------------------------------------------------------- where and clip

namespace detail {
/// The first ShardedArray among the arguments (the view and mesh the others join), else the
/// first array.
template <typename A, typename... Rest>
const auto& anchor(const A& a, const Rest&... rest) {
  if constexpr (is_sharded_v<A>) {
    return a;
  } else if constexpr (sizeof...(Rest) > 0) {
    if constexpr ((is_sharded_v<Rest> || ...))
      return anchor(rest...);
    else if constexpr (ArrayLike<A>)
      return a;
    else
      return anchor(rest...);
  } else {
    return a;
  }
}
/// An array operand in the anchor's view, or a scalar as a 0-d array there.
template <Dtype R, typename V, ArrayLike Anchor>
decltype(auto) operand(const V& v, const Anchor& anchor) {
  if constexpr (ArrayLike<V>)
    return in_view_of<R>(v, anchor);
  else
    return scalar_like<R>(static_cast<R>(v), anchor);
}
template <typename V>
struct operand_dtype {
  using type = scalar_dtype_t<V>;
};
template <ArrayLike V>
struct operand_dtype<V> {
  using type = elem_t<V>;
};
/// where()'s value type: arrays promote, a scalar is weak against an array.
template <typename A, typename B>
auto where_dtype() {
  using DA = typename operand_dtype<A>::type;
  using DB = typename operand_dtype<B>::type;
  if constexpr (ArrayLike<A> && !ArrayLike<B>)
    return weak_promote_t<DA, B>{};
  else if constexpr (!ArrayLike<A> && ArrayLike<B>)
    return weak_promote_t<DB, A>{};
  else
    return promote_t<DA, DB>{};
}
}  // namespace detail

/// cond ? a : b elementwise with numpy broadcasting of all three. a and b are arrays or
/// scalars and promote like a binary op (a scalar is weak); a non-bool cond means cond != 0.
template <ArrayLike C, typename A, typename B>
requires((ArrayLike<A> || Scalar<A>)&&(ArrayLike<B> || Scalar<B>)) auto where(
    const C& cond, const A& a, const B& b, shard::source_location site = shard::source_location::current()) {
  const detail::CallScope scope("where", site);  // (a parameter named `where` would hide this function)
  using R = decltype(detail::where_dtype<A, B>());
  const auto& at = detail::anchor(cond, a, b);
  return where(detail::in_view_of<bool>(cond, at), detail::operand<R>(a, at), detail::operand<R>(b, at));
}

/// min(max(x, lo), hi) (numpy's clip); lo and hi are arrays or scalars.
template <ArrayLike X, typename L, typename H>
auto clip(const X& x, const L& lo, const H& hi,
          shard::source_location where = shard::source_location::current()) {
  const detail::CallScope scope("clip", where);
  return minimum(maximum(x, lo), hi);
}

// ---------------------------------------------------------------- reductions

/// Sums (bool sums to int32). Floating sums accumulate pairwise, float32 in float64, locally
/// and (ShardedArray) across devices: error like numpy's, independent of the mesh.
template <ArrayLike X>
auto sum(const X& x, const Dims& dims = {}, bool keepdims = false,
         shard::source_location where = shard::source_location::current()) {
  const detail::CallScope scope("sum", where);
  return reduce(as_dtype<sum_t<elem_t<X>>>(x), ReduceKind::kSum, dims, keepdims);
}
/// Means are floating (float_of_t) for every input type, as in JAX.
template <ArrayLike X>
auto mean(const X& x, const Dims& dims = {}, bool keepdims = false,
          shard::source_location where = shard::source_location::current()) {
  const detail::CallScope scope("mean", where);
  return reduce(as_dtype<float_of_t<elem_t<X>>>(x), ReduceKind::kMean, dims, keepdims);
}
template <ArrayLike X>
auto max(const X& x, const Dims& dims = {}, bool keepdims = false,
         shard::source_location where = shard::source_location::current()) {
  const detail::CallScope scope("max", where);
  return reduce(x, ReduceKind::kMax, dims, keepdims);
}
template <ArrayLike X>
auto min(const X& x, const Dims& dims = {}, bool keepdims = false,
         shard::source_location where = shard::source_location::current()) {
  const detail::CallScope scope("min", where);
  return reduce(x, ReduceKind::kMin, dims, keepdims);
}
template <ArrayLike X>
auto prod(const X& x, const Dims& dims = {}, bool keepdims = false,
          shard::source_location where = shard::source_location::current()) {
  const detail::CallScope scope("prod", where);
  return reduce(as_dtype<sum_t<elem_t<X>>>(x), ReduceKind::kProd, dims, keepdims);
}
namespace detail {
/// Whether reducing x over `dims` combines no element (a zero-size reduced dim): any and all then
/// give their identities, false and true, as numpy's and JAX's do (max and min have none).
template <ArrayLike X>
bool reduces_nothing(const X& x, const Dims& dims, const char* what) {
  for (const int d : dims.resolve(x.ndim(), what))
    if (x.shape()[static_cast<std::size_t>(d)] == 0) return true;
  return false;
}
}  // namespace detail

/// Logical reductions (numpy's any/all): true where some/every element is non-zero; over no
/// element, false / true.
template <ArrayLike X>
auto any(const X& x, const Dims& dims = {}, bool keepdims = false,
         shard::source_location where = shard::source_location::current()) {
  const detail::CallScope scope("any", where);
  if (detail::reduces_nothing(x, dims, "any"))  // a sum of nothing is 0: false
    return greater(reduce(as_dtype<std::int32_t>(as_dtype<bool>(x)), ReduceKind::kSum, dims, keepdims), 0);
  return reduce(as_dtype<bool>(x), ReduceKind::kMax, dims, keepdims);
}
template <ArrayLike X>
auto all(const X& x, const Dims& dims = {}, bool keepdims = false,
         shard::source_location where = shard::source_location::current()) {
  const detail::CallScope scope("all", where);
  if (detail::reduces_nothing(x, dims, "all"))  // a sum of nothing is 0: true
    return equal(reduce(as_dtype<std::int32_t>(as_dtype<bool>(x)), ReduceKind::kSum, dims, keepdims), 0);
  return reduce(as_dtype<bool>(x), ReduceKind::kMin, dims, keepdims);
}

/// jnp.cumsum along `axis` (negative counts from the end): element i is the sum of elements
/// 0..i along it. Dtypes as sum's (bool gives int32, integers keep their type and wrap as in
/// JAX); floating prefix sums accumulate in float64. A ShardedArray keeps its sharding: a split
/// axis costs one all_gather of the blocks' totals (prefix_sum in ops.hpp), never the blocks.
template <ArrayLike X>
auto cumsum(const X& x, int axis, shard::source_location where = shard::source_location::current()) {
  const detail::CallScope scope("cumsum", where);
  return prefix_sum(as_dtype<sum_t<elem_t<X>>>(x), axis, false);
}
/// jnp.cumsum(x) (axis=None): of the flattened array, cumsum(reshape(x, {-1}), 0) (a
/// ShardedArray is flattened by reshape's rule first).
template <ArrayLike X>
auto cumsum(const X& x, shard::source_location where = shard::source_location::current()) {
  const detail::CallScope scope("cumsum", where);
  return cumsum(reshape(x, Shape{-1}), 0);
}

namespace detail {
// (src/core/tensor_rows.cpp)
/// softmax and standardize along `axis` of a floating Tensor, each in one pass over a row
/// (and one for its VJP): the kernels of ops/nn.hpp's prim::Softmax and prim::Standardize.
/// fused_standardize writes 1/std of each row to `rstd` when given (what its VJP reads).
template <Dtype T>
Tensor<T> fused_softmax(const Tensor<T>& x, int axis);
template <Dtype T>
Tensor<T> fused_softmax_vjp(const Tensor<T>& y, const Tensor<T>& ct, int axis);
template <Dtype T>
Tensor<T> fused_standardize(const Tensor<T>& x, int axis, double epsilon, Tensor<T>* rstd = nullptr);
template <Dtype T>
Tensor<T> fused_standardize_vjp(const Tensor<T>& y, const Tensor<T>& rstd, const Tensor<T>& ct, int axis);
}  // namespace detail

namespace detail {
// (src/core/tensor_attention.cpp)
/// What shard::dot_product_attention runs on Tensors (ops/nn.hpp's prim::Attention): products
/// on the strided head blocks (no transposes), the causal mask as loop bounds, the attention
/// probabilities kept in `probs` when given; its VJP (dq, dk, dv) in the same blocks.
template <Dtype T>
Tensor<T> fused_attention(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, double scale,
                          bool causal, Tensor<T>* probs = nullptr);
template <Dtype T>
std::array<Tensor<T>, 3> fused_attention_vjp(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                             const Tensor<T>& probs, const Tensor<T>& ct, double scale,
                                             bool causal);
/// ShapeError unless query, key and value have dot_product_attention's shapes (both views).
void check_attention_shapes(const Shape& q, const Shape& k, const Shape& v);
/// 0 where row i may attend to column j (j <= i), -inf elsewhere: JAX's causal mask, (T, S).
template <Dtype R>
Tensor<R> causal_bias(std::int64_t t, std::int64_t s) {
  Tensor<R> m(Shape{t, s}, R(0));
  for (std::int64_t i = 0; i < t; ++i)
    for (std::int64_t j = i + 1; j < s; ++j) m.flat(i * s + j) = -std::numeric_limits<R>::infinity();
  return m;
}
}  // namespace detail

// ---------------------------------------------------------------- products

/// numpy's matmul: 1-D operands are promoted to matrices and the added dim removed again;
/// leading (batch) dims broadcast. OpenBLAS for float32/float64.
template <ArrayLike X, ArrayLike Y>
auto matmul(const X& a, const Y& b, shard::source_location where = shard::source_location::current()) {
  const detail::CallScope scope("matmul", where);
  using R = promote_t<elem_t<X>, elem_t<Y>>;
  return matmul(detail::in_view_of<R>(a, b), detail::in_view_of<R>(b, a));
}
/// numpy's dot: a scalar operand multiplies; b 1-D contracts the last dims; otherwise the
/// last dim of a with the second-to-last of b (b 2-D; for N-D operands use matmul).
template <ArrayLike X, ArrayLike Y>
auto dot(const X& a, const Y& b, shard::source_location where = shard::source_location::current()) {
  const detail::CallScope scope("dot", where);
  using R = promote_t<elem_t<X>, elem_t<Y>>;
  return dot(detail::in_view_of<R>(a, b), detail::in_view_of<R>(b, a));
}
/// The sum of the elementwise products of the flattened operands (0-d), accumulated in
/// float64 for float32.
template <ArrayLike X, ArrayLike Y>
auto vdot(const X& a, const Y& b, shard::source_location where = shard::source_location::current()) {
  const detail::CallScope scope("vdot", where);
  using R = promote_t<elem_t<X>, elem_t<Y>>;
  return vdot(detail::in_view_of<R>(a, b), detail::in_view_of<R>(b, a));
}

}  // namespace shard
