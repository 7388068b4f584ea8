#pragma once
/// \file `shard::bfloat16`, JAX's `jnp.bfloat16` (ml_dtypes.bfloat16): the top 16 bits of an
/// IEEE float32 (1 sign, 8 exponent and 7 mantissa bits), so float32's range with 2-3
/// significant digits. It is storage: arithmetic converts to float32, computes there and rounds
/// the result back, to nearest with ties to even, as XLA's CPU backend does op by op.
///
/// Conversions:
///   - from float32: round to nearest, ties to even; a NaN stays a NaN (quiet, sign kept); a
///     finite value past the largest bfloat16 (3.3895e38) rounds to infinity;
///   - from double or an integer: through float32, as ml_dtypes and Eigen do;
///   - to float32: exact (implicit), hence to double and to the integer types.
///
/// Mixed arithmetic follows JAX's promotion: bfloat16 with bfloat16 or with a C++ integer (a
/// weak scalar) gives bfloat16; with float gives float, with double gives double. Comparisons
/// compare the values. An element type of Tensor and ShardedArray (the dtype list in dtype.hpp):
/// kernels widen it to float32, compute there and store the rounded result; sums accumulate in
/// float32.

#include <bit>
#include <concepts>
#include <cstdint>
#include <limits>
#include <ostream>

namespace shard {

struct bfloat16 {
  using storage_type = std::uint16_t;  // what MPI moves (mpi::datatype)
  std::uint16_t bits;                  // uninitialised by default, as float is; bfloat16{} is +0

  bfloat16() = default;
  constexpr bfloat16(float f) : bits(round_to_bits(f)) {}  // NOLINT: implicit, as c10::BFloat16's
  constexpr operator float() const { return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16); }

  /// The bfloat16 with these bits (0x3f80 is 1).
  static constexpr bfloat16 from_bits(std::uint16_t b) {
    bfloat16 r{};
    r.bits = b;
    return r;
  }

  /// float32 to the nearest bfloat16's bits, ties to even; NaN quiet with its sign and top
  /// payload bits.
  static constexpr std::uint16_t round_to_bits(float f) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
    const std::uint32_t lsb = (u >> 16) & 1u;  // the kept part's last bit: a tie goes to even
    return static_cast<std::uint16_t>((u + 0x7fffu + lsb) >> 16);
  }
};

static_assert(sizeof(bfloat16) == 2);

constexpr bfloat16 operator-(bfloat16 a) {
  return bfloat16::from_bits(static_cast<std::uint16_t>(a.bits ^ 0x8000u));
}
constexpr bfloat16 operator+(bfloat16 a) { return a; }

#define SHARD_BF16_ARITHMETIC(OP)                                                                          \
  constexpr bfloat16 operator OP(bfloat16 a, bfloat16 b) { return bfloat16(float(a) OP float(b)); }        \
  constexpr float operator OP(bfloat16 a, float b) { return float(a) OP b; }                               \
  constexpr float operator OP(float a, bfloat16 b) { return a OP float(b); }                               \
  constexpr double operator OP(bfloat16 a, double b) { return double(float(a)) OP b; }                     \
  constexpr double operator OP(double a, bfloat16 b) { return a OP double(float(b)); }                     \
  constexpr bfloat16 operator OP(bfloat16 a, int b) { return a OP bfloat16(static_cast<float>(b)); }       \
  constexpr bfloat16 operator OP(int a, bfloat16 b) { return bfloat16(static_cast<float>(a)) OP b; }       \
  constexpr bfloat16 operator OP(bfloat16 a, long b) { return a OP bfloat16(static_cast<float>(b)); }      \
  constexpr bfloat16 operator OP(long a, bfloat16 b) { return bfloat16(static_cast<float>(a)) OP b; }      \
  constexpr bfloat16 operator OP(bfloat16 a, long long b) { return a OP bfloat16(static_cast<float>(b)); } \
  constexpr bfloat16 operator OP(long long a, bfloat16 b) { return bfloat16(static_cast<float>(a)) OP b; } \
  constexpr bfloat16& operator OP##=(bfloat16& a, bfloat16 b) { return a = a OP b; }
SHARD_BF16_ARITHMETIC(+)
SHARD_BF16_ARITHMETIC(-)
SHARD_BF16_ARITHMETIC(*)
SHARD_BF16_ARITHMETIC(/)
#undef SHARD_BF16_ARITHMETIC

