// shard::optim against a serial reference of optax's / PyTorch's formulas: SGD (momentum,
// Nesterov, L2), Adam and AdamW, over several steps on random parameters sharded with random
// specs (replicas included), with global-norm clipping (one psum) and ZeRO-1 state; the
// schedules against their formulas; state checkpointed and resumed on another mesh.

#include <cmath>
#include <filesystem>
#include <limits>
#include <random>

#include "mpi_test.hpp"
#include "shard/train/optim.hpp"
#include "test_util.hpp"

namespace shard::testing {
namespace {

using optim::Optimizer;

std::vector<Mesh> meshes() {
  const int n = runtime().device_count();
  std::vector<Mesh> out{make_mesh({n}, {"data"})};
  const auto f2 = factorisations(n, 2);
  out.push_back(make_mesh(f2[f2.size() / 2], {"data", "model"}));
  return out;
}

/// The reference: optax / PyTorch in float64 on host arrays.
struct Reference {
  Optimizer::Config c;
  std::vector<Tensor<double>> s0, s1;
  std::int64_t t = 0;
  void step(std::vector<Tensor<double>>& w, const std::vector<Tensor<double>>& g) {
    if (s0.empty())
      for (const auto& x : w) {
        s0.emplace_back(x.shape(), 0.0);
        s1.emplace_back(x.shape(), 0.0);
      }
    double scale = 1;
    if (c.max_norm > 0) {
      double sq = 0;
      for (const auto& x : g)
        for (double v : x) sq += v * v;
      if (std::sqrt(sq) > c.max_norm) scale = c.max_norm / std::sqrt(sq);
    }
    const double lr = c.lr(t);
    for (std::size_t i = 0; i < w.size(); ++i)
      for (std::int64_t k = 0; k < w[i].size(); ++k) {
        double& wk = w[i].flat(k);
        double& m = s0[i].flat(k);
        double& v = s1[i].flat(k);
        if (c.kind == Optimizer::Kind::kSgd) {
          const double gk = g[i].flat(k) * scale + c.weight_decay * wk;
          if (c.momentum == 0) {
            wk -= lr * gk;
            continue;
          }
          m = c.momentum * m + gk;
          wk -= lr * (c.nesterov ? gk + c.momentum * m : m);
        } else {
          const bool decoupled = c.kind == Optimizer::Kind::kAdamW;
          const double gk = g[i].flat(k) * scale + (decoupled ? 0 : c.weight_decay * wk);
          m = c.b1 * m + (1 - c.b1) * gk;
          v = c.b2 * v + (1 - c.b2) * gk * gk;
          const double mh = m / (1 - std::pow(c.b1, t + 1)), vh = v / (1 - std::pow(c.b2, t + 1));
          wk -= lr * (mh / (std::sqrt(vh) + c.eps) + (decoupled ? c.weight_decay * wk : 0));
        }
      }
    ++t;
  }
};

double max_rel_diff(const Tensor<double>& a, const Tensor<double>& b) {
  double m = 0;
  for (std::int64_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a.flat(i) - b.flat(i)) / std::max(1.0, std::abs(b.flat(i))));
  return m;
}

std::vector<Optimizer> optimizers() {
  std::vector<Optimizer> out{optim::sgd(0.1),
                             optim::sgd(optim::cosine_decay(0.05, 10), 0.9),
                             optim::sgd(0.02, 0.8, true, 0.01),
                             optim::adam(optim::warmup_cosine_decay(0.0, 0.01, 2, 10)),
                             optim::adamw(0.003, 0.05),
                             optim::adam(0.01).clip_by_global_norm(0.5),
                             optim::sgd(0.01, 0.5).clip_by_global_norm(1e6)};
  Optimizer::Config c = optim::adam(0.01).config();
  c.weight_decay = 0.02;  // Adam with L2
  out.emplace_back(c);
  return out;
}

SHARD_MPI_TEST(Optim, UpdatesMatchTheReferenceOnEveryLayout) {
  std::mt19937_64 rng(3);
  std::uint64_t seed = 10;
  const std::vector<Shape> shapes{{6, 4}, {5}, {3, 2, 4}, {}};
  for (const auto& mesh : meshes()) {
    for (bool zero : {false, true}) {
      for (Optimizer opt : optimizers()) {
        if (zero) opt.shard_state_over("data");
        Reference ref{opt.config(), {}, {}, 0};
        std::vector<Tensor<double>> hw;
        std::vector<ShardedArray<double>> w;
        for (const auto& s : shapes) {
          hw.push_back(random_tensor<double>(s, seed++));
          w.push_back(device_put(hw.back(), NamedSharding(mesh, random_spec(mesh, static_cast<int>(s.size()), rng))));
        }
        auto state = opt.init(w);
        for (int step = 0; step < 3; ++step) {
          std::vector<Tensor<double>> hg;
          std::vector<ShardedArray<double>> g;
          for (std::size_t i = 0; i < shapes.size(); ++i) {
            hg.push_back(random_tensor<double>(shapes[i], seed++));
            for (auto& v : hg.back()) v *= 0.01;
            // Gradients sharded like the parameters, like grad_sharding() asks (the state's
            // rows with ZeRO), or otherwise (resharded by the update).
            const auto how = rng() % 3;
            g.push_back(device_put(hg.back(), how == 0   ? w[i].sharding()
                                              : how == 1 ? opt.grad_sharding()(w[i].sharding(), shapes[i])
                                                         : NamedSharding(mesh, random_spec(mesh, static_cast<int>(shapes[i].size()), rng))));
          }
          const double norm = opt.update(w, g, state);
          ref.step(hw, hg);
          if (opt.config().max_norm > 0) {
            double sq = 0;
            for (const auto& x : hg)
              for (double v : x) sq += v * v;
            EXPECT_NEAR(norm, std::sqrt(sq), 1e-12 * std::sqrt(sq));
          }
        }
        EXPECT_EQ(state.step.item(), 3);
        for (std::size_t i = 0; i < shapes.size(); ++i) {
          EXPECT_LT(max_rel_diff(w[i].to_host(), hw[i]), 1e-12) << mesh.to_string() << " zero " << zero << " param " << i;
          for (const auto& s : w[i].addressable_shards()) {  // every local shard, replicas included
            const Tensor<double> want = reference_block(hw[i], s.box);
            EXPECT_LT(max_rel_diff(s.data, want), 1e-12) << "device " << s.device;
          }
        }
      }
    }
  }
}

SHARD_MPI_TEST(Optim, ZeroOneSplitsTheStateOverData) {
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"data"});
  const std::vector<ShardedArray<float>> w{device_put(random_tensor<float>({4 * static_cast<std::int64_t>(n), 3}, 1),
                                                      NamedSharding(mesh, P())),
                                           device_put(random_tensor<float>({3}, 2), NamedSharding(mesh, P()))};
  const auto state = optim::adam(1e-3).shard_state_over("data").init(w);
  EXPECT_EQ(state.arrays.at("mu/0").spec(), n > 1 ? P("data") : P());
  EXPECT_EQ(state.arrays.at("nu/1").spec(), n > 1 && 3 % n == 0 ? P("data") : P());
}

