#include "shard/core/time_split.hpp"

#include <mutex>

#include "shard/core/timeline.hpp"

namespace shard {

namespace detail {
std::atomic<bool> g_time_split_on{false};

namespace {
constexpr int kKinds = 4;
std::mutex g_mutex;
double g_seconds[kKinds] = {};  // by TimeKind
thread_local int t_depth[kKinds] = {};
}  // namespace

void add_time(TimeKind kind, double seconds) {
  const std::lock_guard<std::mutex> lock(g_mutex);
  g_seconds[static_cast<int>(kind)] += seconds;
}

ScopedTime::ScopedTime(TimeKind kind) : kind_(kind) {
  if (!g_time_split_on.load(std::memory_order_relaxed) && !trace_on()) return;
  active_ = true;
  if (t_depth[static_cast<int>(kind)]++ == 0) start_ = std::chrono::steady_clock::now();  // else enclosed
}

ScopedTime::~ScopedTime() {
  if (!active_) return;
  if (--t_depth[static_cast<int>(kind_)] > 0) return;
  const auto end = std::chrono::steady_clock::now();
  if (g_time_split_on.load(std::memory_order_relaxed))
    add_time(kind_, std::chrono::duration<double>(end - start_).count());
  // The timeline shows the named collectives and waits themselves (TimelineScope where they run).
  static constexpr const char* kNames[kKinds] = {"products", "attention", nullptr, "optimizer"};
  if (trace_on() && kNames[static_cast<int>(kind_)] != nullptr) {
    const auto ns = [](std::chrono::steady_clock::time_point t) {
      return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
    };
    timeline_add(kNames[static_cast<int>(kind_)], kNames[static_cast<int>(kind_)], ns(start_), ns(end));
  }
}
}  // namespace detail

void time_split_enable(bool on) { detail::g_time_split_on.store(on, std::memory_order_relaxed); }
bool time_split_enabled() { return detail::g_time_split_on.load(std::memory_order_relaxed); }

void time_split_reset() {
  const std::lock_guard<std::mutex> lock(detail::g_mutex);
  for (double& v : detail::g_seconds) v = 0;
}

TimeSplit time_split() {
  const std::lock_guard<std::mutex> lock(detail::g_mutex);
  const double* v = detail::g_seconds;
  return TimeSplit{v[0], v[1], v[2],
                   v[3]};  // TimeKind's order: products, attention, communication, optimizer
}

}  // namespace shard
