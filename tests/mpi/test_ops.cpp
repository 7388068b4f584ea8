// Whole-array ops (ops.hpp) on 1-D, 2-D and 3-D meshes: elementwise binary ops with numpy
// broadcasting, scalar ops, unary maps, compare/where, reductions, argmax, transpose and
// astype. Every result is checked on every rank against a serial host reference computed
// from the global host arrays (never with another Shard op): to_host(), every local shard
// (replicas included) against its reference box, and the result's spec against the
// documented sharding rule. CommStats checks which ops communicate.

#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <string>

#include "mpi_test.hpp"
#include "test_util.hpp"

namespace shard::testing {
namespace {

/// 1-D, every 2-D factorisation and one 3-D mesh over all devices.
std::vector<Mesh> test_meshes() {
  const int n = runtime().device_count();
  std::vector<Mesh> out{make_mesh({n}, {"a"})};
  for (const auto& f : factorisations(n, 2)) out.push_back(make_mesh(f, axis_names(2)));
  for (const auto& f : factorisations(n, 3))
    if (std::count(f.begin(), f.end(), 1) <= 1 || n < 4) {
      out.push_back(make_mesh(f, axis_names(3)));
      break;
    }
  return out;
}

// ---------------------------------------------------------------- host references

template <typename R, typename T, typename F>
Tensor<R> host_zip(const Tensor<T>& a, const Tensor<T>& b, F f) {
  const Shape out = host_broadcast(a.shape(), b.shape());
  Tensor<R> r(out);
  Shape idx(out.size(), 0);
  for (std::int64_t i = 0; i < r.size(); ++i, next_index(idx, out))
    r.flat(i) = f(a.flat(broadcast_offset(a.shape(), idx)), b.flat(broadcast_offset(b.shape(), idx)));
  return r;
}

template <typename T, typename F>
Tensor<T> host_map(const Tensor<T>& a, F f) {
  Tensor<T> r(a.shape());
  for (std::int64_t i = 0; i < a.size(); ++i) r.flat(i) = f(a.flat(i));
  return r;
}

std::vector<int> norm_dims(std::vector<int> dims, int rank) {
  if (dims.empty())
    for (int d = 0; d < rank; ++d) dims.push_back(d);
  for (auto& d : dims) d = d < 0 ? d + rank : d;
  return dims;
}

template <typename T>
Tensor<T> host_reduce(const Tensor<T>& x, const std::vector<int>& dims_in, ReduceKind kind) {
  const auto dims = norm_dims(dims_in, x.rank());
  Shape out;
  std::int64_t count = 1;
  for (int d = 0; d < x.rank(); ++d) {
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) out.push_back(x.shape()[d]);
    else count *= x.shape()[d];
  }
  const std::int64_t n_out = num_elements(out);
  std::vector<long double> sum(static_cast<std::size_t>(n_out), 0);
  std::vector<T> mx(sum.size(), std::numeric_limits<T>::lowest()), mn(sum.size(), std::numeric_limits<T>::max());
  Shape idx(x.shape().size(), 0);
  for (std::int64_t i = 0; i < x.size(); ++i, next_index(idx, x.shape())) {
    std::int64_t o = 0;
    for (int d = 0, k = 0; d < x.rank(); ++d)
      if (std::find(dims.begin(), dims.end(), d) == dims.end()) o = o * out[k++] + idx[d];
    sum[o] += x.flat(i);
    mx[o] = std::max(mx[o], x.flat(i));
    mn[o] = std::min(mn[o], x.flat(i));
  }
  Tensor<T> r(out);
  for (std::int64_t o = 0; o < n_out; ++o) {
    switch (kind) {
      case ReduceKind::kSum: r.flat(o) = static_cast<T>(sum[o]); break;
      case ReduceKind::kMax: r.flat(o) = mx[o]; break;
      case ReduceKind::kMin: r.flat(o) = mn[o]; break;
      default:
        if constexpr (std::is_integral_v<T>) r.flat(o) = static_cast<T>(static_cast<T>(sum[o]) / static_cast<T>(count));
        else r.flat(o) = static_cast<T>(sum[o] / count);
    }
  }
  return r;
}

template <typename T>
Tensor<T> host_transpose(const Tensor<T>& x, const std::vector<int>& perm) {
  Shape out;
  for (int p : perm) out.push_back(x.shape()[p]);
  Tensor<T> r(out);
  const Shape st = strides_of(x.shape());
  Shape idx(out.size(), 0);
  for (std::int64_t i = 0; i < r.size(); ++i, next_index(idx, out)) {
    std::int64_t off = 0;
    for (std::size_t k = 0; k < perm.size(); ++k) off += idx[k] * st[perm[k]];
    r.flat(i) = x.flat(off);
  }
  return r;
}

/// b with zeros replaced by ones (a safe divisor).
template <typename T>
Tensor<T> nonzero(Tensor<T> b) {
  for (auto& v : b)
    if (v == T(0)) v = T(1);
  return b;
}

// ---------------------------------------------------------------- checks

struct Tol {
  double atol = 0, rtol = 0;  // both 0: exact
};

template <typename T>
bool close(T got, T want, Tol tol) {
  if (tol.atol == 0 && tol.rtol == 0) return got == want;
  const double g = static_cast<double>(got), w = static_cast<double>(want);
  return std::abs(g - w) <= tol.atol + tol.rtol * std::abs(w);
}

template <typename T>
void expect_values(const T* got, const T* want, std::int64_t n, Tol tol, const std::string& what) {
  std::int64_t bad = 0, first = -1;
  for (std::int64_t i = 0; i < n; ++i)
    if (!close(got[i], want[i], tol) && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0) << what << ": first mismatch at flat " << first << ": got "
                    << (first >= 0 ? +got[first] : T()) << " want " << (first >= 0 ? +want[first] : T());
}

/// The full check of an op result: shape, mesh, spec (if `spec` is given), to_host() and
/// every local shard's box and data against the reference. Collective (to_host).
template <typename T>
void expect_result(const ShardedArray<T>& r, const Tensor<T>& want, const Mesh& mesh, const PartitionSpec* spec,
                   const std::string& what, Tol tol = {}) {
  const Tensor<T> host = r.to_host();  // first: collective on every rank whatever fails below
  EXPECT_TRUE(r.mesh() == mesh) << what << ": result on " << r.mesh().devices_string();
  if (spec) {
    EXPECT_TRUE(r.spec() == *spec) << what << ": spec " << r.spec().to_string() << ", want " << spec->to_string();
  }
  EXPECT_EQ(r.shape(), want.shape()) << what;
  if (r.shape() != want.shape() || host.shape() != want.shape()) return;
  expect_values(host.data(), want.data(), want.size(), tol, what + " to_host");
  const auto local = mesh.local_device_ids();
  EXPECT_EQ(r.addressable_shards().size(), local.size()) << what;
  for (std::size_t i = 0; i < std::min(local.size(), r.addressable_shards().size()); ++i) {
    const auto& s = r.addressable_shards()[i];
    const Box ref = reference_box(mesh, r.spec(), want.shape(), local[i]);
    EXPECT_EQ(s.device, local[i]) << what;
    EXPECT_EQ(s.box, ref) << what << " device " << local[i];
    EXPECT_EQ(s.data.shape(), ref.extent) << what << " device " << local[i];
    if (s.data.shape() != ref.extent) continue;
    const auto expected = reference_block(want, ref);
    expect_values(s.data.data(), expected.data(), ref.size(), tol,
                  what + " shard of device " + std::to_string(local[i]) + " " + to_string(ref));
  }
}

/// Named axes of a mesh: a, b (None on a 1-D mesh), c (None below 3-D), ab = (a, b).
struct Axes {
  SpecEntry a, b, c, ab;
  explicit Axes(const Mesh& m) {
    const auto& n = m.axis_names();
    a = SpecEntry(n[0]);
    if (n.size() > 1) b = SpecEntry(n[1]);
    if (n.size() > 2) c = SpecEntry(n[2]);
    ab = n.size() > 1 ? SpecEntry(std::vector<std::string>{n[0], n[1]}) : a;
  }
};

std::int64_t total_calls() { return comm_stats().total().calls; }

/// MPI calls one collective over `axes` costs this rank: the groups holding a local device
/// that also hold another rank's device (computed from mesh coordinates and ownership).
int spanning_groups(const Mesh& mesh, const std::vector<std::string>& axes) {
  const Topology& topo = mesh.topology();
  std::vector<std::vector<int>> keys;
  int count = 0;
  for (int d : mesh.device_ids()) {
    if (!topo.is_local(d)) continue;
    auto key = mesh.coords(d);
    for (const auto& name : axes) key[mesh.axis_position(name)] = 0;
    if (std::find(keys.begin(), keys.end(), key) != keys.end()) continue;
    keys.push_back(key);
    bool spans = false;
    for (int e : mesh.device_ids()) {
      auto k2 = mesh.coords(e);
      for (const auto& name : axes) k2[mesh.axis_position(name)] = 0;
      if (k2 == key && !topo.is_local(e)) spans = true;
    }
    count += spans;
  }
  return count;
}

// ---------------------------------------------------------------- binary ops

struct Operand {
  Shape shape;
  PartitionSpec spec;
};
struct BinaryCase {
  Operand x, y;
  bool rule_applies = true;  // one operand has the result's shape
};

std::vector<BinaryCase> binary_cases(const Mesh& m) {
  const Axes X(m);
  return {
      {{{19, 7}, P(X.a, X.b)}, {{19, 7}, P(X.a, X.b)}},            // same sharding
      {{{19, 7}, P(X.a, None)}, {{19, 7}, P(None, X.a)}},          // different shardings, same shape
      {{{19, 7}, P(X.b, X.a)}, {{19, 7}, P(X.ab)}},
      {{{19, 7}, P()}, {{19, 7}, P(None, X.ab)}},
      {{{16, 6}, P(X.a, X.b)}, {{6}, P()}},                        // bias row (H,) onto a batch
      {{{16, 6}, P(X.a, None)}, {{6}, P(X.a)}},
      {{{16, 6}, P(X.a, X.b)}, {{1, 6}, P()}},                     // bias row (1, H)
      {{{1, 6}, P(None, X.a)}, {{16, 6}, P(X.a, X.b)}},            // bias first: follows the batch
      {{{19, 7}, P(X.a, X.b)}, {{19, 1}, P(X.a)}},                 // column (B, 1)
      {{{19, 1}, P(X.b)}, {{19, 7}, P(None, X.a)}},
      {{{4, 3, 5}, P(X.a, X.b, X.c)}, {{3, 5}, P(None, X.a)}},     // 3-D with a 2-D operand
      {{{4, 1, 5}, P(X.b, None, X.a)}, {{4, 3, 5}, P(X.c, X.a, X.b)}},
      {{{3, 5}, P(X.ab)}, {{3, 5}, P(None, X.a)}},                 // empty shards beyond 3 devices
      {{{2, 3}, P(None, X.ab)}, {{2, 3}, P(X.a)}},
      {{{7}, P(X.a)}, {{7}, P()}},                                 // 1-D
      {{{}, P()}, {{5, 3}, P(X.a)}},                               // 0-d array operand
      {{{19, 1}, P(X.a)}, {{1, 7}, P(None, X.b)}, false},          // outer: neither has the shape
  };
}

template <typename T>
void check_binary_cases(std::uint64_t seed) {
  using Op = std::function<ShardedArray<T>(const ShardedArray<T>&, const ShardedArray<T>&)>;
  using Ref = std::function<T(T, T)>;
  std::vector<std::tuple<const char*, Op, Ref>> ops = {
      {"+", [](auto& x, auto& y) { return x + y; }, [](T x, T y) { return static_cast<T>(x + y); }},
      {"-", [](auto& x, auto& y) { return x - y; }, [](T x, T y) { return static_cast<T>(x - y); }},
      {"*", [](auto& x, auto& y) { return x * y; }, [](T x, T y) { return static_cast<T>(x * y); }},
      {"maximum", [](auto& x, auto& y) { return maximum(x, y); }, [](T x, T y) { return x > y ? x : y; }},
      {"minimum", [](auto& x, auto& y) { return minimum(x, y); }, [](T x, T y) { return x < y ? x : y; }},
  };
  if constexpr (is_floating_v<T>) {
    ops.emplace_back("/", [](auto& x, auto& y) { return x / y; }, [](T x, T y) { return static_cast<T>(x / y); });
  } else {  // numpy's // and %: the quotient rounded down, the remainder with the divisor's sign
    ops.emplace_back("floor_divide", [](auto& x, auto& y) { return floor_divide(x, y); }, [](T x, T y) {
      return static_cast<T>(std::floor(static_cast<double>(x) / static_cast<double>(y)));
    });
    ops.emplace_back("remainder", [](auto& x, auto& y) { return remainder(x, y); }, [](T x, T y) {
      return static_cast<T>(x - y * static_cast<T>(std::floor(static_cast<double>(x) / static_cast<double>(y))));
    });
  }
  for (const auto& mesh : test_meshes())
    for (const auto& c : binary_cases(mesh)) {
      const Tensor<T> hx = random_tensor<T>(c.x.shape, seed++);
      const Tensor<T> hy = nonzero(random_tensor<T>(c.y.shape, seed++));
      const auto x = device_put(hx, NamedSharding(mesh, c.x.spec));
      const auto y = device_put(hy, NamedSharding(mesh, c.y.spec));
      const Shape out = host_broadcast(c.x.shape, c.y.shape);
      const PartitionSpec want = c.x.shape == out ? c.x.spec : c.y.spec;
      for (const auto& [name, op, ref] : ops) {
        const std::string what = std::string(dtype_name<T>()) + " " + name + " on " + mesh.to_string() + ": " +
                                 to_string(c.x.shape) + " " + c.x.spec.to_string() + " with " +
                                 to_string(c.y.shape) + " " + c.y.spec.to_string();
        expect_result(op(x, y), host_zip<T>(hx, hy, ref), mesh, c.rule_applies ? &want : nullptr, what);
      }
    }
}

template <typename T>
class OpsTyped : public MpiTest {};
using Types = ::testing::Types<float, double, std::int32_t, std::int64_t, bfloat16>;
TYPED_TEST_SUITE(OpsTyped, Types);

TYPED_TEST(OpsTyped, BinaryBroadcastingEveryMesh) { check_binary_cases<TypeParam>(100); }

TYPED_TEST(OpsTyped, ScalarOnEitherSide) {
  using T = TypeParam;
  std::uint64_t seed = 300;
  for (const auto& mesh : test_meshes()) {
    const Axes X(mesh);
    for (const auto& spec : {P(X.a, X.b), P(None, X.ab), P()}) {
      const Tensor<T> hx = nonzero(random_tensor<T>({19, 7}, seed++));
      const auto x = device_put(hx, NamedSharding(mesh, spec));
      const T s = static_cast<T>(2.5);  // 2 for integers
      const std::string what = std::string(dtype_name<T>()) + " " + mesh.to_string() + " " + spec.to_string();
      comm_stats().reset();
      using F = float_of_t<T>;
      const std::vector<std::tuple<const char*, ShardedArray<T>, std::function<T(T)>>> got = {
          {"x + s", x + s, [&](T v) { return static_cast<T>(v + s); }},
          {"x - s", x - s, [&](T v) { return static_cast<T>(v - s); }},
          {"x * s", x * s, [&](T v) { return static_cast<T>(v * s); }},
          {"s + x", s + x, [&](T v) { return static_cast<T>(s + v); }},
          {"s - x", s - x, [&](T v) { return static_cast<T>(s - v); }},
          {"s * x", s * x, [&](T v) { return static_cast<T>(s * v); }},
          {"-x", -x, [&](T v) { return static_cast<T>(-v); }}};
      // True division is floating for every type (JAX): int32 / int32 is float32.
      const ShardedArray<F> q1 = x / s, q2 = s / x;
      EXPECT_EQ(total_calls(), 0) << what << ": scalar ops communicated\n" << comm_stats().to_string();
      for (const auto& [name, r, ref] : got) expect_result(r, host_map(hx, ref), mesh, &spec, what + " " + name);
      Tensor<F> w1(hx.shape()), w2(hx.shape());
      for (std::int64_t i = 0; i < hx.size(); ++i) {
        w1.flat(i) = static_cast<F>(static_cast<F>(hx.flat(i)) / static_cast<F>(s));
        w2.flat(i) = static_cast<F>(static_cast<F>(s) / static_cast<F>(hx.flat(i)));
      }
      expect_result(q1, w1, mesh, &spec, what + " x / s");
      expect_result(q2, w2, mesh, &spec, what + " s / x");
    }
  }
}

SHARD_MPI_TEST(Ops, AstypeTruncatesLikeStaticCast) {
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const PartitionSpec spec = P(None, "a");
  const Tensor<float> h({2, 5}, std::vector<float>{-2.9f, -1.5f, -0.5f, 0.5f, 1.5f, 2.9f, -7.0f, 7.99f, 0.f, 100.7f});
  const auto x = device_put(h, NamedSharding(mesh, spec));
  const Tensor<std::int32_t> want({2, 5}, std::vector<std::int32_t>{-2, -1, 0, 0, 1, 2, -7, 7, 0, 100});
  expect_result(astype<std::int32_t>(x), want, mesh, &spec, "astype<int32>(float)");
  const Tensor<std::int32_t> hi = random_tensor<std::int32_t>({3, 4}, 401);
  const auto xi = device_put(hi, NamedSharding(mesh, P("a")));
  Tensor<double> wd(hi.shape());
  for (std::int64_t i = 0; i < hi.size(); ++i) wd.flat(i) = hi.flat(i);
  const PartitionSpec pa = P("a");
  expect_result(astype<double>(xi), wd, mesh, &pa, "astype<double>(int32)");
}

SHARD_MPI_TEST(Ops, DifferentlyShardedOperands) {
  // x P('a', None) + y P(None, 'a'): y moves to x's layout, the result has x's spec.
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  for (const Shape& shape : {Shape{8, 12}, Shape{19, 7}, Shape{3, 2}}) {
    const Tensor<double> hx = random_tensor<double>(shape, 500), hy = random_tensor<double>(shape, 501);
    const auto x = device_put(hx, NamedSharding(mesh, P("a", None)));
    const auto y = device_put(hy, NamedSharding(mesh, P(None, "a")));
    const PartitionSpec want = P("a", None);
    expect_result(x + y, host_zip<double>(hx, hy, [](double a, double b) { return a + b; }), mesh, &want,
                  "x P('a', None) + y P(None, 'a') " + to_string(shape));
    const PartitionSpec want_y = P(None, "a");
    expect_result(y * x, host_zip<double>(hy, hx, [](double a, double b) { return a * b; }), mesh, &want_y,
                  "y P(None, 'a') * x P('a', None) " + to_string(shape));
  }
}

SHARD_MPI_TEST(Ops, SameShardingAndReplicatedBiasDoNotCommunicate) {
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh(factorisations(n, 2)[factorisations(n, 2).size() / 2], {"data", "model"});
  const Tensor<float> hb = random_tensor<float>({16, 6}, 600), hbias = random_tensor<float>({6}, 601);
  const auto batch = device_put(hb, NamedSharding(mesh, P("data", "model")));
  const auto other = device_put(hb, NamedSharding(mesh, P("data", "model")));
  const auto bias = device_put(hbias, NamedSharding(mesh, P()));
  comm_stats().reset();
  const auto r1 = batch + other;
  const auto r2 = batch + bias;
  const auto r3 = bias * batch;
  EXPECT_EQ(total_calls(), 0) << comm_stats().to_string();
  const PartitionSpec want = P("data", "model");
  expect_result(r1, host_zip<float>(hb, hb, [](float a, float b) { return a + b; }), mesh, &want, "batch + batch");
  expect_result(r2, host_zip<float>(hb, hbias, [](float a, float b) { return a + b; }), mesh, &want, "batch + bias");
  expect_result(r3, host_zip<float>(hbias, hb, [](float a, float b) { return a * b; }), mesh, &want, "bias * batch");
}

// ---------------------------------------------------------------- unary, compare, where

/// v -> f(v) computed in double, rounded to T.
template <typename T, typename F>
auto in_double(F f) {
  return [f](T v) { return static_cast<T>(f(static_cast<double>(v))); };
}

template <typename T>
void check_unary(const Mesh& mesh, const PartitionSpec& spec, const Shape& shape, std::uint64_t seed) {
  const std::string what = std::string(dtype_name<T>()) + " " + mesh.to_string() + " " + spec.to_string() + " " +
                           to_string(shape);
  const NamedSharding s(mesh, spec);
  const Tensor<T> h = random_tensor<T>(shape, seed);
  const auto x = device_put(h, s);
  const auto check = [&](const ShardedArray<T>& r, const Tensor<T>& in, auto f, const char* name, Tol tol = {}) {
    expect_result(r, host_map(in, f), mesh, &spec, what + " " + name, tol);
  };
  check(abs(x), h, [](T v) { return v < 0 ? static_cast<T>(-v) : v; }, "abs");
  check(neg(x), h, [](T v) { return static_cast<T>(-v); }, "neg");
  check(square(x), h, [](T v) { return static_cast<T>(v * v); }, "square");
  check(relu(x), h, [](T v) { return v > 0 ? v : T(0); }, "relu");
  check(map(x, [](T v) { return static_cast<T>(v * 3 - 2); }), h, [](T v) { return static_cast<T>(v * 3 - 2); }, "map");
  if constexpr (is_floating_v<T>) {
    // Inputs prepared on the host: x/20 for exp and tanh, |x| + 1 for log, |x| for sqrt.
    const Tensor<T> small = host_map(h, [](T v) { return static_cast<T>(v / 20); });
    const Tensor<T> pos = host_map(h, [](T v) { return static_cast<T>(std::abs(v) + 1); });
    const Tensor<T> mag = host_map(h, [](T v) { return static_cast<T>(std::abs(v)); });
    const auto xs = device_put(small, s), xp = device_put(pos, s), xm = device_put(mag, s);
    const Tol tol{1e-30, tol_for<T>(1e-6, 1e-14, 8e-3)};
    check(exp(xs), small, in_double<T>([](double v) { return std::exp(v); }), "exp", tol);
    check(log(xp), pos, in_double<T>([](double v) { return std::log(v); }), "log(|x|+1)", tol);
    check(sin(x), h, in_double<T>([](double v) { return std::sin(v); }), "sin", tol);
    check(cos(x), h, in_double<T>([](double v) { return std::cos(v); }), "cos", tol);
    check(tanh(xs), small, in_double<T>([](double v) { return std::tanh(v); }), "tanh", tol);
    check(sqrt(xm), mag, in_double<T>([](double v) { return std::sqrt(v); }), "sqrt(|x|)", tol);
  }
}

TYPED_TEST(OpsTyped, UnaryMaps) {
  std::uint64_t seed = 700;
  for (const auto& mesh : test_meshes()) {
    const Axes X(mesh);
    check_unary<TypeParam>(mesh, P(X.a, X.b), {19, 7}, seed++);
    check_unary<TypeParam>(mesh, P(None, X.ab), {3, 3}, seed++);
    check_unary<TypeParam>(mesh, P(X.c, None, X.a), {4, 3, 5}, seed++);
  }
}

TYPED_TEST(OpsTyped, CompareAndWhere) {
  using T = TypeParam;
  using Cmp = std::function<bool(T, T)>;
  const std::vector<std::tuple<CompareOp, const char*, Cmp>> cmps = {
      {CompareOp::kLess, "<", [](T a, T b) { return a < b; }},
      {CompareOp::kLessEqual, "<=", [](T a, T b) { return a <= b; }},
      {CompareOp::kGreater, ">", [](T a, T b) { return a > b; }},
      {CompareOp::kGreaterEqual, ">=", [](T a, T b) { return a >= b; }},
      {CompareOp::kEqual, "==", [](T a, T b) { return a == b; }},
      {CompareOp::kNotEqual, "!=", [](T a, T b) { return a != b; }},
  };
  std::uint64_t seed = 800;
  for (const auto& mesh : test_meshes()) {
    const Axes X(mesh);
    // Values in {-2..2} so equality and ties are frequent.
    const auto coarse = [](Tensor<T> t) {
      for (auto& v : t) v = static_cast<T>(static_cast<std::int64_t>(v) % 3);
      return t;
    };
    const Tensor<T> ha = coarse(random_tensor<T>({19, 7}, seed++)), hb = coarse(random_tensor<T>({19, 7}, seed++));
    const Tensor<T> hrow = coarse(random_tensor<T>({7}, seed++));
    const PartitionSpec sa = P(X.a, X.b);
    const auto a = device_put(ha, NamedSharding(mesh, sa));
    const auto b = device_put(hb, NamedSharding(mesh, P(None, X.ab)));
    const auto row = device_put(hrow, NamedSharding(mesh, P(X.a)));
    const std::string m = std::string(dtype_name<T>()) + " " + mesh.to_string();
    for (const auto& [op, name, ref] : cmps) {
      expect_result(compare(a, b, op), host_zip<bool>(ha, hb, ref), mesh, &sa, m + " a " + name + " b");
      expect_result(compare(a, row, op), host_zip<bool>(ha, hrow, ref), mesh, &sa, m + " a " + name + " row");
      expect_result(compare(a, T(1), op), host_zip<bool>(ha, Tensor<T>(Shape{}, T(1)), ref), mesh, &sa,
                    m + " a " + name + " 1");
    }
    // The operators are the same comparisons.
    expect_result(a < b, host_zip<bool>(ha, hb, [](T x, T y) { return x < y; }), mesh, &sa, m + " operator<");
    expect_result(a >= 1, host_zip<bool>(ha, Tensor<T>(Shape{}, T(1)), [](T x, T y) { return x >= y; }), mesh, &sa,
                  m + " operator>= scalar");
    // where(a > b, a, b) is the elementwise maximum; the result follows a.
    const auto gt = compare(a, b, CompareOp::kGreater);
    const Tensor<bool> hgt = host_zip<bool>(ha, hb, [](T x, T y) { return x > y; });
    const auto pick = [](bool c, T x, T y) { return c ? x : y; };
    Tensor<T> want(ha.shape());
    for (std::int64_t i = 0; i < want.size(); ++i) want.flat(i) = pick(hgt.flat(i), ha.flat(i), hb.flat(i));
    expect_result(where(gt, a, b), want, mesh, &sa, m + " where(a > b, a, b)");
    // A condition with another sharding, and a broadcast row as the second value.
    const auto cond = device_put(hgt, NamedSharding(mesh, P(None, X.a)));
    for (std::int64_t i = 0; i < want.size(); ++i) want.flat(i) = pick(hgt.flat(i), ha.flat(i), hrow.flat(i % 7));
    expect_result(where(cond, a, row), want, mesh, &sa, m + " where(cond P(None, a), a, row)");
    // The condition compared against a scalar, the row as the first value: follows b (full shape).
    const auto pos = compare(b, T(0), CompareOp::kGreater);
    const PartitionSpec sb = P(None, X.ab);
    for (std::int64_t i = 0; i < want.size(); ++i) want.flat(i) = pick(hb.flat(i) > T(0), hrow.flat(i % 7), hb.flat(i));
    expect_result(where(pos, row, b), want, mesh, &sb, m + " where(b > 0, row, b)");
  }
}

SHARD_MPI_TEST(Ops, WhereBroadcastsTheCondition) {
  // numpy: where(cond (B, H), row (H,), 0-d) has shape (B, H); ops.hpp: "broadcasting all three".
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const Tensor<double> hrow = random_tensor<double>({7}, 850);
  const Tensor<std::int32_t> hc = host_map(random_tensor<std::int32_t>({5, 7}, 851), [](std::int32_t v) { return v & 1; });
  const auto cond = device_put(hc, NamedSharding(mesh, P("a")));
  const auto row = device_put(hrow, NamedSharding(mesh, P()));
  const auto zero = full<double>(Shape{}, 0.0, NamedSharding(mesh, P()));
  Tensor<double> want({5, 7});
  for (std::int64_t i = 0; i < want.size(); ++i) want.flat(i) = hc.flat(i) ? hrow.flat(i % 7) : 0.0;
  try {  // the result spec is not documented for this case: values and layout consistency only
    expect_result(where(cond, row, zero), want, mesh, nullptr, "where(cond (5, 7), row (7,), 0.0)");
  } catch (const ShapeError& e) {
    ADD_FAILURE() << "where(cond (5, 7), row (7,), 0-d) does not broadcast the condition: " << e.what();
  }
}

// ---------------------------------------------------------------- reductions

const char* kind_name(ReduceKind k) {
  static const char* kNames[] = {"sum", "mean", "max", "min", "prod"};
  return kNames[static_cast<int>(k)];
}

template <typename T>
void check_reductions(const Mesh& mesh, const PartitionSpec& spec, const Shape& shape, std::uint64_t seed) {
  const int rank = static_cast<int>(shape.size());
  const Tensor<T> h = random_tensor<T>(shape, seed);
  const auto x = device_put(h, NamedSharding(mesh, spec));
  std::vector<std::vector<int>> dim_sets = {{}};
  if (rank >= 1) dim_sets.push_back({-1});
  for (int d = 0; d < rank; ++d) dim_sets.push_back({d});
  if (rank >= 2) dim_sets.push_back({0, rank - 1});
  if (rank >= 3) dim_sets.push_back({-3, -2});
  for (const auto& dims_in : dim_sets) {
    const auto dims = norm_dims(dims_in, rank);
    std::vector<SpecEntry> kept;
    std::int64_t count = 1;
    for (int d = 0; d < rank; ++d) {
      if (std::find(dims.begin(), dims.end(), d) == dims.end()) kept.push_back(spec[d]);
      else count *= shape[d];
    }
    const PartitionSpec want(kept);
    for (ReduceKind kind : {ReduceKind::kSum, ReduceKind::kMean, ReduceKind::kMax, ReduceKind::kMin}) {
      std::string what = std::string(dtype_name<T>()) + " " + kind_name(kind) + " dims {";
      for (int d : dims_in) what += std::to_string(d) + ",";
      what += "} of " + to_string(shape) + " " + spec.to_string() + " on " + mesh.to_string();
      Tol tol;
      const double eps = tol_for<T>(2e-6, 1e-14, 8e-3);
      if (kind == ReduceKind::kSum) tol.atol = eps * 100 * static_cast<double>(count);
      if (kind == ReduceKind::kMean) tol.atol = eps * 100;
      if (kind == ReduceKind::kMean && !is_floating_v<T>) {  // integer means are floating (JAX)
        const Tensor<T> s = host_reduce(h, dims_in, ReduceKind::kSum);
        Tensor<float_of_t<T>> wm(s.shape());
        for (std::int64_t i = 0; i < wm.size(); ++i)
          wm.flat(i) = static_cast<float_of_t<T>>(static_cast<double>(s.flat(i)) / static_cast<double>(count));
        expect_result(mean(x, dims_in), wm, mesh, &want, what, Tol{1e-12, 1e-6});
        continue;
      }
      expect_result(reduce(x, kind, dims_in), host_reduce(h, dims_in, kind), mesh, &want, what, tol);
    }
  }
}

TYPED_TEST(OpsTyped, ReductionsEverySpec2D) {
  std::uint64_t seed = 900;
  for (const auto& mesh : test_meshes()) {
    if (mesh.ndim() > 2) continue;
    for (const Shape& shape : {Shape{19, 7}, Shape{3, 5}})
      for (const auto& spec : all_specs(mesh.axis_names(), 2)) check_reductions<TypeParam>(mesh, spec, shape, seed++);
  }
}

TYPED_TEST(OpsTyped, Reductions3D) {
  std::uint64_t seed = 1000;
  for (const auto& mesh : test_meshes()) {
    const Axes X(mesh);
    check_reductions<TypeParam>(mesh, P(X.a, X.b, X.c), {4, 3, 5}, seed++);
    check_reductions<TypeParam>(mesh, P(X.c, None, X.ab), {5, 2, 3}, seed++);
    check_reductions<TypeParam>(mesh, P(None, X.ab), {2, 3, 1}, seed++);
    check_reductions<TypeParam>(mesh, P(X.b, None, X.a), {2, 3, 1}, seed++);  // size-1 dim split: empty shards
    check_reductions<TypeParam>(mesh, P(), {7}, seed++);
    check_reductions<TypeParam>(mesh, P(), {}, seed++);
    check_reductions<TypeParam>(mesh, P(X.ab), {19}, seed++);
  }
}

SHARD_MPI_TEST(Ops, ReductionCommunication) {
  const int n = runtime().device_count();
  const int k = runtime().devices_per_rank();
  const int p = runtime().process_count();
  const Tensor<double> h = random_tensor<double>({19, 7}, 1100);
  // 1-D mesh over every device: 'a' spans the ranks when there are several.
  const Mesh m1 = make_mesh({n}, {"a"});
  const auto x = device_put(h, NamedSharding(m1, P("a", None)));
  comm_stats().reset();
  const auto r0 = sum(x, {1});  // dim 1 is not split: local
  EXPECT_EQ(total_calls(), 0) << "sum over an unsplit dim\n" << comm_stats().to_string();
  const PartitionSpec pa = P("a");
  expect_result(r0, host_reduce(h, {1}, ReduceKind::kSum), m1, &pa, "sum dim 1", Tol{1e-11, 0});
  comm_stats().reset();
  const auto r1 = sum(x, {0});
  const auto psum_calls = comm_stats().get("psum").calls;
  EXPECT_EQ(psum_calls, p > 1 ? 1 : 0) << comm_stats().to_string();
  EXPECT_EQ(total_calls(), psum_calls) << comm_stats().to_string();
  EXPECT_EQ(spanning_groups(m1, {"a"}), p > 1 ? 1 : 0);
  const PartitionSpec none = P();
  expect_result(r1, host_reduce(h, {0}, ReduceKind::kSum), m1, &none, "sum dim 0", Tol{1e-11, 0});
  comm_stats().reset();
  const auto r2 = max(x);
  EXPECT_EQ(comm_stats().get("pmax").calls, p > 1 ? 1 : 0) << comm_stats().to_string();
  expect_result(r2, host_reduce(h, {}, ReduceKind::kMax), m1, &none, "max all");
  // A 2-D mesh whose minor axis 'b' holds the devices of one rank: reducing over it stays in memory.
  const Mesh m2 = make_mesh({n / k, k}, {"a", "b"});
  const auto y = device_put(h, NamedSharding(m2, P("b", "a")));
  for (const auto& [dims, axes, spec] : std::vector<std::tuple<std::vector<int>, std::vector<std::string>, P>>{
           {{0}, {"b"}, P("a")}, {{1}, {"a"}, P("b")}, {{}, {"a", "b"}, P()}}) {
    comm_stats().reset();
    const auto r = mean(y, dims);
    const auto calls = total_calls();
    EXPECT_EQ(calls, spanning_groups(m2, axes)) << "mean over " << axes.size() << " axes\n" << comm_stats().to_string();
    if (axes.size() == 1 && axes[0] == "b") {
      EXPECT_EQ(calls, 0) << "'b' holds one rank's devices";
    }
    expect_result(r, host_reduce(h, dims, ReduceKind::kMean), m2, &spec, "mean of P('b', 'a')", Tol{1e-12, 0});
  }
}

// ---------------------------------------------------------------- argmax, transpose

template <typename T>
void check_argmax(const Mesh& mesh, const PartitionSpec& spec, const Shape& shape, std::uint64_t seed) {
  // Few distinct values: most lines hold the maximum several times (the first index must win).
  Tensor<T> h = random_tensor<T>(shape, seed);
  for (auto& v : h) v = static_cast<T>(std::floor(static_cast<double>(v) / 50.0) * 1.5);
  const auto x = device_put(h, NamedSharding(mesh, spec));
  const int rank = static_cast<int>(shape.size());
  for (int dim = -1; dim < rank; ++dim) {
    const int d = dim < 0 ? dim + rank : dim;
    std::vector<SpecEntry> kept;
    for (int k = 0; k < rank; ++k)
      if (k != d) kept.push_back(spec[k]);
    const PartitionSpec want(kept);
    expect_result(argmax(x, dim), host_argmax(h, dim), mesh, &want,
                  std::string(dtype_name<T>()) + " argmax dim " + std::to_string(dim) + " of " + to_string(shape) +
                      " " + spec.to_string() + " on " + mesh.to_string());
  }
}

TYPED_TEST(OpsTyped, ArgmaxFirstIndexWinsTies) {
  std::uint64_t seed = 1200;
  for (const auto& mesh : test_meshes()) {
    const Axes X(mesh);
    for (const auto& spec : {P(X.a, X.b), P(X.b, X.a), P(None, X.ab), P()})
      for (const Shape& shape : {Shape{19, 7}, Shape{3, 5}}) check_argmax<TypeParam>(mesh, spec, shape, seed++);
    check_argmax<TypeParam>(mesh, P(X.c, X.a, X.b), {4, 9, 3}, seed++);
    check_argmax<TypeParam>(mesh, P(X.ab), {19}, seed++);
  }
}

SHARD_MPI_TEST(Ops, ArgmaxCollectives) {
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  Tensor<std::int32_t> h({4, 2 * n + 1}, 5);  // every element ties: index 0 must win
  const auto x = device_put(h, NamedSharding(mesh, P(None, "a")));
  comm_stats().reset();
  const auto r = argmax(x, 1);
  const int want = runtime().process_count() > 1 ? 1 : 0;
  EXPECT_EQ(comm_stats().get("pmax").calls, want) << comm_stats().to_string();
  EXPECT_EQ(comm_stats().get("pmin").calls, want) << comm_stats().to_string();
  const PartitionSpec none = P();
  expect_result(r, Tensor<std::int64_t>({4}, 0), mesh, &none, "argmax of all ties");
}

template <typename T>
void check_transpose(const Mesh& mesh, const PartitionSpec& spec, const Shape& shape, std::uint64_t seed) {
  const Tensor<T> h = random_tensor<T>(shape, seed);
  const auto x = device_put(h, NamedSharding(mesh, spec));
  const int rank = static_cast<int>(shape.size());
  std::vector<int> rev(static_cast<std::size_t>(rank));
  std::iota(rev.rbegin(), rev.rend(), 0);
  for (const auto& perm : std::vector<std::vector<int>>{{}, {1, 0, 2}, {2, 0, 1}, {0, 1, 2}}) {
    const auto& p = perm.empty() ? rev : perm;
    std::vector<SpecEntry> moved;
    for (int d : p) moved.push_back(spec[d]);
    const PartitionSpec want(moved);
    comm_stats().reset();
    const auto r = perm.empty() ? transpose(x) : transpose(x, perm);
    EXPECT_EQ(total_calls(), 0) << "transpose communicated\n" << comm_stats().to_string();
    std::string what = std::string(dtype_name<T>()) + " transpose " + (perm.empty() ? "default" : "perm");
    for (int d : p) what += " " + std::to_string(d);
    expect_result(r, host_transpose(h, p), mesh, &want, what + " of " + to_string(shape) + " " + spec.to_string());
  }
}

TYPED_TEST(OpsTyped, Transpose3D) {
  std::uint64_t seed = 1300;
  for (const auto& mesh : test_meshes()) {
    const Axes X(mesh);
    check_transpose<TypeParam>(mesh, P(X.a, X.b, X.c), {4, 3, 5}, seed++);
    check_transpose<TypeParam>(mesh, P(None, X.ab, X.c), {5, 3, 2}, seed++);
    check_transpose<TypeParam>(mesh, P(X.c, None, X.a), {19, 1, 7}, seed++);
  }
}

// ---------------------------------------------------------------- errors

/// f() must throw E on this rank, with every needle in its message.
template <typename E>
void expect_error(const std::function<void()>& f, const std::vector<std::string>& needles, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << what << ": no exception";
  } catch (const E& e) {
    for (const auto& needle : needles) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": wrong exception: " << e.what();
  }
}

