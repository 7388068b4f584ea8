// The timeline's time split (core/timeline.hpp, timeline_totals): each instant of a thread goes to
// its innermost span; a rank computes when any thread does, communicates when any thread does, and
// its exposed communication is communicating while no thread computes.

#include <gtest/gtest.h>

#include <vector>

#include "shard/core/timeline.hpp"

namespace {

using shard::detail::timeline_totals;
using shard::detail::TimelineSpan;

TEST(TimelineTotals, InnermostSpanOfEachThreadAndTheUnionOverThreads) {
  // Thread 0: an op [0, 100) around a collective [20, 50); thread 1: products [40, 70).
  // Computing: [0, 20) and [50, 100) on thread 0, [40, 70) on thread 1: [0, 20) + [40, 100) = 80.
  // Communicating: [20, 50) = 30, of which [40, 50) overlaps thread 1's products: 20 exposed.
  const auto t = timeline_totals({{"op", 0, 100, 0}, {"collective", 20, 50, 0}, {"products", 40, 70, 1}});
  EXPECT_EQ(t.wall_ns, 100);
  EXPECT_EQ(t.compute_ns, 80);
  EXPECT_EQ(t.communication_ns, 30);
  EXPECT_EQ(t.exposed_communication_ns, 20);
}

TEST(TimelineTotals, NestedSpansSiblingsAndGaps) {
  // Thread 0: jit [10, 60) holding a fused chain [10, 30) and a wait [30, 45), then nothing, then a
  // start [70, 72) and an optimizer [72, 90) holding a collective [80, 85). Thread 2: a wait [50, 75).
  std::vector<TimelineSpan> s = {{"jit", 10, 60, 0},   {"jit", 10, 30, 0},       {"wait", 30, 45, 0},
                                 {"start", 70, 72, 0}, {"optimizer", 72, 90, 0}, {"collective", 80, 85, 0},
                                 {"wait", 50, 75, 2}};
  const auto t = timeline_totals(s);
  // Computing: [10, 30) + [45, 60) + [72, 80) + [85, 90) = 20 + 15 + 8 + 5 = 48.
  // Communicating: [30, 45) + [50, 75) + [80, 85) (thread 0's start [70, 72) inside [50, 75)) = 15 + 25 + 5
  // = 45. Exposed: [30, 45) + [60, 72) + [80, 85) = 15 + 12 + 5 = 32 (thread 2's wait under computing on
  // thread 0 over [50, 60) and [72, 75) is hidden).
  EXPECT_EQ(t.wall_ns, 80);
  EXPECT_EQ(t.compute_ns, 48);
  EXPECT_EQ(t.communication_ns, 45);
  EXPECT_EQ(t.exposed_communication_ns, 32);
  // The order the spans were recorded in does not matter (a thread records inner spans first).
  std::vector<TimelineSpan> reversed(s.rbegin(), s.rend());
  const auto r = timeline_totals(reversed);
  EXPECT_EQ(r.compute_ns, 48);
  EXPECT_EQ(r.communication_ns, 45);
  EXPECT_EQ(r.exposed_communication_ns, 32);
}

TEST(TimelineTotals, NothingRecorded) {
  const auto t = timeline_totals({});
  EXPECT_EQ(t.wall_ns, 0);
  EXPECT_EQ(t.exposed_communication_ns, 0);
}

}  // namespace
