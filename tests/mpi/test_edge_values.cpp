// Nothing silently wrong (issue 33's value classes), against numpy's semantics on a host
// reference: a generated sweep of nan and +-inf at every position through every floating
// reduction, argmax/argmin, cumsum, softmax, log_softmax, the comparisons and maximum/minimum,
// split over every device (one shard empty, or uneven) and replicated, 2-D along each dim; integer
// floor_divide / remainder at MIN, -1, 0, MAX; every other integer op (add, subtract, multiply,
// maximum, minimum, the bitwise ops, negative, abs, square, sign, sum, prod, max, min, argmax,
// argmin, cumsum, the psum that combines devices) at MIN, MIN+1, -1, 0, 1, MAX-1, MAX, wrapping as
// numpy's and JAX's two's complement does (no undefined signed overflow: UBSan runs this); astype of
// out-of-range floats to integers (saturating, as JAX); an optimizer state that belongs to other parameters
// or is damaged; print options out of range.

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "mpi_test.hpp"
#include "shard/shard.hpp"
#include "test_util.hpp"

namespace {

using namespace shard;
using shard::testing::random_tensor;

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

/// numpy's max / min / sum / argmax / argmin of one line: a nan anywhere makes max and min nan,
/// and argmax and argmin the index of the first nan; otherwise the first extreme.
struct Reference {
  double max = -kInf, min = kInf, sum = 0, prod = 1, logsumexp = 0;
  std::int64_t argmax = -1, argmin = -1;
  explicit Reference(const std::vector<double>& v) {
    for (std::size_t i = 0; i < v.size(); ++i) {
      const auto k = static_cast<std::int64_t>(i);
      sum += v[i];
      prod *= v[i];
      if (std::isnan(v[i]) && !std::isnan(max)) {
        max = min = v[i];
        argmax = argmin = k;
      }
      if (std::isnan(max)) continue;
      if (argmax < 0 || v[i] > max) max = v[i], argmax = k;
      if (argmin < 0 || v[i] < min) min = v[i], argmin = k;
    }
    // log(sum(exp(v))): nan with a nan, inf with an inf, -inf only if every term is -inf.
    if (std::isnan(max) || std::isinf(max)) {
      logsumexp = max;
    } else {
      double s = 0;
      for (const double x : v) s += std::exp(x - max);
      logsumexp = max + std::log(s);
    }
  }
};

void expect_same(double got, double want, const std::string& what) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << what << ": got " << got << ", numpy gives nan";
  } else if (std::isinf(want)) {
    EXPECT_EQ(got, want) << what;
  } else {
    EXPECT_NEAR(got, want, 1e-5 * (1 + std::abs(want))) << what;
  }
}

