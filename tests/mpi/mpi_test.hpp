#pragma once
// The MPI test harness: every rank runs every test in the same order; at the end of each
// test the failures of all ranks are exchanged, so a failure on any rank fails the test on
// every rank (and so the exit code), and rank 0 prints each with the rank it came from.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "shard/runtime/runtime.hpp"

namespace shard::testing {

/// The fixture behind SHARD_MPI_TEST: its TearDown exchanges failures between ranks.
class MpiTest : public ::testing::Test {
 protected:
  void TearDown() override;
};

/// The runtime the test main created.
Runtime& runtime();

/// Collective: whether `flag` is the same on every rank (a load raises on every rank or on none).
inline bool same_on_every_rank(bool flag) {
  const auto& world = runtime().world();
  return world.allreduce<int>(flag ? 1 : 0, MPI_MIN) == world.allreduce<int>(flag ? 1 : 0, MPI_MAX);
}

/// Runs `fn`, expects exception E, and checks its message has this rank's "[rank r]" prefix
/// and every string in `needles`.
template <typename E, typename F>
void expect_error(F&& fn, std::vector<std::string> needles) {
  try {
    fn();
    ADD_FAILURE() << "expected an exception mentioning '" << needles.front() << "'";
  } catch (const E& e) {
    const std::string what = e.what();
    needles.push_back("[rank " + std::to_string(runtime().process_index()) + "]");
    for (const auto& n : needles) {
      EXPECT_NE(what.find(n), std::string::npos) << "missing '" << n << "' in: " << what;
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

}  // namespace shard::testing

/// Like TEST(suite, name), for tests that run on every rank under mpiexec.
#define SHARD_MPI_TEST(suite, name)                                   \
  GTEST_TEST_(suite, name, ::shard::testing::MpiTest, \
              ::testing::internal::GetTypeId<::shard::testing::MpiTest>())
