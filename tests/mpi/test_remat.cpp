// shard::checkpoint (jax.checkpoint / remat) against the same programs without it and host
// references: gradients equal for each policy (nothing, dots, everything, a predicate) on a
// parameter tree, in the global view on random specs of the 1-3-axis meshes and inside a
// differentiated shard_map body (an invariant argument's cotangent summed once over the axes it
// varies over); the replay really recomputes (the function runs twice, the kept products are
// not bound again); peak live bytes fall on a deep chain; vjp's function called twice; jit (the
// recomputation kept apart from the forward by the common-subexpression pass, values equal to
// eager's); the plain function when nothing is differentiated; a captured tracked array and a
// function that binds other ops on its replay raise; a nested checkpoint. Gradient accumulation
// (accumulate_value_and_grad) against the whole batch in one value_and_grad, in the global view
// and through a shard_map, with the parameters' sums over 'data' made once per step. Checked on
// every rank.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "mpi_test.hpp"
#include "shard/autodiff/accumulate.hpp"
#include "shard/autodiff/autodiff.hpp"
#include "shard/autodiff/remat.hpp"
#include "shard/comm/comm_stats.hpp"
#include "shard/jit/jit.hpp"
#include "test_util.hpp"

namespace remat_model {
/// A block's parameters, as a user writes a model.
template <typename A>
struct Block {
  A w1, b1, w2;
};
using HBlock = Block<shard::Tensor<double>>;
using SBlock = Block<shard::ShardedArray<double>>;
SHARD_TREE(HBlock, w1, b1, w2)
SHARD_TREE(SBlock, w1, b1, w2)
}  // namespace remat_model

