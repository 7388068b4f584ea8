#pragma once
/// \file Element types and JAX's type promotion. Core layer: no MPI, nothing communicates.
///
/// Shard arrays hold one of five element types: bool, int32, int64, float32 (float) and
/// float64 (double). Mixed operands promote along JAX's lattice
///     bool < int32 < int64 < float32 < float64
/// to the larger of the two, so int32 + float32 is float32 and int64 + float32 is float32
/// (numpy would say float64). A C++ scalar is *weakly typed* as a Python scalar is in JAX: it
/// takes the array's type unless it is of a higher kind (x_int32 * 2.5 is floating, with the
/// scalar's own float or double; x_float32 * 2.5 stays float32; x_bool + 1 is int32).
/// True division and means of integers are floating: int32 and bool give float32, int64
/// gives float64.

#include <concepts>
#include <cstdint>
#include <type_traits>

namespace shard {

/// The element types of Shard arrays.
template <typename T>
concept Dtype = std::same_as<T, bool> || std::same_as<T, std::int32_t> || std::same_as<T, std::int64_t> ||
                std::same_as<T, float> || std::same_as<T, double>;

/// The floating element types (the ones autodiff differentiates).
template <typename T>
concept FloatDtype = std::same_as<T, float> || std::same_as<T, double>;

/// A C++ scalar usable with arrays: any arithmetic type.
template <typename S>
concept Scalar = std::is_arithmetic_v<S>;

/// "bool", "int32", "int64", "float32", "float64" (numpy's names).
template <Dtype T>
constexpr const char* dtype_name() {
  if constexpr (std::is_same_v<T, bool>) return "bool";
  else if constexpr (std::is_same_v<T, std::int32_t>) return "int32";
  else if constexpr (std::is_same_v<T, std::int64_t>) return "int64";
  else if constexpr (std::is_same_v<T, float>) return "float32";
  else return "float64";
}

namespace detail {
template <Dtype T>
constexpr int dtype_rank() {
  if constexpr (std::is_same_v<T, bool>) return 0;
  else if constexpr (std::is_same_v<T, std::int32_t>) return 1;
  else if constexpr (std::is_same_v<T, std::int64_t>) return 2;
  else if constexpr (std::is_same_v<T, float>) return 3;
  else return 4;
}

/// The Dtype a C++ scalar type stands for on its own (int -> int32, long -> int64, ...).
template <Scalar S>
struct scalar_dtype {
  using type = std::conditional_t<
      std::is_same_v<S, bool>, bool,
      std::conditional_t<std::is_floating_point_v<S>, std::conditional_t<(sizeof(S) <= 4), float, double>,
                         std::conditional_t<(sizeof(S) <= 4), std::int32_t, std::int64_t>>>;
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
    std::is_floating_point_v<T>, T,
    std::conditional_t<std::is_floating_point_v<S>, scalar_dtype_t<S>,
                       std::conditional_t<std::is_same_v<T, bool> && !std::is_same_v<S, bool>, scalar_dtype_t<S>, T>>>;

/// The floating type of true division and means: float for bool, int32 and float, double for
/// int64 and double.
template <Dtype T>
using float_of_t = std::conditional_t<std::is_same_v<T, std::int64_t> || std::is_same_v<T, double>, double, float>;

/// The type sums and products of T have (JAX: bool sums to int32, everything else keeps its type).
template <Dtype T>
using sum_t = std::conditional_t<std::is_same_v<T, bool>, std::int32_t, T>;

}  // namespace shard
