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
// Per kind: the rank's threads inside one (outermost on their thread), and since when some are.
int g_active[kKinds] = {};
std::chrono::steady_clock::time_point g_since[kKinds];
thread_local int t_depth[kKinds] = {};

/// The wall time some thread of the rank is in `kind`: the union over threads, not their sum
/// (two device threads in products at once count once).
void enter(int kind, std::chrono::steady_clock::time_point now) {
  const std::lock_guard<std::mutex> lock(g_mutex);
  if (g_active[kind]++ == 0) g_since[kind] = now;
}
void leave(int kind, std::chrono::steady_clock::time_point now) {
  const std::lock_guard<std::mutex> lock(g_mutex);
  if (--g_active[kind] == 0) g_seconds[kind] += std::chrono::duration<double>(now - g_since[kind]).count();
}
}  // namespace

ScopedTime::ScopedTime(TimeKind kind) : kind_(kind) {
  if (!g_time_split_on.load(std::memory_order_relaxed) && !trace_on()) return;
  // The products inside attention's kernels are attention's time.
  if (kind == TimeKind::kProducts && t_depth[static_cast<int>(TimeKind::kAttention)] > 0) return;
  active_ = true;
  if (t_depth[static_cast<int>(kind)]++ > 0) return;  // enclosed by one of the same kind
  start_ = std::chrono::steady_clock::now();
  counted_ = g_time_split_on.load(std::memory_order_relaxed);
  if (counted_) enter(static_cast<int>(kind), start_);
}

ScopedTime::~ScopedTime() {
  if (!active_) return;
  if (--t_depth[static_cast<int>(kind_)] > 0) return;
  const auto end = std::chrono::steady_clock::now();
  if (counted_) leave(static_cast<int>(kind_), end);
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
  const auto now = std::chrono::steady_clock::now();
  for (int k = 0; k < detail::kKinds; ++k) {
    detail::g_seconds[k] = 0;
    detail::g_since[k] = now;  // a span open across the reset counts from here
  }
}

TimeSplit time_split() {
  const std::lock_guard<std::mutex> lock(detail::g_mutex);
  const double* v = detail::g_seconds;
  return TimeSplit{v[0], v[1], v[2],
                   v[3]};  // TimeKind's order: products, attention, communication, optimizer
}

}  // namespace shard