namespace shard::testing {
namespace {

using HT = Tensor<double>;
using SA = ShardedArray<double>;
using remat_model::HBlock;
using remat_model::SBlock;

/// x + tanh(x @ w1 + b1) @ w2: a residual MLP block (a static scale passes through).
template <typename A, typename B>
A block(const A& x, const B& p, double scale) {
  return x + matmul(tanh(matmul(x, p.w1) + p.b1), p.w2) * scale;
}

HBlock host_block(std::int64_t d, std::int64_t h, std::uint64_t seed) {
  HBlock p{random_tensor<double>({d, h}, seed), random_tensor<double>({h}, seed + 1),
           random_tensor<double>({h, d}, seed + 2)};
  for (auto* t : {&p.w1, &p.w2})
    for (auto& v : *t) v *= 0.4;
  return p;
}

const std::vector<std::pair<std::string, RematPolicy>>& policies() {
  static const std::vector<std::pair<std::string, RematPolicy>> all{
      {"nothing", checkpoint_policies::nothing_saveable},
      {"dots", checkpoint_policies::dots_saveable},
      {"everything", checkpoint_policies::everything_saveable},
      {"tanh only", RematPolicy{[](std::string_view op) { return op == "tanh"; }}}};
  return all;
}

void expect_tree_near(const HBlock& got, const HBlock& want, double tol, const std::string& what) {
  const std::vector<std::pair<const HT*, const HT*>> pairs{
      {&got.w1, &want.w1}, {&got.b1, &want.b1}, {&got.w2, &want.w2}};
  for (const auto& [g, w] : pairs) {
    ASSERT_EQ(g->shape(), w->shape()) << what;
    for (std::int64_t i = 0; i < g->size(); ++i)
      EXPECT_NEAR(g->flat(i), w->flat(i), tol * std::max(1.0, std::abs(w->flat(i)))) << what << " " << i;
  }
}

SHARD_MPI_TEST(Remat, EachPolicyGivesTheUncheckpointedGradientsAndRecomputes) {
  const HT x = random_tensor<double>({6, 4}, 11);
  const HT wout = random_tensor<double>({6, 4}, 12);
  const HBlock p0 = host_block(4, 5, 13), p1 = host_block(4, 5, 23);
  const auto loss = [&](const std::vector<HBlock>& ps, auto&& apply) {
    HT h = x;
    for (const auto& p : ps) h = apply(h, p);
    return sum(tanh(h) * wout);
  };
  int runs = 0;
  const auto plain = [&](const HT& h, const HBlock& p, double s) {
    ++runs;
    return block(h, p, s);
  };
  const std::vector<HBlock> params{p0, p1};
  const std::uint64_t before = detail::bind_calls();
  const auto [v0, g0] = value_and_grad([&](const std::vector<HBlock>& ps) {
    return loss(ps, [&](const HT& h, const HBlock& p) { return plain(h, p, 0.7); });
  })(params);
  const std::uint64_t plain_binds = detail::bind_calls() - before;
  EXPECT_EQ(runs, 2);
  std::vector<std::uint64_t> binds;
  for (const auto& [name, policy] : policies()) {
    runs = 0;
    const auto ck = checkpoint(plain, policy);
    const std::uint64_t start = detail::bind_calls();
    const auto [v, g] = value_and_grad([&](const std::vector<HBlock>& ps) {
      return loss(ps, [&](const HT& h, const HBlock& p) { return ck(h, p, 0.7); });
    })(params);
    binds.push_back(detail::bind_calls() - start);
    EXPECT_EQ(runs, 4) << name;  // each block forward, then again in the backward pass
    EXPECT_EQ(v.flat(0), v0.flat(0)) << name;
    for (std::size_t b = 0; b < 2; ++b) expect_tree_near(g[b], g0[b], 1e-13, name);
  }
  // The replay binds again what the policy did not keep: every op under "nothing", none of the 4
  // products under "dots" (2 per block), nothing but the ops without a kept result under
  // "everything". A recorded op binds twice (its record step, then its kernel).
  EXPECT_GT(binds[0], plain_binds) << "nothing saved: the forward ops run twice";
  EXPECT_EQ(binds[0] - binds[1], 2u * 4u) << "dots: the 4 products are not bound again";
  EXPECT_LT(binds[2], binds[1]);
  EXPECT_EQ(binds[0] - binds[3], 2u * 2u) << "the predicate keeps the 2 tanh results";
}

SHARD_MPI_TEST(Remat, DeepChainKeepsOnlyTheBlockInputs) {
  // 12 blocks of width 64 and hidden width 256: without checkpoint the tape keeps each block's
  // input and its hidden values (4 times as many); with it only each block's input (and one
  // block's values during its replay).
  const std::int64_t d = 64, depth = 12;
  const HT x = random_tensor<double>({512, d}, 31);
  std::vector<HBlock> params;
  for (std::int64_t k = 0; k < depth; ++k)
    params.push_back(host_block(d, 4 * d, 40 + 3 * static_cast<std::uint64_t>(k)));
  const auto run = [&](bool remat) {
    const auto ck = checkpoint([](const HT& h, const HBlock& p) { return block(h, p, 0.1); });
    reset_tensor_memory_peak();
    const std::int64_t base = tensor_memory_stats().live_bytes;
    auto g = grad([&](const std::vector<HBlock>& ps) {
      HT h = x;
      for (const auto& p : ps) h = remat ? ck(h, p) : block(h, p, 0.1);
      return sum(h * h);
    })(params);
    return std::make_pair(tensor_memory_stats().peak_bytes - base, std::move(g));
  };
  const auto [peak_plain, g_plain] = run(false);
  const auto [peak_remat, g_remat] = run(true);
  for (std::int64_t k = 0; k < depth; ++k) expect_tree_near(g_remat[k], g_plain[k], 1e-12, "block");
  EXPECT_LT(static_cast<double>(peak_remat), 0.6 * static_cast<double>(peak_plain))
      << peak_remat << " bytes with checkpoint, " << peak_plain << " without";
}

SHARD_MPI_TEST(Remat, GlobalViewOnRandomSpecsEqualsTheHost) {
  std::mt19937_64 rng(51);
  const HT hx = random_tensor<double>({8, 6}, 52);
  const HBlock hp = host_block(6, 4, 53);
  const auto host_g = grad([&](const HBlock& p) { return sum(tanh(block(hx, p, 0.5))); })(hp);
  for (const Mesh& mesh : abc_meshes(runtime().device_count())) {
    std::vector<PartitionSpec> specs;
    for (int trial = 0; trial < 2; ++trial) specs.push_back(random_spec(mesh, 2, rng));
    for (const auto& spec : specs_or_all(mesh, 2, specs)) {
      const SA x = device_put(hx, NamedSharding(mesh, spec));
      const SBlock p{device_put(hp.w1, NamedSharding(mesh, random_spec(mesh, 2, rng))),
                     device_put(hp.b1, NamedSharding(mesh, random_spec(mesh, 1, rng))),
                     device_put(hp.w2, NamedSharding(mesh, random_spec(mesh, 2, rng)))};
      for (const auto& [name, policy] : policies()) {
        const auto ck = checkpoint([](const SA& h, const SBlock& q) { return block(h, q, 0.5); }, policy);
        const SBlock g = grad([&](const SBlock& q) { return sum(tanh(ck(x, q))); })(p);
        EXPECT_EQ(g.w1.sharding(), p.w1.sharding());
        const HBlock got{g.w1.to_host(), g.b1.to_host(), g.w2.to_host()};
        expect_tree_near(got, host_g, 1e-12, name + " " + spec.to_string());
      }
    }
  }
}

SHARD_MPI_TEST(Remat, InsideADifferentiatedShardMapBody) {
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"d"});
  const HT hx = random_tensor<double>({3 * static_cast<std::int64_t>(n), 4}, 61);
  const HBlock hp = host_block(4, 3, 62);
  const SA x = device_put(hx, NamedSharding(mesh, P("d")));
  const NamedSharding rep(mesh, P());
  const SBlock p{device_put(hp.w1, rep), device_put(hp.b1, rep), device_put(hp.w2, rep)};
  // The block's weights are invariant over 'd', its input varies: their cotangents vary and are
  // summed over 'd' once, by the transpose of pvary, as without checkpoint.
  const auto loss = [&](const auto& apply) {
    return [&, apply](const SA& xs, const SBlock& q) {
      return sum(shard_map(mesh, {P("d"), P(), P(), P()}, {P()},
                           [&](const HT& xb, const HT& w1, const HT& b1, const HT& w2) {
                             return psum(sum(tanh(apply(xb, HBlock{w1, b1, w2}))), "d");
                           })(xs, q.w1, q.b1, q.w2));
    };
  };
  const auto plain = [](const HT& h, const HBlock& q) { return block(h, q, 0.5); };
  const auto want = grad(loss(plain), argnums<0, 1>)(x, p);
  const auto host_g = grad([&](const HBlock& q) { return sum(tanh(block(hx, q, 0.5))); })(hp);
  for (const auto& [name, policy] : policies()) {
    const auto ck = checkpoint(plain, policy);
    const auto got = grad(loss([ck](const HT& h, const HBlock& q) { return ck(h, q); }), argnums<0, 1>)(x, p);
    const HT gx = std::get<0>(got).to_host(), wx = std::get<0>(want).to_host();
    for (std::int64_t i = 0; i < gx.size(); ++i) EXPECT_NEAR(gx.flat(i), wx.flat(i), 1e-13) << name;
    const SBlock& g = std::get<1>(got);
    expect_tree_near(HBlock{g.w1.to_host(), g.b1.to_host(), g.w2.to_host()}, host_g, 1e-12, name);
  }
}

