// The backward pass's deferred gradient reduction (ops/detail/grad_reduce.hpp): parameters'
// gradients whose products contract over mesh axes are summed in row chunks behind the rest of
// the pass. For overlap on and off and bucket sizes from one row to the whole gradient, the
// gradients of a data-parallel and a data x model (Megatron) MLP equal the host reference on
// every rank, the chunks move exactly the gradient's bytes (CommStats), float32 and float64;
// ranks whose bucket sizes differ get a CollectiveMismatchError on every rank. Registered
// twice: as it comes (one node: the sums go through group-shared memory where they can) and
// with SHARD_SHARED_REDUCE=0 (every sum through MPI_Iallreduce).

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include <mpi.h>

#include "mpi_test.hpp"
#include "shard/autodiff/autodiff.hpp"
#include "shard/comm/detail/collective_guard.hpp"
#include "shard/spmd/shard_map.hpp"
#include "test_util.hpp"

namespace shard::testing {
namespace {

template <typename T>
Tensor<T> random_values(const Shape& shape, std::uint64_t seed, double scale) {
  Tensor<double> t = random_tensor<double>(shape, seed);
  Tensor<T> out(shape);
  for (std::int64_t i = 0; i < t.size(); ++i) out.data()[i] = static_cast<T>(t.data()[i] * scale);
  return out;
}

/// max |a - b| / max(1, max |b|).
template <typename T>
double max_rel_diff(const Tensor<T>& a, const Tensor<T>& b) {
  double diff = 0, scale = 1;
  for (std::int64_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a.data()[i]) - static_cast<double>(b.data()[i])));
    scale = std::max(scale, std::abs(static_cast<double>(b.data()[i])));
  }
  return a.shape() == b.shape() ? diff / scale : 1e300;
}

/// Restores the process-wide settings after a test.
struct Settings {
  GradientReduction saved = gradient_reduction();
  ~Settings() { gradient_reduction() = saved; }
};

/// The loss of a two-layer MLP, written once for both views.
template <typename X>
X mlp_loss(const std::vector<X>& p, const X& x, const X& t) {
  return sum(square(matmul(tanh(matmul(x, p[0]) + p[1]), p[2]) - t));
}

bool deferred_through_mpi() {
  const char* e = std::getenv("SHARD_SHARED_REDUCE");
  return runtime().process_count() > 1 && e && std::string(e) == "0";
}

template <typename T>
void check_mlp(const Mesh& mesh, const std::vector<PartitionSpec>& specs, double tol) {
  const std::int64_t b = 6 * mesh.size(), d = 7, h = 4 * mesh.size(), o = 3;
  const std::vector<Tensor<T>> host{random_values<T>({d, h}, 11, 0.5), random_values<T>({h}, 12, 0.5),
                                    random_values<T>({h, o}, 13, 0.5)};
  const Tensor<T> hx = random_values<T>({b, d}, 14, 1.0), ht = random_values<T>({b, o}, 15, 1.0);
  const auto want = grad([&](const std::vector<Tensor<T>>& p) { return mlp_loss(p, hx, ht); })(host);
  std::vector<ShardedArray<T>> params;
  for (std::size_t i = 0; i < host.size(); ++i) params.push_back(device_put(host[i], NamedSharding(mesh, specs[i])));
  const auto x = device_put(hx, NamedSharding(mesh, P("data")));
  const auto t = device_put(ht, NamedSharding(mesh, P("data")));
  auto loss = [&](const std::vector<ShardedArray<T>>& p) { return mlp_loss(p, x, t); };

  const Settings keep;
  std::int64_t reference_bytes = -1;
  for (const bool overlap : {true, false}) {
    for (const std::int64_t bucket : {std::int64_t{1}, std::int64_t{3 * 4 * static_cast<std::int64_t>(sizeof(T))},
                                      std::int64_t{1} << 20}) {
      gradient_reduction() = GradientReduction{overlap, bucket};
      comm_stats().reset();
      const auto g = grad(loss)(params);
      const std::string name = mesh.to_string() + (overlap ? " overlap" : " no overlap") + " bucket " +
                               std::to_string(bucket);
      for (std::size_t i = 0; i < g.size(); ++i) {
        EXPECT_EQ(g[i].sharding(), params[i].sharding()) << name << " param " << i;
        EXPECT_LT(max_rel_diff(g[i].to_host(), want[i]), tol) << name << " param " << i;
      }
      // However the gradients are cut, the same bytes go over 'data'.
      const std::int64_t bytes = comm_stats().get("psum", "'data'").bytes;
      if (reference_bytes < 0) reference_bytes = bytes;
      EXPECT_EQ(bytes, reference_bytes) << name << "\n" << comm_stats().to_string();
    }
  }
}