/// Every reduction of a [rows, cols] float array holding `special` at (r, c), reduced along `dim`,
/// laid out by `spec`, in both views (the ShardedArray and the host Tensor), against the reference
/// of each line; on every rank. Returns the number of values checked.
int check_reductions(const Mesh& mesh, const PartitionSpec& spec, std::int64_t rows, std::int64_t cols,
                     std::int64_t r, std::int64_t c, double special, int dim) {
  Tensor<float> h = random_tensor<float>({rows, cols}, static_cast<std::uint64_t>(7 + r * cols + c));
  h.flat(r * cols + c) = static_cast<float>(special);
  const auto x = device_put(h, NamedSharding(mesh, spec));
  const std::string what = "value " + std::to_string(special) + " at (" + std::to_string(r) + ", " +
                           std::to_string(c) + ") of " + to_string(h.shape()) + " " + spec.to_string() +
                           " along dim " + std::to_string(dim);
  const std::vector<std::string> names{"max", "min", "sum", "mean", "prod", "logsumexp"};
  const std::vector<Tensor<float>> sharded{max(x, {dim}).to_host(),  min(x, {dim}).to_host(),
                                           sum(x, {dim}).to_host(),  mean(x, {dim}).to_host(),
                                           prod(x, {dim}).to_host(), logsumexp(x, {dim}).to_host()};
  const std::vector<Tensor<float>> host{max(h, {dim}),  min(h, {dim}),  sum(h, {dim}),
                                        mean(h, {dim}), prod(h, {dim}), logsumexp(h, {dim})};
  const Tensor<std::int64_t> am = argmax(x, dim).to_host(), an = argmin(x, dim).to_host();
  const Tensor<std::int64_t> tam = argmax(h, dim), tan = argmin(h, dim);
  // The scans and normalisations along the same dim (shaped like x): cumsum, softmax, log_softmax.
  const std::vector<std::string> scan_names{"cumsum", "softmax", "log_softmax"};
  const std::vector<Tensor<float>> scans{cumsum(x, dim).to_host(), softmax(x, dim).to_host(),
                                         log_softmax(x, dim).to_host()};
  const std::vector<Tensor<float>> host_scans{cumsum(h, dim), softmax(h, dim), log_softmax(h, dim)};
  const std::int64_t lines = dim == 0 ? cols : rows, len = dim == 0 ? rows : cols;
  int checked = 0;
  for (std::int64_t l = 0; l < lines; ++l) {
    std::vector<double> v;
    for (std::int64_t k = 0; k < len; ++k)
      v.push_back(dim == 0 ? h.flat(k * cols + l) : h.flat(l * cols + k));
    const Reference ref(v);
    const std::string at = what + ", line " + std::to_string(l);
    const double want[] = {ref.max,  ref.min,      ref.sum, ref.sum / static_cast<double>(len),
                           ref.prod, ref.logsumexp};
    for (std::size_t k = 0; k < names.size(); ++k) {
      expect_same(sharded[k].flat(l), want[k], names[k] + " " + at);
      expect_same(host[k].flat(l), want[k], "Tensor " + names[k] + " " + at);
    }
    EXPECT_EQ(am.flat(l), ref.argmax) << "argmax " << at;
    EXPECT_EQ(tam.flat(l), ref.argmax) << "Tensor argmax " << at;
    EXPECT_EQ(an.flat(l), ref.argmin) << "argmin " << at;
    EXPECT_EQ(tan.flat(l), ref.argmin) << "Tensor argmin " << at;
    checked += 2 * static_cast<int>(names.size()) + 4;
    // JAX's: a running sum; with s = x - max (nan where it is inf - inf or nan), exp(s) / sum(exp(s))
    // and s - log(sum(exp(s))): an +inf or a nan in the line makes the whole line nan.
    double run = 0, z = 0;
    for (const double e : v) z += std::exp(e - ref.max);
    const double log_z = std::log(z);
    for (std::int64_t k = 0; k < len; ++k) {
      run += v[static_cast<std::size_t>(k)];
      const double want[] = {run, std::exp(v[static_cast<std::size_t>(k)] - ref.max) / z,
                             (v[static_cast<std::size_t>(k)] - ref.max) - log_z};
      const std::int64_t i = dim == 0 ? k * cols + l : l * cols + k;
      for (std::size_t q = 0; q < scan_names.size(); ++q) {
        const std::string where = scan_names[q] + " " + at + ", element " + std::to_string(k);
        expect_same(scans[q].flat(i), want[q], where);
        expect_same(host_scans[q].flat(i), want[q], "Tensor " + where);
      }
      checked += 2 * static_cast<int>(scan_names.size());
    }
  }
  return checked;
}