SHARD_MPI_TEST(Remat, VjpTwiceJitAndThePlainFunction) {
  const HT x = random_tensor<double>({5, 4}, 71);
  const HBlock hp = host_block(4, 6, 72);
  const auto ck = checkpoint([](const HT& h, const HBlock& q) { return block(h, q, 0.3); },
                             checkpoint_policies::dots_saveable);
  // vjp's function twice: the replay runs from the kept values each time.
  auto [y, f_vjp] = vjp([&](const HT& h) { return tanh(ck(h, hp)); }, x);
  const HT ct = random_tensor<double>({5, 4}, 73);
  const HT a = std::get<0>(f_vjp(ct)), b = std::get<0>(f_vjp(ct));
  const HT want = std::get<0>(vjp([&](const HT& h) { return tanh(block(h, hp, 0.3)); }, x).second(ct));
  for (std::int64_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a.flat(i), b.flat(i));
    EXPECT_NEAR(a.flat(i), want.flat(i), 1e-13);
  }
  // Not differentiated: the function itself, once.
  int runs = 0;
  const auto counted = checkpoint([&](const HT& h) {
    ++runs;
    return h * 2.0;
  });
  const HT z = counted(x);
  EXPECT_EQ(runs, 1);
  for (std::int64_t i = 0; i < x.size(); ++i) EXPECT_EQ(z.flat(i), 2.0 * x.flat(i));

  // Under jit (global view): values and gradients equal eager's; the program binds the
  // products of the recomputation beside the forward's (not merged by CSE) under "nothing".
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"d"});
  const HT hx = random_tensor<double>({2 * static_cast<std::int64_t>(n), 4}, 74);
  const SA sx = device_put(hx, NamedSharding(mesh, P("d")));
  const NamedSharding rep(mesh, P());
  const SBlock sp{device_put(hp.w1, rep), device_put(hp.b1, rep), device_put(hp.w2, rep)};
  for (const bool remat : {false, true}) {
    const auto sck = checkpoint([](const SA& h, const SBlock& q) { return block(h, q, 0.3); });
    const auto loss = [&, remat](const SBlock& q, const SA& h) {
      return sum(tanh(remat ? sck(h, q) : block(h, q, 0.3)));
    };
    const auto eager = value_and_grad(loss)(sp, sx);
    const auto jf = jit(value_and_grad(loss));
    for (int call = 0; call < 2; ++call) {
      const auto got = jf(sp, sx);
      EXPECT_NEAR(got.first.to_host().flat(0), eager.first.to_host().flat(0), 1e-12);
      const HT g1 = got.second.w1.to_host(), e1 = eager.second.w1.to_host();
      for (std::int64_t i = 0; i < g1.size(); ++i) EXPECT_NEAR(g1.flat(i), e1.flat(i), 1e-12) << remat;
    }
    std::size_t products = 0;
    for (const auto& op : jf.lower(sp, sx).optimized().ops()) products += op == "matmul" ? 1 : 0;
    // The forward's 2 products (the VJPs bind matmul_t); the recomputation binds the first again
    // (its result feeds the VJPs; the second's does not, and dead-code elimination drops it).
    EXPECT_EQ(products, remat ? 3u : 2u) << jf.lower(sp, sx).optimized().to_string();
  }
}

