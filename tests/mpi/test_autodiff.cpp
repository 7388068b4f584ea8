// Autodiff (autodiff.hpp) against its references: gradients of random programs written with
// the op set agree with central finite differences (float64, on Tensors), and the same
// program on ShardedArrays (meshes of 1-3 axes, random specs with uneven shards) gives the
// same gradients, sharded like the parameters, on every rank. shard_map bodies with every
// collective (tiled and untiled) are differentiated from outside and checked against the
// global-view gradient of the same function. CommStats checks the communication of a
// data-parallel and a Megatron step against the theory. Bad input raises on every rank.

#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <set>

#include "mpi_test.hpp"
#include "shard/autodiff/autodiff.hpp"
#include "shard/train/optim.hpp"
#include "test_util.hpp"

namespace shard::testing {
namespace {

std::vector<Mesh> meshes() { return abc_meshes(runtime().device_count()); }

/// Random values in [-1, 1) (never all zeros or ones), the same on every rank.
Tensor<double> small_random(const Shape& shape, std::uint64_t seed) {
  Tensor<double> t = random_tensor<double>(shape, seed);
  for (auto& v : t) v *= 0.01;
  return t;
}

// ---------------------------------------------------------------- random programs

constexpr std::int64_t kM = 5, kK = 4, kN = 6;

/// One step of a random program: v (m, n) -> v (m, n), using the parameters p = {A (m, k),
/// B (k, n), c (n), d (m, n)} and the constant index arrays. Every step is smooth at random
/// points (kinks and ties have probability zero) and written once for both views.
template <typename X, typename I>
X step(int op, const X& v, const std::vector<X>& p, const I& idx_rows, const I& idx_along) {
  const X& d = p[3];
  const X& c = p[2];
  switch (op) {
    case 0: return tanh(v) + v * 0.5;
    case 1: return sigmoid(v) * d;
    case 2: return exp(v * 0.3) - d;
    case 3: return sin(v) + cos(d);
    case 4: return v / (d * d + 1.0);
    case 5: return maximum(v, d) + minimum(v, d * 0.5);
    case 6: return where(greater(d, 0.0), v * 2.0, d - v);
    case 7: return v + c;
    case 8: return v * mean(v, 1, true);
    case 9: return softmax(v, 1) * 3.0 + v;
    case 10: return log_softmax(v, 0) + v;
    case 11: return v - logsumexp(v, 1, true);
    case 12: return transpose(transpose(v) * 1.5);
    case 13: return reshape(reshape(v, Shape{-1}) * 0.9, Shape{kM, kN});
    case 14: {  // split along columns and join again, the halves scaled differently
      const X left = slice(v, {Slice(), Slice(0, 2)});
      const X right = slice(v, {Slice(), Slice(2, kN)});
      return concatenate(std::vector<X>{left * 2.0, right}, 1);
    }
    case 15: return v + take(d, idx_rows, 0);  // rows of d in another order
    case 16: return v * take_along_axis(d, idx_along, 1);
    case 17: return v + max(v, 0, true) * 0.25 - min(d, 1, true);
    case 18: return clip(v, -0.8, 0.8) + v * 0.1;
    case 19: return pow(v * v + 1.0, 0.5) + abs(v) * 0.2;
    case 20: return erf(v) + log1p(v * v);
    case 21: return sqrt(v * v + 0.5) * rsqrt(d * d + 2.0);
    case 22: return square(v) * 0.3 + expm1(d * 0.2);
    case 23: return v * prod(d * 0.5 + 1.0, 0, true);
    case 24: return relu(v) + v * 0.1;
    case 25: return astype<double>(astype<float>(v)) * 0.5 + v * 0.5;
    case 26: return expand_dims(sum(v, 1), 1) * 0.1 + v;
    case 27: return squeeze(expand_dims(v, 0), Dims{0}) - reciprocal(d * d + 1.0);
    case 28: return v * vdot(d, d) * 0.1;
    case 29: return gelu(v * 3.0) + gelu(d, false);
    case 30: return standardize(v * 2.0 + d, 1) * 0.5 + standardize(v, 0, 1e-3) * 0.1;
    case 31: {  // a concatenate of more inputs than a VJP's need mask holds (64)
      std::vector<X> rows;
      for (int i = 0; i < 70; ++i)
        rows.push_back(slice(v, {Slice(i % kM, i % kM + 1)}) * (0.02 * (i + 1)));
      return sum(reshape(concatenate(rows, 0), Shape{70 / kM, kM, kN}), 0);
    }
    case 32: return sum(stack(std::vector<X>{v, v * d, d}, 1) * 0.5, 1);
    default: return v;
  }
}
constexpr int kOps = 33;

/// A whole program: v = A @ B (+ c), the steps, then a scalar loss.
template <typename X, typename I>
X program(const std::vector<int>& ops, const std::vector<X>& p, const I& idx_rows, const I& idx_along) {
  X v = matmul(p[0], p[1]);
  for (int op : ops) v = step(op, v, p, idx_rows, idx_along);
  return mean(v * v) + sum(tanh(v) * p[3]);
}

/// Central finite differences of f at p (float64 Tensors).
std::vector<Tensor<double>> finite_differences(const std::function<double(const std::vector<Tensor<double>>&)>& f,
                                               std::vector<Tensor<double>> p) {
  std::vector<Tensor<double>> g;
  for (std::size_t i = 0; i < p.size(); ++i) {
    Tensor<double> gi(p[i].shape());
    for (std::int64_t k = 0; k < p[i].size(); ++k) {
      const double x0 = p[i].flat(k), h = 1e-6 * std::max(1.0, std::abs(x0));
      p[i].flat(k) = x0 + h;
      const double up = f(p);
      p[i].flat(k) = x0 - h;
      const double down = f(p);
      p[i].flat(k) = x0;
      gi.flat(k) = (up - down) / (2 * h);
    }
    g.push_back(std::move(gi));
  }
  return g;
}

double max_rel_diff(const Tensor<double>& a, const Tensor<double>& b) {
  double m = 0;
  for (std::int64_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::abs(a.flat(i) - b.flat(i)) / std::max(1.0, std::abs(b.flat(i))));
  return m;
}

std::vector<Tensor<double>> random_params(std::uint64_t seed) {
  return {small_random({kM, kK}, seed), small_random({kK, kN}, seed + 1), small_random({kN}, seed + 2),
          small_random({kM, kN}, seed + 3)};
}

SHARD_MPI_TEST(Autodiff, RandomProgramsMatchFiniteDifferencesOnTensors) {
  std::mt19937_64 rng(7);
  const Tensor<std::int64_t> idx_rows(Shape{kM}, std::vector<std::int64_t>{3, 0, 4, 1, -3});
  Tensor<std::int64_t> idx_along(Shape{kM, kN});
  for (std::int64_t i = 0; i < idx_along.size(); ++i) idx_along.flat(i) = static_cast<std::int64_t>((i * 7 + 3) % kN);
  // Every op alone, then random sequences of four.
  std::vector<std::vector<int>> programs;
  for (int op = 0; op < kOps; ++op) programs.push_back({op});
  for (int r = 0; r < 12; ++r) {
    std::vector<int> ops;
    for (int k = 0; k < 4; ++k) ops.push_back(static_cast<int>(rng() % kOps));
    programs.push_back(ops);
  }
  std::uint64_t seed = 100;
  for (const auto& ops : programs) {
    if (std::find(ops.begin(), ops.end(), 25) != ops.end()) continue;  // float32 rounding: no finite differences
    const auto params = random_params(seed += 10);
    auto f = [&](const std::vector<Tensor<double>>& p) { return program(ops, p, idx_rows, idx_along); };
    const auto [value, grads] = value_and_grad(f)(params);
    EXPECT_EQ(value.ndim(), 0);
    EXPECT_NEAR(value.item(), f(params).item(), 1e-12 * std::max(1.0, std::abs(value.item())));
    const auto fd = finite_differences([&](const std::vector<Tensor<double>>& p) { return f(p).item(); }, params);
    std::string name;
    for (int op : ops) name += std::to_string(op) + " ";
    ASSERT_EQ(grads.size(), 4u);
    for (std::size_t i = 0; i < 4; ++i) {
      ASSERT_EQ(grads[i].shape(), params[i].shape()) << name;
      EXPECT_LT(max_rel_diff(grads[i], fd[i]), 2e-6) << "ops " << name << "param " << i;
    }
  }
}

SHARD_MPI_TEST(Autodiff, RandomProgramsOnShardedArraysMatchTheTensorGradients) {
  std::mt19937_64 rng(11 + static_cast<std::uint64_t>(runtime().device_count()));
  const Tensor<std::int64_t> idx_rows(Shape{kM}, std::vector<std::int64_t>{3, 0, 4, 1, -3});
  Tensor<std::int64_t> idx_along(Shape{kM, kN});
  for (std::int64_t i = 0; i < idx_along.size(); ++i) idx_along.flat(i) = static_cast<std::int64_t>((i * 5 + 1) % kN);
  std::uint64_t seed = 500;
  for (const auto& mesh : meshes()) {
    for (int r = 0; r < 10; ++r) {
      std::vector<int> ops;
      const int len = 1 + static_cast<int>(rng() % 4);
      for (int k = 0; k < len; ++k) ops.push_back(static_cast<int>(rng() % kOps));
      const auto host = random_params(seed += 10);
      std::vector<ShardedArray<double>> params;
      for (const auto& h : host) params.push_back(device_put(h, NamedSharding(mesh, random_spec(mesh, h.rank(), rng))));
      const auto ir = device_put(idx_rows, NamedSharding(mesh, random_spec(mesh, 1, rng)));
      const auto ia = device_put(idx_along, NamedSharding(mesh, random_spec(mesh, 2, rng)));
      const auto [value, grads] = value_and_grad([&](const std::vector<ShardedArray<double>>& p) {
        return program(ops, p, ir, ia);
      })(params);
      const auto [hv, hg] = value_and_grad([&](const std::vector<Tensor<double>>& p) {
        return program(ops, p, idx_rows, idx_along);
      })(host);
      std::string name = mesh.to_string() + " ops ";
      for (int op : ops) name += std::to_string(op) + " ";
      EXPECT_NEAR(value.to_host().item(), hv.item(), 1e-10 * std::max(1.0, std::abs(hv.item()))) << name;
      for (std::size_t i = 0; i < 4; ++i) {
        EXPECT_EQ(grads[i].sharding(), params[i].sharding()) << name << "param " << i;
        EXPECT_LT(max_rel_diff(grads[i].to_host(), hg[i]), 1e-10) << name << "param " << i << " spec "
                                                                  << params[i].spec().to_string();
      }
    }
  }
}

SHARD_MPI_TEST(Autodiff, DotProductAttentionGradients) {
  // The fused Tensor op's VJP against central finite differences (float64), causal or not,
  // grouped heads (4 query heads on 2 key/value heads), T != S and T longer than a causal block.
  struct Case {
    std::int64_t T, S;
    bool causal;
  };
  std::uint64_t seed = 900;
  for (const Case c : {Case{5, 6, true}, Case{5, 6, false}, Case{35, 34, true}}) {
    const std::vector<Tensor<double>> params = {small_random({2, c.T, 4, 3}, ++seed),
                                                small_random({2, c.S, 2, 3}, ++seed),
                                                small_random({2, c.S, 2, 3}, ++seed)};
    const Tensor<double> w = small_random({2, c.T, 4, 3}, ++seed);
    auto f = [&](const std::vector<Tensor<double>>& p) {
      return sum(dot_product_attention(p[0], p[1], p[2], c.causal) * w);
    };
    const auto [value, grads] = value_and_grad(f)(params);
    EXPECT_NEAR(value.item(), f(params).item(), 1e-12);
    const auto fd = finite_differences([&](const std::vector<Tensor<double>>& p) { return f(p).item(); }, params);
    for (std::size_t i = 0; i < 3; ++i)
      EXPECT_LT(max_rel_diff(grads[i], fd[i]), 2e-6) << max_rel_diff(grads[i], fd[i]) << " T " << c.T << " causal " << c.causal << " operand " << i;
    // No query heads: an empty result in both views.
    const auto none = device_put(Tensor<double>(Shape{2, 3, 0, 2}), NamedSharding(meshes().front(), P()));
    const auto kv = device_put(small_random({2, 3, 1, 2}, 77), NamedSharding(meshes().front(), P()));
    EXPECT_EQ(dot_product_attention(none, kv, kv, c.causal).shape(), (Shape{2, 3, 0, 2}));
    // Bad shapes raise the Tensor view's error in this view too (on every rank).
    const auto q3 = device_put(small_random({2, 3, 3, 2}, 78), NamedSharding(meshes().front(), P()));
    const auto k2 = device_put(small_random({2, 3, 2, 2}, 79), NamedSharding(meshes().front(), P()));
    try {
      dot_product_attention(q3, k2, k2, c.causal);
      ADD_FAILURE() << "3 query heads on 2 key heads did not raise";
    } catch (const ShapeError& e) {
      EXPECT_NE(std::string(e.what()).find("multiple of the key's and value's heads (2)"), std::string::npos) << e.what();
    }
    // The composed form on ShardedArrays (random specs, uneven shards) gives the same values and
    // gradients, sharded like the operands.
    std::mt19937_64 rng(seed);
    for (const auto& mesh : meshes()) {
      std::vector<ShardedArray<double>> sp;
      for (const auto& h : params) sp.push_back(device_put(h, NamedSharding(mesh, random_spec(mesh, 4, rng))));
      const auto ws = device_put(w, NamedSharding(mesh, random_spec(mesh, 4, rng)));
      const auto [sv, sg] = value_and_grad([&](const std::vector<ShardedArray<double>>& p) {
        return sum(dot_product_attention(p[0], p[1], p[2], c.causal) * ws);
      })(sp);
      EXPECT_NEAR(sv.to_host().item(), value.item(), 1e-10) << mesh.to_string();
      for (std::size_t i = 0; i < 3; ++i) {
        EXPECT_EQ(sg[i].sharding(), sp[i].sharding()) << mesh.to_string() << " operand " << i;
        EXPECT_LT(max_rel_diff(sg[i].to_host(), grads[i]), 1e-10)
            << mesh.to_string() << " operand " << i << " spec " << sp[i].spec().to_string();
      }
    }
  }
}

SHARD_MPI_TEST(Autodiff, ReturnedArraysHaveStorageOfTheirOwn) {
  // Inside a differentiated function a reshape shares its operand's memory; what comes back
  // (vjp's primal output, has_aux's aux, shard_map outputs through them) must not write
  // through to the caller's arrays or to a live vjp's residuals.
  Tensor<double> x = small_random({2, 3}, 31);
  const Tensor<double> x_before = x;
  auto [y, fn] = vjp([](const Tensor<double>& a) { return reshape(a, {6}); }, x);
  y.flat(0) = 42.0;
  EXPECT_EQ(x, x_before);
  const auto [dx] = fn(Tensor<double>({6}, 1.0));
  EXPECT_EQ(dx, Tensor<double>({2, 3}, 1.0));
  Tensor<double> w = small_random({4}, 32);
  const auto [va, gw] = value_and_grad(
      [](const Tensor<double>& p) { return std::make_pair(sum(p * p), reshape(p, {2, 2})); }, has_aux)(w);
  const Tensor<double> aux_before = va.second;
  for (std::int64_t i = 0; i < w.size(); ++i) w.flat(i) -= 0.1 * gw.flat(i);  // a hand-written update
  EXPECT_EQ(va.second, aux_before);
  // The same through a differentiated shard_map whose body returns a reshape of its block.
  const Mesh mesh = make_mesh({runtime().device_count()}, {"a"});
  const auto xs = device_put(small_random({2 * static_cast<std::int64_t>(runtime().device_count()), 3}, 33),
                             NamedSharding(mesh, P("a")));
  const auto xs_host = xs.to_host();
  auto [ys, fs] = vjp(
      [&](const ShardedArray<double>& a) {
        return shard_map(mesh, {P("a")}, {P("a")}, [](const Tensor<double>& blk) { return reshape(blk, {-1}); })(a);
      },
      xs);
  for (auto& sh : ys.addressable_shards()) sh.data.flat(0) = 42.0;
  EXPECT_EQ(xs.to_host(), xs_host);
}

// ---------------------------------------------------------------- API

SHARD_MPI_TEST(Autodiff, ApiFormsAgree) {
  const Tensor<double> hw = small_random({4, 3}, 1), hx = small_random({6, 4}, 2);
  const Mesh mesh = make_mesh({runtime().device_count()}, {"a"});
  const auto w = device_put(hw, NamedSharding(mesh, P(None, "a")));
  const auto x = device_put(hx, NamedSharding(mesh, P("a")));
  auto loss = [](const ShardedArray<double>& w, const ShardedArray<double>& x) { return sum(tanh(matmul(x, w))); };
  const auto g = grad(loss)(w, x);
  const auto [v, g2] = value_and_grad(loss)(w, x);
  EXPECT_EQ(g.to_host(), g2.to_host());
  // has_aux: the logits come back beside the value.
  const auto [va, ga] = value_and_grad(
      [&](const ShardedArray<double>& w, const ShardedArray<double>& x) {
        auto logits = matmul(x, w);
        return std::make_pair(sum(tanh(logits)), logits);
      },
      has_aux)(w, x);
  EXPECT_EQ(va.first.to_host(), v.to_host());
  EXPECT_EQ(va.second.shape(), (Shape{6, 3}));
  EXPECT_EQ(va.second.ad(), nullptr);
  EXPECT_EQ(ga.to_host(), g.to_host());
  // A named parameter collection.
  std::map<std::string, ShardedArray<double>> named{{"w", w}};
  const auto gn = grad([&](const std::map<std::string, ShardedArray<double>>& p, const ShardedArray<double>& x) {
    return loss(p.at("w"), x);
  })(named, x);
  EXPECT_EQ(gn.at("w").to_host(), g.to_host());
  // vjp with a cotangent, twice.
  auto [out, fn] = vjp([&](const ShardedArray<double>& w) { return tanh(matmul(x, w)); }, w);
  const auto ct = device_put(small_random({6, 3}, 3), NamedSharding(mesh, P()));
  const auto [gw1] = fn(ct);
  const auto [gw2] = fn(ct);
  EXPECT_EQ(gw1.to_host(), gw2.to_host());
  EXPECT_EQ(gw1.sharding(), w.sharding());
  // The reference: (1 - tanh^2) * ct contracted with x.
  const Tensor<double> t = tanh(matmul(hx, hw));
  const Tensor<double> want = matmul(transpose(hx), (1.0 - t * t) * ct.to_host());
  EXPECT_LT(max_rel_diff(gw1.to_host(), want), 1e-12);
  // A parameter the loss does not use gets zeros, sharded like it.
  const auto unused = device_put(small_random({2, 2}, 4), NamedSharding(mesh, P("a")));
  const auto gz = grad([&](const std::vector<ShardedArray<double>>& p) { return loss(p[0], x); })(
      std::vector<ShardedArray<double>>{w, unused});
  EXPECT_EQ(gz[1].to_host(), Tensor<double>(Shape{2, 2}, 0.0));
  EXPECT_EQ(gz[1].sharding(), unused.sharding());
  // stop_gradient: treated as a constant.
  const auto gs = grad([&](const ShardedArray<double>& w) { return sum(w * stop_gradient(w)); })(w);
  EXPECT_LT(max_rel_diff(gs.to_host(), hw), 1e-15);
  // float32.
  const auto w32 = astype<float>(w);
  const auto g32 = grad([&](const ShardedArray<float>& w) { return sum(tanh(matmul(astype<float>(x), w))); })(w32);
  EXPECT_LT(max_rel_diff(astype<double>(g32.to_host()), g.to_host()), 1e-5);
}

SHARD_MPI_TEST(Autodiff, BadInputRaisesOnEveryRank) {
  const Mesh mesh = make_mesh({runtime().device_count()}, {"a"});
  const auto w = device_put(small_random({4, 3}, 1), NamedSharding(mesh, P("a")));
  expect_error<ValueError>([&] { grad([](const ShardedArray<double>& w) { return w * 2.0; })(w); },
                           {"grad", "shape (4, 3)", "scalar"});
  // Integer parameters do not compile (tests/compile_fail/grad_of_int_params.cpp).
  if (runtime().device_count() > 1) {
    const Mesh sub({1}, {"a"}, {mesh.device_ids()[0]});
    const auto other = device_put(small_random({4, 3}, 3), NamedSharding(sub, P()));
    expect_error<MeshMismatchError>(
        [&] {
          grad([](const std::vector<ShardedArray<double>>& p) { return sum(p[0]); })(
              std::vector<ShardedArray<double>>{w, other});
        },
        {"grad", "device ids"});
  }
  expect_error<ValueError>([&] { grad([](const ShardedArray<double>& w) { return sum(map(w, [](double v) { return v; })); })(w); },
                           {"'map' is not differentiable"});
}

// ---------------------------------------------------------------- through shard_map

using SA = ShardedArray<double>;
using HT = Tensor<double>;

/// value_and_grad of a function of sharded parameters against the same function's gradient
/// on host Tensors (the global view), parameter by parameter.
void expect_same_gradients(const std::string& what, const std::function<SA(const std::vector<SA>&)>& f,
                           const std::function<HT(const std::vector<HT>&)>& ref, const std::vector<SA>& params,
                           double tol = 1e-11) {
  std::vector<HT> host;
  for (const auto& p : params) host.push_back(p.to_host());
  const auto [v, g] = value_and_grad(f)(params);
  const auto [hv, hg] = value_and_grad(ref)(host);
  EXPECT_NEAR(v.to_host().item(), hv.item(), tol * std::max(1.0, std::abs(hv.item()))) << what;
  for (std::size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(g[i].sharding(), params[i].sharding()) << what << " param " << i;
    EXPECT_LT(max_rel_diff(g[i].to_host(), hg[i]), tol) << what << " param " << i;
  }
}

SHARD_MPI_TEST(Autodiff, ShardMapCollectivesTransposeLikeTheGlobalView) {
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const std::int64_t m = 2 * n, k = 3, o = 2 * n;
  std::uint64_t seed = 900;
  auto put = [&](const Shape& s, const PartitionSpec& spec) { return device_put(small_random(s, seed++), NamedSharding(mesh, spec)); };
  const SA c = put({m, o}, P());  // a constant weighting of the outputs

  // psum of a data-parallel loss: W replicated meets x sharded (an implicit pvary), so dW is
  // psummed by the transpose; pmean the same divided by n.
  for (const bool mean : {false, true}) {
    const SA w = put({k, o}, P()), x = put({m, k}, P("a"));
    expect_same_gradients(
        mean ? "pmean" : "psum",
        [&](const std::vector<SA>& p) {
          return shard_map(mesh, {P(), P("a")}, P(), [mean](const HT& w, const HT& x) {
            const HT local = sum(tanh(matmul(x, w)));
            return mean ? pmean(local, "a") : psum(local, "a");
          })(p[0], p[1]);
        },
        [&](const std::vector<HT>& p) { return sum(tanh(matmul(p[1], p[0]))) / (mean ? double(n) : 1.0); }, {w, x});
  }
  // all_gather (tiled and untiled) <-> psum_scatter.
  for (const bool tiled : {true, false}) {
    const SA x = put({m, k}, P("a")), w = put({k, o}, P(None, "a"));
    expect_same_gradients(
        tiled ? "all_gather tiled" : "all_gather untiled",
        [&](const std::vector<SA>& p) {
          const SA y = shard_map(mesh, {P("a"), P(None, "a")}, P(None, "a"), [tiled, m, k](const HT& x, const HT& w) {
            HT g = all_gather(x, "a", 0, tiled);
            if (!tiled) g = reshape(g, Shape{m, k});
            return tanh(matmul(g, w));
          })(p[0], p[1]);
          return sum(y * c);
        },
        [&](const std::vector<HT>& p) { return sum(tanh(matmul(p[0], p[1])) * c.to_host()); }, {x, w});
  }
  // psum_scatter (tiled and untiled) <-> all_gather.
  for (const bool tiled : {true, false}) {
    const SA x = put({m, 2 * static_cast<std::int64_t>(n)}, P(None, "a")), w = put({2 * static_cast<std::int64_t>(n), o}, P("a"));
    expect_same_gradients(
        tiled ? "psum_scatter tiled" : "psum_scatter untiled",
        [&](const std::vector<SA>& p) {
          const SA y = shard_map(mesh, {P(None, "a"), P("a")}, P("a"), [tiled, n, m, o](const HT& x, const HT& w) {
            HT partial = matmul(x, w);
            if (tiled) return psum_scatter(partial, "a", 0, true);
            return psum_scatter(reshape(partial, Shape{n, m / n, o}), "a", 0, false);
          })(p[0], p[1]);
          return sum(tanh(y) * c);
        },
        [&](const std::vector<HT>& p) { return sum(tanh(matmul(p[0], p[1])) * c.to_host()); }, {x, w});
  }
  // all_to_all (tiled and untiled) <-> all_to_all with split and concat swapped.
  for (const bool tiled : {true, false}) {
    const SA x = put({m, o}, P("a"));
    expect_same_gradients(
        tiled ? "all_to_all tiled" : "all_to_all untiled",
        [&](const std::vector<SA>& p) {
          const SA y = shard_map(mesh, {P("a")}, P(None, "a"), [tiled, n, m, o](const HT& x) {
            if (tiled) return all_to_all(x, "a", 1, 0, true);
            const HT split = reshape(x, Shape{m / n, n, o / n});  // dim 1 has the n chunks
            return reshape(all_to_all(split, "a", 1, 0, false), Shape{m, o / n});
          })(p[0]);
          return sum(tanh(y * c) * c);
        },
        [&](const std::vector<HT>& p) { return sum(tanh(p[0] * c.to_host()) * c.to_host()); }, {x});
  }
  // ppermute <-> the inverse permutation: a cyclic shift of the row blocks.
  {
    const SA x = put({m, o}, P("a"));
    std::vector<std::pair<int, int>> shift;
    for (int i = 0; i < n; ++i) shift.emplace_back(i, (i + 1) % n);
    expect_same_gradients(
        "ppermute",
        [&](const std::vector<SA>& p) {
          const SA y = shard_map(mesh, {P("a")}, P("a"), [shift](const HT& x) { return ppermute(x, "a", shift); })(p[0]);
          return sum(tanh(y) * c);
        },
        [&](const std::vector<HT>& p) {
          const std::int64_t b = m / n;
          const HT rolled = concatenate(std::vector<HT>{slice(p[0], {Slice(m - b, m)}), slice(p[0], {Slice(0, m - b)})}, 0);
          return sum(tanh(rolled) * c.to_host());
        },
        {x});
  }
  // axis_index is a constant; an invariant value psummed counts n times.
  {
    const SA x = put({m, o}, P("a")), w = put({o}, P());
    expect_same_gradients(
        "axis_index, psum of an invariant",
        [&](const std::vector<SA>& p) {
          return shard_map(mesh, {P("a"), P()}, P(), [](const HT& x, const HT& w) {
            const double s = axis_index("a") + 1.0;
            return psum(sum(x * s * w), "a") + psum(sum(w * w), "a");
          })(p[0], p[1]);
        },
        [&](const std::vector<HT>& p) {
          HT scale(Shape{m, 1});
          for (std::int64_t r = 0; r < m; ++r) scale.flat(r) = static_cast<double>(r / (m / n) + 1);
          return sum(p[0] * scale * p[1]) + sum(p[1] * p[1]) * static_cast<double>(n);
        },
        {x, w});
  }
}

SHARD_MPI_TEST(Autodiff, ShardMapOnTwoAxesMegatronMlp) {
  const int n = runtime().device_count();
  const auto f2 = factorisations(n, 2);
  const std::vector<int> shape = f2[f2.size() / 2];
  const Mesh mesh = make_mesh(shape, {"data", "model"});
  const std::int64_t b = 2 * shape[0], d = 3, h = 2 * shape[1], o = 2;
  std::uint64_t seed = 1300;
  auto put = [&](const Shape& s, const PartitionSpec& spec) { return device_put(small_random(s, seed++), NamedSharding(mesh, spec)); };
  const SA x = put({b, d}, P("data")), w1 = put({d, h}, P(None, "model")), w2 = put({h, o}, P("model")),
           t = put({b, o}, P("data"));
  auto body = [](const HT& x, const HT& w1, const HT& w2, const HT& t) {
    const HT y = psum(matmul(tanh(matmul(x, w1)), w2), "model");
    return psum(sum(square(y - t)), "data");
  };
  expect_same_gradients(
      "megatron shard_map",
      [&](const std::vector<SA>& p) {
        return shard_map(mesh, {P("data"), P(None, "model"), P("model"), P("data")}, P(), body)(p[0], p[1], p[2], t);
      },
      [&](const std::vector<HT>& p) { return sum(square(matmul(tanh(matmul(p[0], p[1])), p[2]) - t.to_host())); },
      {x, w1, w2});
  // The global view of the same model gives the same gradients.
  expect_same_gradients(
      "megatron global view",
      [&](const std::vector<SA>& p) { return sum(square(matmul(tanh(matmul(p[0], p[1])), p[2]) - t)); },
      [&](const std::vector<HT>& p) { return sum(square(matmul(tanh(matmul(p[0], p[1])), p[2]) - t.to_host())); },
      {x, w1, w2});
}

SHARD_MPI_TEST(Autodiff, ShardMapErrorsNameTheProblem) {
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const SA x = device_put(small_random({2 * static_cast<std::int64_t>(n), 3}, 5), NamedSharding(mesh, P("a")));
  if (n > 1) {  // a varying output with an out_spec that omits the axis
    expect_error<ValueError>(
        [&] {
          grad([&](const SA& x) { return sum(shard_map(mesh, P("a"), P(), [](const HT& b) { return sum(b); })(x)); })(x);
        },
        {"out_spec", "'a'", "psum"});
  }
  expect_error<ValueError>(
      [&] {
        grad([&](const SA& x) {
          return sum(shard_map(mesh, P("a"), P(), [](const HT& b) { return pmax(sum(b), "a"); })(x));
        })(x);
      },
      {"'pmax' is not differentiable"});
  // grad inside a body differentiates the local program; a collective there is an error.
  expect_error<ValueError>(
      [&] {
        shard_map(mesh, P("a"), P(), [](const HT& b) {
          return grad([](const HT& v) { return psum(sum(v), "a"); })(b).sum();
        })(x);
      },
      {"'psum' is not differentiable", "local program"});
  // A tracked array captured by the body instead of passed as an argument.
  expect_error<ValueError>(
      [&] {
        grad([&](const SA& x) {
          const HT host = x.to_host();
          return sum(shard_map(mesh, P("a"), P("a"), [&host](const HT& b) { return b * sum(host); })(x));
        })(x);
      },
      {"pass it to the shard_map as an argument"});
}

SHARD_MPI_TEST(Autodiff, GradInsideABodyIsLocal) {
  // Seed 004's loop: grad of a local loss in the body, then pmean over the devices.
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const std::int64_t b = 2 * n, d = 4, o = 3;
  const SA w = device_put(small_random({d, o}, 1), NamedSharding(mesh, P()));
  const SA x = device_put(small_random({b, d}, 2), NamedSharding(mesh, P("a")));
  const SA gw = shard_map(mesh, {P(), P("a")}, P(), [](const HT& w, const HT& x) {
    const HT g = grad([&](const HT& w) { return mean(square(matmul(x, w))); })(w);
    return pmean(g, "a");
  })(w, x);
  // The mean of the devices' gradients of their own batch means (equal batches: the global mean's).
  const HT hx = x.to_host(), hw = w.to_host();
  const HT want = grad([&](const HT& w) { return mean(square(matmul(hx, w))); })(hw);
  EXPECT_LT(max_rel_diff(gw.to_host(), want), 1e-12);
}

// ---------------------------------------------------------------- communication

SHARD_MPI_TEST(Autodiff, DataParallelStepSendsOneReductionPerGradient) {
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"data"});
  const std::int64_t b = 4 * n, d = 8, o = 5;
  const SA x = device_put(small_random({b, d}, 1), NamedSharding(mesh, P("data")));
  const SA t = device_put(small_random({b, o}, 2), NamedSharding(mesh, P("data")));
  const std::vector<SA> params{device_put(small_random({d, o}, 3), NamedSharding(mesh, P())),
                               device_put(small_random({o}, 4), NamedSharding(mesh, P()))};
  auto loss = [&](const std::vector<SA>& p) { return mean(square(matmul(x, p[0]) + p[1] - t)); };
  comm_stats().reset();
  const auto g = grad(loss)(params);
  const auto all = comm_stats().entries();
  // Theory: the loss's mean (one scalar) forward; dW (d x o) and db (o) reduced over 'data'
  // backward; nothing else.
  std::int64_t calls = 0, bytes = 0;
  for (const auto& [key, rec] : all) {
    EXPECT_EQ(key.first, "psum") << comm_stats().to_string();
    calls += rec.calls;
    bytes += rec.bytes;
  }
  if (runtime().process_count() > 1) {
    EXPECT_EQ(calls, 3) << comm_stats().to_string();
    EXPECT_EQ(bytes, static_cast<std::int64_t>(sizeof(double)) * (1 + d * o + o)) << comm_stats().to_string();
  } else {
    EXPECT_EQ(calls, 0) << comm_stats().to_string();
  }
  EXPECT_EQ(g[0].sharding(), params[0].sharding());
}