/// Every comparison and maximum / minimum of a [rows, cols] float array holding `special` at
/// (r, c) against a random array and against a scalar, laid out by `spec`, in both views, against
/// IEEE's (and numpy's) rules: a nan compares false except with !=; maximum and minimum
/// propagate it. Returns the number of values checked.
int check_comparisons(const Mesh& mesh, const PartitionSpec& spec, std::int64_t rows, std::int64_t cols,
                      std::int64_t r, std::int64_t c, double special) {
  Tensor<float> h = random_tensor<float>({rows, cols}, static_cast<std::uint64_t>(99 + r * cols + c));
  h.flat(r * cols + c) = static_cast<float>(special);
  const Tensor<float> g = random_tensor<float>({rows, cols}, 5);
  const NamedSharding sh(mesh, spec);
  const auto x = device_put(h, sh), y = device_put(g, sh);
  const float s = 0.25f;
  const std::vector<std::string> names{"<", "<=", ">", ">=", "==", "!="};
  auto ref = [](int op, float a, float b) {
    switch (op) {
      case 0:
        return a < b;
      case 1:
        return a <= b;
      case 2:
        return a > b;
      case 3:
        return a >= b;
      case 4:
        return a == b;
      default:
        return a != b;
    }
  };
  std::vector<Tensor<bool>> got;  // per op: array vs array, array vs scalar, scalar vs array; both views
  got.push_back((x < y).to_host()), got.push_back((x <= y).to_host()), got.push_back((x > y).to_host());
  got.push_back((x >= y).to_host()), got.push_back(equal(x, y).to_host()),
      got.push_back(not_equal(x, y).to_host());
  got.push_back((x < s).to_host()), got.push_back((x <= s).to_host()), got.push_back((x > s).to_host());
  got.push_back((x >= s).to_host()), got.push_back(equal(x, s).to_host()),
      got.push_back(not_equal(x, s).to_host());
  got.push_back((s < x).to_host()), got.push_back((s <= x).to_host()), got.push_back((s > x).to_host());
  got.push_back((s >= x).to_host()), got.push_back(equal(s, x).to_host()),
      got.push_back(not_equal(s, x).to_host());
  got.push_back(h < g), got.push_back(h <= g), got.push_back(h > g);
  got.push_back(h >= g), got.push_back(equal(h, g)), got.push_back(not_equal(h, g));
  const Tensor<float> mx = maximum(x, y).to_host(), mn = minimum(x, y).to_host(), tmx = maximum(h, g),
                      tmn = minimum(h, g);
  const std::string what = "value " + std::to_string(special) + " at (" + std::to_string(r) + ", " +
                           std::to_string(c) + ") " + spec.to_string();
  int checked = 0;
  for (std::int64_t i = 0; i < rows * cols; ++i) {
    const float a = h.flat(i), b = g.flat(i);
    for (int op = 0; op < 6; ++op) {
      EXPECT_EQ(got[op].flat(i), ref(op, a, b)) << "x " << names[op] << " y, " << what << ", element " << i;
      EXPECT_EQ(got[6 + op].flat(i), ref(op, a, s)) << "x " << names[op] << " scalar, " << what;
      EXPECT_EQ(got[12 + op].flat(i), ref(op, s, a)) << "scalar " << names[op] << " x, " << what;
      EXPECT_EQ(got[18 + op].flat(i), ref(op, a, b)) << "Tensor x " << names[op] << " y, " << what;
    }
    const double want_max = std::isnan(a) ? kNan : std::max(a, b),
                 want_min = std::isnan(a) ? kNan : std::min(a, b);
    expect_same(mx.flat(i), want_max, "maximum " + what);
    expect_same(mn.flat(i), want_min, "minimum " + what);
    expect_same(tmx.flat(i), want_max, "Tensor maximum " + what);
    expect_same(tmn.flat(i), want_min, "Tensor minimum " + what);
    checked += 28;
  }
  return checked;
}

