// JAX's check_vma inside shard_map, forward (nothing differentiated): every value in a body
// carries the mesh axes it varies over; an output whose out_spec omits such an axis raises on
// every rank, naming the shard_map's call site, the output, the axis and the fix. Programs that
// reduce (or name the axis) run and give the host reference's values on every rank.

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "mpi_test.hpp"
#include "shard/shard.hpp"

namespace shard::testing {
namespace {

using HT = Tensor<double>;
using SA = ShardedArray<double>;

HT random_host(const Shape& shape, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(-2.0, 2.0);
  HT t(shape);
  for (auto& v : t) v = u(gen);
  return t;
}

double host_sum(const HT& t) {
  double s = 0;
  for (double v : t) s += v;
  return s;
}

/// Expects the output-varies error of check_vma, with this test file as the call site.
template <typename F>
void expect_varies(F&& fn, const std::string& output, const std::string& axes) {
  expect_error<ValueError>(std::forward<F>(fn), {"test_vma.cpp:", "output " + output,
                                                 "omits mesh axis " + axes, "psum", "check_vma"});
}

// The program a new user writes first: the sum of a sharded vector, with the psum forgotten.
// Without the check it returned device 0's partial sum and exited 0.
SHARD_MPI_TEST(Vma, AForgottenPsumRaisesOnEveryRank) {
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"x"});
  const HT host = random_host({4 * static_cast<std::int64_t>(n)}, 11);
  const SA x = device_put(host, NamedSharding(mesh, P("x")));
  expect_varies([&] { (void)shard_map(mesh, P("x"), P(), [](const HT& b) { return sum(b); })(x); }, "0",
                "'x'");
  // The fixed program: psum, or name the axis.
  const SA total = shard_map(mesh, P("x"), P(), [](const HT& b) { return psum(sum(b), "x"); })(x);
  EXPECT_NEAR(total.to_host().flat(0), host_sum(host), 1e-9);
  const SA parts = shard_map(mesh, P("x"), P("x"), [](const HT& b) { return reshape(sum(b), Shape{1}); })(x);
  EXPECT_EQ(parts.shape(), (Shape{n}));
  EXPECT_NEAR(host_sum(parts.to_host()), host_sum(host), 1e-9);
  // check_vma = false opts out, as in JAX: no error (the output is one device's value).
  const SA unchecked =
      shard_map(mesh, P("x"), P(), [](const HT& b) { return sum(b); }, {.check_vma = false})(x);
  EXPECT_EQ(unchecked.shape(), Shape{});
}