SHARD_MPI_TEST(Autodiff, GradShardingScattersEachGradientOnce) {
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"data"});
  const std::int64_t b = 4 * n, d = 2 * n, o = 5;
  const SA x = device_put(small_random({b, d}, 1), NamedSharding(mesh, P("data")));
  const SA t = device_put(small_random({b, o}, 2), NamedSharding(mesh, P("data")));
  const std::vector<SA> params{device_put(small_random({d, o}, 3), NamedSharding(mesh, P())),
                               device_put(small_random({o}, 4), NamedSharding(mesh, P()))};
  auto loss = [&](const std::vector<SA>& p) { return mean(square(matmul(x, p[0]) + p[1] - t)); };
  const auto opt = optim::adam(1e-3).shard_state_over("data");
  const auto want = grad(loss)(params);
  comm_stats().reset();
  const auto g = grad(loss, opt.grad_sharding())(params);
  const auto entries = comm_stats().entries();
  const std::string table = comm_stats().to_string();
  auto get = [&](const char* kind) {
    const auto it = entries.find({kind, "'data'"});
    return it == entries.end() ? CommRecord{} : it->second;
  };
  // Each gradient where the optimizer's state is: W's rows over 'data' (its contraction over
  // 'data' ends in one psum_scatter), the bias whole unless its length divides.
  const auto state = opt.init(params);
  for (std::size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(g[i].sharding(), opt.grad_sharding()(params[i].sharding(), params[i].shape()));
    EXPECT_EQ(g[i].sharding(), state.arrays.at("mu/" + std::to_string(i)).sharding());
    EXPECT_LT(max_rel_diff(g[i].to_host(), want[i].to_host()), 1e-12);
  }
  EXPECT_EQ(g[0].spec(), n > 1 ? P("data") : P());
  if (runtime().process_count() > 1) {
    const std::int64_t e = sizeof(double);
    const bool bias_splits = o % n == 0;
    EXPECT_EQ(get("psum_scatter").calls, bias_splits ? 2 : 1) << table;
    EXPECT_EQ(get("psum_scatter").bytes, e * (d * o + (bias_splits ? o : 0)))
        << table;
    EXPECT_EQ(get("psum").calls, bias_splits ? 1 : 2) << table;
    EXPECT_EQ(get("psum").bytes, e * (1 + (bias_splits ? 0 : o))) << table;
    std::int64_t other = 0;
    for (const auto& [key, rec] : entries)
      if (key.second != "'data'" || (key.first != "psum" && key.first != "psum_scatter")) other += rec.calls;
    EXPECT_EQ(other, 0) << table;
  }
  // A sharding on other devices is refused on every rank, naming the option.
  if (n > 1) {
    const Mesh sub({1}, {"data"}, {mesh.device_ids()[0]});
    expect_error<MeshMismatchError>(
        [&] { grad(loss, [&](const NamedSharding&, const Shape&) { return NamedSharding(sub, P()); })(params); },
        {"grad", "grad_sharding"});
  }
}

