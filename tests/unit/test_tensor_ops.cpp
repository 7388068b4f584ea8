// The local op set (tensor_ops.hpp, array_ops.hpp) against naive host references written
// here independently: loops over multi-indices in float64. Random data, every dtype, numpy
// broadcasting with size-1, missing and empty dims, JAX's dtype promotion.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <type_traits>

#include "shard/core/tensor_ops.hpp"
#include "shard/ops/nn.hpp"
#include "shard/error.hpp"

namespace shard {
namespace {

// ---------------------------------------------------------------- helpers

template <typename T>
Tensor<T> rnd(const Shape& shape, std::uint64_t seed, double lo = -10, double hi = 10) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  Tensor<T> t(shape);
  for (auto& v : t) {
    const double x = u(g);
    if constexpr (std::is_same_v<T, bool>) v = x > (lo + hi) / 2;
    else if constexpr (std::is_integral_v<T>) v = static_cast<T>(std::llround(x));
    else v = static_cast<T>(x);
  }
  return t;
}

void next(Shape& idx, const Shape& shape) {
  for (int d = static_cast<int>(idx.size()) - 1; d >= 0; --d) {
    if (++idx[d] < shape[d]) return;
    idx[d] = 0;
  }
}

/// Flat offset of the broadcast index `idx` (of the output's rank) in an array of shape s.
std::int64_t at(const Shape& s, const Shape& idx) {
  const std::size_t lead = idx.size() - s.size();
  std::int64_t off = 0;
  for (std::size_t k = 0; k < s.size(); ++k) off = off * s[k] + (s[k] == 1 ? 0 : idx[k + lead]);
  return off;
}

Shape bshape(const Shape& a, const Shape& b) {
  const std::size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t da = i + a.size() >= n ? a[i + a.size() - n] : 1;
    const std::int64_t db = i + b.size() >= n ? b[i + b.size() - n] : 1;
    out[i] = da == 1 ? db : da;
  }
  return out;
}

template <typename R, typename A, typename B, typename F>
Tensor<R> ref_zip(const Tensor<A>& a, const Tensor<B>& b, F f) {
  const Shape out = bshape(a.shape(), b.shape());
  Tensor<R> r(out);
  Shape idx(out.size(), 0);
  for (std::int64_t i = 0; i < r.size(); ++i, next(idx, out)) r.flat(i) = static_cast<R>(f(a.flat(at(a.shape(), idx)), b.flat(at(b.shape(), idx))));
  return r;
}

template <typename T, typename U>
void expect_near(const Tensor<T>& got, const Tensor<U>& want, double rtol, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  std::int64_t bad = 0, first = -1;
  for (std::int64_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got.flat(i)), w = static_cast<double>(want.flat(i));
    const bool ok = (std::isnan(g) && std::isnan(w)) || g == w || std::abs(g - w) <= rtol * std::max(1.0, std::abs(w));
    if (!ok && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0) << what << ": first mismatch at " << first << ": got "
                    << (first >= 0 ? static_cast<double>(got.flat(first)) : 0) << " want "
                    << (first >= 0 ? static_cast<double>(want.flat(first)) : 0);
}

template <typename T>
double tol() {
  return std::is_same_v<T, float> ? 2e-6 : std::is_same_v<T, double> ? 1e-14 : 0;
}

/// Operand shape pairs that broadcast: equal, row onto a matrix, column, outer, missing
/// leading dims, 0-d, empty dims.
const std::vector<std::pair<Shape, Shape>>& shape_pairs() {
  static const std::vector<std::pair<Shape, Shape>> pairs = {
      {{5, 7}, {5, 7}}, {{5, 7}, {7}},       {{7}, {5, 7}},          {{5, 1}, {1, 7}},       {{3, 4, 5}, {4, 1}},
      {{}, {3, 2}},     {{3, 2}, {}},        {{2, 1, 3}, {4, 1}},    {{0, 3}, {3}},          {{2, 0}, {1, 1}},
      {{1}, {1}},       {{130}, {130}},      {{2, 3, 1, 4}, {3, 5, 1}}, {{6, 1, 1}, {1, 1, 9}}};
  return pairs;
}

// ---------------------------------------------------------------- promotion

TEST(TensorOpsPromotion, JaxLattice) {
  const Tensor<std::int32_t> i32({2}, 1);
  const Tensor<std::int64_t> i64({2}, 1);
  const Tensor<float> f32({2}, 1.f);
  const Tensor<double> f64({2}, 1.0);
  const Tensor<bool> b({2}, true);
  static_assert(std::is_same_v<decltype(i32 + f32), Tensor<float>>);
  static_assert(std::is_same_v<decltype(i64 + f32), Tensor<float>>);  // JAX, not numpy's float64
  static_assert(std::is_same_v<decltype(i32 + i64), Tensor<std::int64_t>>);
  static_assert(std::is_same_v<decltype(b + i32), Tensor<std::int32_t>>);
  static_assert(std::is_same_v<decltype(f32 * f64), Tensor<double>>);
  static_assert(std::is_same_v<decltype(b * b), Tensor<bool>>);
  // Weak scalars: the array's type unless the scalar is of a higher kind.
  static_assert(std::is_same_v<decltype(f32 * 2.5), Tensor<float>>);
  static_assert(std::is_same_v<decltype(i32 * 2), Tensor<std::int32_t>>);
  static_assert(std::is_same_v<decltype(i32 * 2.5f), Tensor<float>>);
  static_assert(std::is_same_v<decltype(i32 * 2.5), Tensor<double>>);
  static_assert(std::is_same_v<decltype(b + 1), Tensor<std::int32_t>>);
  // True division and means are floating.
  static_assert(std::is_same_v<decltype(i32 / i32), Tensor<float>>);
  static_assert(std::is_same_v<decltype(i64 / 2), Tensor<double>>);
  static_assert(std::is_same_v<decltype(mean(i32)), Tensor<float>>);
  static_assert(std::is_same_v<decltype(sum(b)), Tensor<std::int32_t>>);
  static_assert(std::is_same_v<decltype(exp(i32)), Tensor<float>>);
  static_assert(std::is_same_v<decltype(i32 < f32), Tensor<bool>>);
  static_assert(std::is_same_v<decltype(where(b, i32, 1.5)), Tensor<double>>);
  static_assert(std::is_same_v<decltype(matmul(i32.reshaped({1, 2}), f32.reshaped({2, 1}))), Tensor<float>>);
  EXPECT_EQ((i32 + f32).flat(0), 2.f);
  EXPECT_EQ((b + 1).flat(1), 2);
  const Tensor<std::int32_t> seven({1}, 7);
  EXPECT_FLOAT_EQ((seven / 2).flat(0), 3.5f);
}

// The one dtype list (SHARD_DTYPE_TABLE) and what is derived from it.
#define SHARD_TEST_COUNT(T) +1
#define SHARD_TEST_COUNT2(T, U) +1
#define SHARD_TEST_PAIR(T, U) +static_cast<int>(sizeof(T) * 100 + sizeof(U))
TEST(TensorOpsPromotion, OneDtypeList) {
  static_assert(std::is_same_v<AllDtypes, TypeList<bool, std::int32_t, std::int64_t, bfloat16, float, double>>);
  static_assert(std::is_same_v<NumericDtypes, TypeList<std::int32_t, std::int64_t, bfloat16, float, double>>);
  static_assert(std::is_same_v<IntDtypes, TypeList<std::int32_t, std::int64_t>>);
  static_assert(std::is_same_v<FloatDtypes, TypeList<bfloat16, float, double>>);
  static_assert(Dtype<bool> && Dtype<double> && !Dtype<char> && !Dtype<std::uint16_t>);
  static_assert(FloatDtype<float> && FloatDtype<bfloat16> && !FloatDtype<std::int64_t>);
  static_assert(0 SHARD_FOR_EACH_DTYPE(SHARD_TEST_COUNT) == 6);
  static_assert(0 SHARD_FOR_EACH_NUMERIC_DTYPE(SHARD_TEST_COUNT) == 5);
  static_assert(0 SHARD_FOR_EACH_INT_DTYPE(SHARD_TEST_COUNT) == 2);
  static_assert(0 SHARD_FOR_EACH_FLOAT_DTYPE(SHARD_TEST_COUNT) == 3);
  // (bfloat16, float, double) x (int32, int64): 204 + 208 + 404 + 408 + 804 + 808.
  static_assert(0 SHARD_FOR_EACH_DTYPE_PAIR(FLOAT, INT, SHARD_TEST_PAIR) == 2836);
  static_assert(0 SHARD_FOR_EACH_DTYPE_PAIR(ALL, ALL, SHARD_TEST_COUNT2) == 36);
  EXPECT_STREQ(dtype_name<std::int64_t>(), "int64");
  EXPECT_STREQ(dtype_npy_descr<float>(), "<f4");
  std::string seen;
  for_each_dtype([&]<typename T>(std::type_identity<T>) { seen += std::string(dtype_name<T>()) + " "; });
  EXPECT_EQ(seen, "bool int32 int64 bfloat16 float32 float64 ");
  EXPECT_STREQ(dtype_npy_descr<bfloat16>(), "<V2");
  std::size_t size = 0;
  EXPECT_TRUE(visit_dtype("float64", [&]<typename T>(std::type_identity<T>) { size = sizeof(T); }));
  EXPECT_EQ(size, sizeof(double));
  EXPECT_FALSE(visit_dtype("float16", [](auto) {}));
  EXPECT_FALSE(visit_dtype<NumericDtypes>("bool", [](auto) {}));
}
#undef SHARD_TEST_PAIR
#undef SHARD_TEST_COUNT2
#undef SHARD_TEST_COUNT

