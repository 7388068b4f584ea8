// shard::custom_vjp (jax.custom_vjp) against host references: a numerically stable function
// whose VJP the user writes, a derivative at a kink the user chooses, two arguments (one an
// integer constant), the global view on random specs of the 1-3-axis meshes, a differentiated
// shard_map body (the cotangent of an invariant argument psummed over the axes its cotangent
// varies over; a psum inside fwd makes the output invariant), the primal function when nothing
// is differentiated, and a bwd that returns a wrong shape. Checked on every rank.

#include <atomic>
#include <cmath>
#include <cstdint>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "mpi_test.hpp"
#include "shard/autodiff/autodiff.hpp"
#include "test_util.hpp"

namespace shard::testing {
namespace {

using HT = Tensor<double>;
using SA = ShardedArray<double>;

/// softplus with the user's stable forward (large x would overflow exp) and VJP ct * sigmoid(x).
auto stable_softplus() {
  return custom_vjp([](const auto& x) { return maximum(x, 0.0) + log1p(exp(-abs(x))); },
                    [](const auto& x) { return std::make_pair(maximum(x, 0.0) + log1p(exp(-abs(x))), x); },
                    [](const auto& x, const auto& ct) { return std::make_tuple(ct * sigmoid(x)); });
}

/// relu whose derivative at 0 is 1 (JAX's max gives 1/2 at the tie; the user chooses).
auto relu_one_at_zero() {
  return custom_vjp(
      [](const auto& x) { return maximum(x, 0.0); },
      [](const auto& x) { return std::make_pair(maximum(x, 0.0), x); },
      [](const auto& x, const auto& ct) { return std::make_tuple(where(x >= 0.0, ct, ct * 0.0)); });
}

double host_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

SHARD_MPI_TEST(CustomVjp, StableFunctionAndChosenKinkOnTensors) {
  HT x = random_tensor<double>({7, 3}, 41);
  for (auto& v : x) v *= 40.0;  // some far in the tails, where the naive forms overflow
  x.flat(0) = 800.0;
  x.flat(1) = -800.0;
  const auto sp = stable_softplus();
  const auto [value, g] = value_and_grad([&](const HT& p) { return sum(sp(p) * 1.5); })(x);
  double host = 0;
  for (std::int64_t i = 0; i < x.size(); ++i) {
    host += 1.5 * (std::max(x.flat(i), 0.0) + std::log1p(std::exp(-std::abs(x.flat(i)))));
    EXPECT_NEAR(g.flat(i), 1.5 * host_sigmoid(x.flat(i)), 1e-12) << i;
  }
  EXPECT_NEAR(value.flat(0), host, 1e-9 * std::abs(host));
  EXPECT_TRUE(std::isfinite(g.flat(0)) && std::isfinite(g.flat(1)));

  HT z = random_tensor<double>({9}, 42);
  z.flat(2) = 0.0;
  z.flat(5) = 0.0;
  const auto r = relu_one_at_zero();
  const HT gz = grad([&](const HT& p) { return sum(r(p)); })(z);
  for (std::int64_t i = 0; i < z.size(); ++i) EXPECT_EQ(gz.flat(i), z.flat(i) >= 0.0 ? 1.0 : 0.0) << i;
  // Without custom_vjp the tie gets JAX's 1/2: the rule above is what changed it.
  const HT gmax = grad([&](const HT& p) { return sum(maximum(p, 0.0)); })(z);
  EXPECT_EQ(gmax.flat(2), 0.5);
}

SHARD_MPI_TEST(CustomVjp, TwoArgumentsAndAnIntegerConstant) {
  // f(a, b, k) = a * b * k (k an integer array): bwd gives ct * b * k, ct * a * k, and a
  // placeholder for k. Compared with central finite differences of the host formula.
  const auto f = custom_vjp(
      [](const HT& a, const HT& b, const Tensor<std::int32_t>& k) { return a * b * astype<double>(k); },
      [](const HT& a, const HT& b, const Tensor<std::int32_t>& k) {
        return std::make_pair(a * b * astype<double>(k), std::make_tuple(a, b, astype<double>(k)));
      },
      [](const auto& res, const HT& ct) {
        const auto& [a, b, k] = res;
        return std::make_tuple(ct * b * k, ct * a * k, 0);
      });
  const HT a = random_tensor<double>({4, 5}, 51), b = random_tensor<double>({4, 5}, 52);
  Tensor<std::int32_t> k({4, 5});
  for (std::int64_t i = 0; i < k.size(); ++i) k.flat(i) = static_cast<std::int32_t>(i % 5) - 2;
  const HT w = random_tensor<double>({4, 5}, 53);
  const auto grads = grad([&](const std::vector<HT>& p, const Tensor<std::int32_t>& kk) {
    return sum(tanh(f(p[0], p[1], kk)) * w);
  })(std::vector<HT>{a, b}, k);
  for (std::int64_t i = 0; i < a.size(); ++i) {
    const double y = a.flat(i) * b.flat(i) * k.flat(i);
    const double dy = (1 - std::tanh(y) * std::tanh(y)) * w.flat(i);
    EXPECT_NEAR(grads[0].flat(i), dy * b.flat(i) * k.flat(i), 1e-12);
    EXPECT_NEAR(grads[1].flat(i), dy * a.flat(i) * k.flat(i), 1e-12);
  }
}

SHARD_MPI_TEST(CustomVjp, GlobalViewOnRandomSpecsEqualsTheHost) {
  std::mt19937_64 rng(61);
  const auto sp = stable_softplus();
  const HT hx = random_tensor<double>({7, 5}, 62);
  const HT hw = random_tensor<double>({7, 5}, 63);
  const HT hg = grad([&](const HT& p) { return sum(sp(p * 3.0) * hw); })(hx);
  for (std::int64_t i = 0; i < hx.size(); ++i)
    EXPECT_NEAR(hg.flat(i), 3.0 * hw.flat(i) * host_sigmoid(3.0 * hx.flat(i)), 1e-12);
  for (const Mesh& mesh : abc_meshes(runtime().device_count())) {
    std::vector<PartitionSpec> specs;  // x's: a fixed-seed sample, every spec in the slow tier
    for (int trial = 0; trial < 3; ++trial) specs.push_back(random_spec(mesh, 2, rng));
    for (const auto& spec : specs_or_all(mesh, 2, specs)) {
      const NamedSharding s(mesh, spec);
      const SA x = device_put(hx, s);
      const SA w = device_put(hw, NamedSharding(mesh, random_spec(mesh, 2, rng)));
      const SA g = grad([&](const SA& p) { return sum(sp(p * 3.0) * w); })(x);
      EXPECT_EQ(g.sharding(), x.sharding());
      const HT got = g.to_host();
      for (std::int64_t i = 0; i < hx.size(); ++i)
        EXPECT_NEAR(got.flat(i), hg.flat(i), 1e-12) << s.spec().to_string();
    }
  }
}

SHARD_MPI_TEST(CustomVjp, InsideADifferentiatedShardMap) {
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"d"});
  const HT hx = random_tensor<double>({2 * static_cast<std::int64_t>(n), 3}, 71);
  const HT hw = random_tensor<double>({3}, 72);
  const SA x = device_put(hx, NamedSharding(mesh, P("d")));
  const SA w = device_put(hw, NamedSharding(mesh, P()));
  // f(xb, w) = xb * w with its VJP; w is invariant, xb varies over 'd': w's cotangent varies
  // over 'd' (it is computed from xb) and is psummed once, as JAX's transpose of pvary.
  const auto mul =
      custom_vjp([](const HT& xb, const HT& wv) { return xb * wv; },
                 [](const HT& xb, const HT& wv) { return std::make_pair(xb * wv, std::make_pair(xb, wv)); },
                 [](const auto& res, const HT& ct) {
                   return std::make_tuple(ct * res.second, sum(ct * res.first, Dims{0}));
                 });
  const auto loss = [&](const std::vector<SA>& p) {
    return sum(shard_map(mesh, {P("d"), P()}, {P()}, [&](const HT& xb, const HT& wv) {
      return psum(sum(tanh(mul(xb, wv))), "d");
    })(p[0], p[1]));
  };
  const auto g = grad(loss)(std::vector<SA>{x, w});
  const HT gx = g[0].to_host(), gw = g[1].to_host();
  std::vector<double> host_gw(3, 0.0);
  for (std::int64_t i = 0; i < hx.shape()[0]; ++i)
    for (std::int64_t j = 0; j < 3; ++j) {
      const double t = std::tanh(hx.flat(i * 3 + j) * hw.flat(j));
      EXPECT_NEAR(gx.flat(i * 3 + j), (1 - t * t) * hw.flat(j), 1e-12);
      host_gw[j] += (1 - t * t) * hx.flat(i * 3 + j);
    }
  for (std::int64_t j = 0; j < 3; ++j) EXPECT_NEAR(gw.flat(j), host_gw[j], 1e-10);