SHARD_MPI_TEST(Autodiff, MegatronStepSendsTheMegatronCollectives) {
  const int n = runtime().device_count();
  if (n % 2 || n < 4) GTEST_SKIP() << "needs an even device count of 4 or more (both axes of size 2+)";
  const Mesh mesh = make_mesh({n / 2, 2}, {"data", "model"});
  const std::int64_t b = 4 * (n / 2), d = 6, h = 8, o = 3;
  const SA x = device_put(small_random({b, d}, 1), NamedSharding(mesh, P("data")));
  const SA t = device_put(small_random({b, o}, 2), NamedSharding(mesh, P("data")));
  const std::vector<SA> params{device_put(small_random({d, h}, 3), NamedSharding(mesh, P(None, "model"))),
                               device_put(small_random({h, o}, 4), NamedSharding(mesh, P("model")))};
  auto loss = [&](const std::vector<SA>& p) { return sum(square(matmul(tanh(matmul(x, p[0])), p[1]) - t)); };
  comm_stats().reset();
  const auto g = grad(loss)(params);
  // Forward: y = h @ W2 summed over 'model' (b/data x o); the loss summed over 'data'.
  // Backward: dW2 = h^T dy and dW1 = x^T dh each summed over 'data'; dh = dy W2^T is local.
  const auto model = comm_stats().get("psum", "'model'");
  const auto data = comm_stats().get("psum", "'data'");
  const bool multi = runtime().process_count() > 1;
  const std::int64_t e = sizeof(double);
  std::int64_t other = 0;
  for (const auto& [key, rec] : comm_stats().entries())
    if (!(key.first == "psum" && (key.second == "'model'" || key.second == "'data'"))) other += rec.calls;
  EXPECT_EQ(other, 0) << comm_stats().to_string();
  if (multi) {
    // A rank takes part in one reduction per group its devices are in (the groups over
    // 'data' are told apart by the 'model' coordinate, and the other way round); groups
    // within one rank send nothing.
    std::set<int> data_groups, model_groups;
    for (int dev : mesh.local_device_ids()) {
      data_groups.insert(mesh.coords(dev)[1]);
      model_groups.insert(mesh.coords(dev)[0]);
    }
    const auto g_data = static_cast<std::int64_t>(data_groups.size());
    EXPECT_EQ(data.calls, 3 * g_data) << comm_stats().to_string();
    EXPECT_EQ(data.bytes, g_data * e * (1 + (h / 2) * o + d * (h / 2))) << comm_stats().to_string();
    EXPECT_LE(model.calls, static_cast<std::int64_t>(model_groups.size())) << comm_stats().to_string();
    if (model.calls) {
      EXPECT_EQ(model.bytes, model.calls * e * (b / (n / 2)) * o) << comm_stats().to_string();
    }
  }
  EXPECT_EQ(g[0].sharding(), params[0].sharding());
  EXPECT_EQ(g[1].sharding(), params[1].sharding());
}