SHARD_MPI_TEST(Ops, SameDevicesInAnotherOrderCombine) {
  // JAX combines arrays whose meshes hold the same devices: the second moves to the first's mesh.
  const int n = runtime().device_count();
  const Mesh m = make_mesh({n}, {"a"});
  std::vector<int> ids = m.device_ids();
  std::reverse(ids.begin(), ids.end());
  const Mesh rev({n}, {"a"}, ids);
  const Tensor<float> hx = random_tensor<float>({6, 4}, 1400), hy = random_tensor<float>({6, 4}, 1401);
  const auto x = device_put(hx, NamedSharding(m, P("a")));
  const auto y = device_put(hy, NamedSharding(rev, P("a")));
  const PartitionSpec pa = P("a");
  expect_result(x + y, host_zip<float>(hx, hy, [](float a, float b) { return a + b; }), m, &pa, "x + y(reversed)");
  expect_result(y * x, host_zip<float>(hy, hx, [](float a, float b) { return a * b; }), rev, &pa, "y(reversed) * x");
  expect_result(where(x < 0.f, x, y), host_zip<float>(hx, hy, [](float a, float b) { return a < 0 ? a : b; }), m, &pa,
                "where across meshes");
}

SHARD_MPI_TEST(Ops, DifferentDeviceSetsThrowEverywhere) {
  const int n = runtime().device_count();
  if (n < 2) GTEST_SKIP() << "needs two devices";
  const Mesh all = make_mesh({n}, {"a"});
  const Mesh first({1}, {"a"}, {all.device_ids()[0]});
  const Mesh last({1}, {"a"}, {all.device_ids()[n - 1]});
  const Tensor<float> h = random_tensor<float>({6, 4}, 1402);
  const auto x = device_put(h, NamedSharding(first, P()));
  const auto y = device_put(h, NamedSharding(last, P()));
  const std::vector<std::string> sets = {"[" + std::to_string(all.device_ids()[0]) + "]",
                                         "[" + std::to_string(all.device_ids()[n - 1]) + "]", "devices"};
  expect_error<MeshMismatchError>([&] { (void)(x + y); }, sets, "x + y");
  expect_error<MeshMismatchError>([&] { (void)maximum(x, y); }, sets, "maximum");
  expect_error<MeshMismatchError>([&] { (void)where(x < 0.f, x, y); }, sets, "where");
  expect_error<MeshMismatchError>([&] { (void)reshard(x, y.sharding()); }, sets, "reshard");
}

