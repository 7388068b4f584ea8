#pragma once
/// \file Element types and JAX's type promotion. Core layer: no MPI, nothing communicates.
///
/// Shard arrays hold one of six element types (SHARD_DTYPE_TABLE below, the one list): bool,
/// int32, int64, bfloat16 (shard::bfloat16), float32 (float) and float64 (double). Mixed
/// operands promote along JAX's lattice
///     bool < int32 < int64 < bfloat16 < float32 < float64
/// to the larger of the two, so int32 + float32 is float32 and int64 + float32 is float32
/// (numpy would say float64). A C++ scalar is *weakly typed* as a Python scalar is in JAX: it
/// takes the array's type unless it is of a higher kind (x_int32 * 2.5 is floating, with the
/// scalar's own float or double; x_float32 * 2.5 stays float32; x_bool + 1 is int32).
/// True division and means of integers are floating: int32 and bool give float32, int64
/// gives float64.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "shard/core/bfloat16.hpp"

/// The one dtype list. Every explicit instantiation, extern template declaration and dispatch
/// by dtype name or .npy code in Shard comes from this table: adding a dtype is one row here
/// plus its kernels (tests/check_dtype_list.sh fails on a list typed out anywhere else). The
/// rows run in the order of the promotion lattice (promote_t takes the later of two); each is
///     X(<the caller's arguments>, C++ type, numpy name, kind, .npy descr)
/// and its kind (BOOL, INT or FLOAT) places the dtype in the sets below.
#define SHARD_DTYPE_TABLE(X, ...)                   \
  X(__VA_ARGS__, bool, "bool", BOOL, "|b1")         \
  X(__VA_ARGS__, std::int32_t, "int32", INT, "<i4") \
  X(__VA_ARGS__, std::int64_t, "int64", INT, "<i8") \
  X(__VA_ARGS__, ::shard::bfloat16, "bfloat16", FLOAT, "<V2") \
  X(__VA_ARGS__, float, "float32", FLOAT, "<f4")    \
  X(__VA_ARGS__, double, "float64", FLOAT, "<f8")

/// M(T) for every dtype T of a set, in the table's order. The sets: ALL; NUMERIC (the INT and
/// FLOAT kinds: what .npy files and checkpoints hold); INT (also take's index types); FLOAT
/// (what autodiff differentiates). A file instantiates its templates with
///     #define SHARD_INSTANTIATE_X(T) template Tensor<T> x<T>(const Tensor<T>&);
///     SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_X)
///     #undef SHARD_INSTANTIATE_X
/// M must not use SHARD_FOR_EACH_* itself (a macro does not expand inside its own
/// expansion): for two dtypes use SHARD_FOR_EACH_DTYPE_PAIR.
#define SHARD_FOR_EACH_DTYPE_IN(SET, M) SHARD_DTYPE_TABLE(SHARD_DETAIL_DTYPE_ONE, SET, M)
#define SHARD_FOR_EACH_DTYPE(M) SHARD_FOR_EACH_DTYPE_IN(ALL, M)
#define SHARD_FOR_EACH_NUMERIC_DTYPE(M) SHARD_FOR_EACH_DTYPE_IN(NUMERIC, M)
#define SHARD_FOR_EACH_INT_DTYPE(M) SHARD_FOR_EACH_DTYPE_IN(INT, M)
#define SHARD_FOR_EACH_FLOAT_DTYPE(M) SHARD_FOR_EACH_DTYPE_IN(FLOAT, M)

/// M(T, U) for every T of SET1 and U of SET2 (sets as above; T is the outer loop): astype's
/// (to, from) pairs are SHARD_FOR_EACH_DTYPE_PAIR(ALL, ALL, M), take's (array, index) types
/// SHARD_FOR_EACH_DTYPE_PAIR(ALL, INT, M).
#define SHARD_FOR_EACH_DTYPE_PAIR(SET1, SET2, M) \
  SHARD_DETAIL_DTYPE_EXPAND(SHARD_DTYPE_TABLE(SHARD_DETAIL_DTYPE_PAIR_OUTER, SET1, SET2, M))