// Each rule of the forward vma on a 2-D mesh: psum/pmean/pmax/pmin remove their axes,
// all_gather/psum_scatter/all_to_all/ppermute keep the value varying, an op's result varies
// over the union of its operands', invariant inputs stay invariant.
SHARD_MPI_TEST(Vma, EachRuleOnATwoAxisMesh) {
  const int n = runtime().device_count();
  const int a = n % 2 == 0 ? 2 : 1;
  const int b = n / a;
  const Mesh mesh = make_mesh({a, b}, {"a", "b"});
  const HT hx = random_host({2 * static_cast<std::int64_t>(a), 3 * static_cast<std::int64_t>(b)}, 21);
  const HT hw = random_host({3}, 22);
  const SA x = device_put(hx, NamedSharding(mesh, P("a", "b")));
  const SA w = device_put(hw, NamedSharding(mesh, P()));

  // Invariant inputs and what is made from them alone may be returned replicated.
  const SA w2 = shard_map(mesh, P(), P(), [](const HT& v) { return exp(v) * 2.0 + v; })(w);
  for (std::int64_t i = 0; i < 3; ++i)
    EXPECT_NEAR(w2.to_host().flat(i), std::exp(hw.flat(i)) * 2.0 + hw.flat(i), 1e-12);

  // x varies over {a, b}; a psum over 'b' leaves 'a'.
  expect_varies(
      [&] { (void)shard_map(mesh, P("a", "b"), P(), [](const HT& v) { return psum(sum(v), "b"); })(x); }, "0",
      "'a'");
  expect_varies(
      [&] { (void)shard_map(mesh, P("a", "b"), P(), [](const HT& v) { return pmax(sum(v), "a"); })(x); }, "0",
      "'b'");
  expect_varies([&] { (void)shard_map(mesh, P("a", "b"), P(), [](const HT& v) { return sum(v); })(x); }, "0",
                "'a', 'b'");
  // The union: an invariant value times a varying one varies.
  expect_varies(
      [&] {
        (void)shard_map(mesh, {P(), P("a", "b")}, {P()},
                        [](const HT& v, const HT& xb) { return v * sum(xb); })(w, x);
      },
      "0", "'a', 'b'");
  // all_gather keeps the value varying (JAX's all_gather; all_gather_invariant is not Shard's).
  expect_varies(
      [&] {
        (void)shard_map(mesh, P("a", "b"), P(),
                        [](const HT& v) { return psum(all_gather(v, "a", 0, true), "b"); })(x);
      },
      "0", "'a'");
  // The second output is the one named.
  expect_varies(
      [&] {
        (void)shard_map(mesh, P("a", "b"), {P(), P()}, [](const HT& v) {
          return std::make_tuple(psum(sum(v), SpecEntry({"a", "b"})), pmin(sum(v), "b"));
        })(x);
      },
      "1", "'a'");

  // Reduced over both axes (one tuple, or one after the other; pmean too): invariant, right values.
  const SA s1 = shard_map(mesh, P("a", "b"), P(), [](const HT& v) {
    return psum(sum(v), SpecEntry({"a", "b"}));
  })(x);
  const SA s2 =
      shard_map(mesh, P("a", "b"), P(), [](const HT& v) { return psum(psum(sum(v), "a"), "b"); })(x);
  const SA s3 =
      shard_map(mesh, P("a", "b"), P(), [](const HT& v) { return pmean(pmean(sum(v), "b"), "a"); })(x);
  EXPECT_NEAR(s1.to_host().flat(0), host_sum(hx), 1e-9);
  EXPECT_NEAR(s2.to_host().flat(0), host_sum(hx), 1e-9);
  EXPECT_NEAR(s3.to_host().flat(0), host_sum(hx) / (a * b), 1e-9);
  // Naming the remaining axis in the out_spec is the other fix: rows summed over 'b' stay split over 'a'.
  const SA rows =
      shard_map(mesh, P("a", "b"), P("a"), [](const HT& v) { return psum(sum(v, Dims{1}), "b"); })(x);
  const HT hr = rows.to_host();
  for (std::int64_t i = 0; i < hx.shape()[0]; ++i) {
    double r = 0;
    for (std::int64_t j = 0; j < hx.shape()[1]; ++j) r += hx.flat(i * hx.shape()[1] + j);
    EXPECT_NEAR(hr.flat(i), r, 1e-9);
  }
}

// Lists of outputs and integer values carry their vma too.
SHARD_MPI_TEST(Vma, ListsAndIntegers) {
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"x"});
  const SA x =
      device_put(random_host({2 * static_cast<std::int64_t>(n), 2}, 31), NamedSharding(mesh, P("x")));
  expect_varies(
      [&] {
        (void)shard_map(mesh, P("x"), {std::vector<PartitionSpec>{P(), P()}}, [](const HT& v) {
          return std::vector<HT>{psum(sum(v), "x"), sum(v)};
        })(x);
      },
      "0", "'x'");
  expect_varies([&] { (void)shard_map(mesh, P("x"), P(), [](const HT& v) { return argmax(v); })(x); }, "0",
                "'x'");
  const auto counts = shard_map(mesh, P("x"), P(),
                                [](const HT& v) { return psum(sum(astype<std::int64_t>(v > 0.0)), "x"); })(x);
  std::int64_t host_count = 0;
  for (double v : x.to_host()) host_count += v > 0.0;
  EXPECT_EQ(counts.to_host().flat(0), host_count);
}

// jax.lax.all_gather_invariant: the gathered array is invariant, so it may leave under P();
// its transpose hands each device its own chunk of the cotangent (no communication).
SHARD_MPI_TEST(Vma, AllGatherInvariantAndItsTranspose) {
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"x"});
  const HT host = random_host({2 * static_cast<std::int64_t>(n), 3}, 41);
  const HT hw = random_host({2 * static_cast<std::int64_t>(n), 3}, 42);
  const SA x = device_put(host, NamedSharding(mesh, P("x")));
  const SA w = device_put(hw, NamedSharding(mesh, P()));
  const SA tiled =
      shard_map(mesh, P("x"), P(), [](const HT& b) { return all_gather_invariant(b, "x", 0, true); })(x);
  EXPECT_TRUE(tiled.to_host() == host);
  const SA stacked =
      shard_map(mesh, P("x"), P(), [](const HT& b) { return all_gather_invariant(b, "x", 1); })(x);
  EXPECT_EQ(stacked.shape(), (Shape{2, n, 3}));
  const HT hs = stacked.to_host();
  for (std::int64_t r = 0; r < 2; ++r)
    for (std::int64_t d = 0; d < n; ++d)
      for (std::int64_t c = 0; c < 3; ++c)
        EXPECT_EQ(hs.flat((r * n + d) * 3 + c), host.flat((d * 2 + r) * 3 + c));
  // d/dx sum(all_gather_invariant(x) * w) = w (every device's chunk), tiled and untiled.
  const SA g = grad([&](const SA& p) {
    return sum(shard_map(mesh, {P("x"), P()}, {P()}, [](const HT& b, const HT& wv) {
      return sum(all_gather_invariant(b, "x", 0, true) * wv);
    })(p, w));
  })(x);
  EXPECT_TRUE(g.to_host() == hw);
  const SA g2 = grad([&](const SA& p) {
    return sum(shard_map(mesh, {P("x"), P()}, {P()}, [](const HT& b, const HT& wv) {
      return sum(reshape(all_gather_invariant(b, "x", 0), wv.shape()) * wv);
    })(p, w));
  })(x);
  EXPECT_TRUE(g2.to_host() == hw);
}