SHARD_MPI_TEST(Optim, WeightDecayMaskDecaysOnlyWhatItAccepts) {
  // optax.adamw's mask: with zero gradients AdamW's update is only its decay, lr wd w; the
  // mask (matrices only) leaves the bias as it was.
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  std::vector<ShardedArray<double>> p{device_put(random_tensor<double>({2 * static_cast<std::int64_t>(n), 3}, 61), NamedSharding(mesh, P("a"))),
                                      device_put(random_tensor<double>({3}, 62), NamedSharding(mesh, P()))};
  const std::vector<Tensor<double>> before{p[0].to_host(), p[1].to_host()};
  std::vector<ShardedArray<double>> g{zeros_like(p[0]), zeros_like(p[1])};
  auto opt = optim::adamw(0.1, 0.5).mask_weight_decay([](const Shape& s) { return s.size() >= 2; });
  auto st = opt.init(p);
  opt.update(p, g, st);
  const Tensor<double> w = p[0].to_host(), b = p[1].to_host();
  for (std::int64_t i = 0; i < w.size(); ++i) EXPECT_NEAR(w.flat(i), before[0].flat(i) * (1 - 0.1 * 0.5), 1e-14 * std::abs(before[0].flat(i)));
  EXPECT_EQ(b, before[1]);
}

SHARD_MPI_TEST(Optim, ClippingIsOnePsum) {
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"data"});
  std::vector<ShardedArray<float>> w{device_put(random_tensor<float>({8, 3}, 1), NamedSharding(mesh, P("data"))),
                                     device_put(random_tensor<float>({3}, 2), NamedSharding(mesh, P()))};
  const auto g = w;
  const auto opt = optim::sgd(1e-3).clip_by_global_norm(1.0);
  auto state = opt.init(w);
  comm_stats().reset();
  opt.update(w, g, state);
  std::int64_t calls = 0;
  for (const auto& [k, rec] : comm_stats().entries()) {
    EXPECT_EQ(k.first, "psum");
    calls += rec.calls;
  }
  EXPECT_LE(calls, 1) << comm_stats().to_string();
}