// The machinery. SHARD_DETAIL_DTYPE_IN_<set>_<kind>(...) keeps its arguments if the kind's
// dtypes belong to the set, and drops them if not.
#define SHARD_DETAIL_DTYPE_IN_ALL_BOOL(...) __VA_ARGS__
#define SHARD_DETAIL_DTYPE_IN_ALL_INT(...) __VA_ARGS__
#define SHARD_DETAIL_DTYPE_IN_ALL_FLOAT(...) __VA_ARGS__
#define SHARD_DETAIL_DTYPE_IN_NUMERIC_BOOL(...)
#define SHARD_DETAIL_DTYPE_IN_NUMERIC_INT(...) __VA_ARGS__
#define SHARD_DETAIL_DTYPE_IN_NUMERIC_FLOAT(...) __VA_ARGS__
#define SHARD_DETAIL_DTYPE_IN_INT_BOOL(...)
#define SHARD_DETAIL_DTYPE_IN_INT_INT(...) __VA_ARGS__
#define SHARD_DETAIL_DTYPE_IN_INT_FLOAT(...)
#define SHARD_DETAIL_DTYPE_IN_FLOAT_BOOL(...)
#define SHARD_DETAIL_DTYPE_IN_FLOAT_INT(...)
#define SHARD_DETAIL_DTYPE_IN_FLOAT_FLOAT(...) __VA_ARGS__
#define SHARD_DETAIL_DTYPE_ONE(SET, M, T, NAME, KIND, DESCR) SHARD_DETAIL_DTYPE_IN_##SET##_##KIND(M(T))
// A pair walks the table inside a walk of the table. The inner walk's name is deferred: it
// appears only when SHARD_DETAIL_DTYPE_EXPAND rescans the outer walk's result, after the
// outer walk has finished, so the preprocessor expands it instead of leaving it unexpanded as
// a use of SHARD_DTYPE_TABLE inside itself.
#define SHARD_DETAIL_DTYPE_EMPTY()
#define SHARD_DETAIL_DTYPE_DEFER(id) id SHARD_DETAIL_DTYPE_EMPTY()
#define SHARD_DETAIL_DTYPE_EXPAND(...) __VA_ARGS__
#define SHARD_DETAIL_DTYPE_TABLE_ID() SHARD_DTYPE_TABLE
// clang-format off
#define SHARD_DETAIL_DTYPE_PAIR_OUTER(SET1, SET2, M, T, NAME, KIND, DESCR) \
  SHARD_DETAIL_DTYPE_DEFER(SHARD_DETAIL_DTYPE_TABLE_ID)()(SHARD_DETAIL_DTYPE_PAIR_INNER, SET1, KIND, SET2, M, T)
// clang-format on
#define SHARD_DETAIL_DTYPE_PAIR_INNER(SET1, KIND1, SET2, M, T, U, NAME, KIND2, DESCR) \
  SHARD_DETAIL_DTYPE_IN_##SET1##_##KIND1(SHARD_DETAIL_DTYPE_IN_##SET2##_##KIND2(M(T, U)))
#define SHARD_DETAIL_DTYPE_COMMA(T) , T