SHARD_MPI_TEST(Autodiff, AParameterUsedTwiceInABodyIsSummedOnce) {
  // A tied embedding's pattern: an invariant W used directly and through a transpose, each
  // meeting data-varying values. The transpose passes the varying cotangent through, so W's
  // two uses are added first and summed over 'a' in one psum (not one psum per use).
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const std::int64_t b = 2 * n, d = 4, o = 3;
  const SA w = device_put(small_random({d, o}, 21), NamedSharding(mesh, P()));
  const SA x = device_put(small_random({b, d}, 22), NamedSharding(mesh, P("a")));
  const SA u = device_put(small_random({b, o}, 23), NamedSharding(mesh, P("a")));
  auto body = [](const HT& w, const HT& x, const HT& u) {
    const HT y = matmul(x, w);                               // (b, o): W's first use
    const HT back = matmul(u, transpose(reshape(w, {d, o})));  // (b, d): through a reshape and a transpose
    return psum(sum(square(y)) + sum(tanh(back) * x), "a");
  };
  comm_stats().reset();
  expect_same_gradients(
      "W used twice",
      [&](const std::vector<SA>& p) { return shard_map(mesh, {P(), P("a"), P("a")}, P(), body)(p[0], x, u); },
      [&](const std::vector<HT>& p) {
        const HT hx = x.to_host(), hu = u.to_host();
        return sum(square(matmul(hx, p[0]))) + sum(tanh(matmul(hu, transpose(p[0]))) * hx);
      },
      {w});
  // One psum forward (the loss) and one backward (W's gradient), over 'a' (MPI calls: none on one rank).
  if (runtime().process_count() > 1) {
    std::int64_t calls = 0;
    for (const auto& [key, rec] : comm_stats().entries())
      if (key.first == "psum") calls += rec.calls;
    EXPECT_EQ(calls, 2) << comm_stats().to_string();
  }
}