SHARD_MPI_TEST(Optim, SchedulesFollowTheirFormulas) {
  EXPECT_DOUBLE_EQ(optim::constant(0.3)(7), 0.3);
  const auto cd = optim::cosine_decay(1.0, 10, 0.1);
  EXPECT_DOUBLE_EQ(cd(0), 1.0);
  EXPECT_NEAR(cd(5), 0.1 + 0.9 * 0.5, 1e-15);
  EXPECT_NEAR(cd(10), 0.1, 1e-15);
  EXPECT_NEAR(cd(20), 0.1, 1e-15);
  const auto wc = optim::warmup_cosine_decay(0.0, 2.0, 4, 14, 0.5);
  EXPECT_DOUBLE_EQ(wc(0), 0.0);
  EXPECT_DOUBLE_EQ(wc(2), 1.0);
  EXPECT_DOUBLE_EQ(wc(4), 2.0);
  EXPECT_NEAR(wc(9), 0.5 + 1.5 * 0.5, 1e-12);
  EXPECT_NEAR(wc(14), 0.5, 1e-12);
  expect_error<ValueError>([] { optim::cosine_decay(1.0, 0); }, {"decay_steps"});
  expect_error<ValueError>([] { optim::sgd(0.1, 0.0, true); }, {"nesterov"});
}

SHARD_MPI_TEST(Optim, StateCheckpointsAndResumesOnAnotherMesh) {
  const int n = runtime().device_count();
  const Mesh a = make_mesh({n}, {"data"});
  const auto f2 = factorisations(n, 2);
  const Mesh b = make_mesh(f2.back(), {"data", "model"});
  const Tensor<float> h0 = random_tensor<float>({6, 4}, 1), h1 = random_tensor<float>({4}, 2);
  auto grads_on = [&](const std::vector<ShardedArray<float>>& w, int step) {
    std::vector<ShardedArray<float>> g;
    for (std::size_t i = 0; i < w.size(); ++i) g.push_back(w[i] * (0.01f * static_cast<float>(step + 1)));
    return g;
  };
  const auto opt = optim::adamw(0.01, 0.1);
  // Uninterrupted: four steps on mesh a.
  std::vector<ShardedArray<float>> wa{device_put(h0, NamedSharding(a, P("data"))), device_put(h1, NamedSharding(a, P()))};
  auto sa = opt.init(wa);
  for (int s = 0; s < 4; ++s) opt.update(wa, grads_on(wa, s), sa);
  // Two steps, a checkpoint, two more on mesh b.
  std::vector<ShardedArray<float>> w{device_put(h0, NamedSharding(a, P("data"))), device_put(h1, NamedSharding(a, P()))};
  auto st = opt.init(w);
  for (int s = 0; s < 2; ++s) opt.update(w, grads_on(w, s), st);
  const TempDir dir("shard-optim-", false);
  CheckpointWriter writer(dir.str(), 1);
  writer.add("w0", w[0]);
  writer.add("w1", w[1]);
  st.save(writer);
  const std::string path = writer.commit(2);
  const auto manifest = read_manifest(path);
  std::vector<ShardedArray<float>> wb{load_checkpoint_array<float>(path, manifest, "w0", NamedSharding(b, P(None, "model"))),
                                      load_checkpoint_array<float>(path, manifest, "w1", NamedSharding(b, P("model")))};
  auto sb = opt.init(wb);
  sb.load(path, manifest);
  EXPECT_EQ(sb.step.item(), 2);
  EXPECT_EQ(sb.arrays.at("mu/0").sharding(), wb[0].sharding());
  for (int s = 2; s < 4; ++s) opt.update(wb, grads_on(wb, s), sb);
  EXPECT_EQ(wb[0].to_host(), wa[0].to_host());
  EXPECT_EQ(wb[1].to_host(), wa[1].to_host());
}

