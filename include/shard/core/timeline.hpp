#pragma once
/// \file The timeline's recorder: spans of time (an op, a block product, a collective, a wait) on
/// each thread of this rank, kept while a trace is on (shard::start_trace / shard::stop_trace,
/// runtime/profiler.hpp, write them as Chrome-trace JSON). Off by default: a scope costs one
/// relaxed load.
///
/// Categories: "op" (a primitive run eagerly, on ShardedArrays or on a device's blocks inside a
/// shard_map), "jit" (an equation of a replayed program, "fused" for a fused chain),
/// "products", "attention", "optimizer" (time_split's kinds), "collective" (a collective or a
/// reshard's transfers, with its bytes), "wait" (waiting for a collective started earlier) and
/// "start" (posting one).

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace shard::detail {

extern std::atomic<bool> g_trace_on;
inline bool trace_on() { return g_trace_on.load(std::memory_order_relaxed); }

/// Monotonic nanoseconds (steady_clock: one clock for every process of a host).
std::int64_t timeline_now_ns();
/// This thread's lane in the trace (Chrome trace's tid): the local device index of a device
/// thread (the executor's workers set theirs; the thread that starts a trace is 0), else 100 + n.
void timeline_set_lane(int lane);

/// Records [begin_ns, end_ns) on this thread's lane. `args`: a JSON object's members without the
/// braces ("\"bytes\": 64"), or empty.
void timeline_add(const char* category, std::string_view name, std::int64_t begin_ns, std::int64_t end_ns,
                  std::string args = {});

/// Records its lifetime when a trace is on.
class TimelineScope {
 public:
  TimelineScope(const char* category, const char* name) noexcept {
    if (trace_on()) [[unlikely]]
      begin(category, name);
  }
  ~TimelineScope() {
    if (begin_ns_ >= 0) [[unlikely]]
      end();
  }
  TimelineScope(const TimelineScope&) = delete;
  TimelineScope& operator=(const TimelineScope&) = delete;
  /// A name made only when the trace is on (a collective's "psum 'data'").
  template <typename F>
  static TimelineScope named(const char* category, F&& make_name) {
    TimelineScope s;
    if (trace_on()) [[unlikely]] {
      s.category_ = category;
      s.owned_ = make_name();
      s.name_ = s.owned_.c_str();
      s.begin_ns_ = timeline_now_ns();
    }
    return s;
  }
  /// JSON members shown with the span ("\"bytes\": 64"), when the trace is on.
  void set_args(std::string args) {
    if (begin_ns_ >= 0) args_ = std::move(args);
  }
  bool active() const { return begin_ns_ >= 0; }
  TimelineScope(TimelineScope&& o) noexcept
      : category_(o.category_),
        owned_(std::move(o.owned_)),
        args_(std::move(o.args_)),
        begin_ns_(o.begin_ns_) {
    name_ = owned_.empty() ? o.name_ : owned_.c_str();
    o.begin_ns_ = -1;
  }
  TimelineScope& operator=(TimelineScope&&) = delete;

 private:
  TimelineScope() = default;
  void begin(const char* category, const char* name) noexcept;
  void end();
  const char* category_ = nullptr;
  const char* name_ = nullptr;
  std::string owned_;
  std::string args_;
  std::int64_t begin_ns_ = -1;
};

/// The recorded events of this rank as Chrome-trace event objects separated by ",\n" (pid
/// `pid`, times in microseconds from `origin_ns` of this rank's clock), and clears them.
/// `dropped` receives how many were not kept (past the cap of kMaxTimelineEvents).
std::string timeline_take_json(int pid, std::int64_t origin_ns, std::int64_t& dropped);
/// The lanes that recorded, for the trace's thread names.
std::string timeline_lanes_json(int pid, int first_device);
inline constexpr std::int64_t kMaxTimelineEvents = 4'000'000;
/// One recorded span, for the totals below.
struct TimelineSpan {
  std::string category;
  std::int64_t begin_ns = 0, end_ns = 0;
  int lane = 0;
};
/// Where a rank's time went over its recorded spans. Each instant of a thread is its innermost
/// span's (an op's span around a collective is communication while the collective runs):
/// communication is "collective", "start" and "wait", computing every other category. The rank's
/// time computing and communicating are the unions over its threads; exposed communication is
/// the time some thread communicates while no thread computes (what overlap did not hide).
struct TimelineTotals {
  std::int64_t wall_ns = 0;  ///< first span's begin to the last one's end
  std::int64_t compute_ns = 0, communication_ns = 0, exposed_communication_ns = 0;
};
TimelineTotals timeline_totals(std::vector<TimelineSpan> spans);
/// The totals of this rank's recorded spans (before timeline_take_json clears them).
TimelineTotals timeline_totals();
/// Starts recording (clears what was recorded); returns the start time.
std::int64_t timeline_start();
void timeline_stop();

}  // namespace shard::detail