// ---------------------------------------------------------------- composite and scan ops

/// The gradients of f (a generic lambda of a parameter vector: one program for both views) on
/// float64 Tensors against central finite differences, then on ShardedArrays (every mesh,
/// random specs, so uneven and empty shards) against the Tensor gradients, sharded like the
/// parameters. In the slow tier (full_matrix()) each parameter takes every spec in turn, the
/// others random ones. Returns the Tensor gradients.
template <typename F>
std::vector<HT> check_gradients(const std::string& what, F f, const std::vector<HT>& host, std::uint64_t seed,
                                double fd_tol = 2e-6) {
  const auto [hv, hg] = value_and_grad([&](const std::vector<HT>& p) { return f(p); })(host);
  EXPECT_NEAR(hv.item(), f(host).item(), 1e-12 * std::max(1.0, std::abs(hv.item()))) << what;
  const auto fd = finite_differences([&](const std::vector<HT>& p) { return f(p).item(); }, host);
  for (std::size_t i = 0; i < host.size(); ++i)
    EXPECT_LT(max_rel_diff(hg[i], fd[i]), fd_tol) << what << " param " << i;
  std::mt19937_64 rng(seed);  // the same specs on every rank
  for (const auto& mesh : meshes()) {
    std::vector<std::vector<PartitionSpec>> cases;  // one spec per parameter
    auto random_case = [&] {
      std::vector<PartitionSpec> c;
      for (const auto& h : host) c.push_back(random_spec(mesh, h.rank(), rng));
      return c;
    };
    if (full_matrix()) {
      for (std::size_t i = 0; i < host.size(); ++i)
        for (const auto& spec : all_specs(mesh.axis_names(), host[i].rank())) {
          cases.push_back(random_case());
          cases.back()[i] = spec;
        }
    } else {
      for (int r = 0; r < 3; ++r) cases.push_back(random_case());
    }
    for (const auto& specs : cases) {
      std::vector<SA> sp;
      for (std::size_t i = 0; i < host.size(); ++i) sp.push_back(device_put(host[i], NamedSharding(mesh, specs[i])));
      std::string name = what + " " + mesh.to_string();
      for (const auto& p : sp) name += " " + p.spec().to_string();
      const auto [v, g] = value_and_grad([&](const std::vector<SA>& p) { return f(p); })(sp);
      EXPECT_NEAR(v.to_host().item(), hv.item(), 1e-10 * std::max(1.0, std::abs(hv.item()))) << name;
      for (std::size_t i = 0; i < host.size(); ++i) {
        EXPECT_EQ(g[i].sharding(), sp[i].sharding()) << name << " param " << i;
        EXPECT_LT(max_rel_diff(g[i].to_host(), hg[i]), 1e-10) << name << " param " << i;
      }
    }
  }
  return hg;
}