// ---------------------------------------------------------------- binary ops

template <typename T>
class TensorOpsTyped : public ::testing::Test {};
using NumericTypes = ::testing::Types<std::int32_t, std::int64_t, float, double>;
TYPED_TEST_SUITE(TensorOpsTyped, NumericTypes);

TYPED_TEST(TensorOpsTyped, BinaryBroadcasting) {
  using T = TypeParam;
  std::uint64_t seed = 1;
  for (const auto& [sa, sb] : shape_pairs()) {
    const Tensor<T> a = rnd<T>(sa, seed++), b0 = rnd<T>(sb, seed++);
    Tensor<T> b = b0;
    for (auto& v : b)
      if (v == T(0)) v = T(3);  // a safe divisor
    const std::string what = std::string(dtype_name<T>()) + " " + to_string(sa) + " op " + to_string(sb);
    expect_near(a + b, ref_zip<T>(a, b, [](double x, double y) { return x + y; }), tol<T>(), what + " +");
    expect_near(a - b, ref_zip<T>(a, b, [](double x, double y) { return x - y; }), tol<T>(), what + " -");
    expect_near(a * b, ref_zip<T>(a, b, [](double x, double y) { return x * y; }), tol<T>(), what + " *");
    expect_near(a / b, ref_zip<float_of_t<T>>(a, b, [](double x, double y) { return x / y; }), 2e-6, what + " /");
    expect_near(maximum(a, b), ref_zip<T>(a, b, [](double x, double y) { return std::max(x, y); }), 0, what + " max");
    expect_near(minimum(a, b), ref_zip<T>(a, b, [](double x, double y) { return std::min(x, y); }), 0, what + " min");
    expect_near(floor_divide(a, b), ref_zip<T>(a, b, [](double x, double y) { return std::floor(x / y); }), tol<T>(),
                what + " //");
    expect_near(remainder(a, b), ref_zip<T>(a, b, [](double x, double y) { return x - y * std::floor(x / y); }),
                std::is_integral_v<T> ? 0 : 1e-5, what + " %");
    expect_near(a < b, ref_zip<bool>(a, b, [](double x, double y) { return x < y; }), 0, what + " <");
    expect_near(a >= b, ref_zip<bool>(a, b, [](double x, double y) { return x >= y; }), 0, what + " >=");
    expect_near(equal(a, b), ref_zip<bool>(a, b, [](double x, double y) { return x == y; }), 0, what + " ==");
    expect_near(not_equal(a, a), ref_zip<bool>(a, a, [](double, double) { return false; }), 0, what + " !=");
  }
}

TYPED_TEST(TensorOpsTyped, ScalarsOnEitherSide) {
  using T = TypeParam;
  const Tensor<T> a = rnd<T>({4, 9}, 11);
  const T s = static_cast<T>(3);
  const Tensor<T> st(Shape{}, s);
  expect_near(a + s, ref_zip<T>(a, st, [](double x, double y) { return x + y; }), tol<T>(), "a + s");
  expect_near(s - a, ref_zip<T>(st, a, [](double x, double y) { return x - y; }), tol<T>(), "s - a");
  expect_near(s * a, ref_zip<T>(st, a, [](double x, double y) { return x * y; }), tol<T>(), "s * a");
  expect_near(a / s, ref_zip<float_of_t<T>>(a, st, [](double x, double y) { return x / y; }), 2e-6, "a / s");
  expect_near(maximum(a, s), ref_zip<T>(a, st, [](double x, double y) { return std::max(x, y); }), 0, "max(a, s)");
  expect_near(s > a, ref_zip<bool>(st, a, [](double x, double y) { return x > y; }), 0, "s > a");
  expect_near(-a, ref_zip<T>(a, st, [](double x, double) { return -x; }), 0, "-a");
  expect_near(power(a, 2), ref_zip<T>(a, st, [](double x, double) { return x * x; }), tol<T>(), "a ** 2");
}

TEST(TensorOps, IntegerDivisionEdgesAndBoolOps) {
  const Tensor<std::int32_t> a({6}, std::vector<std::int32_t>{7, -7, 7, -7, 5, 0});
  const Tensor<std::int32_t> b({6}, std::vector<std::int32_t>{2, 2, -2, -2, 0, 3});
  const auto q = floor_divide(a, b), r = remainder(a, b);
  EXPECT_EQ(q, Tensor<std::int32_t>({6}, std::vector<std::int32_t>{3, -4, -4, 3, 0, 0}));  // x // 0 is 0
  EXPECT_EQ(r, Tensor<std::int32_t>({6}, std::vector<std::int32_t>{1, 1, -1, -1, 0, 0}));
  const Tensor<bool> t({4}, std::vector<bool>{true, true, false, false});
  const Tensor<bool> u({4}, std::vector<bool>{true, false, true, false});
  EXPECT_EQ(t & u, Tensor<bool>({4}, std::vector<bool>{true, false, false, false}));
  EXPECT_EQ(t | u, Tensor<bool>({4}, std::vector<bool>{true, true, true, false}));
  EXPECT_EQ(t ^ u, Tensor<bool>({4}, std::vector<bool>{false, true, true, false}));
  EXPECT_EQ(~t, Tensor<bool>({4}, std::vector<bool>{false, false, true, true}));
  EXPECT_EQ(t + u, t | u);  // numpy: + on bool is or
  EXPECT_THROW((void)(t - u), ValueError);
  EXPECT_EQ(logical_and(a, b), Tensor<std::int32_t>({6}, std::vector<std::int32_t>{7 & 2, -7 & 2, 7 & -2, -7 & -2, 0, 0}));
  EXPECT_THROW((void)logical_and(Tensor<float>({1}, 1.f), Tensor<float>({1}, 1.f)), ValueError);
}

// ---------------------------------------------------------------- unary ops

TEST(TensorOps, UnaryMathMatchesLibm) {
  const Tensor<double> x = rnd<double>({3, 41}, 21, -3, 3);
  const Tensor<float> xf = astype<float>(x);
  const Tensor<double> pos = abs(x) + 0.5;
  using F = double (*)(double);
  const std::vector<std::tuple<const char*, Tensor<double>, Tensor<float>, const Tensor<double>*, F>> cases = {
      {"exp", exp(x), exp(xf), &x, [](double v) { return std::exp(v); }},
      {"log", log(pos), log(astype<float>(pos)), &pos, [](double v) { return std::log(v); }},
      {"log1p", log1p(pos), log1p(astype<float>(pos)), &pos, [](double v) { return std::log1p(v); }},
      {"expm1", expm1(x), expm1(xf), &x, [](double v) { return std::expm1(v); }},
      {"sqrt", sqrt(pos), sqrt(astype<float>(pos)), &pos, [](double v) { return std::sqrt(v); }},
      {"rsqrt", rsqrt(pos), rsqrt(astype<float>(pos)), &pos, [](double v) { return 1 / std::sqrt(v); }},
      {"sin", sin(x), sin(xf), &x, [](double v) { return std::sin(v); }},
      {"cos", cos(x), cos(xf), &x, [](double v) { return std::cos(v); }},
      {"tanh", tanh(x), tanh(xf), &x, [](double v) { return std::tanh(v); }},
      {"sigmoid", sigmoid(x), sigmoid(xf), &x, [](double v) { return 1 / (1 + std::exp(-v)); }},
      {"erf", erf(x), erf(xf), &x, [](double v) { return std::erf(v); }},
      {"reciprocal", reciprocal(pos), reciprocal(astype<float>(pos)), &pos, [](double v) { return 1 / v; }},
      {"abs", abs(x), abs(xf), &x, [](double v) { return std::abs(v); }},
      {"negative", negative(x), negative(xf), &x, [](double v) { return -v; }},
      {"square", square(x), square(xf), &x, [](double v) { return v * v; }},
      {"relu", relu(x), relu(xf), &x, [](double v) { return v > 0 ? v : 0.0; }},
      {"sign", sign(x), sign(xf), &x, [](double v) { return double((v > 0) - (v < 0)); }},
      {"floor", floor(x), floor(xf), &x, [](double v) { return std::floor(v); }},
      {"ceil", ceil(x), ceil(xf), &x, [](double v) { return std::ceil(v); }},
      {"round", round(x), round(xf), &x, [](double v) { return std::nearbyint(v); }},
  };
  for (const auto& [name, got, got_f, in, f] : cases) {
    Tensor<double> want(in->shape());
    for (std::int64_t i = 0; i < want.size(); ++i) want.flat(i) = f((*in).flat(i));
    expect_near(got, want, 1e-14, std::string(name) + " float64");
    if (std::string(name) != "round" && std::string(name) != "floor" && std::string(name) != "ceil")
      expect_near(got_f, want, 3e-6, std::string(name) + " float32");
  }
  // Integers: the type-keeping ops stay integer; transcendental ops become float32.
  const Tensor<std::int32_t> xi = rnd<std::int32_t>({17}, 22);
  static_assert(std::is_same_v<decltype(abs(xi)), Tensor<std::int32_t>>);
  expect_near(abs(xi), ref_zip<std::int32_t>(xi, xi, [](double v, double) { return std::abs(v); }), 0, "abs int32");
  expect_near(sqrt(abs(xi)), ref_zip<float>(xi, xi, [](double v, double) { return std::sqrt(std::abs(v)); }), 2e-6,
              "sqrt int32");
  EXPECT_EQ(isnan(Tensor<double>({3}, std::vector<double>{1.0, NAN, INFINITY})),
            Tensor<bool>({3}, std::vector<bool>{false, true, false}));
  EXPECT_EQ(isfinite(Tensor<double>({3}, std::vector<double>{1.0, NAN, -INFINITY})),
            Tensor<bool>({3}, std::vector<bool>{true, false, false}));
}

