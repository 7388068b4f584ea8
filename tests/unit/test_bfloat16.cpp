// shard::bfloat16 against a reference rounding computed in double, ml_dtypes' known values,
// JAX's promotion of mixed arithmetic, and the name under `using namespace shard;` (no BLAS
// header's global bfloat16 reaches a user's program).

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <type_traits>

#include "shard/shard.hpp"

using namespace shard;  // NOLINT: what a user writes; `bfloat16` below is Shard's

namespace {

float from_bits32(std::uint32_t u) { return std::bit_cast<float>(u); }

/// The nearest bfloat16 to f by distance in double (ties to the even last bit), from the two
/// bfloat16s around it: what round_to_bits must give for a non-NaN f.
std::uint16_t reference_round(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint16_t down = static_cast<std::uint16_t>(u >> 16);  // toward zero
  if ((u & 0xffffu) == 0) return down;
  const std::uint16_t up = static_cast<std::uint16_t>(down + 1);  // away from zero (may be inf)
  const double d = std::abs(static_cast<double>(f));
  const double lo = std::abs(static_cast<double>(from_bits32(static_cast<std::uint32_t>(down) << 16)));
  const double hi = std::abs(static_cast<double>(from_bits32(static_cast<std::uint32_t>(up) << 16)));
  if ((up & 0x7fffu) == 0x7f80u) {
    // Past the largest finite bfloat16: rounds to inf from the midpoint to the next
    // would-be value 2^128 on.
    const double next = std::ldexp(1.0, 128);
    const double mid = (lo + next) / 2;
    return d < mid ? down : up;
  }
  if (d - lo < hi - d) return down;
  if (hi - d < d - lo) return up;
  return (down & 1u) ? up : down;
}

}  // namespace

TEST(Bfloat16, IsTwoBytesAndTriviallyCopyable) {
  static_assert(sizeof(bfloat16) == 2);
  static_assert(std::is_trivially_copyable_v<bfloat16>);
  static_assert(std::is_trivially_default_constructible_v<bfloat16>);
  EXPECT_EQ(bfloat16{}.bits, 0);
}

TEST(Bfloat16, KnownValues) {
  // ml_dtypes.bfloat16(x).view(np.uint16) for these x.
  EXPECT_EQ(bfloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(bfloat16(-2.0f).bits, 0xc000);
  EXPECT_EQ(bfloat16(3.14159265f).bits, 0x4049);
  EXPECT_EQ(float(bfloat16(3.14159265f)), 3.140625f);
  EXPECT_EQ(bfloat16(0.1f).bits, 0x3dcd);
  EXPECT_EQ(bfloat16(65504.0f).bits, 0x4780);
  EXPECT_EQ(bfloat16(-0.0f).bits, 0x8000);
  EXPECT_EQ(bfloat16(1e-40f).bits, 0x0001);  // float32 subnormal: bfloat16 keeps its top bits
  // Ties: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 and goes to the even 1; 1 + 3 * 2^-8
  // lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 and goes up.
  EXPECT_EQ(bfloat16(1.0f + std::ldexp(1.0f, -8)).bits, 0x3f80);
  EXPECT_EQ(bfloat16(1.0f + 3 * std::ldexp(1.0f, -8)).bits, 0x3f82);
  // Just above a tie rounds up.
  EXPECT_EQ(bfloat16(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)).bits, 0x3f81);
  // The largest float rounds to infinity; the largest bfloat16 is exact.
  EXPECT_EQ(bfloat16(std::numeric_limits<float>::max()).bits, 0x7f80);
  EXPECT_EQ(bfloat16(-std::numeric_limits<float>::max()).bits, 0xff80);
  EXPECT_EQ(bfloat16(float(std::numeric_limits<bfloat16>::max())).bits, 0x7f7f);
  EXPECT_EQ(float(std::numeric_limits<bfloat16>::max()), 3.38953139e38f);
  EXPECT_EQ(float(std::numeric_limits<bfloat16>::epsilon()), 0.0078125f);
  EXPECT_EQ(float(std::numeric_limits<bfloat16>::min()), std::numeric_limits<float>::min());
  EXPECT_TRUE(isinf(std::numeric_limits<bfloat16>::infinity()));
}