/// Random values in [-scale, scale).
HT spread(const Shape& shape, std::uint64_t seed, double scale) {
  HT t = small_random(shape, seed);
  for (auto& v : t) v *= scale;
  return t;
}

SHARD_MPI_TEST(Autodiff, LogaddexpGradients) {
  const HT w = spread({7, 5}, 1201, 1.0);  // weights the outputs (a constant)
  check_gradients(
      "logaddexp",
      [&](const auto& p) { return sum(logaddexp(p[0], p[1]) * w) + sum(logaddexp(p[1], 0.3) * logaddexp(-0.7, p[0])); },
      {spread({7, 5}, 1202, 4.0), spread({5}, 1203, 4.0)}, 1204);
  // Ties (1/2 each) and infinities: finite where JAX's rule is; -inf, -inf gives 1 and 1.
  const double inf = std::numeric_limits<double>::infinity();
  const HT a({7}, std::vector<double>{-inf, inf, inf, -inf, 100, -100, 0.3});
  const HT b({7}, std::vector<double>{2, 1, inf, -inf, -100, 100, 0.3});
  const auto [v, g] = value_and_grad([](const std::vector<HT>& p) { return sum(logaddexp(p[0], p[1])); })(
      std::vector<HT>{a, b});
  EXPECT_TRUE(std::isnan(v.item()));  // the outputs hold +inf and -inf (checked in test_tensor_ops)
  const std::vector<double> da{0, 1, 1, 1, 1, std::exp(-200.0), 0.5}, db{1, 0, 1, 1, std::exp(-200.0), 1, 0.5};
  for (int i = 0; i < 7; ++i) {
    EXPECT_NEAR(g[0].flat(i), da[i], 1e-15) << "d/da at " << a.flat(i) << ", " << b.flat(i);
    EXPECT_NEAR(g[1].flat(i), db[i], 1e-15) << "d/db at " << a.flat(i) << ", " << b.flat(i);
  }
}