SHARD_MPI_TEST(EdgeValues, NanAndInfinityThroughEveryReduction) {
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const std::int64_t cols = 3;
  const bool full = shard::testing::full_matrix();
  int cases = 0, values = 0;
  // n + 1 rows: uneven over the devices; n - 1 (at least 1): the last device's shard is empty.
  for (const std::int64_t rows : {std::int64_t{n} + 1, std::int64_t{std::max(n - 1, 1)}})
    for (const PartitionSpec& spec : {P("a"), P(), P(None, "a")})
      for (const double special : {kNan, kInf, -kInf})
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t c = 0; c < cols; ++c) {
            if (!full && (r * cols + c) % 2 == 1 && r != rows - 1)
              continue;  // a fixed half in the default tier
            for (int dim = 0; dim < 2; ++dim)
              values += check_reductions(mesh, spec, rows, cols, r, c, special, dim);
            values += check_comparisons(mesh, spec, rows, cols, r, c, special);
            ++cases;
          }
  if (shard::testing::runtime().process_index() == 0)
    std::printf(
        "[ sweep    ] nan/+-inf: %d placements (2 shapes x 3 specs x 3 values x positions), %d values "
        "checked "
        "(max, min, sum, mean, prod, logsumexp, argmax, argmin, cumsum, softmax, log_softmax along each dim; "
        "<, <=, >, >=, ==, !=, maximum, minimum; both views)\n",
        cases, values);
  // The case the adversarial pass reported: [1, 1, 1, nan] split and replicated.
  Tensor<float> t({4});
  for (int i = 0; i < 3; ++i) t.flat(i) = 1.f;
  t.flat(3) = std::nanf("");
  for (const PartitionSpec& spec : {P("a"), P()}) {
    const auto x = device_put(t, NamedSharding(mesh, spec));
    EXPECT_TRUE(std::isnan(max(x).item())) << spec.to_string();
    EXPECT_TRUE(std::isnan(min(x).item())) << spec.to_string();
    EXPECT_EQ(argmax(x, 0).item(), 3) << spec.to_string();
    EXPECT_EQ(argmin(x, 0).item(), 3) << spec.to_string();
  }
}

template <typename I>
void check_integer_division() {
  const I lo = std::numeric_limits<I>::min(), hi = std::numeric_limits<I>::max();
  const std::vector<I> values{lo, static_cast<I>(lo + 1), -7, -1, 0, 1, 7, static_cast<I>(hi - 1), hi};
  const std::int64_t m = static_cast<std::int64_t>(values.size());
  Tensor<I> a({m, m}), b({m, m});
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < m; ++j) {
      a.flat(i * m + j) = values[static_cast<std::size_t>(i)];
      b.flat(i * m + j) = values[static_cast<std::size_t>(j)];
    }
  // numpy: x // 0 and x % 0 are 0 (with a warning); MIN // -1 wraps to MIN, MIN % -1 is 0.
  auto floor_ref = [&](I x, I y) -> I {
    if (y == 0) return 0;
    if (y == -1)
      return static_cast<I>(static_cast<std::make_unsigned_t<I>>(0) -
                            static_cast<std::make_unsigned_t<I>>(x));
    I q = static_cast<I>(x / y);
    if (x % y != 0 && ((x < 0) != (y < 0))) --q;
    return q;
  };
  auto mod_ref = [&](I x, I y) -> I {
    if (y == 0 || y == -1) return 0;
    I r = static_cast<I>(x % y);
    if (r != 0 && ((r < 0) != (y < 0))) r = static_cast<I>(r + y);
    return r;
  };
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const auto sa = device_put(a, NamedSharding(mesh, P("a"))), sb = device_put(b, NamedSharding(mesh, P("a")));
  const Tensor<I> fq = floor_divide(a, b), fr = remainder(a, b);
  const Tensor<I> sq = floor_divide(sa, sb).to_host(), sr = remainder(sa, sb).to_host();
  for (std::int64_t k = 0; k < m * m; ++k) {
    const I x = a.flat(k), y = b.flat(k);
    const std::string what = std::to_string(x) + " and " + std::to_string(y) + " (" + dtype_name<I>() + ")";
    EXPECT_EQ(fq.flat(k), floor_ref(x, y)) << "floor_divide " << what;
    EXPECT_EQ(sq.flat(k), floor_ref(x, y)) << "sharded floor_divide " << what;
    EXPECT_EQ(fr.flat(k), mod_ref(x, y)) << "remainder " << what;
    EXPECT_EQ(sr.flat(k), mod_ref(x, y)) << "sharded remainder " << what;
  }
}

