// The collective consistency check (SHARD_CHECK_COLLECTIVES): ranks that issue different
// collectives get a CollectiveMismatchError on every rank naming both call sites, instead of
// a hang or a wrong result; consistent programs are unaffected and the job goes on after a
// caught mismatch. (The abort paths are driven through fault_injection in reliability.cmake.)

#include <algorithm>
#include <string>
#include <vector>

#include "check_on.hpp"
#include "mpi_test.hpp"
#include "shard/comm/comm_stats.hpp"
#include "shard/comm/detail/collective_guard.hpp"
#include "shard/linalg/linalg.hpp"
#include "test_util.hpp"

namespace shard::testing {
namespace {

int rank() { return runtime().process_index(); }

SHARD_MPI_TEST(Reliability, ConsistentCollectivesPass) {
  const CheckOn on;
  const Mesh mesh = make_mesh({runtime().device_count()}, {"a"});
  const auto x = from_callback<double>({2 * runtime().device_count(), 3}, NamedSharding(mesh, P("a")),
                                       [](const Box& b) { return Tensor<double>(b.extent, 1.0); });
  const auto y = shard_map(mesh, P("a"), P("a"), [](DeviceContext& ctx, const Tensor<double>& b) {
        auto s = ctx.psum(b, "a");
        auto g = ctx.all_gather(s, "a", 0, true);
        return ctx.psum_scatter(std::move(g), "a", 0, true);
      })(x);
  const double n = runtime().device_count();
  for (const auto& s : y.addressable_shards())
    for (double v : s.data) EXPECT_EQ(v, n * n);
  const auto z = psum(zeros<double>({3}, NamedSharding(mesh, P())), "a");
  EXPECT_EQ(z.shape(), (Shape{3}));
}

SHARD_MPI_TEST(Reliability, DifferentOpsNameBothCallSites) {
  if (runtime().process_count() < 2) GTEST_SKIP() << "needs 2 ranks";
  const CheckOn on;
  const Mesh mesh = make_mesh({runtime().device_count()}, {"a"});
  const auto x = zeros<double>({2 * runtime().device_count(), 3}, NamedSharding(mesh, P("a")));
  const int psum_line = __LINE__ + 4;
  expect_error<CollectiveMismatchError>(
      [&] {
        shard_map(mesh, P("a"), P("a"), [](DeviceContext& ctx, const Tensor<double>& b) {
          return rank() == 0 ? ctx.psum(b, "a")
                             : ctx.pmax(b, "a");
        })(x);
      },
      {"collective mismatch", "rank 0 called psum over 'a' of float64(2, 3)", "called pmax over 'a' of float64(2, 3)",
       "test_reliability.cpp:" + std::to_string(psum_line), "collective #"});
  // The ranks stay in step: the next collectives work.
  const auto y =
      shard_map(mesh, P("a"), P("a"), [](DeviceContext& ctx, const Tensor<double>& b) { return ctx.psum(b, "a"); })(x);
  EXPECT_EQ(y.shape(), x.shape());
}

SHARD_MPI_TEST(Reliability, DifferentAxesNameBothCallSites) {
  if (runtime().process_count() < 2) GTEST_SKIP() << "needs 2 ranks";
  const CheckOn on;
  const int k = runtime().devices_per_rank();
  // 'a' crosses ranks, 'b' stays on one: the ranks use different group communicators.
  const Mesh mesh = make_mesh({runtime().process_count(), k}, {"a", "b"});
  const auto x = zeros<double>({runtime().process_count(), k}, NamedSharding(mesh, P("a", "b")));
  const int line_a = __LINE__ + 4, line_b = line_a + 1;
  expect_error<CollectiveMismatchError>(
      [&] {
        shard_map(mesh, P("a", "b"), P("a", "b"), [](DeviceContext& ctx, const Tensor<double>& b) {
              if (rank() == 0) return ctx.psum(b, "a");
              return ctx.psum(b, "b");
            })(x);
      },
      {"collective mismatch", "rank 0 called psum over 'a'", "called psum over 'b'",
       "test_reliability.cpp:" + std::to_string(line_a), "test_reliability.cpp:" + std::to_string(line_b)});
}

SHARD_MPI_TEST(Reliability, DifferentShapesAreCaught) {
  if (runtime().process_count() < 2) GTEST_SKIP() << "needs 2 ranks";
  const CheckOn on;
  const Mesh mesh = make_mesh({runtime().device_count()}, {"a"});
  const auto x = zeros<double>({runtime().device_count(), 3}, NamedSharding(mesh, P("a")));
  expect_error<CollectiveMismatchError>(
      [&] {
        shard_map(mesh, P("a"), P("a"), [](DeviceContext& ctx, const Tensor<double>& b) {
              const std::int64_t cols = rank() == 0 ? 3 : 4;
              ctx.psum(Tensor<double>({1, cols}, 1.0), "a");
              return b;
            })(x);
      },
      {"collective mismatch", "float64(1, 3)", "float64(1, 4)"});
}

SHARD_MPI_TEST(Reliability, CallSiteOfArrayLevelCollectives) {
  if (runtime().process_count() < 2) GTEST_SKIP() << "needs 2 ranks";
  const CheckOn on;
  const Mesh mesh = make_mesh({runtime().device_count()}, {"a"});
  const auto r = zeros<double>({2, 3}, NamedSharding(mesh, P()));
  const int line = __LINE__ + 4;
  expect_error<CollectiveMismatchError>(
      [&] {
        if (rank() == 0) {
          (void)psum(r, "a");
        } else {
          (void)psum(zeros<double>({2, 4}, NamedSharding(mesh, P())), "a");
        }
      },
      {"collective mismatch", "test_reliability.cpp:" + std::to_string(line)});
}

// Transfers outside the named-axis collectives go through the comm verbs, which take part in
// the same check: a reshard on one rank against a to_host on another, reshards of different
// shapes, gathers to different roots, Cannon against SUMMA are each a CollectiveMismatchError
// on every rank, before any data moves; the ranks stay in step afterwards.
SHARD_MPI_TEST(Reliability, MismatchedTransfersAreCaught) {
  if (runtime().process_count() < 2) GTEST_SKIP() << "needs 2 ranks";
  const CheckOn on;
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const NamedSharding rows(mesh, P("a", None)), cols(mesh, P(None, "a"));
  const auto x = device_put(random_tensor<double>({2 * n, 2 * n}, 7), rows);
  const auto y = device_put(random_tensor<double>({n, 2 * n}, 8), rows);
  // The general reshard (one Alltoallv): onto the same devices in the reverse order.
  std::vector<int> reversed = mesh.device_ids();
  std::reverse(reversed.begin(), reversed.end());
  const NamedSharding rows_rev(Mesh({n}, {"a"}, reversed), P("a", None));
  const std::string big = std::to_string(2 * n) + ", " + std::to_string(2 * n);
  expect_error<CollectiveMismatchError>(
      [&] {
        if (rank() == 0) (void)reshard(x, rows_rev);
        else (void)x.to_host();
      },
      {"collective mismatch", "rank 0 called reshard of float64(" + big + ") to ", "called to_host of float64(" + big});
  expect_error<CollectiveMismatchError>(
      [&] { (void)reshard(rank() == 0 ? x : y, rows_rev); },
      {"collective mismatch", "reshard of float64(" + big + ")",
       "reshard of float64(" + std::to_string(n) + ", " + std::to_string(2 * n) + ")"});
  // A reshard by a collective rule (all_to_all) against a to_host.
  expect_error<CollectiveMismatchError>(
      [&] {
        if (rank() == 0) (void)reshard(x, cols);
        else (void)x.to_host();
      },
      {"collective mismatch", "rank 0 called reshard over 'a'", "called to_host of float64(" + big});
  expect_error<CollectiveMismatchError>([&] { (void)x.gather(rank() == 0 ? 0 : 1); },
                                        {"collective mismatch", "gather of", "to rank 0", "to rank 1"});
  if (n == 4) {  // a 2 x 2 grid: Cannon on rank 0, SUMMA on the others
    const Mesh grid = make_mesh({2, 2}, {"x", "y"});
    const NamedSharding s(grid, P("x", "y"));
    const auto a = device_put(random_tensor<double>({8, 8}, 9), s);
    expect_error<CollectiveMismatchError>(
        [&] {
          if (rank() == 0) (void)linalg::cannon(a, a);
          else (void)linalg::summa(a, a);
        },
        {"collective mismatch", "cannon of float64(8, 8) @ float64(8, 8)", "summa of float64(8, 8) @ float64(8, 8)"});
  }
  // In step afterwards: consistent reshards and to_host give the host reference.
  const Tensor<double> want = random_tensor<double>({2 * n, 2 * n}, 7);
  for (const auto& to : {cols, rows_rev}) {
    const auto back = reshard(x, to).to_host();
    for (std::int64_t i = 0; i < want.size(); ++i) ASSERT_EQ(back.data()[i], want.data()[i]);
  }
}

// CommStats sees every transfer of the verbs, with the bytes the plan sends from this rank.
SHARD_MPI_TEST(Reliability, TransfersCountThePlannedBytes) {
  const int n = runtime().device_count(), k = runtime().devices_per_rank();
  const Mesh mesh = make_mesh({n}, {"a"});
  const std::int64_t r = 2 * n, c = 3 * n;
  const auto x = device_put(random_tensor<double>({r, c}, 11), NamedSharding(mesh, P("a", None)));
  comm_stats().reset();
  (void)reshard(x, NamedSharding(mesh, P(None, "a")));
  // Each of this rank's k blocks (r/n x c) splits into n column pieces; n - k go to other ranks.
  EXPECT_EQ(comm_stats().get("reshard").bytes, k * (n - k) * (r / n) * (c / n) * 8) << comm_stats().to_string();
  comm_stats().reset();
  (void)x.to_host();
  EXPECT_EQ(comm_stats().get("to_host").bytes, k * (r / n) * c * 8) << comm_stats().to_string();
  comm_stats().reset();
  (void)x.gather(0);
  EXPECT_EQ(comm_stats().get("gather").bytes, k * (r / n) * c * 8) << comm_stats().to_string();
  if (runtime().process_count() == 2 && k == 2) {
    // A 2 x 2 grid, rank p holding row p: A moves along 'y' (inside a rank: copies); B along 'x'
    // crosses ranks: the skew moves column 1's block, the one shift both columns' blocks.
    const Mesh grid = make_mesh({2, 2}, {"x", "y"});
    const auto a = device_put(random_tensor<double>({8, 8}, 12), NamedSharding(grid, P("x", "y")));
    comm_stats().reset();
    (void)linalg::cannon(a, a);
    EXPECT_EQ(comm_stats().get("cannon").bytes, 3 * 4 * 4 * 8) << comm_stats().to_string();
  }
}

}  // namespace
}  // namespace shard::testing