TEST(TensorOps, WhereAndClip) {
  std::uint64_t seed = 31;
  for (const auto& [sa, sb] : shape_pairs()) {
    const Tensor<double> a = rnd<double>(sa, seed++);
    const Tensor<float> b = rnd<float>(sb, seed++);
    const Tensor<bool> c = a > 0.0;
    const auto w = where(c, a, b);  // promotes to float64
    static_assert(std::is_same_v<decltype(w), const Tensor<double>>);
    const Shape out = bshape(sa, sb);
    Tensor<double> want(out);
    Shape idx(out.size(), 0);
    for (std::int64_t i = 0; i < want.size(); ++i, next(idx, out))
      want.flat(i) = c.flat(at(sa, idx)) ? a.flat(at(sa, idx)) : static_cast<double>(b.flat(at(sb, idx)));
    expect_near(w, want, 0, "where " + to_string(sa) + " " + to_string(sb));
  }
  const Tensor<float> x = rnd<float>({50}, 39);
  const auto y = clip(x, -2.0f, 3.0f);
  for (std::int64_t i = 0; i < x.size(); ++i) EXPECT_EQ(y.flat(i), std::min(std::max(x.flat(i), -2.0f), 3.0f));
  const auto z = where(x > 0.f, 1, 0);  // two scalars: an int32 array of the condition's shape
  static_assert(std::is_same_v<decltype(z), const Tensor<std::int32_t>>);
  for (std::int64_t i = 0; i < x.size(); ++i) EXPECT_EQ(z.flat(i), x.flat(i) > 0 ? 1 : 0);
  // Large arrays with each operand a scalar (the fast paths): nothing past a scalar is read.
  const Tensor<float> big = rnd<float>({200000}, 40), other = rnd<float>({200000}, 41);
  const Tensor<bool> cb = big > 0.f;
  const auto s1 = where(cb, 2.5f, other), s2 = where(cb, other, -1.5f), s3 = where(cb, 2.5f, -1.5f);
  for (std::int64_t i = 0; i < big.size(); ++i) {
    EXPECT_EQ(s1.flat(i), cb.flat(i) ? 2.5f : other.flat(i));
    EXPECT_EQ(s2.flat(i), cb.flat(i) ? other.flat(i) : -1.5f);
    EXPECT_EQ(s3.flat(i), cb.flat(i) ? 2.5f : -1.5f);
  }
}

// ---------------------------------------------------------------- reductions

/// Host reference of a reduction over `dims` in float64.
Tensor<double> ref_reduce(const Tensor<double>& x, std::vector<int> dims, ReduceKind kind, bool keepdims) {
  if (dims.empty())
    for (int d = 0; d < x.rank(); ++d) dims.push_back(d);
  for (auto& d : dims) d = d < 0 ? d + x.rank() : d;
  Shape out;
  std::int64_t count = 1;
  for (int d = 0; d < x.rank(); ++d) {
    const bool r = std::find(dims.begin(), dims.end(), d) != dims.end();
    if (r) count *= x.shape()[d];
    if (!r) out.push_back(x.shape()[d]);
    else if (keepdims) out.push_back(1);
  }
  const double init = kind == ReduceKind::kMax   ? -INFINITY
                      : kind == ReduceKind::kMin ? INFINITY
                      : kind == ReduceKind::kProd ? 1.0
                                                 : 0.0;
  Tensor<double> r(out, init);
  Shape idx(x.rank(), 0);
  for (std::int64_t i = 0; i < x.size(); ++i, next(idx, x.shape())) {
    std::int64_t o = 0;
    for (int d = 0, k = 0; d < x.rank(); ++d) {
      const bool red = std::find(dims.begin(), dims.end(), d) != dims.end();
      if (!red) o = o * out[k++] + idx[d];
      else if (keepdims) ++k;
    }
    double& v = r.flat(o);
    switch (kind) {
      case ReduceKind::kMax: v = std::max(v, x.flat(i)); break;
      case ReduceKind::kMin: v = std::min(v, x.flat(i)); break;
      case ReduceKind::kProd: v *= x.flat(i); break;
      default: v += x.flat(i);
    }
  }
  if (kind == ReduceKind::kMean)
    for (auto& v : r) v /= static_cast<double>(count);
  return r;
}

TYPED_TEST(TensorOpsTyped, ReductionsOverEveryDimSet) {
  using T = TypeParam;
  std::uint64_t seed = 41;
  for (const Shape& shape : {Shape{3, 1, 4, 5}, Shape{7}, Shape{}, Shape{2, 300}, Shape{300, 3}, Shape{2, 0, 3}}) {
    const Tensor<T> x = rnd<T>(shape, seed++, -2, 2);
    const Tensor<double> xd = astype<double>(x);
    const int rank = x.rank();
    for (int mask = 0; mask < (1 << rank); ++mask) {
      std::vector<int> dims;
      for (int d = 0; d < rank; ++d)
        if (mask & (1 << d)) dims.push_back(d - (d % 2) * rank);  // odd dims counted from the end
      bool empty = dims.empty() && x.size() == 0;
      for (int d : dims) empty = empty || shape[(d + rank) % rank] == 0;
      for (bool keep : {false, true}) {
        const std::string what = std::string(dtype_name<T>()) + to_string(shape) + " mask " + std::to_string(mask) +
                                 (keep ? " keepdims" : "");
        const Dims ds = dims.empty() ? Dims() : Dims(dims);
        const double t = std::is_same_v<T, float> ? 1e-5 : 1e-12;
        expect_near(sum(x, ds, keep), ref_reduce(xd, dims, ReduceKind::kSum, keep), t, what + " sum");
        expect_near(mean(x, ds, keep), ref_reduce(xd, dims, ReduceKind::kMean, keep), 1e-5, what + " mean");
        if (!empty) {
          expect_near(max(x, ds, keep), ref_reduce(xd, dims, ReduceKind::kMax, keep), 0, what + " max");
          expect_near(min(x, ds, keep), ref_reduce(xd, dims, ReduceKind::kMin, keep), 0, what + " min");
        } else if (!dims.empty() || rank > 0) {
          EXPECT_THROW((void)max(x, ds, keep), ValueError) << what;
        }
        const Tensor<T> small = clip(x, T(-1), T(1)) + (std::is_integral_v<T> ? T(0) : T(0));
        expect_near(prod(small, ds, keep), ref_reduce(astype<double>(small), dims, ReduceKind::kProd, keep), 1e-5,
                    what + " prod");
      }
    }
  }
}

TEST(TensorOps, AnyAllArgmaxArgmin) {
  const Tensor<std::int32_t> x({3, 4}, std::vector<std::int32_t>{0, 0, 1, 0, 2, 5, 5, -1, -3, -3, -3, -3});
  EXPECT_EQ(any(x, 1), Tensor<bool>({3}, std::vector<bool>{true, true, true}));
  EXPECT_EQ(all(x, 1), Tensor<bool>({3}, std::vector<bool>{false, true, true}));
  EXPECT_EQ(any(x > 4, 0), Tensor<bool>({4}, std::vector<bool>{false, true, true, false}));
  EXPECT_EQ(argmax(x, 1), Tensor<std::int64_t>({3}, std::vector<std::int64_t>{2, 1, 0}));  // first of ties
  EXPECT_EQ(argmin(x, 0), Tensor<std::int64_t>({4}, std::vector<std::int64_t>{2, 2, 2, 2}));
  EXPECT_EQ(argmax(x, -1, true).shape(), (Shape{3, 1}));
  EXPECT_EQ(argmax(x).item(), 5);  // flattened
  const Tensor<double> n({4}, std::vector<double>{1.0, NAN, 3.0, NAN});
  EXPECT_EQ(argmax(n).item(), 1);  // numpy: the first nan
  EXPECT_TRUE(std::isnan(max(n).item()));
  EXPECT_THROW((void)argmax(Tensor<float>({0, 3}), 0), ValueError);
  EXPECT_THROW((void)sum(x, {0, 0}), ShapeError);
  EXPECT_THROW((void)sum(x, 2), ShapeError);
}

TEST(TensorOps, Float32SumIsAccurate) {
  // 3M values in [0, 1): numpy's pairwise sum is ~1e-7 off float64; a sequential float32
  // loop is ~3e-3 off. Along the last dim (contiguous) and along dim 0 (rows).
  const std::int64_t n = 3'000'000;
  const Tensor<float> x = rnd<float>({n}, 51, 0, 1);
  double ref = 0;
  for (auto v : x) ref += static_cast<double>(v);
  EXPECT_LT(std::abs(sum(x).item() - ref) / ref, 1e-6);
  EXPECT_LT(std::abs(mean(x).item() - ref / n) / (ref / n), 1e-6);
  const Tensor<float> rows = x.reshaped({n / 3, 3});
  const Tensor<float> s0 = sum(rows, 0);
  for (int j = 0; j < 3; ++j) {
    double r = 0;
    for (std::int64_t i = 0; i < n / 3; ++i) r += rows.flat(i * 3 + j);
    EXPECT_LT(std::abs(s0.flat(j) - r) / r, 1e-6) << "column " << j;
  }
  const Tensor<float> v = vdot(x, x);
  double rv = 0;
  for (auto e : x) rv += static_cast<double>(e) * e;
  EXPECT_LT(std::abs(v.item() - rv) / rv, 1e-6);
}