SHARD_MPI_TEST(Remat, IntegerArgumentsKeepTheirAxesAndGradientsTheirSharding) {
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"d"});
  // A table looked up at indices that vary over 'd' (train_gpt's embedding): take's VJP scatters
  // each device's cotangent at its own indices before the sum over 'd'.
  const std::int64_t rows = 3 * static_cast<std::int64_t>(n);
  const HT htab = random_tensor<double>({5, 4}, 91);
  Tensor<std::int32_t> hidx({rows});
  for (std::int64_t i = 0; i < rows; ++i) hidx.flat(i) = static_cast<std::int32_t>((i * 7 + i / 3) % 5);
  const SA tab = device_put(htab, NamedSharding(mesh, P()));
  const ShardedArray<std::int32_t> idx = device_put(hidx, NamedSharding(mesh, P("d")));
  const auto lookup = [](const HT& t, const Tensor<std::int32_t>& i) { return tanh(take(t, i, 0)); };
  for (const bool remat : {false, true}) {
    const auto ck = checkpoint(lookup);
    const SA g = grad([&](const SA& t) {
      return sum(shard_map(mesh, {P(), P("d")}, {P()}, [&](const HT& tb, const Tensor<std::int32_t>& ib) {
        return psum(sum(remat ? ck(tb, ib) : lookup(tb, ib)), "d");
      })(t, idx));
    })(tab);
    const HT got = g.to_host();
    HT want({5, 4}, 0.0);
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t c = 0; c < 4; ++c) {
        const double y = std::tanh(htab.flat(hidx.flat(i) * 4 + c));
        want.flat(hidx.flat(i) * 4 + c) += 1 - y * y;
      }
    for (std::int64_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got.flat(i), want.flat(i), 1e-12) << remat;
  }
  // grad_sharding (ZeRO: the gradient asked for split over 'd') through a checkpoint in the
  // global view: the gradient lands where it was asked for, with the uncheckpointed values.
  const HT hx = random_tensor<double>({2 * static_cast<std::int64_t>(n), 4}, 92);
  const HBlock hp = host_block(4, 2 * static_cast<std::int64_t>(n), 93);
  const SA x = device_put(hx, NamedSharding(mesh, P("d")));
  const NamedSharding rep(mesh, P());
  const SBlock p{device_put(hp.w1, rep), device_put(hp.b1, rep), device_put(hp.w2, rep)};
  const GradSharding split = [](const NamedSharding& s, const Shape& shape) {
    return shape.size() == 2 && shape[0] % s.mesh().axis_size("d") == 0 ? NamedSharding(s.mesh(), P("d")) : s;
  };
  const auto ck = checkpoint([](const SA& h, const SBlock& q) { return block(h, q, 0.5); });
  const SBlock want = grad([&](const SBlock& q) { return sum(tanh(block(x, q, 0.5))); }, split)(p);
  const SBlock got = grad([&](const SBlock& q) { return sum(tanh(ck(x, q))); }, split)(p);
  EXPECT_EQ(got.w1.sharding(), want.w1.sharding());
  EXPECT_EQ(got.w2.sharding(), want.w2.sharding());
  expect_tree_near(HBlock{got.w1.to_host(), got.b1.to_host(), got.w2.to_host()},
                   HBlock{want.w1.to_host(), want.b1.to_host(), want.w2.to_host()}, 1e-12, "grad_sharding");
}