SHARD_MPI_TEST(Autodiff, MatmulGradientsInEveryShape) {
  // matmul's VJP (ops/matmul.hpp): 2-D (transposes in the gemm), 1-D operands promoted, batch
  // dims broadcast, in both views; uneven shapes.
  const HT w = spread({3, 5, 4}, 1251, 1.0);
  check_gradients(
      "matmul",
      [&](const auto& p) {
        return sum(matmul(p[0], p[1])) + sum(matmul(p[2], p[0]) * p[3]) + sum(matmul(p[0], p[3])) +
               sum(matmul(p[4], p[1]) * w) + sum(square(matmul(p[4], p[3])));
      },
      {spread({5, 7}, 1252, 1.0), spread({7, 4}, 1253, 1.0), spread({5}, 1254, 1.0), spread({7}, 1255, 1.0),
       spread({3, 1, 5, 7}, 1256, 1.0)},
      1257);
  // dot with a right operand of more than 2 dims (Tensors: a composition of primitives now).
  const std::vector<HT> host{spread({2, 3}, 1258, 1.0), spread({4, 3, 5}, 1259, 1.0)};
  const HT c = spread({2, 4, 5}, 1260, 1.0);
  auto f = [&](const std::vector<HT>& p) { return sum(dot(p[0], p[1]) * c); };
  const auto [v, g] = value_and_grad(f)(host);
  const auto fd = finite_differences([&](const std::vector<HT>& p) { return f(p).item(); }, host);
  for (std::size_t i = 0; i < host.size(); ++i) EXPECT_LT(max_rel_diff(g[i], fd[i]), 2e-6) << "dot param " << i;
  // A vector times a batch of matrices (Tensors: the sharded rules take no 2-D A with a 3-D B).
  const std::vector<HT> vb{spread({3}, 1261, 1.0), spread({2, 3, 4}, 1262, 1.0)};
  auto h = [](const std::vector<HT>& p) { return sum(square(matmul(p[0], p[1]))); };
  const auto gv = grad(h)(vb);
  const auto fv = finite_differences([&](const std::vector<HT>& p) { return h(p).item(); }, vb);
  for (std::size_t i = 0; i < vb.size(); ++i) EXPECT_LT(max_rel_diff(gv[i], fv[i]), 2e-6) << "vector @ batch " << i;
}

SHARD_MPI_TEST(Autodiff, SoftplusGradients) {
  const HT w = spread({7, 5}, 1301, 1.0);
  check_gradients(
      "softplus", [&](const auto& p) { return sum(softplus(p[0] * p[1]) * w) + sum(softplus(p[1])); },
      {spread({7, 5}, 1302, 6.0), spread({5}, 1303, 2.0)}, 1304);
  // The derivative is sigmoid(x): 1/2 at 0, 1 at 100, exp(-100) at -100 (finite, not 0 / 0).
  const HT x({5}, std::vector<double>{0, 100, -100, 1000, -1000});
  const HT gx = grad([](const HT& v) { return sum(softplus(v)); })(x);
  const std::vector<double> want{0.5, 1, std::exp(-100.0), 1, 0};
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(gx.flat(i), want[i], 1e-15 * std::max(1e-30, want[i]) + 1e-300) << x.flat(i);
  EXPECT_GT(gx.flat(2), 0.0);
  // Inside a shard_map body: forward against loops, gradient against the global view. The
  // rows of x are split over 'a'; the scale s is replicated (its gradient is one psum).
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const std::int64_t rows = 2 * n;
  const SA xs = device_put(spread({rows, 3}, 1305, 5.0), NamedSharding(mesh, P("a")));
  const SA ss = device_put(spread({3}, 1306, 2.0), NamedSharding(mesh, P()));
  const SA y = shard_map(mesh, {P("a"), P()}, P("a"), [](const HT& x, const HT& s) { return softplus(x * s); })(xs, ss);
  const HT hx = xs.to_host(), hs = ss.to_host();
  HT want_y(hx.shape());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < 3; ++c) {
      const double v = hx(r, c) * hs.flat(c);
      want_y(r, c) = std::max(v, 0.0) + std::log1p(std::exp(-std::abs(v)));
    }
  EXPECT_LT(max_rel_diff(y.to_host(), want_y), 1e-15);
  expect_same_gradients(
      "softplus in shard_map",
      [&](const std::vector<SA>& p) {
        return shard_map(mesh, {P("a"), P()}, P(), [](const HT& x, const HT& s) {
          return psum(sum(softplus(x * s) * s), "a");
        })(p[0], p[1]);
      },
      [&](const std::vector<HT>& p) { return sum(softplus(p[0] * p[1]) * p[1]); }, {xs, ss});
}

SHARD_MPI_TEST(Autodiff, LogSigmoidGradients) {
  const HT w = spread({7, 5}, 1401, 1.0);
  check_gradients(
      "log_sigmoid", [&](const auto& p) { return sum(log_sigmoid(p[0] - p[1]) * w); },
      {spread({7, 5}, 1402, 6.0), spread({7, 1}, 1403, 2.0)}, 1404);
  // The derivative is sigmoid(-x): 1/2 at 0, exp(-100) at 100, 1 at -100.
  const HT x({4}, std::vector<double>{0, 100, -100, -1000});
  const HT gx = grad([](const HT& v) { return sum(log_sigmoid(v)); })(x);
  EXPECT_DOUBLE_EQ(gx.flat(0), 0.5);
  EXPECT_NEAR(gx.flat(1), std::exp(-100.0), 1e-15 * std::exp(-100.0));
  EXPECT_EQ(gx.flat(2), 1.0);
  EXPECT_EQ(gx.flat(3), 1.0);
}

SHARD_MPI_TEST(Autodiff, CumsumGradients) {
  const HT w = spread({7, 5}, 1501, 1.0);
  check_gradients(
      "cumsum",
      [&](const auto& p) {
        return sum(cumsum(p[0], 0) * w) + sum(tanh(cumsum(p[0] * p[1], -1))) + sum(cumsum(p[1]) * p[1]);
      },
      {spread({7, 5}, 1502, 1.0), spread({5}, 1503, 1.0)}, 1504);
  // The VJP is the reverse cumsum of the cotangent: vjp with a random cotangent against loops.
  const HT x = spread({4, 6}, 1505, 1.0), ct = spread({4, 6}, 1506, 1.0);
  for (int axis : {0, 1}) {
    auto [y, fn] = vjp([axis](const HT& v) { return cumsum(v, axis); }, x);
    const auto [dx] = fn(ct);
    HT want(x.shape());
    for (std::int64_t i = 0; i < 4; ++i)
      for (std::int64_t j = 0; j < 6; ++j) {
        double acc = 0;
        if (axis == 0)
          for (std::int64_t k = i; k < 4; ++k) acc += ct(k, j);
        else
          for (std::int64_t k = j; k < 6; ++k) acc += ct(i, k);
        want(i, j) = acc;
      }
    EXPECT_LT(max_rel_diff(dx, want), 1e-15) << "axis " << axis;
  }
}