/// Inclusive prefix sums along `dim` (suffix sums when reverse) by loops over multi-indices,
/// each element summed afresh in long double.
template <typename T>
Tensor<double> ref_cumsum(const Tensor<T>& x, int dim, bool reverse = false) {
  const Shape& sh = x.shape();
  const Shape st = strides_of(sh);
  Tensor<double> r(sh);
  Shape idx(sh.size(), 0);
  for (std::int64_t i = 0; i < x.size(); ++i, next(idx, sh)) {
    long double acc = 0;
    const std::int64_t lo = reverse ? idx[dim] : 0, hi = reverse ? sh[dim] : idx[dim] + 1;
    for (std::int64_t j = lo; j < hi; ++j) acc += static_cast<long double>(x.flat(i + (j - idx[dim]) * st[dim]));
    r.flat(i) = static_cast<double>(acc);
  }
  return r;
}

TEST(TensorOps, Cumsum) {
  // Every axis of a 3-D array, negative ones too, and the flattened array (axis=None).
  const Tensor<double> x = rnd<double>({3, 4, 5}, 61);
  for (int axis : {0, 1, 2, -1, -2, -3}) {
    const int d = axis < 0 ? axis + 3 : axis;
    expect_near(cumsum(x, axis), ref_cumsum(x, d), 1e-14, "cumsum axis " + std::to_string(axis));
    expect_near(prefix_sum(x, axis, true), ref_cumsum(x, d, true), 1e-14, "reverse axis " + std::to_string(axis));
  }
  const auto flat = cumsum(x);
  ASSERT_EQ(flat.shape(), (Shape{60}));
  expect_near(flat, ref_cumsum(x.reshaped({60}), 0), 1e-14, "cumsum flattened");
  // Dtypes as sum's: int32 and int64 keep their type (exact), bool counts as int32.
  const Tensor<std::int32_t> xi = rnd<std::int32_t>({6, 7}, 62, -1000, 1000);
  const auto ci = cumsum(xi, 1);
  static_assert(std::is_same_v<decltype(ci), const Tensor<std::int32_t>>);
  expect_near(ci, ref_cumsum(xi, 1), 0, "cumsum int32");
  static_assert(std::is_same_v<decltype(cumsum(Tensor<std::int64_t>({2}, 1), 0)), Tensor<std::int64_t>>);
  const Tensor<bool> xb = rnd<bool>({4, 9}, 63);
  const auto cb = cumsum(xb, 0);
  static_assert(std::is_same_v<decltype(cb), const Tensor<std::int32_t>>);
  expect_near(cb, ref_cumsum(xb, 0), 0, "cumsum bool");
  static_assert(std::is_same_v<decltype(cumsum(xb)), Tensor<std::int32_t>>);
  // int32 wraps on overflow, as in JAX.
  const Tensor<std::int32_t> big({3}, std::vector<std::int32_t>{2147483647, 1, 5});
  EXPECT_EQ(cumsum(big, 0), Tensor<std::int32_t>({3}, std::vector<std::int32_t>{2147483647, -2147483647 - 1, -2147483643}));
  // float32 accumulates in float64: a million values in [0, 1) stay within float32 rounding of
  // the exact prefix sums (a float32 running sum drifts by ~1e-4 relative).
  const Tensor<float> xf = rnd<float>({1'000'000}, 64, 0, 1);
  const auto cf = cumsum(xf, 0);
  double acc = 0, worst = 0;
  for (std::int64_t i = 0; i < xf.size(); ++i) {
    acc += static_cast<double>(xf.flat(i));
    worst = std::max(worst, std::abs(cf.flat(i) - acc) / acc);
  }
  EXPECT_LT(worst, 1e-7);
  // Empty dims, size-1 dims, a 0-d array (axis=None gives shape (1,)), bad axes.
  EXPECT_EQ(cumsum(Tensor<float>({0, 3}), 0).shape(), (Shape{0, 3}));
  EXPECT_EQ(cumsum(Tensor<float>({2, 0}), 0).shape(), (Shape{2, 0}));
  expect_near(cumsum(x.reshaped({3, 1, 20}), 1), x.reshaped({3, 1, 20}), 0, "cumsum over a size-1 dim");
  EXPECT_EQ(cumsum(Tensor<double>(Shape{}, 2.5)), Tensor<double>({1}, 2.5));
  EXPECT_THROW((void)cumsum(Tensor<double>(Shape{}, 2.5), 0), ShapeError);
  EXPECT_THROW((void)cumsum(x, 3), ShapeError);
  EXPECT_THROW((void)cumsum(x, -4), ShapeError);
  EXPECT_THROW((void)prefix_sum(xb, 0), ValueError);  // the kernel itself has no bool
}

// ---------------------------------------------------------------- products

Tensor<double> ref_matmul(const Tensor<double>& a, const Tensor<double>& b) {
  // a (.., m, k), b (.., k, n), batch dims broadcast (both at least 2-D here)
  const Shape ab(a.shape().begin(), a.shape().end() - 2), bb(b.shape().begin(), b.shape().end() - 2);
  const Shape batch = bshape(ab, bb);
  const std::int64_t m = a.shape()[a.rank() - 2], k = a.shape().back(), n = b.shape().back();
  Shape out = batch;
  out.push_back(m);
  out.push_back(n);
  Tensor<double> c(out, 0.0);
  Shape idx(batch.size(), 0);
  for (std::int64_t q = 0; q < num_elements(batch); ++q, next(idx, batch))
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (std::int64_t l = 0; l < k; ++l) s += a.flat(at(ab, idx) * m * k + i * k + l) * b.flat(at(bb, idx) * k * n + l * n + j);
        c.flat((q * m + i) * n + j) = s;
      }
  return c;
}

TYPED_TEST(TensorOpsTyped, MatmulBatchedAndVectors) {
  using T = TypeParam;
  std::uint64_t seed = 61;
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{3, 4}, {4, 5}}, {{2, 3, 4}, {4, 5}}, {{2, 3, 4}, {2, 4, 5}}, {{1, 3, 4}, {5, 4, 2}},
      {{2, 1, 3, 4}, {3, 4, 2}}, {{0, 4}, {4, 3}}, {{3, 0}, {0, 2}}, {{64, 33}, {33, 70}}};
  for (const auto& [sa, sb] : cases) {
    const Tensor<T> a = rnd<T>(sa, seed++, -3, 3), b = rnd<T>(sb, seed++, -3, 3);
    expect_near(matmul(a, b), ref_matmul(astype<double>(a), astype<double>(b)), 1e-5,
                std::string(dtype_name<T>()) + " matmul " + to_string(sa) + " @ " + to_string(sb));
  }
  const Tensor<T> v = rnd<T>({4}, seed++), m = rnd<T>({4, 5}, seed++), w = rnd<T>({3, 4}, seed++);
  expect_near(matmul(v, m), reshape(ref_matmul(astype<double>(v).reshaped({1, 4}), astype<double>(m)), {5}), 1e-5, "vec @ mat");
  expect_near(matmul(w, v), reshape(ref_matmul(astype<double>(w), astype<double>(v).reshaped({4, 1})), {3}), 1e-5, "mat @ vec");
  expect_near(matmul(v, v), sum(astype<double>(v) * astype<double>(v)), 1e-5, "vec @ vec");
  expect_near(dot(w, v), matmul(w, v), 0, "dot = matmul for 2-D @ 1-D");
  expect_near(vdot(w, w), sum(astype<double>(w) * astype<double>(w)), 1e-6, "vdot");
  const Tensor<T> b3 = rnd<T>({2, 4, 3}, seed++);
  const Tensor<double> d = astype<double>(dot(w, b3));  // (3, 2, 3): numpy's dot over a 3-D b
  ASSERT_EQ(d.shape(), (Shape{3, 2, 3}));
  for (std::int64_t i = 0; i < 3; ++i)
    for (std::int64_t p = 0; p < 2; ++p)
      for (std::int64_t j = 0; j < 3; ++j) {
        double s = 0;
        for (std::int64_t l = 0; l < 4; ++l) s += static_cast<double>(w.flat(i * 4 + l)) * static_cast<double>(b3.flat((p * 4 + l) * 3 + j));
        EXPECT_NEAR(d.flat((i * 2 + p) * 3 + j), s, 1e-4);
      }
  EXPECT_THROW((void)matmul(w, w), ShapeError);
  EXPECT_THROW((void)matmul(Tensor<T>(Shape{}, T(1)), w), ShapeError);
}

// ---------------------------------------------------------------- shape and indexing

