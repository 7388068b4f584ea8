// The plan caches of matmul and reshard (detail/plan_cache.hpp): a repeated shard::matmul with
// one signature plans once, another signature plans again, the backward pass of a second
// value_and_grad step plans nothing, and the values stay those of a host reference (every
// rank checks every shard it holds). Uneven shapes (7x5 @ 5x3) throughout.

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "mpi_test.hpp"
#include "shard/array/detail/plan_cache.hpp"
#include "test_util.hpp"

namespace shard::testing {
namespace {

using detail::plan_cache_stats;

template <typename T>
Tensor<T> host_matmul(const Tensor<T>& a, const Tensor<T>& b) {
  const std::int64_t m = a.shape()[0], k = a.shape()[1], n = b.shape()[1];
  Tensor<T> c(Shape{m, n}, T(0));
  for (std::int64_t r = 0; r < m; ++r)
    for (std::int64_t col = 0; col < n; ++col) {
      double s = 0;
      for (std::int64_t q = 0; q < k; ++q)
        s += static_cast<double>(a.flat(r * k + q)) * static_cast<double>(b.flat(q * n + col));
      c.flat(r * n + col) = static_cast<T>(s);
    }
  return c;
}

template <typename T>
Tensor<T> host_transpose(const Tensor<T>& a) {
  Tensor<T> t(Shape{a.shape()[1], a.shape()[0]});
  for (std::int64_t i = 0; i < a.shape()[0]; ++i)
    for (std::int64_t j = 0; j < a.shape()[1]; ++j)
      t.flat(j * a.shape()[0] + i) = a.flat(i * a.shape()[1] + j);
  return t;
}

/// Every shard this rank holds against the same box of the host reference.
template <typename T>
void expect_close(const ShardedArray<T>& c, const Tensor<T>& ref, const std::string& what) {
  ASSERT_EQ(c.shape(), ref.shape()) << what;
  const double tol = std::is_same_v<T, float> ? 1e-4 : 1e-10;
  for (const auto& s : c.addressable_shards()) {
    EXPECT_EQ(s.box, reference_box(c.mesh(), c.spec(), c.shape(), s.device)) << what;
    const auto want = reference_slice(ref, s.box);
    ASSERT_EQ(static_cast<std::int64_t>(want.size()), s.data.size()) << what;
    for (std::size_t i = 0; i < want.size(); ++i) {
      const double w = static_cast<double>(want[i]),
                   got = static_cast<double>(s.data.flat(static_cast<std::int64_t>(i)));
      if (std::abs(got - w) > tol * (1 + std::abs(w))) {
        ADD_FAILURE() << what << " device " << s.device << " element " << i << ": " << got << " vs " << w;
        return;
      }
    }
  }
}

struct Case {
  Mesh mesh;
  PartitionSpec a, b;
};

/// Layouts the sharding rules multiply (no 2-D block algorithm): operands where they lie, a
/// contraction over a mesh axis (psum), and operands the plan moves first.
std::vector<Case> rule_cases() {
  const int n = runtime().device_count();
  const Mesh line = make_mesh({n}, {"a"});
  std::vector<Case> out = {{line, P("a", None), P()}, {line, P(None, "a"), P("a", None)},
                           {line, P(), P(None, "a")}, {line, P("a", None), P("a", None)},
                           {line, P(None, "a"), P()}, {line, P(None, "a"), P(None, "a")}};
  const auto f = factorisations(n, 2);
  const Mesh grid = make_mesh(f[f.size() / 2], {"a", "b"});
  out.push_back({grid, P("a", "b"), P("b", None)});
  out.push_back({grid, P("a", None), P(None, "b")});
  out.push_back({grid, P(None, "a"), P("b", None)});
  out.push_back({grid, P("b", "a"), P()});
  return out;
}

std::string name_of(const Case& c) {
  return c.mesh.to_string() + " " + c.a.to_string() + " @ " + c.b.to_string();
}

SHARD_MPI_TEST(PlanCache, RepeatedMatmulPlansOnce) {
  const Shape as{7, 5}, bs{5, 3};
  std::uint64_t seed = 10;
  for (const auto& c : rule_cases()) {
    const std::string what = name_of(c);
    const Tensor<double> ha = random_tensor<double>(as, ++seed), hb = random_tensor<double>(bs, ++seed);
    const Tensor<double> want = host_matmul(ha, hb);
    const auto a = device_put(ha, NamedSharding(c.mesh, c.a));
    const auto b = device_put(hb, NamedSharding(c.mesh, c.b));
    detail::clear_plan_caches();
    detail::reset_plan_cache_stats();
    expect_close(matmul(a, b), want, what + " call 1");
    const auto first = plan_cache_stats();
    EXPECT_EQ(first.matmul.misses, 1) << what;
    EXPECT_EQ(first.matmul.hits, 0) << what;
    constexpr int kCalls = 6;
    for (int i = 2; i <= kCalls; ++i) expect_close(matmul(a, b), want, what + " call " + std::to_string(i));
    const auto after = plan_cache_stats();
    EXPECT_EQ(after.matmul.misses, 1) << what;  // planned once
    EXPECT_EQ(after.matmul.hits, kCalls - 1) << what;
    EXPECT_EQ(after.reshard.misses, first.reshard.misses) << what;  // the operands' reshards too
    // Forcing the rules is the same signature: no new plan.
    expect_close(matmul(a, b, Algorithm::kRules), want, what + " kRules");
    EXPECT_EQ(plan_cache_stats().matmul.misses, 1) << what;
  }
}

SHARD_MPI_TEST(PlanCache, AnotherSignatureIsANewMiss) {
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const Tensor<double> ha = random_tensor<double>({7, 5}, 1), hb = random_tensor<double>({5, 3}, 2);
  const Tensor<double> ha8 = random_tensor<double>({8, 5}, 3);
  const auto a = device_put(ha, NamedSharding(mesh, P("a", None)));
  const auto b = device_put(hb, NamedSharding(mesh, P()));
  detail::clear_plan_caches();
  detail::reset_plan_cache_stats();
  auto misses = [] { return plan_cache_stats().matmul.misses; };

  expect_close(matmul(a, b), host_matmul(ha, hb), "first");
  EXPECT_EQ(misses(), 1);
  // Another spec of A.
  const auto a2 = device_put(ha, NamedSharding(mesh, P(None, "a")));
  expect_close(matmul(a2, b), host_matmul(ha, hb), "A split along k");
  EXPECT_EQ(misses(), 2);
  // Another shape of A.
  const auto a8 = device_put(ha8, NamedSharding(mesh, P("a", None)));
  expect_close(matmul(a8, b), host_matmul(ha8, hb), "8x5");
  EXPECT_EQ(misses(), 3);
  // Another element size (float32).
  const Tensor<float> fa = random_tensor<float>({7, 5}, 4), fb = random_tensor<float>({5, 3}, 5);
  expect_close(
      matmul(device_put(fa, NamedSharding(mesh, P("a", None))), device_put(fb, NamedSharding(mesh, P()))),
      host_matmul(fa, fb), "float32");
  EXPECT_EQ(misses(), 4);
  // Another mesh over the same devices: axis named differently, devices in reverse order.
  const Mesh named_z = make_mesh({n}, {"z"});
  expect_close(matmul(device_put(ha, NamedSharding(named_z, P("z", None))),
                      device_put(hb, NamedSharding(named_z, P()))),
               host_matmul(ha, hb), "axis 'z'");
  EXPECT_EQ(misses(), 5);
  std::vector<int> reversed = mesh.device_ids();
  std::reverse(reversed.begin(), reversed.end());
  const Mesh backwards({n}, {"a"}, reversed);
  expect_close(matmul(device_put(ha, NamedSharding(backwards, P("a", None))),
                      device_put(hb, NamedSharding(backwards, P()))),
               host_matmul(ha, hb), "reversed devices");
  EXPECT_EQ(misses(), n > 1 ? 6 : 5);  // one device: the same mesh
  // The first signatures again: hits only.
  const auto hits = plan_cache_stats().matmul.hits;
  expect_close(matmul(a, b), host_matmul(ha, hb), "first again");
  expect_close(matmul(a2, b), host_matmul(ha, hb), "A split along k again");
  EXPECT_EQ(misses(), n > 1 ? 6 : 5);
  EXPECT_EQ(plan_cache_stats().matmul.hits, hits + 2);
  // An out sharding is not part of the plan (the closing reshard has its own cached plan).
  const NamedSharding out(mesh, P(None, "a"));
  const auto reshard_misses = plan_cache_stats().reshard.misses;
  for (int i = 0; i < 3; ++i) {
    const auto c = matmul(a2, b, &out);
    EXPECT_EQ(c.sharding(), out);
    expect_close(c, host_matmul(ha, hb), "out P(None, 'a')");
  }
  EXPECT_EQ(misses(), n > 1 ? 6 : 5);
  EXPECT_LE(plan_cache_stats().reshard.misses, reshard_misses + 1);  // the closing reshard, planned once
  // A mesh built again after the last copy of an equal one died: the content matches.
  {
    const Mesh tmp = make_mesh({n}, {"t"});
    (void)matmul(device_put(ha, NamedSharding(tmp, P("t", None))), device_put(hb, NamedSharding(tmp, P())));
  }
  const auto before_rebuild = misses();
  const Mesh again = make_mesh({n}, {"t"});
  expect_close(
      matmul(device_put(ha, NamedSharding(again, P("t", None))), device_put(hb, NamedSharding(again, P()))),
      host_matmul(ha, hb), "mesh built again");
  EXPECT_EQ(misses(), before_rebuild);
}

SHARD_MPI_TEST(PlanCache, SecondValueAndGradStepPlansNothing) {
  const Shape xs{7, 5}, ws{5, 3};
  std::uint64_t seed = 300;
  for (const auto& c : rule_cases()) {
    const std::string what = name_of(c);
    const Tensor<double> hx = random_tensor<double>(xs, ++seed), hw = random_tensor<double>(ws, ++seed);
    const Tensor<double> ht = random_tensor<double>({7, 3}, ++seed);
    const std::vector<ShardedArray<double>> params = {device_put(hx, NamedSharding(c.mesh, c.a)),
                                                      device_put(hw, NamedSharding(c.mesh, c.b))};
    const auto t = device_put(ht, NamedSharding(c.mesh, P()));
    auto loss = [&](const std::vector<ShardedArray<double>>& p) { return sum(matmul(p[0], p[1]) * t); };
    // d loss / d x = t @ w^T and d loss / d w = x^T @ t.
    const Tensor<double> gx = host_matmul(ht, host_transpose(hw)), gw = host_matmul(host_transpose(hx), ht);
    detail::clear_plan_caches();
    detail::reset_plan_cache_stats();
    std::array<detail::PlanCacheStats, 3> after{};
    for (int step = 0; step < 3; ++step) {
      const auto [value, grads] = value_and_grad(loss)(params);
      ASSERT_EQ(grads.size(), 2u);
      EXPECT_EQ(grads[0].sharding(), params[0].sharding()) << what;
      EXPECT_EQ(grads[1].sharding(), params[1].sharding()) << what;
      expect_close(grads[0], gx, what + " dx step " + std::to_string(step));
      expect_close(grads[1], gw, what + " dw step " + std::to_string(step));
      after[static_cast<std::size_t>(step)] = plan_cache_stats();
    }
    // Step 1 plans the forward product and the backward's two products, each once.
    EXPECT_GE(after[0].matmul.misses, 1) << what;
    EXPECT_LE(after[0].matmul.misses, 3) << what;
    // Later steps plan nothing: every product, forward and backward, and every reshard hits.
    for (std::size_t s = 1; s < 3; ++s) {
      EXPECT_EQ(after[s].matmul.misses, after[0].matmul.misses) << what << " step " << s;
      EXPECT_EQ(after[s].reshard.misses, after[0].reshard.misses) << what << " step " << s;
      EXPECT_GT(after[s].matmul.hits, after[s - 1].matmul.hits) << what << " step " << s;
    }
  }
}

SHARD_MPI_TEST(PlanCache, ReshardPlansOnceAndKeepsTheDtypeLabel) {
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const Tensor<double> h = random_tensor<double>({7, 5}, 40);
  const auto x = device_put(h, NamedSharding(mesh, P("a", None)));
  const NamedSharding to(mesh, P(None, "a"));
  detail::clear_plan_caches();
  detail::reset_plan_cache_stats();
  for (int i = 0; i < 4; ++i) expect_close(reshard(x, to), h, "reshard");
  EXPECT_EQ(plan_cache_stats().reshard.misses, 1);
  EXPECT_EQ(plan_cache_stats().reshard.hits, 3);
  // int64 has float64's element size: the same plan, labelled with its own dtype.
  const auto xi = device_put(random_tensor<std::int64_t>({7, 5}, 41), NamedSharding(mesh, P("a", None)));
  const ReshardPlan pd = reshard_plan(x, to), pi = reshard_plan(xi, to);
  EXPECT_EQ(plan_cache_stats().reshard.misses, 1);
  EXPECT_EQ(pd.dtype, "float64");
  EXPECT_EQ(pi.dtype, "int64");
  EXPECT_EQ(pd.kind, pi.kind);
  EXPECT_EQ(pd.bytes_sent, pi.bytes_sent);
  EXPECT_NE(pi.to_string().find("int64"), std::string::npos) << pi.to_string();
}

SHARD_MPI_TEST(PlanCache, ErrorsAreRaisedOnEveryCall) {
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const auto a = device_put(random_tensor<double>({7, 5}, 50), NamedSharding(mesh, P("a", None)));
  const auto b = device_put(random_tensor<double>({4, 3}, 51), NamedSharding(mesh, P()));
  detail::clear_plan_caches();
  detail::reset_plan_cache_stats();
  for (int i = 0; i < 3; ++i) expect_error<ShapeError>([&] { (void)matmul(a, b); }, {"do not multiply"});
  EXPECT_EQ(plan_cache_stats().matmul.size, 0u);  // a failed plan is not remembered
}

SHARD_MPI_TEST(PlanCache, EvictsTheLeastRecentlyUsed) {
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const NamedSharding rows(mesh, P("a", None)), cols(mesh, P(None, "a")), none(mesh, P());
  detail::clear_plan_caches();
  detail::reset_plan_cache_stats();
  detail::set_plan_cache_capacity(2);
  const MatmulPlan p1 = plan_matmul({7, 5}, rows, {5, 3}, none, 8);
  (void)plan_matmul({7, 5}, cols, {5, 3}, none, 8);
  (void)plan_matmul({7, 5}, rows, {5, 3}, none, 8);  // a hit: now the most recent
  (void)plan_matmul({7, 5}, none, {5, 3}, cols, 8);  // evicts the second
  auto s = plan_cache_stats().matmul;
  EXPECT_EQ(s.size, 2u);
  EXPECT_EQ(s.capacity, 2u);
  EXPECT_EQ(s.misses, 3);
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.evictions, 1);
  EXPECT_EQ(plan_matmul({7, 5}, rows, {5, 3}, none, 8).to_string(), p1.to_string());  // kept
  EXPECT_EQ(plan_cache_stats().matmul.misses, 3);
  (void)plan_matmul({7, 5}, cols, {5, 3}, none, 8);  // evicted: planned again
  EXPECT_EQ(plan_cache_stats().matmul.misses, 4);
  // Capacity 0: nothing is kept, every lookup plans.
  detail::set_plan_cache_capacity(0);
  EXPECT_EQ(plan_cache_stats().matmul.size, 0u);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(plan_matmul({7, 5}, rows, {5, 3}, none, 8).to_string(), p1.to_string());
  EXPECT_EQ(plan_cache_stats().matmul.misses, 7);
  detail::set_plan_cache_capacity(detail::kDefaultPlanCacheCapacity);
  EXPECT_EQ(plan_cache_stats().matmul.capacity, detail::kDefaultPlanCacheCapacity);
}

SHARD_MPI_TEST(PlanCache, ThreadsShareOneCache) {
  // Metadata only (no communication): several threads plan the same signatures at once.
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const std::vector<NamedSharding> specs = {NamedSharding(mesh, P("a", None)),
                                            NamedSharding(mesh, P(None, "a")), NamedSharding(mesh, P())};
  std::vector<std::string> want;
  for (const auto& s : specs) want.push_back(plan_matmul({7, 5}, s, {5, 3}, specs[0], 8).to_string());
  detail::clear_plan_caches();
  detail::reset_plan_cache_stats();
  constexpr int kThreads = 4, kIterations = 300;
  std::vector<int> wrong(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < kIterations; ++i) {
        const std::size_t k = static_cast<std::size_t>(i + t) % specs.size();
        if (plan_matmul({7, 5}, specs[k], {5, 3}, specs[0], 8).to_string() != want[k])
          ++wrong[static_cast<std::size_t>(t)];
      }
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(wrong[static_cast<std::size_t>(t)], 0) << "thread " << t;
  const auto s = plan_cache_stats().matmul;
  EXPECT_EQ(s.hits + s.misses, kThreads * kIterations);
  EXPECT_GE(s.misses, 3);
  EXPECT_LE(s.misses, 3 * kThreads);  // each thread misses each signature at most once
  EXPECT_EQ(s.size, 3u);
}

}  // namespace
}  // namespace shard::testing
