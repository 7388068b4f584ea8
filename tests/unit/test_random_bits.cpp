// Threefry-2x32 and the random generators, single process, no MPI: known-answer vectors
// (Random123), values asserted by JAX's tests and values JAX gives in its default
// partitionable mode, the per-box generators against a naive element-by-element reference,
// erfinv accuracy, distribution sanity and permutations.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "shard/error.hpp"
#include "shard/sharding/mesh.hpp"
#include "shard/sharding/named_sharding.hpp"
#include "shard/array/random.hpp"

namespace shard::random {
namespace {

struct Words {
  std::uint32_t y0, y1;
};
Words tf(Key k, std::uint32_t x0, std::uint32_t x1) {
  Words w{};
  threefry2x32(k, x0, x1, w.y0, w.y1);
  return w;
}

// ---- Threefry-2x32 ----------------------------------------------------------------------

// Random123's kat_vectors, 20 rounds: "threefry2x32 20 ctr0 ctr1 key0 key1 out0 out1"
// (also asserted by JAX's PrngTest.testThreefry2x32 with key=[key0, key1], count=[ctr0, ctr1]).
TEST(Threefry, Random123KnownAnswers) {
  const Words zeros = tf(Key{0, 0}, 0, 0);
  EXPECT_EQ(zeros.y0, 0x6b200159u);
  EXPECT_EQ(zeros.y1, 0x99ba4efeu);
  const Words ones = tf(Key{0xffffffffu, 0xffffffffu}, 0xffffffffu, 0xffffffffu);
  EXPECT_EQ(ones.y0, 0x1cb996fcu);
  EXPECT_EQ(ones.y1, 0xbb002be7u);
  const Words pi = tf(Key{0x13198a2eu, 0x03707344u}, 0x243f6a88u, 0x85a308d3u);
  EXPECT_EQ(pi.y0, 0xc4923a9cu);
  EXPECT_EQ(pi.y1, 0x483df7a0u);
}

// Values asserted by JAX's tests for its original (non-partitionable) mode, read back as raw
// Threefry outputs. Original split(key(0), 4) hashes counters iota(8) as the pairs (i, i+4)
// and lays out [y0 of all pairs, y1 of all pairs]; testPRNGValues expects
// [[2285895361, 1501764800], [1518642379, 4090693311], [433833334, 4221794875],
// [839183663, 3740430601]]. Original random_bits(key(1701), 32, (3,)) hashes (0, 2) and
// (1, 0) (odd count padded with a zero) and gives [56197195, 4200222568, 961309823];
// with 64 bits it hashes (i, i+3) and gives y0 << 32 | y1 =
// [3982329540505020460, 16822122385914693683, 7882654074788531506].
TEST(Threefry, ValuesAssertedByJaxTests) {
  const std::uint32_t a[4] = {2285895361u, 1501764800u, 1518642379u, 4090693311u};
  const std::uint32_t b[4] = {433833334u, 4221794875u, 839183663u, 3740430601u};
  for (std::uint32_t i = 0; i < 4; ++i) {
    const Words w = tf(key(0), i, i + 4);
    EXPECT_EQ(w.y0, a[i]) << i;
    EXPECT_EQ(w.y1, b[i]) << i;
  }
  const Words w02 = tf(key(1701), 0, 2);
  EXPECT_EQ(w02.y0, 56197195u);
  EXPECT_EQ(w02.y1, 961309823u);
  EXPECT_EQ(tf(key(1701), 1, 0).y0, 4200222568u);
  const std::uint64_t expected64[3] = {3982329540505020460ull, 16822122385914693683ull,
                                       7882654074788531506ull};
  for (std::uint32_t i = 0; i < 3; ++i) {
    const Words w = tf(key(1701), i, i + 3);
    EXPECT_EQ((static_cast<std::uint64_t>(w.y0) << 32) | w.y1, expected64[i]) << i;
  }
}

// ---- keys -------------------------------------------------------------------------------

TEST(RandomKeys, KeyFromSeedIsHiLoWords) {
  EXPECT_EQ(key(0), (Key{0, 0}));
  EXPECT_EQ(key(1701), (Key{0, 1701}));
  EXPECT_EQ(key(0x123456789abcdef0ull), (Key{0x12345678u, 0x9abcdef0u}));
  EXPECT_EQ(key(~0ull), (Key{0xffffffffu, 0xffffffffu}));  // JAX's key(-1) with x64
}

// jax.random.fold_in(key(0), 4) (testPRNGValues; fold_in is the same in both modes).
TEST(RandomKeys, FoldInMatchesJax) { EXPECT_EQ(fold_in(key(0), 4), (Key{2285895361u, 433833334u})); }

// jax.random.key_data(jax.random.split(jax.random.key(1), 3)) in JAX's default
// (partitionable) mode, as recorded by jax-js's random.test.ts.
TEST(RandomKeys, SplitMatchesJax) {
  const auto keys = split(key(1), 3);
  ASSERT_EQ(keys.size(), 3u);
  EXPECT_EQ(keys[0], (Key{507451445u, 1853169794u}));
  EXPECT_EQ(keys[1], (Key{1948878966u, 4237131848u}));
  EXPECT_EQ(keys[2], (Key{2441914641u, 3819641963u}));
  EXPECT_EQ(split(key(1)).size(), 2u);
  EXPECT_TRUE(split(key(1), 0).empty());
  EXPECT_THROW(split(key(1), -1), ValueError);
}

// JAX's test_threefry_split_fold_in_symmetry (partitionable mode): split(k, n)[i] == fold_in(k, i).
TEST(RandomKeys, SplitFoldInSymmetry) {
  for (std::uint64_t seed : {72ull, 0ull, 1ull << 40}) {
    const auto keys = split(key(seed), 5);
    for (std::uint32_t i = 0; i < 5; ++i) EXPECT_EQ(keys[i], fold_in(key(seed), i)) << seed << " " << i;
    const auto two = split(key(seed));
    EXPECT_EQ(two[0], keys[0]);
    EXPECT_EQ(two[1], keys[1]);
    EXPECT_NE(keys[0], keys[1]);
    EXPECT_NE(keys[0], key(seed));
  }
}

// ---- bits and uniform match JAX ---------------------------------------------------------

// jax.random.bits(jax.random.key(0)) and jax.random.bits(jax.random.key(10), (4,)) in
// JAX's default partitionable mode (jax-js random.test.ts): word = y0 ^ y1 of counter (0, i).
TEST(RandomBits, MatchesJaxPartitionable) {
  const auto scalar = bits_box(key(0), Shape{}, full_box(Shape{}));
  ASSERT_EQ(scalar.size(), 1);
  EXPECT_EQ(scalar.flat(0), 4070199207);
  const auto four = bits_box(key(10), Shape{4}, full_box(Shape{4}));
  const std::vector<std::int64_t> expected = {169096361, 1572511259, 2689743692, 2228103506};
  EXPECT_EQ(std::vector<std::int64_t>(four.begin(), four.end()), expected);
}

// jax.random.uniform(jax.random.key(51), (4,)) (float32, partitionable; jax-js random.test.ts).
TEST(RandomUniform, MatchesJaxFloat32) {
  const auto u = uniform_box<float>(key(51), Shape{4}, full_box(Shape{4}));
  const float expected[4] = {0.471269f, 0.12344253f, 0.17550635f, 0.5663593f};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(u.flat(i), expected[i]) << i;
}

// The bit recipe of jax.random.uniform: float32 from (y0 ^ y1) >> 9, float64 from
// ((y0 << 32) | y1) >> 12, both as the mantissa of a number in [1, 2), minus 1.
TEST(RandomUniform, MantissaRecipe) {
  const Key k = key(2024);
  const Shape shape{3, 50};
  const auto f = uniform_box<float>(k, shape, full_box(shape));
  const auto d = uniform_box<double>(k, shape, full_box(shape));
  const auto b = bits_box(k, shape, full_box(shape));
  for (std::uint32_t i = 0; i < 150; ++i) {
    const Words w = tf(k, 0, i);
    EXPECT_EQ(b.flat(i), static_cast<std::int64_t>(w.y0 ^ w.y1));
    const std::uint32_t fb = ((w.y0 ^ w.y1) >> 9) | 0x3F800000u;
    float fv;
    std::memcpy(&fv, &fb, 4);
    EXPECT_EQ(f.flat(i), fv - 1.0f) << i;
    const std::uint64_t db =
        (((static_cast<std::uint64_t>(w.y0) << 32) | w.y1) >> 12) | 0x3FF0000000000000ull;
    double dv;
    std::memcpy(&dv, &db, 8);
    EXPECT_EQ(d.flat(i), dv - 1.0) << i;
  }
}

TEST(RandomUniform, ScaledRangeIsHalfOpenAndClamped) {
  const Shape shape{1000};
  const auto d = uniform_box<double>(key(3), shape, full_box(shape), -3.0, 5.0);
  const auto u = uniform_box<double>(key(3), shape, full_box(shape));
  for (std::int64_t i = 0; i < 1000; ++i) {
    EXPECT_EQ(d.flat(i), std::max(-3.0, u.flat(i) * 8.0 + -3.0));
    EXPECT_TRUE(d.flat(i) >= -3.0 && d.flat(i) < 5.0) << d.flat(i);
  }
  const auto f = uniform_box<float>(key(3), shape, full_box(shape), 10.0f, 15.0f);
  for (float v : f) EXPECT_TRUE(v >= 10.0f && v < 15.0f) << v;
  const auto same = uniform_box<float>(key(3), shape, full_box(shape), 2.0f, 2.0f);
  for (float v : same) EXPECT_EQ(v, 2.0f);
}

// ---- per-box generation = element-by-element reference ---------------------------------

/// The naive reference: element with global flat index i is word(threefry(k, (hi32(i), lo32(i)))).
std::vector<std::int64_t> naive_bits(Key k, const Shape& global, const Box& box) {
  std::vector<std::int64_t> out;
  const Shape st = strides_of(global);
  Shape idx(box.extent.size(), 0);
  for (std::int64_t n = 0; n < box.size(); ++n) {
    std::uint64_t i = 0;
    for (std::size_t d = 0; d < idx.size(); ++d)
      i += static_cast<std::uint64_t>((box.offset[d] + idx[d]) * st[d]);
    const Words w = tf(k, static_cast<std::uint32_t>(i >> 32), static_cast<std::uint32_t>(i));
    out.push_back(w.y0 ^ w.y1);
    for (int d = static_cast<int>(idx.size()) - 1; d >= 0; --d) {
      if (++idx[d] < box.extent[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

TEST(RandomBoxes, EveryBoxMatchesNaiveReferenceAndFullSlice) {
  const Key k = key(99);
  const std::vector<std::pair<Shape, std::vector<Box>>> cases = {
      {{}, {Box{{}, {}}}},
      {{19}, {Box{{0}, {19}}, Box{{5}, {7}}, Box{{18}, {1}}, Box{{19}, {0}}}},
      {{19, 7},
       {Box{{0, 0}, {19, 7}}, Box{{5, 0}, {5, 7}}, Box{{3, 2}, {9, 4}}, Box{{0, 6}, {19, 1}},
        Box{{0, 0}, {0, 7}}}},
      {{4, 3, 5},
       {Box{{0, 0, 0}, {4, 3, 5}}, Box{{1, 0, 0}, {2, 3, 5}}, Box{{1, 1, 0}, {3, 2, 5}},
        Box{{0, 1, 2}, {4, 2, 2}}}},
      {{3, 2, 5, 2}, {Box{{1, 0, 1, 0}, {2, 2, 3, 2}}, Box{{0, 1, 0, 1}, {3, 1, 5, 1}}}},
      {{0, 5}, {Box{{0, 0}, {0, 5}}}},
  };
  for (const auto& [shape, boxes] : cases) {
    const auto full = bits_box(k, shape, full_box(shape));
    const auto full_u = uniform_box<double>(k, shape, full_box(shape));
    const auto full_n = normal_box<float>(k, shape, full_box(shape));
    for (const auto& box : boxes) {
      const auto got = bits_box(k, shape, box);
      ASSERT_EQ(got.shape(), box.extent);
      const auto naive = naive_bits(k, shape, box);
      EXPECT_EQ(std::vector<std::int64_t>(got.begin(), got.end()), naive)
          << to_string(shape) << " " << to_string(box);
      EXPECT_TRUE(got == full.slice(box)) << to_string(box);
      EXPECT_TRUE(uniform_box<double>(k, shape, box) == full_u.slice(box)) << to_string(box);
      EXPECT_TRUE(normal_box<float>(k, shape, box) == full_n.slice(box)) << to_string(box);
      EXPECT_TRUE(bernoulli_box(k, 0.4, shape, box) ==
                  bernoulli_box(k, 0.4, shape, full_box(shape)).slice(box));
    }
  }
}

// Element i uses the counter (hi32(i), lo32(i)) (JAX's iota_2x32_shape): boxes of huge
// arrays (never materialised) across the 2^32 boundary, inside one run and across rows.
TEST(RandomBoxes, CounterHighWordBeyondTwoToThe32) {
  const Key k = key(7);
  const std::int64_t two32 = std::int64_t{1} << 32;
  const Shape flat{two32 * 2};
  const Box across{{two32 - 5}, {10}};  // the low word wraps inside the run
  const auto got = bits_box(k, flat, across);
  EXPECT_EQ(std::vector<std::int64_t>(got.begin(), got.end()), naive_bits(k, flat, across));
  const Words at = tf(k, 1, 2);  // index 2^32 + 2 is element 7 of the box
  EXPECT_EQ(got.flat(7), static_cast<std::int64_t>(at.y0 ^ at.y1));
  const Shape rows{3, two32};
  const Box corner{{0, two32 - 4}, {3, 4}};  // one run per row, rows 2^32 apart
  const auto r = bits_box(k, rows, corner);
  EXPECT_EQ(std::vector<std::int64_t>(r.begin(), r.end()), naive_bits(k, rows, corner));
  const Shape pairs{two32 / 2 + 1, 2};
  const Box merged{{two32 / 2 - 1, 0}, {2, 2}};  // full rows merge into one run across 2^32
  const auto m = bits_box(k, pairs, merged);
  EXPECT_EQ(std::vector<std::int64_t>(m.begin(), m.end()), naive_bits(k, pairs, merged));
  const auto mu = uniform_box<double>(k, pairs, merged);
  const Words w = tf(k, 1, 1);  // index 2^32 + 1 is the last element
  EXPECT_EQ(mu.flat(3), uniform_box<double>(k, Shape{two32 + 2}, Box{{two32 + 1}, {1}}).flat(0));
  EXPECT_EQ(m.flat(3), static_cast<std::int64_t>(w.y0 ^ w.y1));
}

TEST(RandomBoxes, BadBoxThrows) {
  EXPECT_THROW(bits_box(key(0), Shape{4}, Box{{2}, {3}}), ShapeError);
  EXPECT_THROW(uniform_box<float>(key(0), Shape{4, 4}, Box{{0}, {4}}), ShapeError);
  EXPECT_THROW(normal_box<double>(key(0), Shape{4}, Box{{-1}, {2}}), ShapeError);
}

// The sharded generators on simulated topologies (each rank's view built in one process,
// no MPI): every local shard of every rank is the slice of the one full array.
TEST(RandomSharded, SimulatedRanksHoldSlicesOfOneArray) {
  const Key k = key(123);
  const Shape shape{19, 7};
  const auto ref_u = uniform_box<float>(k, shape, full_box(shape));
  const auto ref_n = normal_box<double>(k, shape, full_box(shape));
  const auto ref_b = bernoulli_box(k, 0.25, shape, full_box(shape));
  const auto ref_i = bits_box(k, shape, full_box(shape));
  struct Layout {
    std::vector<int> mesh;
    std::vector<std::string> names;
    PartitionSpec spec;
  };
  const std::vector<Layout> layouts = {
      {{8}, {"a"}, P()},
      {{8}, {"a"}, P("a")},
      {{8}, {"a"}, P(None, "a")},
      {{4, 2}, {"a", "b"}, P("a", "b")},
      {{4, 2}, {"a", "b"}, P("b", "a")},
      {{4, 2}, {"a", "b"}, P(SpecEntry{"a", "b"})},
      {{2, 2, 2}, {"a", "b", "c"}, P(SpecEntry{"c", "a"}, "b")},
      {{2, 2, 2}, {"a", "b", "c"}, P(None, "b")},
  };
  for (int ranks : {1, 2, 4, 8}) {
    for (int me = 0; me < ranks; ++me) {
      const Topology topo = Topology::simulated(ranks, 8 / ranks, me);
      for (const auto& l : layouts) {
        const NamedSharding s(make_mesh(l.mesh, l.names, topo), l.spec);
        const auto u = uniform<float>(k, shape, s);
        const auto n = normal<double>(k, shape, s);
        const auto b = bernoulli(k, 0.25, shape, s);
        const auto i = bits(k, shape, s);
        ASSERT_EQ(u.addressable_shards().size(), static_cast<std::size_t>(8 / ranks));
        for (std::size_t j = 0; j < u.addressable_shards().size(); ++j) {
          const Box& box = u.addressable_shards()[j].box;
          EXPECT_TRUE(u.addressable_shards()[j].data == ref_u.slice(box))
              << s.to_string() << " " << to_string(box);
          EXPECT_TRUE(n.addressable_shards()[j].data == ref_n.slice(box)) << s.to_string();
          EXPECT_TRUE(b.addressable_shards()[j].data == ref_b.slice(box)) << s.to_string();
          EXPECT_TRUE(i.addressable_shards()[j].data == ref_i.slice(box)) << s.to_string();
        }
      }
    }
  }
}

// ---- erfinv and normal -------------------------------------------------------------------

/// erfinv in long double: Newton steps on erfl (erfcl near |x| = 1) from the double value.
long double erfinv_reference(long double x) {
  if (x == 0) return 0;
  const long double a = std::fabs(x);
  long double y = erfinv(static_cast<double>(a));
  for (int it = 0; it < 5; ++it) {
    const long double r = a < 0.5L ? std::erf(y) - a : (1.0L - a) - std::erfc(y);
    y -= r / (1.1283791670955125738961589031215452L * std::exp(-y * y));
  }
  return x < 0 ? -y : y;
}

TEST(RandomErfinv, DoubleWithin1e15AndFloatWithin1Ulp) {
  std::vector<double> xs;
  for (int i = -999; i <= 999; ++i) xs.push_back(i / 1000.0);
  for (int e = 1; e <= 52; ++e) {
    xs.push_back(1.0 - std::ldexp(1.0, -e));
    xs.push_back(-(1.0 - std::ldexp(1.0, -e)));
    xs.push_back(1.0 - 3 * std::ldexp(1.0, -e - 2));
    xs.push_back(std::ldexp(1.0, -e));
  }
  xs.push_back(std::nextafter(-1.0, 0.0));
  xs.push_back(0.99999999292605946);
  double worst_d = 0;
  double worst_f = 0;
  for (double x : xs) {
    if (!(std::fabs(x) < 1)) continue;
    const long double ref = erfinv_reference(x);
    const double d = erfinv(x);
    if (ref != 0) worst_d = std::max(worst_d, static_cast<double>(std::fabs((d - ref) / ref)));
    const float xf = static_cast<float>(x);
    if (!(std::fabs(xf) < 1) || xf == 0) continue;
    const long double rf = erfinv_reference(xf);
    const float r = static_cast<float>(rf);
    const double ulp = std::nextafter(std::fabs(r), std::numeric_limits<float>::infinity()) - std::fabs(r);
    worst_f = std::max(worst_f, static_cast<double>(std::fabs(erfinv(xf) - rf)) / ulp);
  }
  EXPECT_LT(worst_d, 1e-15);
  EXPECT_LE(worst_f, 0.51);
  EXPECT_EQ(erfinv(0.0), 0.0);
  EXPECT_EQ(erfinv(1.0), std::numeric_limits<double>::infinity());
  EXPECT_EQ(erfinv(-1.0f), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(erfinv(1.5)));
  EXPECT_TRUE(std::isnan(erfinv(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(erfinv(-0.3), -erfinv(0.3));
  EXPECT_NEAR(erfinv(0.5), 0.47693627620446987338, 3e-16);
}

// JAX's normal: u = uniform(key, lo = nextafter(-1, 0), hi = 1), value sqrt(2) * erfinv(u).
TEST(RandomNormal, IsSqrt2ErfinvOfJaxUniform) {
  const Shape shape{2000};
  const Key k = key(11);
  const auto ud = uniform_box<double>(k, shape, full_box(shape), std::nextafter(-1.0, 0.0), 1.0);
  const auto nd = normal_box<double>(k, shape, full_box(shape));
  const auto uf = uniform_box<float>(k, shape, full_box(shape), std::nextafter(-1.0f, 0.0f), 1.0f);
  const auto nf = normal_box<float>(k, shape, full_box(shape));
  const double sqrt2 = std::sqrt(2.0);
  for (std::int64_t i = 0; i < 2000; ++i) {
    EXPECT_EQ(nd.flat(i), sqrt2 * erfinv(ud.flat(i))) << i;
    EXPECT_EQ(nf.flat(i), static_cast<float>(sqrt2 * erfinv(static_cast<double>(uf.flat(i))))) << i;
  }
}

// ---- distributions ------------------------------------------------------------------------

template <typename T>
void moments(const Tensor<T>& t, double& mean, double& var) {
  mean = 0;
  for (T v : t) mean += static_cast<double>(v);
  mean /= static_cast<double>(t.size());
  var = 0;
  for (T v : t) var += (static_cast<double>(v) - mean) * (static_cast<double>(v) - mean);
  var /= static_cast<double>(t.size() - 1);
}

// Tolerances are 5 standard errors for n = 1e5.
TEST(RandomStats, UniformMeanAndVariance) {
  const Shape shape{100000};
  double mean = 0;
  double var = 0;
  moments(uniform_box<double>(key(5), shape, full_box(shape)), mean, var);
  EXPECT_NEAR(mean, 0.5, 0.0046);
  EXPECT_NEAR(var, 1.0 / 12, 0.0012);
  moments(uniform_box<float>(key(6), shape, full_box(shape), -2.0f, 2.0f), mean, var);
  EXPECT_NEAR(mean, 0.0, 0.019);
  EXPECT_NEAR(var, 16.0 / 12, 0.019);
}

TEST(RandomStats, NormalMeanVarianceAndOneSigma) {
  const Shape shape{100000};
  for (int dtype = 0; dtype < 2; ++dtype) {
    double mean = 0;
    double var = 0;
    std::int64_t within = 0;
    if (dtype == 0) {
      const auto t = normal_box<float>(key(8), shape, full_box(shape));
      moments(t, mean, var);
      for (float v : t) within += std::fabs(v) <= 1.0f;
    } else {
      const auto t = normal_box<double>(key(9), shape, full_box(shape));
      moments(t, mean, var);
      for (double v : t) within += std::fabs(v) <= 1.0;
    }
    EXPECT_NEAR(mean, 0.0, 0.016) << dtype;
    EXPECT_NEAR(var, 1.0, 0.023) << dtype;
    EXPECT_NEAR(static_cast<double>(within) / 1e5, 0.682689, 0.0074) << dtype;
  }
}

TEST(RandomStats, BernoulliRate) {
  const Shape shape{100000};
  for (double p : {0.1, 0.3, 0.5, 0.9}) {
    const auto t = bernoulli_box(key(12), p, shape, full_box(shape));
    std::int64_t ones = 0;
    for (std::int32_t v : t) {
      EXPECT_TRUE(v == 0 || v == 1);
      ones += v;
    }
    EXPECT_NEAR(static_cast<double>(ones) / 1e5, p, 5 * std::sqrt(p * (1 - p) / 1e5)) << p;
  }
  for (std::int32_t v : bernoulli_box(key(12), 0.0, Shape{1000}, full_box(Shape{1000}))) EXPECT_EQ(v, 0);
  for (std::int32_t v : bernoulli_box(key(12), 1.0, Shape{1000}, full_box(Shape{1000}))) EXPECT_EQ(v, 1);
}

TEST(RandomStats, BitsAreBalanced) {
  const Shape shape{100000};
  const auto t = bits_box(key(13), shape, full_box(shape));
  std::int64_t set[32] = {};
  for (std::int64_t v : t) {
    EXPECT_TRUE(v >= 0 && v <= 0xffffffffll);
    for (int b = 0; b < 32; ++b) set[b] += (v >> b) & 1;
  }
  for (int b = 0; b < 32; ++b) EXPECT_NEAR(static_cast<double>(set[b]) / 1e5, 0.5, 0.008) << "bit " << b;
}

// ---- permutation --------------------------------------------------------------------------

TEST(RandomPermutation, IsAPermutationAndDependsOnTheKey) {
  for (std::int64_t n : {0, 1, 2, 10, 1000}) {
    const auto p = permutation(key(1), n);
    ASSERT_EQ(p.shape(), Shape{n});
    std::vector<std::int64_t> sorted(p.begin(), p.end());
    std::sort(sorted.begin(), sorted.end());
    std::vector<std::int64_t> iota(static_cast<std::size_t>(n));
    std::iota(iota.begin(), iota.end(), 0);
    EXPECT_EQ(sorted, iota) << n;
    EXPECT_TRUE(p == permutation(key(1), n)) << n;
  }
  const auto a = permutation(key(1), 1000);
  const auto b = permutation(key(2), 1000);
  const auto c = permutation(fold_in(key(1), 1), 1000);
  EXPECT_FALSE(a == b);
  EXPECT_FALSE(a == c);
  std::int64_t fixed = 0;
  for (std::int64_t i = 0; i < 1000; ++i) fixed += a.flat(i) == i;
  EXPECT_LT(fixed, 8);  // a uniform permutation has ~1 fixed point
  EXPECT_THROW(permutation(key(1), -1), ValueError);
}

// All 24 orderings of 4 elements over 48000 keys: a chi-squared test (23 degrees of
// freedom; 60 is far beyond the 0.9999 quantile, ~52).
TEST(RandomPermutation, OrderingsAreUniform) {
  std::map<std::vector<std::int64_t>, int> counts;
  const int trials = 48000;
  for (int t = 0; t < trials; ++t) {
    const auto p = permutation(fold_in(key(77), static_cast<std::uint32_t>(t)), 4);
    ++counts[std::vector<std::int64_t>(p.begin(), p.end())];
  }
  ASSERT_EQ(counts.size(), 24u);
  const double expected = trials / 24.0;
  double chi2 = 0;
  for (const auto& [perm, c] : counts) chi2 += (c - expected) * (c - expected) / expected;
  EXPECT_LT(chi2, 60.0);
}

// Where element 0 of 0..n-1 lands, over many keys: uniform over the n positions.
TEST(RandomPermutation, PositionsAreUniform) {
  const int n = 50;
  const int trials = 20000;
  std::vector<int> where(n, 0);
  for (int t = 0; t < trials; ++t) {
    const auto p = permutation(fold_in(key(5), static_cast<std::uint32_t>(t)), n);
    for (int i = 0; i < n; ++i)
      if (p.flat(i) == 0) ++where[i];
  }
  const double expected = static_cast<double>(trials) / n;
  double chi2 = 0;
  for (int c : where) chi2 += (c - expected) * (c - expected) / expected;
  EXPECT_LT(chi2, 100.0);  // 49 degrees of freedom: 0.9999 quantile ~ 90
}

}  // namespace
}  // namespace shard::random