TEST(TensorOps, ReshapeTransposeAndFriends) {
  const Tensor<double> x = rnd<double>({2, 3, 4}, 71);
  EXPECT_EQ(reshape(x, {4, -1}).shape(), (Shape{4, 6}));
  EXPECT_EQ(reshape(x, {-1}).shape(), (Shape{24}));
  EXPECT_THROW((void)reshape(x, {5, -1}), ShapeError);
  EXPECT_THROW((void)reshape(x, {-1, -1}), ShapeError);
  EXPECT_THROW((void)reshape(x, {25}), ShapeError);
  const auto t = transpose(x, {2, 0, 1});
  ASSERT_EQ(t.shape(), (Shape{4, 2, 3}));
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) EXPECT_EQ(t(k, i, j), x(i, j, k));
  EXPECT_EQ(transpose(x).shape(), (Shape{4, 3, 2}));
  EXPECT_EQ(swapaxes(x, 0, -1), transpose(x, {2, 1, 0}));
  EXPECT_EQ(moveaxis(x, 0, -1), transpose(x, {1, 2, 0}));
  EXPECT_EQ(expand_dims(x, 1).shape(), (Shape{2, 1, 3, 4}));
  EXPECT_EQ(expand_dims(x, -1).shape(), (Shape{2, 3, 4, 1}));
  EXPECT_EQ(squeeze(reshape(x, {2, 1, 3, 1, 4})).shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(squeeze(reshape(x, {2, 1, 3, 1, 4}), {1}).shape(), (Shape{2, 3, 1, 4}));
  EXPECT_THROW((void)squeeze(x, {0}), ShapeError);
  const auto bt = broadcast_to(Tensor<int>({3, 1}, std::vector<int>{1, 2, 3}), {2, 3, 4});
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) EXPECT_EQ(bt(i, j, k), j + 1);
  EXPECT_THROW((void)broadcast_to(x, {3, 4}), ShapeError);
}

TEST(TensorOps, SlicingLikeNumpy) {
  const Tensor<std::int64_t> x = arange<std::int64_t>(5 * 6 * 7).reshaped({5, 6, 7});
  auto ref = [&](const std::vector<Index>& index) {
    // numpy by hand: every selected index, in order.
    std::vector<std::vector<std::int64_t>> sel(3);
    std::vector<bool> drop(3, false);
    for (int d = 0; d < 3; ++d) {
      const std::int64_t n = x.shape()[d];
      if (d < static_cast<int>(index.size()) && std::holds_alternative<std::int64_t>(index[d])) {
        const std::int64_t i = std::get<std::int64_t>(index[d]);
        sel[d] = {i < 0 ? i + n : i};
        drop[d] = true;
        continue;
      }
      const Slice s = d < static_cast<int>(index.size()) ? std::get<Slice>(index[d]) : Slice();
      const std::int64_t step = s.step;
      std::int64_t start = s.start.is_none() ? (step > 0 ? 0 : n - 1) : s.start.value();
      std::int64_t stop = s.stop.is_none() ? (step > 0 ? n : -n - 1) : s.stop.value();
      if (start < 0) start += n;
      if (stop < 0) stop += n;
      for (std::int64_t i = start; step > 0 ? i < std::min(stop, n) : i > std::max<std::int64_t>(stop, -1); i += step)
        if (i >= 0 && i < n) sel[d].push_back(i);
    }
    std::vector<std::int64_t> vals;
    Shape shape;
    for (int d = 0; d < 3; ++d)
      if (!drop[d]) shape.push_back(static_cast<std::int64_t>(sel[d].size()));
    for (auto i : sel[0])
      for (auto j : sel[1])
        for (auto k : sel[2]) vals.push_back(x(i, j, k));
    return Tensor<std::int64_t>(shape, vals);
  };
  const std::vector<std::vector<Index>> cases = {
      {2}, {-1}, {Slice(1, 4)}, {Slice(None, None, 2)}, {Slice(None, None, -1)}, {1, Slice(2, 5)},
      {Slice(), 3, Slice(None, -2)}, {Slice(-3, None), Slice(4, 1, -1), Slice(None, None, 3)},
      {Slice(10, 20)}, {Slice(3, 1)}, {0, 0, 0}, {Slice(1, None, 2), -2, Slice(6, None, -2)}};
  for (const auto& c : cases) {
    const auto got = slice(x, c);
    const auto want = ref(c);
    EXPECT_EQ(got, want) << "case with " << c.size() << " entries, shape " << to_string(got.shape());
  }
  EXPECT_EQ((x[{1, Slice(2, 5)}]), slice(x, {1, Slice(2, 5)}));
  EXPECT_THROW((void)slice(x, {5}), ShapeError);
  EXPECT_THROW((void)slice(x, {-6}), ShapeError);
  EXPECT_THROW((void)slice(x, {0, 0, 0, 0}), ShapeError);
  EXPECT_THROW((void)slice(x, {Slice(None, None, 0)}), ValueError);
}

TEST(TensorOps, ConcatenateStackTake) {
  const Tensor<float> a = rnd<float>({2, 3}, 81), b = rnd<float>({4, 3}, 82), c = rnd<float>({2, 5}, 83);
  const auto ab = concatenate<float>({a, b}, 0);
  ASSERT_EQ(ab.shape(), (Shape{6, 3}));
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 3; ++j) EXPECT_EQ(ab(i, j), i < 2 ? a(i, j) : b(i - 2, j));
  const auto ac = concatenate<float>({a, c}, -1);
  ASSERT_EQ(ac.shape(), (Shape{2, 8}));
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 8; ++j) EXPECT_EQ(ac(i, j), j < 3 ? a(i, j) : c(i, j - 3));
  EXPECT_THROW((void)concatenate<float>({a, c}, 0), ShapeError);
  const auto s = stack<float>({a, a * 2.f, a * 3.f}, 1);
  ASSERT_EQ(s.shape(), (Shape{2, 3, 3}));
  for (int i = 0; i < 2; ++i)
    for (int k = 0; k < 3; ++k)
      for (int j = 0; j < 3; ++j) EXPECT_EQ(s(i, k, j), a(i, j) * static_cast<float>(k + 1));
  // take: embedding rows by (B, T) indices, negative indices from the end.
  const Tensor<float> table = rnd<float>({10, 4}, 84);
  const Tensor<std::int32_t> idx({2, 3}, std::vector<std::int32_t>{0, 9, -1, 3, 3, -10});
  const auto e = take(table, idx, 0);
  ASSERT_EQ(e.shape(), (Shape{2, 3, 4}));
  for (int p = 0; p < 6; ++p) {
    const int r = idx.flat(p) < 0 ? idx.flat(p) + 10 : idx.flat(p);
    for (int j = 0; j < 4; ++j) EXPECT_EQ(e.flat(p * 4 + j), table(r, j));
  }
  const auto cols = take(table, Tensor<std::int64_t>({2}, std::vector<std::int64_t>{3, 1}), 1);
  ASSERT_EQ(cols.shape(), (Shape{10, 2}));
  for (int i = 0; i < 10; ++i) EXPECT_EQ(cols(i, 0), table(i, 3));
  EXPECT_THROW((void)take(table, Tensor<std::int32_t>({1}, 10), 0), ShapeError);
  // take_along_axis: the label's log-probability of each row.
  const Tensor<std::int32_t> labels({10, 1}, std::vector<std::int32_t>{0, 1, 2, 3, 0, 1, 2, 3, 3, 0});
  const auto picked = take_along_axis(table, labels, 1);
  ASSERT_EQ(picked.shape(), (Shape{10, 1}));
  for (int i = 0; i < 10; ++i) EXPECT_EQ(picked.flat(i), table(i, labels.flat(i)));
  const auto oh = one_hot(Tensor<std::int32_t>({3}, std::vector<std::int32_t>{2, 0, 1}), 4);
  static_assert(std::is_same_v<decltype(oh), const Tensor<float>>);
  EXPECT_EQ(oh, Tensor<float>({3, 4}, std::vector<float>{0, 0, 1, 0, 1, 0, 0, 0, 0, 1, 0, 0}));
}

TEST(TensorOps, GeluAndStandardize) {
  const Tensor<double> x = rnd<double>({5, 6}, 93, -4, 4);
  const auto ga = gelu(x), ge = gelu(x, false);
  const Tensor<float> xf = rnd<float>({3, 4}, 94, -4, 4);
  static_assert(std::is_same_v<decltype(gelu(xf)), Tensor<float>>);
  for (std::int64_t i = 0; i < x.size(); ++i) {
    const double v = x.flat(i);
    EXPECT_NEAR(ga.flat(i), 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))), 1e-14);
    EXPECT_NEAR(ge.flat(i), 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))), 1e-14);
  }
  // float32: tanh and gelu's rational tanh (XLA's) within a few ulp of the double formulas,
  // and gelu's derivative (its VJP's kernel) against a central difference in double.
  const Tensor<float> wide = rnd<float>({2000}, 95, -10, 10);
  const auto tf = tanh(wide), gf = gelu(wide), dg = unary(wide, UnaryOp::kGeluGrad);
  for (std::int64_t i = 0; i < wide.size(); ++i) {
    const double v = wide.flat(i);
    auto g = [](double u) { return 0.5 * u * (1 + std::tanh(std::sqrt(2 / M_PI) * (u + 0.044715 * u * u * u))); };
    EXPECT_NEAR(tf.flat(i), std::tanh(v), 4e-7 * std::abs(std::tanh(v)) + 1e-12) << v;
    EXPECT_NEAR(gf.flat(i), g(v), 1e-6 * std::max(1.0, std::abs(v))) << v;
    EXPECT_NEAR(dg.flat(i), (g(v + 1e-5) - g(v - 1e-5)) / 2e-5, 1e-5) << v;  // float32: 1 - t^2 cancels for |x| > 4
  }
  EXPECT_TRUE(std::isnan(tanh(Tensor<float>({1}, NAN)).flat(0)));
  const auto s = standardize(x, 1, 1e-5);
  for (int i = 0; i < 5; ++i) {
    double m = 0, var = 0;
    for (int j = 0; j < 6; ++j) m += x(i, j) / 6;
    for (int j = 0; j < 6; ++j) var += (x(i, j) - m) * (x(i, j) - m) / 6;
    for (int j = 0; j < 6; ++j) EXPECT_NEAR(s(i, j), (x(i, j) - m) / std::sqrt(var + 1e-5), 1e-12);
  }
}

