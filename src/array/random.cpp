// Counter-based random numbers: Threefry-2x32 over the global element index, generated
// box by box with no communication (see include/shard/array/random.hpp).

#include "shard/array/random.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>

#include "shard/error.hpp"

namespace shard::random {

namespace {

constexpr std::uint32_t kParity = 0x1BD11BDA;  // Threefry's key-schedule constant

inline std::uint32_t rotl(std::uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

/// One MIX step of Threefry: x0 += x1; x1 = rotl(x1, r) ^ x0.
inline void mix(std::uint32_t& x0, std::uint32_t& x1, int r) {
  x0 += x1;
  x1 = rotl(x1, r) ^ x0;
}

/// 20 rounds in five groups of four, a key injection after each group (ks = k0, k1,
/// k0 ^ k1 ^ parity, rotating by one each time, plus the injection count on x1).
inline void threefry20(std::uint32_t k0, std::uint32_t k1, std::uint32_t& x0, std::uint32_t& x1) {
  const std::uint32_t k2 = k0 ^ k1 ^ kParity;
  x0 += k0;
  x1 += k1;
  mix(x0, x1, 13), mix(x0, x1, 15), mix(x0, x1, 26), mix(x0, x1, 6);
  x0 += k1;
  x1 += k2 + 1u;
  mix(x0, x1, 17), mix(x0, x1, 29), mix(x0, x1, 16), mix(x0, x1, 24);
  x0 += k2;
  x1 += k0 + 2u;
  mix(x0, x1, 13), mix(x0, x1, 15), mix(x0, x1, 26), mix(x0, x1, 6);
  x0 += k0;
  x1 += k1 + 3u;
  mix(x0, x1, 17), mix(x0, x1, 29), mix(x0, x1, 16), mix(x0, x1, 24);
  x0 += k1;
  x1 += k2 + 4u;
  mix(x0, x1, 13), mix(x0, x1, 15), mix(x0, x1, 26), mix(x0, x1, 6);
  x0 += k2;
  x1 += k0 + 5u;
}

void check_box(const Shape& global, const Box& box, const char* what) {
  bool ok = box.offset.size() == global.size() && box.extent.size() == global.size();
  for (std::size_t d = 0; ok && d < global.size(); ++d)
    ok = global[d] >= 0 && box.offset[d] >= 0 && box.extent[d] >= 0 &&
         box.offset[d] + box.extent[d] <= global[d];
  if (!ok)
    raise<ShapeError>(what, ": box ", to_string(box), " is not inside an array of shape ", to_string(global));
}

/// Fills `out` (dense, shape box.extent) with word(y0, y1) of each element's counter. The
/// box is walked as runs of consecutive global indices (the last dim, merged with the dims
/// before it while the box spans them fully); inside a run the counter's low word just
/// counts up, so the inner loop is a plain loop the compiler vectorises.
template <typename T, typename Word>
void fill(Key k, const Shape& global, const Box& box, T* out, Word word) {
  const std::int64_t total = box.size();
  if (total == 0) return;
  const int rank = static_cast<int>(global.size());
  const Shape stride = strides_of(global);
  // Dims [split, rank) form one contiguous run; dims [0, split) are iterated.
  int split = rank;
  std::int64_t run = 1;
  while (split > 0) {
    --split;
    run *= box.extent[split];
    if (split == 0 || box.extent[split] != global[split]) break;
  }
  const std::uint32_t k0 = k.hi;
  const std::uint32_t k1 = k.lo;
  Shape idx(static_cast<std::size_t>(split), 0);
  for (std::int64_t done = 0; done < total; done += run) {
    std::uint64_t g = 0;
    for (int d = 0; d < split; ++d) g += static_cast<std::uint64_t>((box.offset[d] + idx[d]) * stride[d]);
    if (rank > 0) g += static_cast<std::uint64_t>(box.offset[split] * stride[split]);
    T* dst = out + done;
    std::int64_t left = run;
    while (left > 0) {
      const std::uint32_t hi = static_cast<std::uint32_t>(g >> 32);
      const std::uint32_t lo = static_cast<std::uint32_t>(g);
      // Elements until the low word wraps (the high word is constant inside the chunk).
      const std::int64_t m = std::min<std::int64_t>(left, static_cast<std::int64_t>((1ull << 32) - lo));
      for (std::int64_t j = 0; j < m; ++j) {
        std::uint32_t x0 = hi;
        std::uint32_t x1 = lo + static_cast<std::uint32_t>(j);
        threefry20(k0, k1, x0, x1);
        dst[j] = word(x0, x1);
      }
      dst += m;
      g += static_cast<std::uint64_t>(m);
      left -= m;
    }
    for (int d = split - 1; d >= 0; --d) {
      if (++idx[d] < box.extent[d]) break;
      idx[d] = 0;
    }
  }
}

/// JAX's uniform: the top mantissa bits of the random word under the exponent of 1.0
/// give a float in [1, 2); minus 1, scaled to [lo, hi), clamped below by lo.
inline float unit_float(std::uint32_t y0, std::uint32_t y1) {
  return std::bit_cast<float>(((y0 ^ y1) >> 9) | 0x3F800000u) - 1.0f;
}
inline double unit_double(std::uint32_t y0, std::uint32_t y1) {
  const std::uint64_t word = (static_cast<std::uint64_t>(y0) << 32) | y1;
  return std::bit_cast<double>((word >> 12) | 0x3FF0000000000000ull) - 1.0;
}
/// bfloat16 (JAX's 16-bit draw in partitionable threefry: the low 16 bits of y0 ^ y1; the top
/// 7 of them under 1.0's exponent, minus 1).
inline bfloat16 unit_bf16(std::uint32_t y0, std::uint32_t y1) {
  const auto bits = static_cast<std::uint16_t>((y0 ^ y1) & 0xFFFFu);
  return bfloat16::from_bits(static_cast<std::uint16_t>((bits >> 9) | 0x3F80u)) - bfloat16(1.0f);
}
template <typename T>
inline T unit(std::uint32_t y0, std::uint32_t y1) {
  if constexpr (std::is_same_v<T, float>)
    return unit_float(y0, y1);
  else if constexpr (std::is_same_v<T, bfloat16>)
    return unit_bf16(y0, y1);
  else
    return unit_double(y0, y1);
}

template <typename T>
void fill_uniform(Key k, const Shape& global, const Box& box, T* out, T lo, T hi) {
  const T span = hi - lo;
  fill(k, global, box, out, [lo, span](std::uint32_t y0, std::uint32_t y1) {
    const T v = unit<T>(y0, y1) * span + lo;
    return v < lo ? lo : v;  // lax.max(minval, v)
  });
}

// Giles, "Approximating the erfinv function" (GPU Computing Gems, 2011): the
// double-precision polynomials in w = -log(1 - x^2), three branches (w < 6.25, w < 16,
// else), highest degree first, as XLA's ErfInv64 evaluates them.
constexpr double kGilesF64Small[] = {
    -3.6444120640178196996e-21, -1.685059138182016589e-19,  1.2858480715256400167e-18,
    1.115787767802518096e-17,   -1.333171662854620906e-16,  2.0972767875968561637e-17,
    6.6376381343583238325e-15,  -4.0545662729752068639e-14, -8.1519341976054721522e-14,
    2.6335093153082322977e-12,  -1.2975133253453532498e-11, -5.4154120542946279317e-11,
    1.051212273321532285e-09,   -4.1126339803469836976e-09, -2.9070369957882005086e-08,
    4.2347877827932403518e-07,  -1.3654692000834678645e-06, -1.3882523362786468719e-05,
    0.0001867342080340571352,   -0.00074070253416626697512, -0.0060336708714301490533,
    0.24015818242558961693,     1.6536545626831027356};
constexpr double kGilesF64Mid[] = {
    2.2137376921775787049e-09, 9.0756561938885390979e-08, -2.7517406297064545428e-07,
    1.8239629214389227755e-08, 1.5027403968909827627e-06, -4.013867526981545969e-06,
    2.9234449089955446044e-06, 1.2475304481671778723e-05, -4.7318229009055733981e-05,
    6.8284851459573175448e-05, 2.4031110387097893999e-05, -0.0003550375203628474796,
    0.00095328937973738049703, -0.0016882755560235047313, 0.0024914420961078508066,
    -0.0037512085075692412107, 0.005370914553590063617,   1.0052589676941592334,
    3.0838856104922207635};
constexpr double kGilesF64Large[] = {
    -2.7109920616438573243e-11, -2.5556418169965252055e-10, 1.5076572693500548083e-09,
    -3.7894654401267369937e-09, 7.6157012080783393804e-09,  -1.4960026627149240478e-08,
    2.9147953450901080826e-08,  -6.7711997758452339498e-08, 2.2900482228026654717e-07,
    -9.9298272942317002539e-07, 4.5260625972231537039e-06,  -1.9681778105531670567e-05,
    7.5995277030017761139e-05,  -0.00021503011930044477347, -0.00013871931833623122026,
    1.0103004648645343977,      4.8499064014085844221};

/// c[0] w^(N-1) + ... + c[N-1] by Horner's rule, unrolled (so a loop over many w vectorises).
template <std::size_t N, std::size_t... I>
inline double horner_unrolled(const double (&c)[N], double w, std::index_sequence<I...>) {
  double p = c[0];
  ((p = c[I + 1] + p * w), ...);
  return p;
}
template <std::size_t N>
inline double horner(const double (&c)[N], double w) {
  return horner_unrolled(c, w, std::make_index_sequence<N - 1>{});
}

/// -log(1 - a^2) for 0 <= a < 1 as -log((1 - a) * (1 + a)): near a = 1 the factor 1 - a is
/// exact (1 - a*a would cancel), and for small a the absolute error of w stays ~1e-16, which
/// is all the w < 6.25 polynomial (in w - 3.125) needs. One log call, no branch.
inline double neg_log_one_minus_sq(double a) { return -std::log((1.0 - a) * (1.0 + a)); }

/// erfinv(x) / x as a function of w = -log(1 - x^2).
inline double giles_ratio(double w) {
  if (w < 6.25) return horner(kGilesF64Small, w - 3.125);
  if (w < 16.0) return horner(kGilesF64Mid, std::sqrt(w) - 3.25);
  return horner(kGilesF64Large, std::sqrt(w) - 5.0);
}

constexpr double kSqrt2 = 1.41421356237309504880168872420969808;

/// v = sqrt(2) * erfinv(v) in place for values in (-1, 1), with exactly the arithmetic of
/// the scalar erfinv, laid out for throughput: the logs, then the common branch's
/// polynomial (w < 6.25, i.e. |v| < 0.998) as a vectorised loop, then the rare tails.
/// Products are formed in double and rounded once to T.
template <typename T>
void sqrt2_erfinv_in_place(T* v, std::int64_t n) {
  constexpr std::int64_t kBlock = 256;
  double w[kBlock];
  double p[kBlock];
  for (std::int64_t s = 0; s < n; s += kBlock) {
    const std::int64_t m = std::min(kBlock, n - s);
    T* x = v + s;
    for (std::int64_t i = 0; i < m; ++i) w[i] = neg_log_one_minus_sq(std::fabs(static_cast<double>(x[i])));
    for (std::int64_t i = 0; i < m; ++i) p[i] = horner(kGilesF64Small, w[i] - 3.125);
    for (std::int64_t i = 0; i < m; ++i)
      if (!(w[i] < 6.25)) p[i] = giles_ratio(w[i]);
    for (std::int64_t i = 0; i < m; ++i) x[i] = static_cast<T>(kSqrt2 * (p[i] * static_cast<double>(x[i])));
  }
}

}  // namespace

Key key(std::uint64_t seed) {
  return Key{static_cast<std::uint32_t>(seed >> 32), static_cast<std::uint32_t>(seed & 0xFFFFFFFFu)};
}

void threefry2x32(Key k, std::uint32_t x0, std::uint32_t x1, std::uint32_t& y0, std::uint32_t& y1) {
  threefry20(k.hi, k.lo, x0, x1);
  y0 = x0;
  y1 = x1;
}

std::vector<Key> split(Key k, int n) {
  if (n < 0) raise<ValueError>("random::split: the number of keys must be >= 0, got ", n);
  std::vector<Key> out(static_cast<std::size_t>(n));
  for (int j = 0; j < n; ++j) threefry2x32(k, 0u, static_cast<std::uint32_t>(j), out[j].hi, out[j].lo);
  return out;
}

Key fold_in(Key k, std::uint32_t data) {
  Key out;
  threefry2x32(k, 0u, data, out.hi, out.lo);
  return out;
}

float erfinv(float x) {
  // The double-precision result rounded once: within 0.5 ulp plus ~1e-16 relative, where
  // Giles' single-precision polynomial evaluated in float is off by up to ~4 ulp.
  return static_cast<float>(erfinv(static_cast<double>(x)));
}

double erfinv(double x) {
  const double a = std::fabs(x);
  if (!(a < 1.0))
    return a == 1.0 ? std::copysign(std::numeric_limits<double>::infinity(), x)
                    : std::numeric_limits<double>::quiet_NaN();
  return giles_ratio(neg_log_one_minus_sq(a)) * x;
}

template <typename T>
Tensor<T> uniform_box(Key k, const Shape& global, const Box& box, T lo, T hi) {
  check_box(global, box, "random::uniform");
  Tensor<T> t(box.extent);
  fill_uniform<T>(k, global, box, t.data(), lo, hi);
  return t;
}

template <typename T>
Tensor<T> normal_box(Key k, const Shape& global, const Box& box) {
  check_box(global, box, "random::normal");
  Tensor<T> t(box.extent);
  // JAX: u uniform in [nextafter(-1, 0), 1), then sqrt(2) * erfinv(u), all in T.
  if constexpr (std::is_same_v<T, bfloat16>) {
    // Each op rounds to bfloat16 as in XLA: erfinv(u), then the product with bfloat16(sqrt 2).
    fill_uniform<T>(k, global, box, t.data(), bfloat16::from_bits(0xBF7F), T(1.0f));
    const float sqrt2 = float(bfloat16(static_cast<float>(kSqrt2)));
    for (auto& v : t)
      v = bfloat16(sqrt2 * float(bfloat16(static_cast<float>(erfinv(static_cast<double>(float(v)))))));
    return t;
  }
  const T lo = std::nextafter(T(-1), T(0));
  fill_uniform<T>(k, global, box, t.data(), lo, T(1));
  // Formed in double and rounded once: float values are within about 0.5 ulp of
  // sqrt(2) * erfinv(u) (XLA's float32 erfinv is off by several ulp).
  sqrt2_erfinv_in_place(t.data(), t.size());
  return t;
}

Tensor<std::int32_t> bernoulli_box(Key k, double p, const Shape& global, const Box& box) {
  check_box(global, box, "random::bernoulli");
  Tensor<std::int32_t> t(box.extent);
  fill(k, global, box, t.data(), [p](std::uint32_t y0, std::uint32_t y1) {
    return static_cast<std::int32_t>(unit_double(y0, y1) < p);
  });
  return t;
}

Tensor<std::int64_t> bits_box(Key k, const Shape& global, const Box& box) {
  check_box(global, box, "random::bits");
  Tensor<std::int64_t> t(box.extent);
  fill(k, global, box, t.data(),
       [](std::uint32_t y0, std::uint32_t y1) { return static_cast<std::int64_t>(y0 ^ y1); });
  return t;
}

template <typename T>
ShardedArray<T> uniform(Key k, const Shape& shape, const NamedSharding& s, T lo, T hi) {
  return generate<T>(shape, s, [&](const Box& b) { return uniform_box<T>(k, shape, b, lo, hi); });
}

template <typename T>
ShardedArray<T> normal(Key k, const Shape& shape, const NamedSharding& s) {
  return generate<T>(shape, s, [&](const Box& b) { return normal_box<T>(k, shape, b); });
}

ShardedArray<std::int32_t> bernoulli(Key k, double p, const Shape& shape, const NamedSharding& s) {
  return generate<std::int32_t>(shape, s, [&](const Box& b) { return bernoulli_box(k, p, shape, b); });
}

ShardedArray<std::int64_t> bits(Key k, const Shape& shape, const NamedSharding& s) {
  return generate<std::int64_t>(shape, s, [&](const Box& b) { return bits_box(k, shape, b); });
}

Tensor<std::int64_t> permutation(Key k, std::int64_t n) {
  if (n < 0) raise<ValueError>("random::permutation: n must be >= 0, got ", n);
  Tensor<std::int64_t> perm(Shape{n});
  for (std::int64_t i = 0; i < n; ++i) perm.flat(i) = i;
  // Draw c uses counter c: a 64-bit word (y0 << 32) | y1, as for float64 values.
  std::uint64_t counter = 0;
  auto next_word = [&] {
    std::uint32_t y0 = 0, y1 = 0;
    threefry2x32(k, static_cast<std::uint32_t>(counter >> 32), static_cast<std::uint32_t>(counter), y0, y1);
    ++counter;
    return (static_cast<std::uint64_t>(y0) << 32) | y1;
  };
  // Fisher-Yates from the back: swap i with j uniform in [0, i]. Words below
  // 2^64 mod (i + 1) are rejected so that r mod (i + 1) is exactly uniform.
  for (std::int64_t i = n - 1; i > 0; --i) {
    const std::uint64_t range = static_cast<std::uint64_t>(i) + 1;
    const std::uint64_t reject_below = (0 - range) % range;  // 2^64 mod range
    std::uint64_t r = next_word();
    while (r < reject_below) r = next_word();
    std::swap(perm.flat(i), perm.flat(static_cast<std::int64_t>(r % range)));
  }
  return perm;
}

#define SHARD_INSTANTIATE_RANDOM(T)                                                   \
  template ShardedArray<T> uniform<T>(Key, const Shape&, const NamedSharding&, T, T); \
  template ShardedArray<T> normal<T>(Key, const Shape&, const NamedSharding&);        \
  template Tensor<T> uniform_box<T>(Key, const Shape&, const Box&, T, T);             \
  template Tensor<T> normal_box<T>(Key, const Shape&, const Box&);
SHARD_FOR_EACH_FLOAT_DTYPE(SHARD_INSTANTIATE_RANDOM)
#undef SHARD_INSTANTIATE_RANDOM

}  // namespace shard::random