SHARD_MPI_TEST(GradReduce, DataParallelMatchesTheHost) {
  const Mesh mesh = make_mesh({runtime().device_count()}, {"data"});
  check_mlp<double>(mesh, {P(), P(), P()}, 1e-12);
  check_mlp<float>(mesh, {P(), P(), P()}, 2e-5);
}

SHARD_MPI_TEST(GradReduce, MegatronMatchesTheHost) {
  const int n = runtime().device_count();
  if (n % 2 != 0) GTEST_SKIP() << "needs an even device count";
  const Mesh mesh = make_mesh({n / 2, 2}, {"data", "model"});
  check_mlp<double>(mesh, {P(None, "model"), P("model"), P("model", None)}, 1e-12);
}

SHARD_MPI_TEST(GradReduce, OneSumPerChunk) {
  if (!deferred_through_mpi()) GTEST_SKIP() << "the chunks go through MPI only with SHARD_SHARED_REDUCE=0";
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"data"});
  const std::int64_t b = 4 * n, d = 10, o = 6;
  const Tensor<double> hx = random_values<double>({b, d}, 1, 1.0), hw = random_values<double>({d, o}, 2, 1.0);
  const auto x = device_put(hx, NamedSharding(mesh, P("data")));
  const auto w = device_put(hw, NamedSharding(mesh, P()));
  const Settings keep;
  // Chunks of 3 rows of dW (d = 10 rows: 3 + 3 + 3 + 1), the loss's psum forward.
  gradient_reduction() = GradientReduction{true, 3 * o * static_cast<std::int64_t>(sizeof(double))};
  comm_stats().reset();
  const auto g = grad([&](const ShardedArray<double>& p) { return sum(square(matmul(x, p))); })(w);
  const auto rec = comm_stats().get("psum", "'data'");
  EXPECT_EQ(rec.calls, 1 + 4) << comm_stats().to_string();
  EXPECT_EQ(rec.bytes, static_cast<std::int64_t>(sizeof(double)) * (1 + d * o)) << comm_stats().to_string();
  const auto want = grad([&](const Tensor<double>& p) { return sum(square(matmul(hx, p))); })(hw);
  EXPECT_LT(max_rel_diff(g.to_host(), want), 1e-12);
}

SHARD_MPI_TEST(GradReduce, ShardMapArgumentsUseTheSameBuckets) {
  // A shard_map body differentiated from outside: the replicated W's cotangent varies over
  // 'data' on each device; its psum over 'data' is the same bucketed reduction (3 + 3 + 3 + 1
  // rows of dW), for W (2-D) and b (1-D: one row of 5), overlap on and off, against the host.
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"data"});
  const std::int64_t rows = 4 * n, d = 10, o = 6;
  const Tensor<double> hx = random_values<double>({rows, d}, 21, 1.0), hw = random_values<double>({d, o}, 22, 1.0);
  const Tensor<double> hb = random_values<double>({o}, 23, 1.0);
  const auto x = device_put(hx, NamedSharding(mesh, P("data")));
  const std::vector<ShardedArray<double>> params{device_put(hw, NamedSharding(mesh, P())),
                                                 device_put(hb, NamedSharding(mesh, P()))};
  auto body = [](const Tensor<double>& xb, const Tensor<double>& w, const Tensor<double>& b) {
    return psum(sum(square(tanh(matmul(xb, w) + b))), "data");
  };
  auto loss = [&](const std::vector<ShardedArray<double>>& p) {
    return shard_map(mesh, {P("data"), P(), P()}, P(), body)(x, p[0], p[1]);
  };
  const auto want =
      grad([&](const std::vector<Tensor<double>>& p) { return sum(square(tanh(matmul(hx, p[0]) + p[1]))); })(
          std::vector<Tensor<double>>{hw, hb});
  const Settings keep;
  for (const bool overlap : {true, false}) {
    gradient_reduction() = GradientReduction{overlap, 3 * o * static_cast<std::int64_t>(sizeof(double))};
    comm_stats().reset();
    const auto g = grad(loss)(params);
    const std::string name = overlap ? "overlap" : "no overlap";
    for (std::size_t i = 0; i < g.size(); ++i) {
      EXPECT_EQ(g[i].sharding(), params[i].sharding()) << name << " param " << i;
      EXPECT_LT(max_rel_diff(g[i].to_host(), want[i]), 1e-12) << name << " param " << i;
    }
    if (deferred_through_mpi()) {  // the loss's psum, then W's 4 chunks and b's 1 (3 rows of o)
      const auto rec = comm_stats().get("psum", "'data'");
      EXPECT_EQ(rec.calls, 1 + 4 + 1) << name << "\n" << comm_stats().to_string();
      EXPECT_EQ(rec.bytes, static_cast<std::int64_t>(sizeof(double)) * (1 + d * o + o))
          << name << "\n" << comm_stats().to_string();
    }
  }
}