TEST(TensorOps, SoftmaxFamily) {
  Tensor<float> x = rnd<float>({4, 7}, 91, -20, 20);
  for (int j = 0; j < 7; ++j) x(3, j) = -INFINITY;  // an all -inf row
  x(2, 0) = 80.f;                                    // exp would overflow unshifted
  const auto sm = softmax(x), lsm = log_softmax(x);
  const auto lse = logsumexp(x, -1);
  for (int i = 0; i < 3; ++i) {
    double m = -INFINITY, s = 0;
    for (int j = 0; j < 7; ++j) m = std::max(m, static_cast<double>(x(i, j)));
    for (int j = 0; j < 7; ++j) s += std::exp(x(i, j) - m);
    EXPECT_NEAR(lse.flat(i), m + std::log(s), 1e-4);
    for (int j = 0; j < 7; ++j) {
      EXPECT_NEAR(sm(i, j), std::exp(x(i, j) - m) / s, 1e-6);
      EXPECT_NEAR(lsm(i, j), x(i, j) - m - std::log(s), 1e-4);
    }
  }
  EXPECT_EQ(lse.flat(3), -INFINITY);
  for (int j = 0; j < 7; ++j) EXPECT_TRUE(std::isnan(sm(3, j)));  // an all -inf row: nan, as in JAX
  EXPECT_EQ(logsumexp(x, {}, true).shape(), (Shape{1, 1}));
  EXPECT_EQ(softmax(x, 0).shape(), x.shape());
  // Along a middle axis (the strided rows of the fused kernel), against the formula.
  const Tensor<double> z = rnd<double>({3, 5, 4}, 92, -3, 3);
  const auto s1 = softmax(z, 1);
  for (int a = 0; a < 3; ++a)
    for (int c = 0; c < 4; ++c) {
      double m = -INFINITY, tot = 0;
      for (int b = 0; b < 5; ++b) m = std::max(m, z(a, b, c));
      for (int b = 0; b < 5; ++b) tot += std::exp(z(a, b, c) - m);
      for (int b = 0; b < 5; ++b) EXPECT_NEAR(s1(a, b, c), std::exp(z(a, b, c) - m) / tot, 1e-15);
    }
  const auto st = standardize(z, 1, 1e-3);
  for (int a = 0; a < 3; ++a)
    for (int c = 0; c < 4; ++c) {
      double m = 0, var = 0;
      for (int b = 0; b < 5; ++b) m += z(a, b, c) / 5;
      for (int b = 0; b < 5; ++b) var += (z(a, b, c) - m) * (z(a, b, c) - m) / 5;
      for (int b = 0; b < 5; ++b) EXPECT_NEAR(st(a, b, c), (z(a, b, c) - m) / std::sqrt(var + 1e-3), 1e-12);
    }
  // gelu's derivative stays finite (1 or 0) for huge inputs.
  const auto dg = unary(Tensor<float>({4}, std::vector<float>{1e20f, -1e20f, 30.f, -30.f}), UnaryOp::kGeluGrad);
  EXPECT_EQ(dg, Tensor<float>({4}, std::vector<float>{1, 0, 1, 0}));
  static_assert(std::is_same_v<decltype(softmax(Tensor<std::int32_t>({2}, 1))), Tensor<float>>);
}

/// jax.nn.dot_product_attention by its definition, in double, one (batch, head) at a time.
template <typename E>
Tensor<double> attention_reference(const Tensor<E>& q, const Tensor<E>& k, const Tensor<E>& v, bool causal,
                                   double scale) {
  const bool three = q.rank() == 3;
  const std::int64_t B = three ? 1 : q.shape()[0], o = three ? 0 : 1;
  const std::int64_t T = q.shape()[o], N = q.shape()[o + 1], H = q.shape()[o + 2], S = k.shape()[o],
                     K = k.shape()[o + 1];
  Tensor<double> out(q.shape());
  auto at = [](const Tensor<E>& x, std::int64_t b, std::int64_t t, std::int64_t n, std::int64_t h) {
    const auto& sh = x.shape();
    const std::size_t d = sh.size() == 3 ? 0 : 1;
    const std::int64_t L = sh[d], M = sh[d + 1], D = sh[d + 2];
    return static_cast<double>(x.flat(((b * L + t) * M + n) * D + h));
  };
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t n = 0; n < N; ++n) {
      const std::int64_t kh = n / (N / K);
      for (std::int64_t i = 0; i < T; ++i) {
        std::vector<double> w(static_cast<std::size_t>(S), -INFINITY);
        double m = -INFINITY;
        for (std::int64_t j = 0; j < S; ++j) {
          if (causal && j > i) continue;
          double dot = 0;
          for (std::int64_t h = 0; h < H; ++h) dot += at(q, b, i, n, h) * at(k, b, j, kh, h);
          w[j] = dot * scale;
          m = std::max(m, w[j]);
        }
        double tot = 0;
        for (auto& x : w) tot += (x = std::exp(x - m));
        for (std::int64_t h = 0; h < H; ++h) {
          double acc = 0;
          for (std::int64_t j = 0; j < S; ++j) acc += w[j] / tot * at(v, b, j, kh, h);
          out.flat(((b * T + i) * N + n) * H + h) = acc;
        }
      }
    }
  return out;
}

