#include "shard/core/time_split.hpp"

#include <mutex>

namespace shard {

namespace detail {
std::atomic<bool> g_time_split_on{false};

namespace {
std::mutex g_mutex;
TimeSplit g_split;
thread_local int t_depth[4] = {0, 0, 0, 0};
}  // namespace

void add_time(TimeKind kind, double seconds) {
  const std::lock_guard<std::mutex> lock(g_mutex);
  switch (kind) {
    case TimeKind::kProducts:
      g_split.products += seconds;
      break;
    case TimeKind::kAttention:
      g_split.attention += seconds;
      break;
    case TimeKind::kCommunication:
      g_split.communication += seconds;
      break;
    case TimeKind::kOptimizer:
      g_split.optimizer += seconds;
      break;
  }
}

ScopedTime::ScopedTime(TimeKind kind) : kind_(kind) {
  if (!g_time_split_on.load(std::memory_order_relaxed)) return;
  if (t_depth[static_cast<int>(kind)]++ > 0) {
    active_ = true;  // enclosed: only the depth is kept
    start_ = {};
    return;
  }
  active_ = true;
  start_ = std::chrono::steady_clock::now();
}

ScopedTime::~ScopedTime() {
  if (!active_) return;
  if (--t_depth[static_cast<int>(kind_)] > 0) return;
  add_time(kind_, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
}
}  // namespace detail

void time_split_enable(bool on) { detail::g_time_split_on.store(on, std::memory_order_relaxed); }
bool time_split_enabled() { return detail::g_time_split_on.load(std::memory_order_relaxed); }

void time_split_reset() {
  const std::lock_guard<std::mutex> lock(detail::g_mutex);
  detail::g_split = TimeSplit{};
}

TimeSplit time_split() {
  const std::lock_guard<std::mutex> lock(detail::g_mutex);
  return detail::g_split;
}

}  // namespace shard