/// Two's complement arithmetic, as numpy and JAX compute integers (the reference: unsigned 64-bit).
template <typename I>
I wrapped(std::uint64_t v) {
  return static_cast<I>(static_cast<std::make_unsigned_t<I>>(v));
}

template <typename I>
void check_integer_ops() {
  using U = std::uint64_t;
  const I lo = std::numeric_limits<I>::min(), hi = std::numeric_limits<I>::max();
  const std::vector<I> values{lo, static_cast<I>(lo + 1), -1, 0, 1, static_cast<I>(hi - 1), hi};
  const std::int64_t m = static_cast<std::int64_t>(values.size());
  Tensor<I> a({m, m}), b({m, m});  // every pair
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < m; ++j) {
      a.flat(i * m + j) = values[static_cast<std::size_t>(i)];
      b.flat(i * m + j) = values[static_cast<std::size_t>(j)];
    }
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const NamedSharding rows(mesh, P("a", None)), cols(mesh, P(None, "a"));
  const auto sa = device_put(a, rows), sb = device_put(b, rows);
  const auto ca = device_put(a, cols);  // reductions along a split dim combine devices (psum)
  const std::string type = dtype_name<I>();
  struct Binary {
    const char* name;
    Tensor<I> got, sharded;
    I (*want)(I, I);
  };
  const std::vector<Binary> binary{
      {"add", a + b, (sa + sb).to_host(), [](I x, I y) { return wrapped<I>(U(x) + U(y)); }},
      {"subtract", a - b, (sa - sb).to_host(), [](I x, I y) { return wrapped<I>(U(x) - U(y)); }},
      {"multiply", a * b, (sa * sb).to_host(), [](I x, I y) { return wrapped<I>(U(x) * U(y)); }},
      {"maximum", maximum(a, b), maximum(sa, sb).to_host(), [](I x, I y) { return x > y ? x : y; }},
      {"minimum", minimum(a, b), minimum(sa, sb).to_host(), [](I x, I y) { return x < y ? x : y; }},
      {"bitwise_and", a & b, (sa & sb).to_host(), [](I x, I y) { return static_cast<I>(x & y); }},
      {"bitwise_xor", a ^ b, (sa ^ sb).to_host(), [](I x, I y) { return static_cast<I>(x ^ y); }}};
  for (const auto& op : binary)
    for (std::int64_t k = 0; k < m * m; ++k) {
      const I x = a.flat(k), y = b.flat(k);
      EXPECT_EQ(op.got.flat(k), op.want(x, y)) << op.name << "(" << x << ", " << y << ") " << type;
      EXPECT_EQ(op.sharded.flat(k), op.want(x, y))
          << "sharded " << op.name << "(" << x << ", " << y << ") " << type;
    }
  struct Unary {
    const char* name;
    Tensor<I> got, sharded;
    I (*want)(I);
  };
  const std::vector<Unary> unary{
      {"negative", -a, (-sa).to_host(), [](I x) { return wrapped<I>(U(0) - U(x)); }},
      {"abs", abs(a), abs(sa).to_host(), [](I x) { return x < 0 ? wrapped<I>(U(0) - U(x)) : x; }},
      {"square", square(a), square(sa).to_host(), [](I x) { return wrapped<I>(U(x) * U(x)); }},
      {"sign", sign(a), sign(sa).to_host(), [](I x) { return static_cast<I>((x > 0) - (x < 0)); }}};
  for (const auto& op : unary)
    for (std::int64_t k = 0; k < m * m; ++k) {
      EXPECT_EQ(op.got.flat(k), op.want(a.flat(k))) << op.name << "(" << a.flat(k) << ") " << type;
      EXPECT_EQ(op.sharded.flat(k), op.want(a.flat(k)))
          << "sharded " << op.name << "(" << a.flat(k) << ") " << type;
    }
  // Reductions along each dim (rows: each row is one value repeated; columns: every value), in
  // both views and on both layouts (a split reduced dim adds a psum over 'a').
  for (const int dim : {0, 1}) {
    const Tensor<I> host_sum = sum(a, {dim}), host_prod = prod(a, {dim});
    const Tensor<I> host_max = max(a, {dim}), host_min = min(a, {dim});
    const Tensor<std::int64_t> host_argmax = argmax(a, dim), host_argmin = argmin(a, dim);
    const Tensor<I> host_cumsum = cumsum(a, dim);
    for (const auto* x : {&sa, &ca}) {
      const std::string what =
          type + " along dim " + std::to_string(dim) + " of " + x->sharding().to_string();
      const Tensor<I> s_sum = sum(*x, {dim}).to_host(), s_prod = prod(*x, {dim}).to_host();
      const Tensor<I> s_max = max(*x, {dim}).to_host(), s_min = min(*x, {dim}).to_host();
      const Tensor<std::int64_t> s_argmax = argmax(*x, dim).to_host(), s_argmin = argmin(*x, dim).to_host();
      const Tensor<I> s_cumsum = cumsum(*x, dim).to_host();
      for (std::int64_t o = 0; o < m; ++o) {
        U total = 0, product = 1, running = 0;
        I best = lo, worst = hi;
        std::int64_t at_best = 0, at_worst = 0;
        for (std::int64_t r = 0; r < m; ++r) {
          const I v = dim == 0 ? a.flat(r * m + o) : a.flat(o * m + r);
          total += U(v);
          product *= U(v);
          running += U(v);
          if (r == 0 || v > best) best = v, at_best = r;
          if (r == 0 || v < worst) worst = v, at_worst = r;
          const std::int64_t flat = dim == 0 ? r * m + o : o * m + r;
          EXPECT_EQ(host_cumsum.flat(flat), wrapped<I>(running)) << "cumsum " << what;
          EXPECT_EQ(s_cumsum.flat(flat), wrapped<I>(running)) << "sharded cumsum " << what;
        }
        EXPECT_EQ(host_sum.flat(o), wrapped<I>(total)) << "sum " << what << " at " << o;
        EXPECT_EQ(s_sum.flat(o), wrapped<I>(total)) << "sharded sum " << what << " at " << o;
        EXPECT_EQ(host_prod.flat(o), wrapped<I>(product)) << "prod " << what << " at " << o;
        EXPECT_EQ(s_prod.flat(o), wrapped<I>(product)) << "sharded prod " << what << " at " << o;
        EXPECT_EQ(host_max.flat(o), best) << "max " << what;
        EXPECT_EQ(s_max.flat(o), best) << "sharded max " << what;
        EXPECT_EQ(host_min.flat(o), worst) << "min " << what;
        EXPECT_EQ(s_min.flat(o), worst) << "sharded min " << what;
        EXPECT_EQ(host_argmax.flat(o), at_best) << "argmax " << what;
        EXPECT_EQ(s_argmax.flat(o), at_best) << "sharded argmax " << what;
        EXPECT_EQ(host_argmin.flat(o), at_worst) << "argmin " << what;
        EXPECT_EQ(s_argmin.flat(o), at_worst) << "sharded argmin " << what;
      }
    }
  }
  // A sum over the devices inside a shard_map: psum of MAX on every device wraps.
  const auto maxes = device_put(Tensor<I>({n, 2}, hi), rows);
  const Tensor<I> summed =
      shard_map(mesh, P("a", None), P(None, None),
                [](DeviceContext& ctx, const Tensor<I>& blk) { return ctx.psum(blk, "a"); })(maxes)
          .to_host();
  for (std::int64_t k = 0; k < summed.size(); ++k)
    EXPECT_EQ(summed.flat(k), wrapped<I>(U(hi) * U(n))) << "psum of " << n << " x MAX " << type;
}