TEST(Bfloat16, NanStaysNan) {
  const float nans[] = {std::numeric_limits<float>::quiet_NaN(),
                        -std::numeric_limits<float>::quiet_NaN(),
                        std::numeric_limits<float>::signaling_NaN(),
                        from_bits32(0x7f800001u),
                        from_bits32(0xff80ffffu),
                        from_bits32(0x7fffffffu)};
  for (float f : nans) {
    const bfloat16 b(f);
    EXPECT_TRUE(isnan(b)) << std::hex << std::bit_cast<std::uint32_t>(f);
    EXPECT_TRUE(std::isnan(float(b)));
    EXPECT_EQ(b.bits & 0x8000u, (std::bit_cast<std::uint32_t>(f) >> 16) & 0x8000u) << "sign kept";
    EXPECT_NE(b.bits & 0x0040u, 0u) << "quiet";
  }
  EXPECT_FALSE(isnan(bfloat16(std::numeric_limits<float>::infinity())));
  EXPECT_FALSE(bfloat16(std::nanf("")) == bfloat16(std::nanf("")));
}

TEST(Bfloat16, RoundsLikeTheReferenceOnEveryExponent) {
  // Random bit patterns (every exponent, subnormals, the overflow edge), plus the exact ties
  // and their neighbours of random bfloat16s.
  std::mt19937 rng(20261128);
  std::int64_t checked = 0;
  for (int i = 0; i < 2000000; ++i) {
    const std::uint32_t u = rng();
    const float f = from_bits32(u);
    if (std::isnan(f)) continue;
    ASSERT_EQ(bfloat16(f).bits, reference_round(f)) << std::hex << u;
    ++checked;
  }
  for (int i = 0; i < 200000; ++i) {
    const std::uint32_t hi = rng() & 0xffff0000u;
    for (std::uint32_t low : {0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      const float f = from_bits32(hi | low);
      if (std::isnan(f)) continue;
      ASSERT_EQ(bfloat16(f).bits, reference_round(f)) << std::hex << (hi | low);
      ++checked;
    }
  }
  EXPECT_GT(checked, 2000000);
}

TEST(Bfloat16, EveryBfloat16RoundTripsThroughFloat) {
  for (std::uint32_t b = 0; b <= 0xffffu; ++b) {
    const bfloat16 x = bfloat16::from_bits(static_cast<std::uint16_t>(b));
    if (isnan(x)) continue;
    ASSERT_EQ(bfloat16(float(x)).bits, b);
    ASSERT_EQ(isinf(x), std::isinf(float(x)));
    ASSERT_EQ(isfinite(x), std::isfinite(float(x)));
  }
}

TEST(Bfloat16, ArithmeticPromotesAsJax) {
  const bfloat16 a(1.5f), b(0.00390625f);  // 2^-8
  static_assert(std::is_same_v<decltype(a + a), bfloat16>);
  static_assert(std::is_same_v<decltype(a * 2), bfloat16>);  // a C++ integer is weak
  static_assert(std::is_same_v<decltype(3L - a), bfloat16>);
  static_assert(std::is_same_v<decltype(a + 1.0f), float>);  // float32 wins
  static_assert(std::is_same_v<decltype(a / 2.0), double>);  // float64 wins
  static_assert(std::is_same_v<decltype(-a), bfloat16>);
  // Each bfloat16 op rounds its float32 result: 1.5 + 2^-8 is a tie that goes to even 1.5.
  EXPECT_EQ(a + b, bfloat16(1.5f));
  EXPECT_EQ(float(a) + float(b), 1.50390625f);
  EXPECT_EQ(a + 1.0f, 2.5f);
  EXPECT_EQ(a * 2, bfloat16(3.0f));
  bfloat16 c = a;
  c *= bfloat16(3.0f);
  EXPECT_EQ(c, 4.5f);
  c -= 1;
  EXPECT_EQ(c, 3.5);
  EXPECT_EQ((-a).bits, 0xbfc0);
  EXPECT_EQ(abs(-a), a);
  EXPECT_TRUE(a > b && b < 1 && a >= 1.5f && a != 1);
  // Conversions from double and from integers go through float32.
  const bfloat16 d = 0.1;
  const bfloat16 e = 7;
  EXPECT_EQ(d.bits, 0x3dcd);
  EXPECT_EQ(float(e), 7.0f);
  std::ostringstream os;
  os << bfloat16(3.14159265f);
  EXPECT_EQ(os.str(), "3.14062");
}
