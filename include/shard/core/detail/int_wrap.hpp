#pragma once
/// \file Integer arithmetic that wraps (kernels, reductions and the collectives' combines).

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

}  // namespace shard::detail