/// Reductions over no element give numpy's / JAX's identities where they have one: any false, all
/// true, sum 0, prod 1, logsumexp -inf; softmax and log_softmax of empty rows are empty; max, min
/// and argmax raise (numpy: "zero-size array ... has no identity"). Both views, split and not.
SHARD_MPI_TEST(EdgeValues, EmptyReductionsGiveTheirIdentities) {
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const Tensor<float> h = random_tensor<float>({0, 3}, 41);
  for (const PartitionSpec& spec : {P("a"), P(), P(None, "a")}) {
    const auto x = device_put(h, NamedSharding(mesh, spec));
    const std::string what = spec.to_string();
    const Tensor<bool> any_s = any(x, {0}).to_host(), all_s = all(x, {0}).to_host();
    const Tensor<bool> any_h = any(h, {0}), all_h = all(h, {0});
    const Tensor<float> lse_s = logsumexp(x, {0}).to_host(), lse_h = logsumexp(h, {0});
    for (std::int64_t i = 0; i < 3; ++i) {
      EXPECT_FALSE(any_s.flat(i)) << what;
      EXPECT_FALSE(any_h.flat(i)) << what;
      EXPECT_TRUE(all_s.flat(i)) << what;
      EXPECT_TRUE(all_h.flat(i)) << what;
      EXPECT_EQ(lse_s.flat(i), -kInf) << what;
      EXPECT_EQ(lse_h.flat(i), -kInf) << what;
    }
    EXPECT_FALSE(any(x).item()) << what;
    EXPECT_TRUE(all(x).item()) << what;
    EXPECT_EQ(sum(x).item(), 0.f) << what;
    EXPECT_EQ(prod(x).item(), 1.f) << what;
    EXPECT_EQ(logsumexp(x).item(), -kInf) << what;
    EXPECT_EQ(softmax(x, 0).shape(), (Shape{0, 3})) << what;
    EXPECT_EQ(log_softmax(x, 0).shape(), (Shape{0, 3})) << what;
    EXPECT_EQ(softmax(h, 0).shape(), (Shape{0, 3})) << what;
    EXPECT_EQ(softmax(x, 1).shape(), (Shape{0, 3})) << what;  // rows of 3, none of them
    EXPECT_EQ(any(x, {1}).shape(), (Shape{0})) << what;       // nothing empty is reduced
    EXPECT_THROW((void)max(x, {0}), Error) << what;
    EXPECT_THROW((void)argmax(x, 0), Error) << what;
  }
}