SHARD_MPI_TEST(GradReduce, Bfloat16SumsAccumulateInFloat32) {
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"data"});
  const std::int64_t b = 8 * n, d = 24, o = 40;
  const Tensor<float> hx = random_values<float>({b, d}, 1, 1.0), hw = random_values<float>({d, o}, 2, 1.0);
  const auto x = device_put(hx, NamedSharding(mesh, P("data")));
  const auto w = device_put(hw, NamedSharding(mesh, P()));
  auto f = [](const auto& p, const auto& xx) { return sum(square(matmul(xx, p))); };
  const auto want = grad(f)(hw, hx);
  const Settings keep;
  gradient_reduction() = GradientReduction{true, 7 * o * 4, true};
  const auto g = grad(f)(w, x);
  const Tensor<float> got = g.to_host();
  // bfloat16 keeps 8 significant bits: each device's partial sum and the total are rounded once,
  // so an element is within 2^-8 of the sum of its terms' sizes, 2 |x|^T |x w| (dW = 2 x^T x w).
  const Tensor<float> bound = grad([](const Tensor<float>& p, const Tensor<float>& xx) {
    return sum(square(matmul(abs(xx), abs(p))));
  })(abs(hw), hx);
  for (std::int64_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got.data()[i], want.data()[i], bound.data()[i] * (1.0 / 128) + 1e-6) << "element " << i;
  if (deferred_through_mpi()) {
    EXPECT_GT(max_rel_diff(got, want), 0.0) << "the sums did not go through bfloat16";
    // Every device holds the same values (the rounded sums were gathered, not recomputed).
    std::uint64_t h = 1469598103934665603ull;
    for (const auto& s : g.addressable_shards())
      for (std::int64_t i = 0; i < s.data.size(); ++i) {
        std::uint32_t u;
        std::memcpy(&u, s.data.data() + i, 4);
        h = (h ^ u) * 1099511628211ull;
      }
    std::uint64_t lo = 0, hi = 0;
    MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    EXPECT_EQ(lo, hi);
  }
}

SHARD_MPI_TEST(GradReduce, DifferentBucketSizesAreAMismatch) {
  if (!deferred_through_mpi()) GTEST_SKIP() << "the chunks go through MPI only with SHARD_SHARED_REDUCE=0";
  if (!detail::collective_guard_on()) GTEST_SKIP() << "needs the collective check (SHARD_CHECK_COLLECTIVES=0)";
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"data"});
  const auto x = device_put(random_values<double>({2 * n, 8}, 1, 1.0), NamedSharding(mesh, P("data")));
  const auto w = device_put(random_values<double>({8, 4}, 2, 1.0), NamedSharding(mesh, P()));
  const Settings keep;
  gradient_reduction().bucket_bytes = runtime().process_index() == 0 ? 32 : 1 << 20;
  auto f = [&](const ShardedArray<double>& p) { return sum(square(matmul(x, p))); };
  EXPECT_THROW(grad(f)(w), CollectiveMismatchError);
  gradient_reduction().bucket_bytes = 1 << 20;
  // The ranks are still in step.
  const auto g = grad(f)(w);
  EXPECT_EQ(g.sharding(), w.sharding());
}

}  // namespace
}  // namespace shard::testing