TEST(TensorOps, DotProductAttentionMatchesItsDefinition) {
  struct Case {
    std::int64_t B, T, S, N, K, H;
    bool causal;
  };
  // Square and not (T < S, T > S), grouped heads (N = 2K, 4K), longer than one causal block (32).
  const std::vector<Case> cases = {{2, 7, 7, 4, 4, 3, true},   {2, 7, 7, 4, 2, 3, false}, {1, 40, 40, 2, 1, 5, true},
                                   {2, 5, 9, 3, 3, 4, true},   {1, 70, 37, 4, 1, 3, true}, {1, 37, 70, 2, 2, 3, true},
                                   {3, 33, 33, 2, 2, 8, false}, {0, 4, 4, 2, 2, 2, true}, {2, 1, 70, 2, 1, 4, false},
                                   {1, 1, 1, 1, 1, 2, true}};
  std::uint64_t seed = 300;
  for (const auto& c : cases) {
    const std::string name = "B" + std::to_string(c.B) + " T" + std::to_string(c.T) + " S" + std::to_string(c.S) +
                             " N" + std::to_string(c.N) + " K" + std::to_string(c.K) + (c.causal ? " causal" : "");
    const auto q = rnd<double>({c.B, c.T, c.N, c.H}, ++seed, -2, 2);
    const auto k = rnd<double>({c.B, c.S, c.K, c.H}, ++seed, -2, 2);
    const auto v = rnd<double>({c.B, c.S, c.K, c.H}, ++seed, -2, 2);
    const double scale = 1 / std::sqrt(static_cast<double>(c.H));
    const auto got = dot_product_attention(q, k, v, c.causal);
    const auto want = attention_reference(q, k, v, c.causal, scale);
    ASSERT_EQ(got.shape(), q.shape()) << name;
    for (std::int64_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got.flat(i), want.flat(i), 1e-12) << name << " at " << i;
    // An explicit scale; float32 within rounding of the double definition.
    const auto g2 = dot_product_attention(q, k, v, c.causal, 0.7);
    const auto w2 = attention_reference(q, k, v, c.causal, 0.7);
    for (std::int64_t i = 0; i < g2.size(); ++i) ASSERT_NEAR(g2.flat(i), w2.flat(i), 1e-12) << name << " scale 0.7";
    const auto gf = dot_product_attention(astype<float>(q), astype<float>(k), astype<float>(v), c.causal);
    for (std::int64_t i = 0; i < gf.size(); ++i) ASSERT_NEAR(gf.flat(i), want.flat(i), 2e-5) << name << " float32";
  }
  // (T, N, H) operands: the same as a batch of one.
  const auto q3 = rnd<double>({6, 2, 4}, 401, -1, 1), k3 = rnd<double>({5, 1, 4}, 402, -1, 1),
             v3 = rnd<double>({5, 1, 4}, 403, -1, 1);
  const auto o3 = dot_product_attention(q3, k3, v3, true);
  const auto r3 = attention_reference(q3, k3, v3, true, 0.5);
  ASSERT_EQ(o3.shape(), q3.shape());
  for (std::int64_t i = 0; i < o3.size(); ++i) EXPECT_NEAR(o3.flat(i), r3.flat(i), 1e-12);
  // Causal: the first position sees only itself, so its output is v's first row.
  for (std::int64_t n = 0; n < 2; ++n)
    for (std::int64_t h = 0; h < 4; ++h) EXPECT_DOUBLE_EQ(o3.flat(n * 4 + h), v3.flat(h));
  // Bad shapes name the operands.
  const auto q4 = rnd<double>({1, 4, 4, 2}, 404, -1, 1), k4 = rnd<double>({1, 4, 3, 2}, 405, -1, 1);
  EXPECT_THROW(dot_product_attention(q4, k4, k4), ShapeError);                                 // 4 heads, 3 kv heads
  EXPECT_THROW(dot_product_attention(q4, q4, rnd<double>({1, 5, 4, 2}, 406, -1, 1)), ShapeError);  // key != value
  EXPECT_THROW(dot_product_attention(q4, rnd<double>({1, 4, 4, 3}, 407, -1, 1), rnd<double>({1, 4, 4, 3}, 408, -1, 1)),
               ShapeError);  // head sizes
  EXPECT_THROW(dot_product_attention(q4, rnd<double>({2, 4, 4, 2}, 409, -1, 1), rnd<double>({2, 4, 4, 2}, 410, -1, 1)),
               ShapeError);  // batch
  EXPECT_THROW(dot_product_attention(Tensor<double>({4, 2}, 1.0), Tensor<double>({4, 2}, 1.0), Tensor<double>({4, 2}, 1.0)),
               ShapeError);  // rank
  try {
    dot_product_attention(q4, k4, k4);
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of the key's and value's heads (3)"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------- log-space activations

/// log(exp(a) + exp(b)) in long double (no overflow for |a|, |b| up to thousands).
double ref_logaddexp(double a, double b) {
  return static_cast<double>(std::log(std::exp(static_cast<long double>(a)) + std::exp(static_cast<long double>(b))));
}

TEST(TensorOps, Logaddexp) {
  // Broadcast operands (3, 1, 4) and (5, 1) against the long double definition.
  const Tensor<double> a = rnd<double>({3, 1, 4}, 201, -40, 40), b = rnd<double>({5, 1}, 202, -40, 40);
  expect_near(logaddexp(a, b), ref_zip<double>(a, b, ref_logaddexp), 1e-15, "logaddexp float64");
  const Tensor<float> af = rnd<float>({6, 7}, 203, -90, 90), bf = rnd<float>({6, 7}, 204, -90, 90);
  const auto rf = logaddexp(af, bf);
  static_assert(std::is_same_v<decltype(rf), const Tensor<float>>);
  expect_near(rf, ref_zip<double>(af, bf, ref_logaddexp), 1e-7, "logaddexp float32");
  // Promotion as a binary op, then floating: int32 -> float32, int64 -> float64, int32 with a
  // double scalar -> float64 (the scalar's own type, as for x * 2.5), a float32 array stays
  // float32 with a double scalar (weak); either operand may be the scalar.
  const Tensor<std::int32_t> ai = rnd<std::int32_t>({4, 3}, 205, -20, 20);
  const Tensor<std::int64_t> bl = rnd<std::int64_t>({3}, 206, -20, 20);
  static_assert(std::is_same_v<decltype(logaddexp(ai, ai)), Tensor<float>>);
  static_assert(std::is_same_v<decltype(logaddexp(ai, bl)), Tensor<double>>);
  static_assert(std::is_same_v<decltype(logaddexp(ai, 2.5)), Tensor<double>>);
  static_assert(std::is_same_v<decltype(logaddexp(af, 2.5)), Tensor<float>>);
  expect_near(logaddexp(ai, bl), ref_zip<double>(ai, bl, [](auto x, auto y) { return ref_logaddexp(x, y); }), 1e-15,
              "logaddexp int32, int64");
  const Tensor<double> s(Shape{}, 2.5);
  expect_near(logaddexp(a, 2.5), ref_zip<double>(a, s, ref_logaddexp), 1e-15, "logaddexp(a, 2.5)");
  expect_near(logaddexp(2.5, a), ref_zip<double>(a, s, ref_logaddexp), 1e-15, "logaddexp(2.5, a)");
  // Extremes as numpy: no overflow at +-1000, -inf is exp's zero, infinities of one sign give
  // that infinity (-inf, -inf is -inf, not nan), nan propagates.
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor<double> ea({9}, std::vector<double>{1000, -1000, -inf, -inf, inf, inf, inf, nan, 1e300});
  const Tensor<double> eb({9}, std::vector<double>{1000, -1001, -inf, 3, -inf, inf, 5, 0, 1e300});
  const auto e = logaddexp(ea, eb);
  const std::vector<double> want{1000 + std::log(2.0), -1000 + std::log1p(std::exp(-1.0)), -inf, 3, inf, inf, inf,
                                 nan, 1e300 + std::log(2.0)};
  for (int i = 0; i < 9; ++i) {
    if (std::isnan(want[i])) EXPECT_TRUE(std::isnan(e.flat(i))) << i;
    else EXPECT_DOUBLE_EQ(e.flat(i), want[i]) << i << ": " << ea.flat(i) << ", " << eb.flat(i);
  }
  const auto ef = logaddexp(Tensor<float>({2}, std::vector<float>{88.f, -INFINITY}), 88.f);
  EXPECT_FLOAT_EQ(ef.flat(0), 88.f + std::log(2.f));  // exp(88) * 2 overflows float32
  EXPECT_EQ(ef.flat(1), 88.f);
}

TEST(TensorOps, Softplus) {
  // log(1 + exp(x)) in long double, float64 and float32; integers become floating.
  auto ref = [](double v) { return static_cast<double>(std::log1p(std::exp(static_cast<long double>(v)))); };
  const Tensor<double> x = rnd<double>({4, 9}, 211, -60, 60);
  const Tensor<double> none(Shape{}, 0.0);
  expect_near(softplus(x), ref_zip<double>(x, none, [&](double v, double) { return ref(v); }), 1e-15, "softplus");
  const Tensor<float> xf = rnd<float>({50}, 212, -80, 80);
  const auto sf = softplus(xf);
  static_assert(std::is_same_v<decltype(sf), const Tensor<float>>);
  for (std::int64_t i = 0; i < xf.size(); ++i) EXPECT_NEAR(sf.flat(i), ref(xf.flat(i)), 2e-7 * std::max(1.0, ref(xf.flat(i)))) << xf.flat(i);
  static_assert(std::is_same_v<decltype(softplus(Tensor<std::int32_t>({2}, 1))), Tensor<float>>);
  static_assert(std::is_same_v<decltype(softplus(Tensor<std::int64_t>({2}, 1))), Tensor<double>>);
  expect_near(softplus(Tensor<bool>({2}, std::vector<bool>{true, false})),
              Tensor<double>({2}, std::vector<double>{ref(1), ref(0)}), 1e-7, "softplus of bool");
  // Extremes: no overflow, no early 0, no precision lost near 0 (log1p), infinities and nan.
  const double inf = std::numeric_limits<double>::infinity();
  const auto e = softplus(Tensor<double>({8}, std::vector<double>{100, -100, 1000, -1000, 1e-20, inf, -inf, NAN}));
  EXPECT_EQ(e.flat(0), 100.0);
  EXPECT_NEAR(e.flat(1), std::exp(-100.0), 1e-15 * std::exp(-100.0));
  EXPECT_EQ(e.flat(2), 1000.0);
  EXPECT_EQ(e.flat(3), 0.0);
  EXPECT_DOUBLE_EQ(e.flat(4), std::log(2.0));
  EXPECT_EQ(e.flat(5), inf);
  EXPECT_EQ(e.flat(6), 0.0);
  EXPECT_TRUE(std::isnan(e.flat(7)));
  const auto ef = softplus(Tensor<float>({2}, std::vector<float>{100.f, -100.f}));
  EXPECT_EQ(ef.flat(0), 100.f);
  EXPECT_NEAR(ef.flat(1), 3.72e-44f, 3e-45f);  // a float32 subnormal: exp(-100)
}

TEST(TensorOps, LogSigmoid) {
  // log(1 / (1 + exp(-x))) in long double; stable at both ends.
  auto ref = [](double v) { return static_cast<double>(-std::log1p(std::exp(-static_cast<long double>(v)))); };
  const Tensor<double> x = rnd<double>({3, 11}, 221, -60, 60);
  const auto r = log_sigmoid(x);
  for (std::int64_t i = 0; i < x.size(); ++i) EXPECT_NEAR(r.flat(i), ref(x.flat(i)), 1e-15 * std::max(1.0, std::abs(ref(x.flat(i))))) << x.flat(i);
  const Tensor<float> xf = rnd<float>({40}, 222, -80, 80);
  const auto rf = log_sigmoid(xf);
  static_assert(std::is_same_v<decltype(rf), const Tensor<float>>);
  for (std::int64_t i = 0; i < xf.size(); ++i)
    EXPECT_NEAR(rf.flat(i), ref(xf.flat(i)), 2e-7 * std::max(1.0, std::abs(ref(xf.flat(i))))) << xf.flat(i);
  static_assert(std::is_same_v<decltype(log_sigmoid(Tensor<std::int32_t>({2}, 1))), Tensor<float>>);
  expect_near(log_sigmoid(Tensor<bool>({2}, std::vector<bool>{true, false})),
              Tensor<double>({2}, std::vector<double>{ref(1), ref(0)}), 1e-7, "log_sigmoid of bool");
  const double inf = std::numeric_limits<double>::infinity();
  const auto e = log_sigmoid(Tensor<double>({6}, std::vector<double>{-100, 100, -1000, 0, inf, -inf}));
  EXPECT_EQ(e.flat(0), -100.0);
  EXPECT_NEAR(e.flat(1), -std::exp(-100.0), 1e-15 * std::exp(-100.0));
  EXPECT_EQ(e.flat(2), -1000.0);
  EXPECT_DOUBLE_EQ(e.flat(3), -std::log(2.0));
  EXPECT_EQ(e.flat(4), 0.0);
  EXPECT_EQ(e.flat(5), -inf);
}

TEST(TensorOps, LayerNorm) {
  // (2, 3, 6) along the last axis with (6,) gain and bias, against loops.
  const Tensor<double> x = rnd<double>({2, 3, 6}, 231, -5, 5);
  const Tensor<double> g = rnd<double>({6}, 232, 0.5, 2), b = rnd<double>({6}, 233, -1, 1);
  const auto y = layer_norm(x, g, b);
  static_assert(std::is_same_v<decltype(y), const Tensor<double>>);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) {
      double m = 0, var = 0;
      for (int k = 0; k < 6; ++k) m += x(i, j, k) / 6;
      for (int k = 0; k < 6; ++k) var += (x(i, j, k) - m) * (x(i, j, k) - m) / 6;
      for (int k = 0; k < 6; ++k)
        EXPECT_NEAR(y(i, j, k), (x(i, j, k) - m) / std::sqrt(var + 1e-5) * g.flat(k) + b.flat(k), 1e-12) << i << j << k;
    }
  // Along a middle axis: a (D,) gain and bias lie along it; a full-shape (D, T) gain broadcasts.
  const Tensor<double> z = rnd<double>({2, 5, 3}, 234, -5, 5);
  const Tensor<double> g5 = rnd<double>({5}, 235, 0.5, 2), b5 = rnd<double>({5}, 236, -1, 1);
  const Tensor<double> g53 = rnd<double>({5, 3}, 237, 0.5, 2);
  const auto y1 = layer_norm(z, g5, b5, 1, 1e-3), yn = layer_norm(z, g5, b5, -2, 1e-3);
  const auto yf = layer_norm(z, g53, b5, 1, 1e-3);
  for (int i = 0; i < 2; ++i)
    for (int k = 0; k < 3; ++k) {
      double m = 0, var = 0;
      for (int j = 0; j < 5; ++j) m += z(i, j, k) / 5;
      for (int j = 0; j < 5; ++j) var += (z(i, j, k) - m) * (z(i, j, k) - m) / 5;
      for (int j = 0; j < 5; ++j) {
        const double s = (z(i, j, k) - m) / std::sqrt(var + 1e-3);
        EXPECT_NEAR(y1(i, j, k), s * g5.flat(j) + b5.flat(j), 1e-12);
        EXPECT_NEAR(yn(i, j, k), s * g5.flat(j) + b5.flat(j), 1e-12);
        EXPECT_NEAR(yf(i, j, k), s * g53(j, k) + b5.flat(j), 1e-12);
      }
    }
  // A constant row normalises to 0 (epsilon keeps it finite): the output is the bias.
  Tensor<float> c = rnd<float>({2, 4}, 238, -3, 3);
  for (int k = 0; k < 4; ++k) c(1, k) = 2.5f;
  const Tensor<float> bf = rnd<float>({4}, 239, -1, 1);
  const auto yc = layer_norm(c, rnd<float>({4}, 240, 0.5, 2), bf);
  static_assert(std::is_same_v<decltype(yc), const Tensor<float>>);
  for (int k = 0; k < 4; ++k) EXPECT_EQ(yc(1, k), bf.flat(k));
  // Promotion: int32 x with float32 parameters is float32; float32 x with float64 gain is float64.
  static_assert(std::is_same_v<decltype(layer_norm(Tensor<std::int32_t>({2, 4}, 1), bf, bf)), Tensor<float>>);
  static_assert(std::is_same_v<decltype(layer_norm(c, Tensor<double>({4}, 1.0), bf)), Tensor<double>>);
  // A gain of the wrong length does not broadcast; a bad axis is named.
  EXPECT_THROW((void)layer_norm(x, Tensor<double>({4}, 1.0), b), ShapeError);
  EXPECT_THROW((void)layer_norm(x, g, b, 3), ShapeError);
}

/// -log(softmax(logits)[label]) along the last dim by loops in long double.
template <typename T, typename I>
Tensor<double> ref_cross_entropy(const Tensor<T>& logits, const Tensor<I>& labels) {
  const std::int64_t c = logits.shape().back(), rows = logits.size() / c;
  Tensor<double> out(labels.shape());
  for (std::int64_t r = 0; r < rows; ++r) {
    long double m = -INFINITY, s = 0;
    for (std::int64_t j = 0; j < c; ++j) m = std::max(m, static_cast<long double>(logits.flat(r * c + j)));
    for (std::int64_t j = 0; j < c; ++j) s += std::exp(static_cast<long double>(logits.flat(r * c + j)) - m);
    out.flat(r) = static_cast<double>(std::log(s) - (static_cast<long double>(logits.flat(r * c + labels.flat(r))) - m));
  }
  return out;
}

TEST(TensorOps, SoftmaxCrossEntropyWithIntegerLabels) {
  const Tensor<double> logits = rnd<double>({6, 9}, 241, -10, 10);
  const Tensor<std::int32_t> labels = rnd<std::int32_t>({6}, 242, 0, 8);
  const auto loss = softmax_cross_entropy_with_integer_labels(logits, labels);
  static_assert(std::is_same_v<decltype(loss), const Tensor<double>>);
  expect_near(loss, ref_cross_entropy(logits, labels), 1e-14, "cross entropy (6, 9)");
  // Leading dims (2, 3) with int64 labels; the classes along axis 0.
  const Tensor<float> l3 = rnd<float>({2, 3, 5}, 243, -10, 10);
  const Tensor<std::int64_t> y3 = rnd<std::int64_t>({2, 3}, 244, 0, 4);
  const auto loss3 = softmax_cross_entropy_with_integer_labels(l3, y3);
  static_assert(std::is_same_v<decltype(loss3), const Tensor<float>>);
  expect_near(loss3, ref_cross_entropy(l3, y3), 1e-6, "cross entropy (2, 3, 5)");
  const Tensor<double> cols = rnd<double>({5, 4}, 245, -10, 10);
  const Tensor<std::int32_t> ycols = rnd<std::int32_t>({4}, 246, 0, 4);
  expect_near(softmax_cross_entropy_with_integer_labels(cols, ycols, 0),
              ref_cross_entropy(transpose(cols), ycols), 1e-14, "cross entropy along axis 0");
  // Large float32 logits: the max is subtracted before anything is rounded at their magnitude
  // (logsumexp(l) - l[y] would be ~1e-3 off at 1e4), and a masked (-inf) class costs nothing.
  const Tensor<float> big({3, 4}, std::vector<float>{1e4f, 1e4f - 1, -1e4f, 1e4f - 2,     //
                                                     -3e4f, -3e4f + 0.5f, -3e4f, -3e4f,  //
                                                     5.f, -INFINITY, 4.f, 3.f});
  const Tensor<std::int32_t> ybig({3}, std::vector<std::int32_t>{1, 1, 2});
  const auto lb = softmax_cross_entropy_with_integer_labels(big, ybig);
  const double e1 = std::exp(-1.0), e2 = std::exp(-2.0), h = std::exp(-0.5);
  EXPECT_NEAR(lb.flat(0), 1 + std::log(1 + e1 + e2), 2e-7);
  EXPECT_NEAR(lb.flat(1), std::log(1 + 3 * h), 2e-7);
  EXPECT_NEAR(lb.flat(2), 1 + std::log(1 + e1 + e2), 2e-7);
  // Shapes that do not line up, labels out of range, a bad axis.
  EXPECT_THROW((void)softmax_cross_entropy_with_integer_labels(logits, Tensor<std::int32_t>({6, 1}, 0)), ShapeError);
  EXPECT_THROW((void)softmax_cross_entropy_with_integer_labels(logits, Tensor<std::int32_t>({9}, 0)), ShapeError);
  EXPECT_THROW((void)softmax_cross_entropy_with_integer_labels(logits, Tensor<std::int32_t>({6}, 9)), ShapeError);
  EXPECT_THROW((void)softmax_cross_entropy_with_integer_labels(logits, labels, 2), ShapeError);
}

// ---------------------------------------------------------------- creation and checked shapes

TEST(TensorOps, Creation) {
  EXPECT_EQ(arange<std::int32_t>(5), Tensor<std::int32_t>({5}, std::vector<std::int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(arange<double>(1.0, 2.0, 0.25), Tensor<double>({4}, std::vector<double>{1.0, 1.25, 1.5, 1.75}));
  EXPECT_EQ(arange<std::int64_t>(5, 0, -2), Tensor<std::int64_t>({3}, std::vector<std::int64_t>{5, 3, 1}));
  EXPECT_EQ(arange<float>(0.f, -1.f).size(), 0);
  const Tensor<float> x = rnd<float>({2, 3}, 101);
  EXPECT_EQ(zeros_like(x), Tensor<float>({2, 3}, 0.f));
  EXPECT_EQ(ones_like(x), ones<float>({2, 3}));
  EXPECT_EQ(full_like(x, 2.5f), full<float>({2, 3}, 2.5f));
  EXPECT_EQ(full<bool>({2}, true), Tensor<bool>({2}, true));
}

TEST(TensorShapes, ValidatedWhereTheyEnter) {
  auto expect = [](auto&& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no error for " << needle;
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect([] { Tensor<float>({-1}, 0.f); }, "(-1,)");
  expect([] { (void)zeros<float>({-4, 2}); }, "(-4, 2)");
  expect([] { Tensor<float>({std::int64_t{1} << 32, std::int64_t{1} << 32}); }, "(4294967296, 4294967296)");
  expect([] { Tensor<double>({std::int64_t{1} << 61}); }, "bytes");
  EXPECT_EQ(Tensor<float>({std::int64_t{1} << 62, 0}).size(), 0);  // empty: valid however large the other dim
  try {  // representable but far beyond this machine: an AllocationError naming shape and bytes
    Tensor<float> t({std::int64_t{1} << 44});
    ADD_FAILURE() << "allocated 64 TiB";
  } catch (const AllocationError& e) {
    EXPECT_NE(std::string(e.what()).find("70368744177664 bytes"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("float32(17592186044416,)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shard