SHARD_MPI_TEST(Optim, ApplyIfFiniteSkipsANonFiniteUpdateOnEveryRank) {
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"data"});
  const Tensor<double> hw = random_tensor<double>({2 * static_cast<std::int64_t>(n), 3}, 5);
  for (bool zero : {false, true}) {
    auto opt = optim::adam(0.01).apply_if_finite();
    if (zero) opt.shard_state_over("data");
    std::vector<ShardedArray<double>> w{device_put(hw, NamedSharding(mesh, P("data")))};
    auto state = opt.init(w);
    // One NaN in one device's block (the last device's, wherever it lives): nothing changes.
    Tensor<double> hg = random_tensor<double>(hw.shape(), 6);
    hg.flat(hg.size() - 1) = std::nan("");
    const std::vector<ShardedArray<double>> bad{device_put(hg, NamedSharding(mesh, P("data")))};
    EXPECT_TRUE(std::isnan(opt.update(w, bad, state)));
    EXPECT_EQ(state.step.item(), 0);
    EXPECT_EQ(max_rel_diff(w[0].to_host(), hw), 0.0);
    for (const auto& [name, a] : state.arrays) EXPECT_EQ(max_rel_diff(a.to_host(), Tensor<double>(hw.shape(), 0.0)), 0.0) << name;
    // A finite gradient then updates as usual.
    hg.flat(hg.size() - 1) = 0.5;
    const std::vector<ShardedArray<double>> good{device_put(hg, NamedSharding(mesh, P("data")))};
    EXPECT_TRUE(std::isfinite(opt.update(w, good, state)));
    EXPECT_EQ(state.step.item(), 1);
    EXPECT_GT(max_rel_diff(w[0].to_host(), hw), 0.0);
  }
}

SHARD_MPI_TEST(Optim, BadInputRaisesOnEveryRank) {
  const Mesh mesh = make_mesh({runtime().device_count()}, {"data"});
  std::vector<ShardedArray<float>> w{device_put(random_tensor<float>({4}, 1), NamedSharding(mesh, P()))};
  const auto opt = optim::adam(1e-3);
  auto state = opt.init(w);
  expect_error<ValueError>([&] { opt.update(w, {}, state); }, {"0 gradients for 1 parameters"});
  std::vector<ShardedArray<float>> g{device_put(random_tensor<float>({5}, 2), NamedSharding(mesh, P()))};
  expect_error<ShapeError>([&] { opt.update(w, g, state); }, {"shape (5,)"});
  auto other = optim::sgd(0.1, 0.9).init(w);
  expect_error<ValueError>([&] { opt.update(w, w, other); }, {"'mu/0'"});
  expect_error<ValueError>([&] { optim::adam(1e-3).shard_state_over("batch").init(w); }, {"shard_state_over('batch')"});
  // Hyperparameters: each checked where it enters, naming the argument and the value.
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  expect_error<ValueError>([&] { optim::sgd(nan); }, {"constant learning rate must be a finite number", "nan"});
  expect_error<ValueError>([&] { optim::sgd(0.1, 1.5); }, {"sgd: momentum must be a finite number in [0, 1], got 1.5"});
  expect_error<ValueError>([&] { optim::sgd(0.1, 0.9, false, inf); }, {"sgd: weight_decay", "inf"});
  expect_error<ValueError>([&] { optim::adam(1e-3, 1.0); }, {"adam: b1 must be a finite number in [0, 1), got 1"});
  expect_error<ValueError>([&] { optim::adam(1e-3, 0.9, -0.1); }, {"adam: b2", "got -0.1"});
  expect_error<ValueError>([&] { optim::adam(1e-3, 0.9, 0.999, nan); }, {"adam: eps", "nan"});
  expect_error<ValueError>([&] { optim::adamw(1e-3, -1e-4); }, {"adamw: weight_decay", "-0.0001"});
  expect_error<ValueError>([&] { optim::adam(1e-3).clip_by_global_norm(0); }, {"max_norm must be a finite number in (0"});
  expect_error<ValueError>([&] { optim::cosine_decay(1e-3, 10, 2.0); }, {"cosine_decay: alpha", "got 2"});
  // A schedule of the user's own that returns a non-finite rate: raised at the step, not applied.
  const auto bad_schedule = optim::adam(optim::Schedule([nan](std::int64_t t) { return t < 1 ? 1e-3 : nan; }));
  auto bs = bad_schedule.init(w);
  const std::vector<ShardedArray<float>> g4{device_put(random_tensor<float>({4}, 3), NamedSharding(mesh, P()))};
  bad_schedule.update(w, g4, bs);
  const Tensor<float> before = w[0].to_host();
  expect_error<ValueError>([&] { bad_schedule.update(w, g4, bs); }, {"the learning-rate schedule gave nan at step 1"});
  const Tensor<float> after = w[0].to_host();
  for (std::int64_t i = 0; i < 4; ++i) EXPECT_EQ(after.data()[i], before.data()[i]);
}

}  // namespace
}  // namespace shard::testing