SHARD_MPI_TEST(Ops, ShapesThatDoNotBroadcast) {
  const Mesh m = make_mesh({runtime().device_count()}, {"a"});
  const auto x = zeros<double>({3, 4}, NamedSharding(m, P("a")));
  const auto y = zeros<double>({5}, NamedSharding(m, P()));
  const auto z = zeros<double>({2, 1, 4}, NamedSharding(m, P()));
  const auto w = zeros<double>({1, 3, 5}, NamedSharding(m, P(None, "a")));
  expect_error<ShapeError>([&] { (void)(x + y); }, {"(3, 4)", "(5,)"}, "(3, 4) + (5,)");
  expect_error<ShapeError>([&] { (void)(y - x); }, {"(3, 4)", "(5,)"}, "(5,) - (3, 4)");
  expect_error<ShapeError>([&] { (void)(z * w); }, {"(2, 1, 4)", "(1, 3, 5)"}, "(2, 1, 4) * (1, 3, 5)");
  expect_error<ShapeError>([&] { (void)compare(x, y, CompareOp::kEqual); }, {"(3, 4)", "(5,)"}, "compare");
  expect_error<ShapeError>([&] { (void)(x < y); }, {"(3, 4)", "(5,)"}, "operator<");
  EXPECT_THROW((void)sum(x, {2}), ShapeError);
  EXPECT_THROW((void)transpose(z, {0, 1}), ShapeError);
}