SHARD_MPI_TEST(Remat, ANestedCheckpointIsPartOfTheOuterOne) {
  const HT x = random_tensor<double>({6, 4}, 85);
  const HBlock p0 = host_block(4, 5, 86), p1 = host_block(4, 5, 87);
  const auto inner = checkpoint([](const HT& h, const HBlock& p) { return block(h, p, 0.5); },
                                checkpoint_policies::dots_saveable);
  const auto outer = checkpoint(
      [&](const HT& h, const std::vector<HBlock>& ps) { return block(inner(h, ps[0]), ps[1], 0.5); },
      checkpoint_policies::dots_saveable);
  const std::vector<HBlock> params{p0, p1};
  const auto g = grad([&](const std::vector<HBlock>& ps) { return sum(tanh(outer(x, ps))); })(params);
  const auto want = grad([&](const std::vector<HBlock>& ps) {
    return sum(tanh(block(block(x, ps[0], 0.5), ps[1], 0.5)));
  })(params);
  for (std::size_t b = 0; b < 2; ++b) expect_tree_near(g[b], want[b], 1e-13, "nested");
}

SHARD_MPI_TEST(Remat, CapturedArraysAndImpureFunctionsRaise) {
  const HT x = random_tensor<double>({4, 3}, 81);
  const HT w = random_tensor<double>({3, 3}, 82);
  // w is differentiated but only captured by the checkpointed function.
  expect_error<ValueError>(
      [&] {
        (void)grad([&](const std::vector<HT>& p) {
          const auto ck = checkpoint([&](const HT& h) { return matmul(h, p[1]); });
          return sum(ck(p[0]));
        })(std::vector<HT>{x, w});
      },
      {"checkpoint", "argument"});
  // A constant captured is fine.
  const HT g = grad([&](const HT& p) {
    const auto ck = checkpoint([&](const HT& h) { return matmul(h, w); });
    return sum(ck(p));
  })(x);
  const HT want = grad([&](const HT& p) { return sum(matmul(p, w)); })(x);
  for (std::int64_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g.flat(i), want.flat(i), 1e-13);
  // A function that binds another product when it runs again.
  int runs = 0;
  const auto impure = checkpoint(
      [&](const HT& h) {
        HT y = matmul(h, w);
        if (runs++ > 0) y = matmul(y, w);
        return y;
      },
      checkpoint_policies::dots_saveable);
  expect_error<ValueError>([&] { (void)grad([&](const HT& p) { return sum(impure(p)); })(x); },
                           {"checkpoint", "recomputing"});
}