namespace shard {

/// A list of types (the dtype sets below).
template <typename... Ts>
struct TypeList {
  static constexpr std::size_t size = sizeof...(Ts);
};

namespace detail {
template <typename L>
struct drop_void;
template <typename... Ts>
struct drop_void<TypeList<void, Ts...>> {
  using type = TypeList<Ts...>;
};

template <typename T, typename L>
inline constexpr bool in_type_list = false;
template <typename T, typename... Ts>
inline constexpr bool in_type_list<T, TypeList<Ts...>> = (std::is_same_v<T, Ts> || ...);

/// What the table says of T: its numpy name and .npy descr.
template <typename T>
struct dtype_traits;
#define SHARD_DETAIL_DTYPE_TRAITS(_, T, NAME, KIND, DESCR) \
  template <>                                              \
  struct dtype_traits<T> {                                 \
    static constexpr const char* name = NAME;              \
    static constexpr const char* npy_descr = DESCR;        \
  };
SHARD_DTYPE_TABLE(SHARD_DETAIL_DTYPE_TRAITS, ~)
#undef SHARD_DETAIL_DTYPE_TRAITS
}  // namespace detail

/// The sets of the table as type lists, in its order.
using AllDtypes = detail::drop_void<TypeList<void SHARD_FOR_EACH_DTYPE(SHARD_DETAIL_DTYPE_COMMA)>>::type;
using NumericDtypes =
    detail::drop_void<TypeList<void SHARD_FOR_EACH_NUMERIC_DTYPE(SHARD_DETAIL_DTYPE_COMMA)>>::type;
using IntDtypes = detail::drop_void<TypeList<void SHARD_FOR_EACH_INT_DTYPE(SHARD_DETAIL_DTYPE_COMMA)>>::type;
using FloatDtypes =
    detail::drop_void<TypeList<void SHARD_FOR_EACH_FLOAT_DTYPE(SHARD_DETAIL_DTYPE_COMMA)>>::type;

/// The element types of Shard arrays (AllDtypes).
template <typename T>
concept Dtype = detail::in_type_list<T, AllDtypes>;

/// The floating element types (FloatDtypes: the ones autodiff differentiates); refines Dtype.
template <typename T>
concept FloatDtype = Dtype<T> && detail::in_type_list<T, FloatDtypes>;

/// Whether T is a floating type: float, double or bfloat16 (std::is_floating_point_v is false for
/// bfloat16, which is a class).
template <typename T>
inline constexpr bool is_floating_v = std::is_floating_point_v<T> || std::is_same_v<T, bfloat16>;

/// A C++ scalar usable with arrays: any arithmetic type, or a bfloat16.
template <typename S>
concept Scalar = std::is_arithmetic_v<S> || std::is_same_v<S, bfloat16>;

/// The type kernels compute T in: float for bfloat16 (its values are widened to float32
/// registers, and sums accumulate there), T itself otherwise.
template <typename T>
using compute_t = std::conditional_t<std::is_same_v<T, bfloat16>, float, T>;

/// "bool", "int32", "int64", "float32", "float64" (numpy's names).
template <Dtype T>
constexpr const char* dtype_name() {
  return detail::dtype_traits<T>::name;
}

/// numpy's .npy type string of T: "|b1", "<i4", "<i8", "<f4", "<f8".
template <Dtype T>
constexpr const char* dtype_npy_descr() {
  return detail::dtype_traits<T>::npy_descr;
}

/// Calls f(std::type_identity<T>{}) for every dtype T of List, in the table's order.
template <typename List = AllDtypes, typename F>
constexpr void for_each_dtype(F&& f) {
  [&]<typename... Ts>(TypeList<Ts...>) { (f(std::type_identity<Ts>{}), ...); }(List{});
}

/// Dispatch by name at run time: calls f(std::type_identity<T>{}) for the dtype T of List whose
/// dtype_name() is `name` and returns true; returns false if no dtype of List has that name.
template <typename List = AllDtypes, typename F>
constexpr bool visit_dtype(std::string_view name, F&& f) {
  bool found = false;
  for_each_dtype<List>([&]<typename T>(std::type_identity<T> t) {
    if (!found && name == dtype_name<T>()) {
      found = true;
      f(t);
    }
  });
  return found;
}

namespace detail {
/// T's place on the promotion lattice: its row in the table.
template <Dtype T>
constexpr int dtype_rank() {
  return []<typename... Ts>(TypeList<Ts...>) {
    int rank = 0, i = 0;
    ((std::is_same_v<T, Ts> ? rank = i : 0, ++i), ...);
    return rank;
  }(AllDtypes{});
}

/// The Dtype a C++ scalar type stands for on its own (int -> int32, long -> int64, ...).
template <Scalar S>
struct scalar_dtype {
  using type = std::conditional_t<
      std::is_same_v<S, bool>, bool,
      std::conditional_t<std::is_same_v<S, bfloat16>, bfloat16,
      std::conditional_t<std::is_floating_point_v<S>, std::conditional_t<(sizeof(S) <= 4), float, double>,
                         std::conditional_t<(sizeof(S) <= 4), std::int32_t, std::int64_t>>>>;
};
}  // namespace detail

/// JAX's promotion of two array element types: the larger on the lattice above.
template <Dtype A, Dtype B>
using promote_t = std::conditional_t<(detail::dtype_rank<A>() >= detail::dtype_rank<B>()), A, B>;

/// The Dtype of a C++ scalar on its own.
template <Scalar S>
using scalar_dtype_t = typename detail::scalar_dtype<S>::type;

/// The result type of an array of T with a weakly typed scalar of type S: T, unless S is of a
/// higher kind (floating over integer over bool), then S's own Dtype.
template <Dtype T, Scalar S>
using weak_promote_t = std::conditional_t<
    is_floating_v<T>, T,
    std::conditional_t<is_floating_v<S>, scalar_dtype_t<S>,
                       std::conditional_t<std::is_same_v<T, bool> && !std::is_same_v<S, bool>, scalar_dtype_t<S>, T>>>;

/// The floating type of true division and means: float for bool, int32 and float, double for
/// int64 and double, bfloat16 for bfloat16 (as JAX: a bfloat16 mean is bfloat16).
template <Dtype T>
using float_of_t = std::conditional_t<
    std::is_same_v<T, bfloat16>, bfloat16,
    std::conditional_t<std::is_same_v<T, std::int64_t> || std::is_same_v<T, double>, double, float>>;

/// The type sums and products of T have (JAX: bool sums to int32, everything else keeps its type).
template <Dtype T>
using sum_t = std::conditional_t<std::is_same_v<T, bool>, std::int32_t, T>;

}  // namespace shard
