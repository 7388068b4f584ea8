#pragma once
/// \file The arithmetic that the kernels, the reductions and the collectives' combines share, so
/// that every view and every device count gives the same values: integers wrap, max and min
/// propagate nan.

#include <type_traits>

namespace shard::detail {

/// Integer arithmetic as numpy's and JAX's: two's complement, wrapping on overflow (C++'s signed
/// overflow is undefined, so signed integers add and multiply as their unsigned type). Other
/// types (floats, bool) as the plain operators.
template <typename A>
constexpr A add_wrap(A x, A y) {
  if constexpr (std::is_integral_v<A> && std::is_signed_v<A>) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(static_cast<U>(x) + static_cast<U>(y)));
  } else {
    return static_cast<A>(x + y);
  }
}
template <typename A>
constexpr A sub_wrap(A x, A y) {
  if constexpr (std::is_integral_v<A> && std::is_signed_v<A>) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(static_cast<U>(x) - static_cast<U>(y)));
  } else {
    return static_cast<A>(x - y);
  }
}
template <typename A>
constexpr A mul_wrap(A x, A y) {
  if constexpr (std::is_integral_v<A> && std::is_signed_v<A>) {
    // (unsigned int * unsigned int stays unsigned; a narrower type would promote to int)
    using U = std::conditional_t<(sizeof(A) < sizeof(unsigned)), unsigned, std::make_unsigned_t<A>>;
    return static_cast<A>(static_cast<U>(static_cast<U>(x) * static_cast<U>(y)));
  } else {
    return static_cast<A>(x * y);
  }
}

/// numpy's and JAX's maximum / minimum (and the combining step of max / min reductions): a nan on
/// either side is the result (a plain comparison with nan is false and would drop it); otherwise
/// the larger (smaller). Other types as the plain comparison (bool: or / and).
template <typename A>
constexpr A max_nan(A x, A y) {
  if constexpr (std::is_integral_v<A>)
    return y > x ? y : x;
  else
    return (y > x || y != y) ? y : x;  // x nan: neither holds, x stays
}
template <typename A>
constexpr A min_nan(A x, A y) {
  if constexpr (std::is_integral_v<A>)
    return y < x ? y : x;
  else
    return (y < x || y != y) ? y : x;
}

}  // namespace shard::detail