/// Rows [r0, r1) of a host matrix.
HT rows_of(const HT& x, std::int64_t r0, std::int64_t r1) {
  HT out({r1 - r0, x.shape()[1]});
  for (std::int64_t r = r0; r < r1; ++r)
    for (std::int64_t c = 0; c < x.shape()[1]; ++c)
      out.flat((r - r0) * x.shape()[1] + c) = x.flat(r * x.shape()[1] + c);
  return out;
}

SHARD_MPI_TEST(Accumulate, MicroBatchesGiveTheWholeBatchInBothViews) {
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"data"});
  const std::int64_t rows = 8 * static_cast<std::int64_t>(n);
  const HT hx = random_tensor<double>({rows, 6}, 91), hy = random_tensor<double>({rows, 6}, 92);
  const HBlock hp = host_block(6, 5, 93);
  const NamedSharding batch_s(mesh, P("data")), rep(mesh, P());
  const SBlock p{device_put(hp.w1, rep), device_put(hp.b1, rep), device_put(hp.w2, rep)};
  // The global view: the weights' products contract over 'data' (their psums deferred).
  const auto global = [](const SBlock& q, const SA& x, const SA& y) {
    const SA d = block(x, q, 0.5) - y;
    return sum(d * d) / static_cast<double>(x.shape()[0]);
  };
  // A shard_map: the weights invariant, their cotangents summed over 'data' at the boundary.
  const auto mapped = [&](const SBlock& q, const SA& x, const SA& y) {
    const double count = static_cast<double>(x.shape()[0]);
    return sum(shard_map(mesh, {P("data"), P("data"), P(), P(), P()}, {P()},
                         [count](const HT& xb, const HT& yb, const HT& w1, const HT& b1, const HT& w2) {
                           const HT d = block(xb, HBlock{w1, b1, w2}, 0.5) - yb;
                           return psum(sum(d * d), "data") / count;
                         })(x, y, q.w1, q.b1, q.w2));
  };
  const SA x = device_put(hx, batch_s), y = device_put(hy, batch_s);
  for (const int view : {0, 1}) {
    const auto f = [&](const SBlock& q, const SA& xb, const SA& yb) {
      return view ? mapped(q, xb, yb) : global(q, xb, yb);
    };
    const auto [v1, g1] = value_and_grad(f)(p, x, y);
    for (const int k : {1, 2, 4}) {
      const std::int64_t m = rows / k;
      comm_stats().reset();
      const auto [v, g] = accumulate_value_and_grad(f, k, [&](int i) {
        return std::make_tuple(device_put(rows_of(hx, i * m, (i + 1) * m), batch_s),
                               device_put(rows_of(hy, i * m, (i + 1) * m), batch_s));
      })(p);
      const std::string what = (view ? "shard_map k=" : "global k=") + std::to_string(k);
      EXPECT_NEAR(v.to_host().flat(0), v1.to_host().flat(0), 1e-12 * std::abs(v1.to_host().flat(0))) << what;
      expect_tree_near(HBlock{g.w1.to_host(), g.b1.to_host(), g.w2.to_host()},
                       HBlock{g1.w1.to_host(), g1.b1.to_host(), g1.w2.to_host()}, 1e-12, what);
      EXPECT_EQ(g.w1.sharding(), p.w1.sharding()) << what;
    }
  }
  // micro_batches < 1 is an error.
  expect_error<ValueError>(
      [&] { (void)accumulate_value_and_grad(global, 0, [&](int) { return std::make_tuple(x, y); })(p); },
      {"micro_batches", "0"});
}