#define SHARD_BF16_COMPARISON(OP)                                                             \
  constexpr bool operator OP(bfloat16 a, bfloat16 b) { return float(a) OP float(b); }         \
  constexpr bool operator OP(bfloat16 a, float b) { return float(a) OP b; }                   \
  constexpr bool operator OP(float a, bfloat16 b) { return a OP float(b); }                   \
  constexpr bool operator OP(bfloat16 a, double b) { return double(float(a)) OP b; }          \
  constexpr bool operator OP(double a, bfloat16 b) { return a OP double(float(b)); }          \
  constexpr bool operator OP(bfloat16 a, int b) { return float(a) OP static_cast<float>(b); } \
  constexpr bool operator OP(int a, bfloat16 b) { return static_cast<float>(a) OP float(b); }
SHARD_BF16_COMPARISON(==)
SHARD_BF16_COMPARISON(!=)
SHARD_BF16_COMPARISON(<)
SHARD_BF16_COMPARISON(<=)
SHARD_BF16_COMPARISON(>)
SHARD_BF16_COMPARISON(>=)
#undef SHARD_BF16_COMPARISON

// Templates that take only a bfloat16 (never a float converted to one: an unqualified isnan or
// abs of a float inside namespace shard must not round it).
template <std::same_as<bfloat16> B>
constexpr bool isnan(B a) {
  return (a.bits & 0x7fffu) > 0x7f80u;
}
template <std::same_as<bfloat16> B>
constexpr bool isinf(B a) {
  return (a.bits & 0x7fffu) == 0x7f80u;
}
template <std::same_as<bfloat16> B>
constexpr bool isfinite(B a) {
  return (a.bits & 0x7f80u) != 0x7f80u;
}
template <std::same_as<bfloat16> B>
constexpr B abs(B a) {
  return B::from_bits(static_cast<std::uint16_t>(a.bits & 0x7fffu));
}

namespace detail {
/// n bfloat16 values widened to float32 (exact), and n float32 values rounded to bfloat16 as
/// the constructor rounds; both loops vectorize.
inline void widen_bf16(const bfloat16* in, float* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i)
    out[i] = std::bit_cast<float>(static_cast<std::uint32_t>(in[i].bits) << 16);
}
inline void narrow_to_bf16(const float* in, bfloat16* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i].bits = bfloat16::round_to_bits(in[i]);
}
}  // namespace detail

/// Prints the value as float32 prints it (3.140625 for bfloat16(3.14159f)).
inline std::ostream& operator<<(std::ostream& os, bfloat16 a) { return os << float(a); }

}  // namespace shard

template <>
class std::numeric_limits<shard::bfloat16> {
 public:
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_signaling_NaN = true;
  static constexpr std::float_denorm_style has_denorm = std::denorm_present;
  static constexpr bool has_denorm_loss = false;
  static constexpr std::float_round_style round_style = std::round_to_nearest;
  static constexpr bool is_iec559 = false;  // not an IEEE 754 interchange format
  static constexpr bool is_bounded = true;
  static constexpr bool is_modulo = false;
  static constexpr int digits = 8;
  static constexpr int digits10 = 2;
  static constexpr int max_digits10 = 4;
  static constexpr int radix = 2;
  static constexpr int min_exponent = -125;
  static constexpr int min_exponent10 = -37;
  static constexpr int max_exponent = 128;
  static constexpr int max_exponent10 = 38;
  static constexpr bool traps = false;
  static constexpr bool tinyness_before = false;
  static constexpr shard::bfloat16 min() noexcept { return shard::bfloat16::from_bits(0x0080); }
  static constexpr shard::bfloat16 lowest() noexcept { return shard::bfloat16::from_bits(0xff7f); }
  static constexpr shard::bfloat16 max() noexcept { return shard::bfloat16::from_bits(0x7f7f); }
  static constexpr shard::bfloat16 epsilon() noexcept { return shard::bfloat16::from_bits(0x3c00); }
  static constexpr shard::bfloat16 round_error() noexcept { return shard::bfloat16::from_bits(0x3f00); }
  static constexpr shard::bfloat16 infinity() noexcept { return shard::bfloat16::from_bits(0x7f80); }
  static constexpr shard::bfloat16 quiet_NaN() noexcept { return shard::bfloat16::from_bits(0x7fc0); }
  static constexpr shard::bfloat16 signaling_NaN() noexcept { return shard::bfloat16::from_bits(0x7fa0); }
  static constexpr shard::bfloat16 denorm_min() noexcept { return shard::bfloat16::from_bits(0x0001); }
};