SHARD_MPI_TEST(EdgeValues, IntegerOpsWrapAtTheLimits) {
  check_integer_ops<std::int32_t>();
  check_integer_ops<std::int64_t>();
}

SHARD_MPI_TEST(EdgeValues, IntegerDivisionAtTheLimits) {
  check_integer_division<std::int32_t>();
  check_integer_division<std::int64_t>();
}

template <typename I, typename F>
void check_saturating_cast() {
  const I lo = std::numeric_limits<I>::min(), hi = std::numeric_limits<I>::max();
  const std::vector<F> in{F(1e20),
                          F(-1e20),
                          std::numeric_limits<F>::quiet_NaN(),
                          std::numeric_limits<F>::infinity(),
                          -std::numeric_limits<F>::infinity(),
                          F(-2.75),
                          F(2.75),
                          F(0)};
  const std::vector<I> want{hi, lo, 0, hi, lo, -2, 2, 0};  // JAX: saturate, nan -> 0, truncate
  Tensor<F> t({static_cast<std::int64_t>(in.size())});
  for (std::size_t i = 0; i < in.size(); ++i) t.flat(static_cast<std::int64_t>(i)) = in[i];
  const int n = shard::testing::runtime().device_count();
  const auto s = device_put(t, NamedSharding(make_mesh({n}, {"a"}), P("a")));
  const Tensor<I> got = astype<I>(t), sharded = astype<I>(s).to_host();
  for (std::size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(got.flat(static_cast<std::int64_t>(i)), want[i]) << "astype of " << in[i];
    EXPECT_EQ(sharded.flat(static_cast<std::int64_t>(i)), want[i]) << "sharded astype of " << in[i];
  }
}

SHARD_MPI_TEST(EdgeValues, FloatToIntegerSaturates) {
  check_saturating_cast<std::int32_t, float>();
  check_saturating_cast<std::int32_t, double>();
  check_saturating_cast<std::int64_t, float>();
  check_saturating_cast<std::int64_t, double>();
}