// ---------------------------------------------------------------- fused axpy

/// axpy(alpha, x, y) against alpha * x + y on the host for every binary case (same sharding,
/// differently sharded, broadcast either way, outer) on every mesh; same-sharded operands and
/// a replicated broadcast operand must not communicate.
template <typename T>
void check_axpy(std::uint64_t seed) {
  const T alpha = static_cast<T>(-2.5);  // -2 for integers
  const auto ref = [alpha](T a, T b) { return static_cast<T>(alpha * a + b); };
  // Floating point: exact in this build, but a compiler that contracts to an FMA rounds once.
  const Tol tol = is_floating_v<T> ? Tol{tol_for<T>(1e-4, 1e-11, 1e-2), 1e-6} : Tol{};
  for (const auto& mesh : test_meshes())
    for (const auto& c : binary_cases(mesh)) {
      const Tensor<T> hx = random_tensor<T>(c.x.shape, seed++), hy = random_tensor<T>(c.y.shape, seed++);
      const auto x = device_put(hx, NamedSharding(mesh, c.x.spec));
      const auto y = device_put(hy, NamedSharding(mesh, c.y.spec));
      const Shape out = host_broadcast(c.x.shape, c.y.shape);
      const PartitionSpec want = c.x.shape == out ? c.x.spec : c.y.spec;
      const std::string what = std::string(dtype_name<T>()) + " axpy on " + mesh.to_string() + ": " +
                               to_string(c.x.shape) + " " + c.x.spec.to_string() + " with " +
                               to_string(c.y.shape) + " " + c.y.spec.to_string();
      comm_stats().reset();
      const auto r = axpy(alpha, x, y);
      const std::int64_t calls = total_calls();
      const bool local = (c.x.shape == c.y.shape && c.x.spec == c.y.spec) || c.y.spec == P();
      if (local && c.x.shape == out) {
        EXPECT_EQ(calls, 0) << what << ": communicated\n" << comm_stats().to_string();
      }
      expect_result(r, host_zip<T>(hx, hy, ref), mesh, c.rule_applies ? &want : nullptr, what, tol);
    }
}