// A collective whose result varies over its axes does so for an invariant operand too (JAX's
// implicit pvary): returned under P() it raises, and differentiated, the invariant parameter's
// cotangent is summed over the axis.
SHARD_MPI_TEST(Vma, CollectivesOfInvariantValuesVary) {
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"x"});
  const HT hw = random_host({2 * static_cast<std::int64_t>(n)}, 51);
  const SA w = device_put(hw, NamedSharding(mesh, P()));
  std::vector<std::pair<int, int>> shift;
  for (int d = 0; d < n; ++d) shift.emplace_back(d, (d + 1) % n);
  expect_varies(
      [&] { (void)shard_map(mesh, P(), P(), [](const HT& v) { return psum_scatter(v, "x", 0, true); })(w); },
      "0", "'x'");
  expect_varies(
      [&] { (void)shard_map(mesh, P(), P(), [&](const HT& v) { return ppermute(v, "x", shift); })(w); }, "0",
      "'x'");
  expect_varies(
      [&] { (void)shard_map(mesh, P(), P(), [](const HT& v) { return all_to_all(v, "x", 0, 0, true); })(w); },
      "0", "'x'");
  expect_varies([&] { (void)shard_map(mesh, P(), P(), [](const HT& v) { return all_gather(v, "x"); })(w); },
                "0", "'x'");
  // loss = psum(sum(ppermute(c) * W), 'x') = n * sum(c * W) (a full cyclic shift of the same c):
  // dW = n * c, the psum over 'x' of W's per-device cotangents.
  const HT hc = random_host({2 * static_cast<std::int64_t>(n)}, 52);
  const SA c = device_put(hc, NamedSharding(mesh, P()));
  const SA g = grad([&](const SA& W) {
    return sum(shard_map(mesh, {P(), P()}, {P()}, [&](const HT& cb, const HT& wb) {
      return psum(sum(ppermute(cb, "x", shift) * wb), "x");
    })(c, W));
  })(w);
  const HT hg = g.to_host();
  for (std::int64_t i = 0; i < hc.size(); ++i) EXPECT_NEAR(hg.flat(i), n * hc.flat(i), 1e-12) << i;
}

// Ops whose derivative is not defined still run in a body that nothing differentiates: the vma
// the body's values carry is not a tape to differentiate.
SHARD_MPI_TEST(Vma, UndifferentiableOpsRunInAPlainBody) {
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"x"});
  const HT ha = random_host({2 * static_cast<std::int64_t>(n), 3}, 61);
  const HT hb = random_host({2, 3, 4}, 62);
  const SA a = device_put(ha, NamedSharding(mesh, P("x")));
  const SA b = device_put(hb, NamedSharding(mesh, P()));
  const SA out =
      shard_map(mesh, {P("x"), P()}, {P("x")}, [](const HT& ab, const HT& bb) { return dot(ab, bb); })(a, b);
  EXPECT_EQ(out.shape(), (Shape{2 * static_cast<std::int64_t>(n), 2, 4}));
  const HT ho = out.to_host();
  for (std::int64_t i = 0; i < ha.shape()[0]; ++i)
    for (std::int64_t j = 0; j < 2; ++j)
      for (std::int64_t m = 0; m < 4; ++m) {
        double r = 0;
        for (std::int64_t k = 0; k < 3; ++k) r += ha.flat(i * 3 + k) * hb.flat((j * 3 + k) * 4 + m);
        EXPECT_NEAR(ho.flat((i * 2 + j) * 4 + m), r, 1e-12);
      }
}

}  // namespace
}  // namespace shard::testing