SHARD_MPI_TEST(EdgeValues, OptimizerStateOfOtherParametersIsRefused) {
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const auto opt = optim::adam(1e-3);
  std::vector<ShardedArray<float>> p{device_put(random_tensor<float>({4, 2}, 1), NamedSharding(mesh, P()))};
  const std::vector<ShardedArray<float>> other{
      device_put(random_tensor<float>({3, 5}, 2), NamedSharding(mesh, P()))};
  auto wrong_shape = opt.init(other);
  shard::testing::expect_error<ShapeError>([&] { opt.update(p, p, wrong_shape); },
                                           {"state 'mu/0' has shape (3, 5)", "parameter 0 has shape (4, 2)"});
  if (n > 1) {
    const std::vector<ShardedArray<float>> split{
        device_put(random_tensor<float>({4, 2}, 3), NamedSharding(mesh, P("a")))};
    auto wrong_layout = opt.init(split);
    shard::testing::expect_error<ShardingError>([&] { opt.update(p, p, wrong_layout); },
                                                {"state 'mu/0' is laid out", "reshard the state"});
  }
  auto damaged = opt.init(p);
  damaged.step = full<std::int64_t>(Shape{}, -1, NamedSharding(mesh, P()));
  shard::testing::expect_error<ValueError>([&] { opt.update(p, p, damaged); },
                                           {"step count is -1", "damaged"});
  auto good = opt.init(p);
  opt.update(p, p, good);  // the parameters are unchanged by the refusals above
  EXPECT_EQ(good.step.item(), 1);
}

/// A shard_map body that reads a differentiated array's block through a capture: its gradient
/// could not flow back (it used to come back 0 with exit 0): ValueError naming the fix.
SHARD_MPI_TEST(EdgeValues, BodyReadingACapturedDifferentiatedArrayRaises) {
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const auto x = device_put(random_tensor<float>({2 * n, 3}, 6), NamedSharding(mesh, P("a")));
  auto f = [&](const ShardedArray<float>& p) {
    return sum(shard_map(mesh, P("a"), P("a"), [&](DeviceContext& ctx, const Tensor<float>& b) {
      return b * p.shard_of(ctx.device()).data;
    })(x));
  };
  shard::testing::expect_error<ValueError>(
      [&] { (void)grad(f)(x); }, {"shard_map body uses an array that the differentiated function tracks",
                                  "pass it to the shard_map as an argument"});
  // Passed as an argument, the same product differentiates: d sum(x * p) / dp = x.
  auto g = [&](const ShardedArray<float>& p) {
    return sum(shard_map(
        mesh, {P("a"), P("a")}, P("a"),
        [](DeviceContext&, const Tensor<float>& b, const Tensor<float>& q) { return b * q; })(x, p));
  };
  EXPECT_EQ(max(abs(grad(g)(x) - x)).item(), 0.f);
}

SHARD_MPI_TEST(EdgeValues, PrintOptionsOutOfRange) {
  const int n = shard::testing::runtime().device_count();
  const auto x = device_put(random_tensor<float>({3, 4}, 5), NamedSharding(make_mesh({n}, {"a"}), P("a")));
  PrintOptions o;
  o.precision = -3;
  shard::testing::expect_error<ValueError>([&] { (void)to_string(x, o); }, {"precision = -3"});
  o = PrintOptions{};
  o.linewidth = 0;
  shard::testing::expect_error<ValueError>([&] { (void)to_string(x, o); }, {"linewidth = 0"});
  o = PrintOptions{};
  o.edgeitems = -1;
  shard::testing::expect_error<ValueError>([&] { (void)to_string(x.to_host(), o); }, {"edgeitems = -1"});
  o = PrintOptions{};
  o.threshold = 0;  // numpy: summarise everything
  o.edgeitems = 1;
  EXPECT_NE(to_string(x.to_host(), o).find("..."), std::string::npos);
}

}  // namespace