SHARD_MPI_TEST(Ops, AxpyFusedMatchesHost) {
  check_axpy<float>(1500);
  check_axpy<double>(1600);
  check_axpy<std::int32_t>(1700);
  check_axpy<std::int64_t>(1800);
  // The two cases the benchmark and the sharding rule care about, spelled out: a replicated
  // bias row broadcast onto a batch (local, the batch's spec) and y P(None, 'a') moved to x's
  // P('a', None) (one reshard, x's spec).
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const Tensor<double> hb = random_tensor<double>({16, 6}, 1900), hbias = random_tensor<double>({6}, 1901);
  const auto batch = device_put(hb, NamedSharding(mesh, P("a", None)));
  const auto bias = device_put(hbias, NamedSharding(mesh, P()));
  const auto moved = device_put(hb, NamedSharding(mesh, P(None, "a")));
  const PartitionSpec want = P("a", None);
  comm_stats().reset();
  const auto r1 = axpy(0.5, bias, batch);
  EXPECT_EQ(total_calls(), 0) << "axpy(bias, batch) communicated\n" << comm_stats().to_string();
  const auto r2 = axpy(0.5, batch, moved);
  expect_result(r1, host_zip<double>(hbias, hb, [](double a, double b) { return 0.5 * a + b; }), mesh, &want,
                "axpy(0.5, bias P(), batch P('a', None))");
  expect_result(r2, host_zip<double>(hb, hb, [](double a, double b) { return 0.5 * a + b; }), mesh, &want,
                "axpy(0.5, batch P('a', None), batch P(None, 'a'))");
}

}  // namespace
}  // namespace shard::testing