  // A psum inside fwd makes the custom output invariant: it may be returned under P().
  const auto total =
      custom_vjp([](const HT& xb) { return psum(sum(xb), "d"); },
                 [](const HT& xb) { return std::make_pair(psum(sum(xb), "d"), xb.shape()); },
                 [](const Shape& s, const HT& ct) { return std::make_tuple(HT(s, ct.flat(0))); });
  const auto g2 = grad([&](const SA& p) {
    return sum(shard_map(mesh, P("d"), P(), [&](const HT& xb) { return total(xb) * 2.0; })(p));
  })(x);
  for (double v : g2.to_host()) EXPECT_NEAR(v, 2.0, 1e-12);
}

SHARD_MPI_TEST(CustomVjp, PrimalWhenNotDifferentiatedAndBadCotangents) {
  int primal_calls = 0, fwd_calls = 0;
  const auto f = custom_vjp(
      [&](const HT& x) {
        ++primal_calls;
        return x * 2.0;
      },
      [&](const HT& x) {
        ++fwd_calls;
        return std::make_pair(x * 2.0, 0);
      },
      [](int, const HT& ct) { return std::make_tuple(ct * 2.0); });
  const HT x = random_tensor<double>({3, 2}, 81);
  const HT y = f(x);
  EXPECT_EQ(primal_calls, 1);
  EXPECT_EQ(fwd_calls, 0);
  for (std::int64_t i = 0; i < x.size(); ++i) EXPECT_EQ(y.flat(i), 2.0 * x.flat(i));
  const HT g = grad([&](const HT& p) { return sum(f(p)); })(x);
  EXPECT_EQ(fwd_calls, 1);
  for (double v : g) EXPECT_EQ(v, 2.0);

  // Inside a shard_map body that nothing differentiates (its values carry their vma) f runs too.
  std::atomic<int> body_primal{0}, body_fwd{0};
  const auto h = custom_vjp(
      [&](const HT& v) {
        ++body_primal;
        return v * 2.0;
      },
      [&](const HT& v) {
        ++body_fwd;
        return std::make_pair(v * 2.0, 0);
      },
      [](int, const HT& ct) { return std::make_tuple(ct * 2.0); });
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"d"});
  const HT hx = random_tensor<double>({2 * static_cast<std::int64_t>(n)}, 82);
  const SA xs = device_put(hx, NamedSharding(mesh, P("d")));
  const HT ys = shard_map(mesh, P("d"), P("d"), [&](const HT& v) { return h(v); })(xs).to_host();
  EXPECT_EQ(body_primal.load(), static_cast<int>(mesh.local_device_ids().size()));
  EXPECT_EQ(body_fwd.load(), 0);
  for (std::int64_t i = 0; i < hx.size(); ++i) EXPECT_EQ(ys.flat(i), 2.0 * hx.flat(i));

  const auto bad =
      custom_vjp([](const HT& x) { return x * 2.0; }, [](const HT& x) { return std::make_pair(x * 2.0, 0); },
                 [](int, const HT& ct) { return std::make_tuple(sum(ct)); });
  expect_error<ShapeError>([&] { (void)grad([&](const HT& p) { return sum(bad(p)); })(x); },
                           {"custom_vjp", "argument 0", "(3, 2)"});
}

}  // namespace
}  // namespace shard::testing
