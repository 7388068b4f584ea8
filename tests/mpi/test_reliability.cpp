// The collective consistency check (SHARD_CHECK_COLLECTIVES): ranks that issue different
// collectives get a CollectiveMismatchError on every rank naming both call sites, instead of
// a hang or a wrong result; consistent programs are unaffected and the job goes on after a
// caught mismatch. (The abort paths are driven through fault_injection in reliability.cmake.)

#include <string>

#include "mpi_test.hpp"
#include "shard/detail/collective_guard.hpp"
#include "test_util.hpp"

namespace shard::testing {
namespace {

/// Turns the check on for one test (every rank does the same), restoring the setting after.
class CheckOn {
 public:
  CheckOn() : check_(detail::collective_check_on()), timeout_(detail::collective_timeout()) {
    detail::set_collective_guard(true, timeout_);
  }
  ~CheckOn() { detail::set_collective_guard(check_, timeout_); }

 private:
  bool check_;
  double timeout_;
};

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

}  // namespace
}  // namespace shard::testing