SHARD_MPI_TEST(Accumulate, TheParametersAreSummedOverDataOncePerStep) {
  // Through a shard_map the weights' cotangents are summed over 'data' at the boundary: with
  // accumulation that sum (psum over 'data') moves the same bytes for 4 micro-batches as for 1.
  const int n = runtime().device_count();
  if (runtime().process_count() < 2) GTEST_SKIP() << "needs 2+ ranks (MPI sums)";
  const Mesh mesh = make_mesh({n}, {"data"});
  const std::int64_t rows = 8 * static_cast<std::int64_t>(n);
  const HT hx = random_tensor<double>({rows, 64}, 95);
  const HT hw = random_tensor<double>({64, 64}, 96);
  const NamedSharding batch_s(mesh, P("data"));
  const SA w = device_put(hw, NamedSharding(mesh, P()));
  const auto f = [&](const SA& q, const SA& x) {
    return sum(shard_map(mesh, {P("data"), P()}, {P()}, [](const HT& xb, const HT& wb) {
      return psum(sum(tanh(matmul(xb, wb))), "data");
    })(x, q));
  };
  const auto psum_bytes = [&](int k) {
    const std::int64_t m = rows / k;
    comm_stats().reset();
    (void)accumulate_value_and_grad(f, k, [&](int i) {
      return std::make_tuple(device_put(rows_of(hx, i * m, (i + 1) * m), batch_s));
    })(w);
    return comm_stats().get("psum").bytes;
  };
  const std::int64_t one = psum_bytes(1), four = psum_bytes(4);
  // The weight stored split over 'data' (FSDP): the shard_map gathers it (a reshard), and its
  // cotangent's sum over 'data' is still made once.
  const SA w_split = device_put(hw, NamedSharding(mesh, P("data")));
  const auto split_bytes = [&](int k) {
    const std::int64_t m = rows / k;
    comm_stats().reset();
    const auto [v, g] = accumulate_value_and_grad(f, k, [&](int i) {
      return std::make_tuple(device_put(rows_of(hx, i * m, (i + 1) * m), batch_s));
    })(w_split);
    EXPECT_EQ(g.sharding(), w_split.sharding());
    return std::make_pair(comm_stats().get("psum").bytes, g.to_host());
  };
  const auto [s1, g1] = split_bytes(1);
  const auto [s4, g4] = split_bytes(4);
  EXPECT_LE(s4, s1 + 3 * 64) << s1 << " bytes with one batch, " << s4 << " with 4 micro-batches (FSDP)";
  for (std::int64_t i = 0; i < g1.size(); ++i)
    EXPECT_NEAR(g4.flat(i), g1.flat(i), 1e-10 * std::max(1.0, std::abs(g1.flat(i))));
  EXPECT_GE(one, hw.size() * 8 / 2) << "the weight's gradient is summed over 'data'";
  // The four losses' psums are 0-d (8 bytes each); the gradient's sum is made once.
  EXPECT_LE(four, one + 3 * 64) << one << " bytes with one batch, " << four << " with 4 micro-batches";
}

}  // namespace
}  // namespace shard::testing