SHARD_MPI_TEST(Autodiff, CumsumInsideShardMap) {
  // A body's cumsum is of its block (local). The global cumsum along the split rows, written
  // by hand in the body: the block's cumsum plus the sum of the blocks before it (an all_gather
  // of the block totals, masked by axis_index), forward against loops and gradients (through
  // the all_gather's transpose, a psum_scatter) against the global view's cumsum.
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const std::int64_t rows = 3 * n, cols = 4;
  const SA x = device_put(spread({rows, cols}, 1601, 1.0), NamedSharding(mesh, P("a")));
  const SA s = device_put(spread({cols}, 1602, 1.0), NamedSharding(mesh, P()));
  auto body = [n](const HT& blk, const HT& scale) {
    const HT v = blk * scale;
    const HT totals = all_gather(sum(v, 0, true), "a", 0, true);  // (n, cols)
    HT before(Shape{n, 1}, 0.0);
    for (int q = 0; q < axis_index("a"); ++q) before.flat(q) = 1.0;
    return cumsum(v, 0) + sum(totals * before, 0, true);
  };
  const SA y = shard_map(mesh, {P("a"), P()}, P("a"), body)(x, s);
  const HT hx = x.to_host(), hs = s.to_host();
  HT want(hx.shape());
  for (std::int64_t j = 0; j < cols; ++j) {
    double acc = 0;
    for (std::int64_t i = 0; i < rows; ++i) want(i, j) = acc += hx(i, j) * hs.flat(j);
  }
  EXPECT_LT(max_rel_diff(y.to_host(), want), 1e-14);
  const HT c = spread({rows, cols}, 1603, 1.0);
  expect_same_gradients(
      "global cumsum in shard_map",
      [&](const std::vector<SA>& p) { return sum(tanh(shard_map(mesh, {P("a"), P()}, P("a"), body)(p[0], p[1])) * c); },
      [&](const std::vector<HT>& p) { return sum(tanh(cumsum(p[0] * p[1], 0)) * c); }, {x, s});
  // The block-local cumsum (along both dims) with an invariant scale: its gradient is one psum.
  expect_same_gradients(
      "block cumsum in shard_map",
      [&](const std::vector<SA>& p) {
        return shard_map(mesh, {P("a"), P()}, P(), [](const HT& blk, const HT& scale) {
          return psum(sum(tanh(cumsum(cumsum(blk * scale, 0), 1))), "a");
        })(p[0], p[1]);
      },
      [&](const std::vector<HT>& p) {
        HT total(Shape{}, 0.0);
        for (int b = 0; b < n; ++b) {
          const HT blk = slice(p[0], {Slice(3 * b, 3 * b + 3)});
          total = total + sum(tanh(cumsum(cumsum(blk * p[1], 0), 1)));
        }
        return total;
      },
      {x, s});
}

SHARD_MPI_TEST(Autodiff, LayerNormGradients) {
  // x, gain and bias all differentiated, along the last axis and along axis 0.
  const HT w = spread({7, 6}, 1701, 1.0);
  check_gradients(
      "layer_norm",
      [&](const auto& p) {
        return sum(tanh(layer_norm(p[0], p[1], p[2])) * w) + sum(layer_norm(p[0] * 0.5, p[3], p[4], 0, 1e-3) * w);
      },
      {spread({7, 6}, 1702, 3.0), spread({6}, 1703, 2.0), spread({6}, 1704, 1.0), spread({7}, 1705, 2.0),
       spread({7}, 1706, 1.0)},
      1707);
  // Inside a shard_map body (rows split over 'a', the normalised axis whole): forward against
  // the global view, gradients of the replicated gain and bias summed over 'a' by the transpose.
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const std::int64_t rows = 2 * n;
  const SA x = device_put(spread({rows, 6}, 1708, 3.0), NamedSharding(mesh, P("a")));
  const SA g = device_put(spread({6}, 1709, 2.0), NamedSharding(mesh, P()));
  const SA b = device_put(spread({6}, 1710, 1.0), NamedSharding(mesh, P()));
  auto body = [](const HT& x, const HT& g, const HT& b) { return layer_norm(x, g, b); };
  const SA y = shard_map(mesh, {P("a"), P(), P()}, P("a"), body)(x, g, b);
  EXPECT_LT(max_rel_diff(y.to_host(), layer_norm(x.to_host(), g.to_host(), b.to_host())), 1e-14);
  const HT c = spread({rows, 6}, 1711, 1.0);
  expect_same_gradients(
      "layer_norm in shard_map",
      [&](const std::vector<SA>& p) {
        return sum(square(shard_map(mesh, {P("a"), P(), P()}, P("a"), body)(p[0], p[1], p[2])) * c);
      },
      [&](const std::vector<HT>& p) { return sum(square(layer_norm(p[0], p[1], p[2])) * c); }, {x, g, b});
}

SHARD_MPI_TEST(Autodiff, SoftmaxCrossEntropyGradients) {
  Tensor<std::int32_t> labels({7});
  for (std::int64_t i = 0; i < 7; ++i) labels.flat(i) = static_cast<std::int32_t>((i * 2 + 1) % 5);
  const HT w = spread({7}, 1801, 1.0);
  check_gradients(
      "cross entropy",
      [&](const auto& p) { return sum(softmax_cross_entropy_with_integer_labels(p[0] * p[1], labels) * w); },
      {spread({7, 5}, 1802, 4.0), spread({5}, 1803, 2.0)}, 1804);
  // d loss_i / d logits_ij = softmax_ij - (j == label_i), by loops (weights w_i).
  const HT logits = spread({7, 5}, 1805, 4.0);
  const HT gl = grad([&](const HT& l) { return sum(softmax_cross_entropy_with_integer_labels(l, labels) * w); })(logits);
  for (std::int64_t i = 0; i < 7; ++i) {
    double m = -INFINITY, s = 0;
    for (std::int64_t j = 0; j < 5; ++j) m = std::max(m, logits(i, j));
    for (std::int64_t j = 0; j < 5; ++j) s += std::exp(logits(i, j) - m);
    for (std::int64_t j = 0; j < 5; ++j)
      EXPECT_NEAR(gl(i, j), w.flat(i) * (std::exp(logits(i, j) - m) / s - (j == labels.flat(i) ? 1.0 : 0.0)), 1e-15) << i << j;
  }
  // Large logits: finite, exact gradients (softmax of the shifted row).
  const HT big({2, 3}, std::vector<double>{1e300, 1e300, -1e300, 1e4, 1e4 - 1, 1e4 - 2});
  const Tensor<std::int64_t> yb({2}, std::vector<std::int64_t>{0, 2});
  const HT gb = grad([&](const HT& l) { return sum(softmax_cross_entropy_with_integer_labels(l, yb)); })(big);
  const double z = 1 + std::exp(-1.0) + std::exp(-2.0);
  const std::vector<double> want{0.5 - 1, 0.5, 0, 1 / z, std::exp(-1.0) / z, std::exp(-2.0) / z - 1};
  for (int k = 0; k < 6; ++k) EXPECT_NEAR(gb.flat(k), want[k], 1e-15) << k;
  // Inside a shard_map body (data parallel: logits and labels split by rows), the mean loss:
  // forward against loops, gradient against the global view.
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const std::int64_t rows = 2 * n;
  Tensor<std::int32_t> hy({rows});
  for (std::int64_t i = 0; i < rows; ++i) hy.flat(i) = static_cast<std::int32_t>((i * 3 + 2) % 5);
  const SA xl = device_put(spread({rows, 5}, 1806, 4.0), NamedSharding(mesh, P("a")));
  const auto yl = device_put(hy, NamedSharding(mesh, P("a")));
  auto body = [rows](const HT& l, const Tensor<std::int32_t>& y) {
    return psum(sum(softmax_cross_entropy_with_integer_labels(l, y)), "a") / static_cast<double>(rows);
  };
  const SA mean_loss = shard_map(mesh, {P("a"), P("a")}, P(), body)(xl, yl);
  const HT hl = xl.to_host();
  double want_mean = 0;
  for (std::int64_t i = 0; i < rows; ++i) {
    double m = -INFINITY, s = 0;
    for (std::int64_t j = 0; j < 5; ++j) m = std::max(m, hl(i, j));
    for (std::int64_t j = 0; j < 5; ++j) s += std::exp(hl(i, j) - m);
    want_mean += (m + std::log(s) - hl(i, hy.flat(i))) / static_cast<double>(rows);
  }
  EXPECT_NEAR(mean_loss.to_host().item(), want_mean, 1e-14);
  expect_same_gradients(
      "cross entropy in shard_map",
      [&](const std::vector<SA>& p) { return shard_map(mesh, {P("a"), P("a")}, P(), body)(p[0], yl); },
      [&](const std::vector<HT>& p) {
        return mean(softmax_cross_entropy_with_integer_labels(p[0], hy));
      },
      {xl});
}

}  // namespace
}  // namespace shard::testing
