#include "shard/core/timeline.hpp"

#include <chrono>
#include <cstdio>
#include <mutex>
#include <set>
#include <vector>

namespace shard::detail {

std::atomic<bool> g_trace_on{false};

namespace {
struct Event {
  const char* category;
  std::string name;
  std::string args;
  std::int64_t begin_ns, end_ns;
  int lane;
};
std::mutex g_mutex;
std::vector<Event> g_events;
std::int64_t g_dropped = 0;
std::atomic<int> g_next_lane{100};
thread_local int t_lane = -1;

int lane() {
  if (t_lane < 0) t_lane = g_next_lane.fetch_add(1, std::memory_order_relaxed);
  return t_lane;
}

void append_escaped(std::string& out, std::string_view s) {
  for (const char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned char>(ch));
      out += buf;
    } else {
      out += ch;
    }
  }
}
}  // namespace

std::int64_t timeline_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void timeline_set_lane(int l) { t_lane = l; }

void timeline_add(const char* category, std::string_view name, std::int64_t begin_ns, std::int64_t end_ns,
                  std::string args) {
  const int l = lane();
  const std::lock_guard<std::mutex> lock(g_mutex);
  if (static_cast<std::int64_t>(g_events.size()) >= kMaxTimelineEvents) {
    ++g_dropped;
    return;
  }
  g_events.push_back(Event{category, std::string(name), std::move(args), begin_ns, end_ns, l});
}

void TimelineScope::begin(const char* category, const char* name) noexcept {
  category_ = category;
  name_ = name;
  begin_ns_ = timeline_now_ns();
}

void TimelineScope::end() {
  if (trace_on()) timeline_add(category_, name_, begin_ns_, timeline_now_ns(), std::move(args_));
}

std::int64_t timeline_start() {
  t_lane = t_lane < 0 ? 0 : t_lane;  // the thread that starts the trace: device 0's
  const std::lock_guard<std::mutex> lock(g_mutex);
  g_events.clear();
  g_dropped = 0;
  g_trace_on.store(true, std::memory_order_relaxed);
  return timeline_now_ns();
}

void timeline_stop() { g_trace_on.store(false, std::memory_order_relaxed); }

std::string timeline_take_json(int pid, std::int64_t origin_ns, std::int64_t& dropped) {
  std::vector<Event> events;
  {
    const std::lock_guard<std::mutex> lock(g_mutex);
    events.swap(g_events);
    dropped = g_dropped;
    g_dropped = 0;
  }
  std::string out;
  out.reserve(events.size() * 120);
  char buf[160];
  for (const auto& e : events) {
    if (!out.empty()) out += ",\n";
    out += "{\"name\": \"";
    append_escaped(out, e.name);
    std::snprintf(buf, sizeof buf,
                  "\", \"cat\": \"%s\", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": %d, \"tid\": %d",
                  e.category, static_cast<double>(e.begin_ns - origin_ns) / 1e3,
                  static_cast<double>(e.end_ns - e.begin_ns) / 1e3, pid, e.lane);
    out += buf;
    if (!e.args.empty()) out += ", \"args\": {" + e.args + "}";
    out += "}";
  }
  return out;
}

std::string timeline_lanes_json(int pid, int first_device) {
  std::set<int> lanes;
  {
    const std::lock_guard<std::mutex> lock(g_mutex);
    for (const auto& e : g_events) lanes.insert(e.lane);
  }
  std::string out;
  for (const int l : lanes) {
    if (!out.empty()) out += ",\n";
    const std::string name =
        l < 100 ? "device " + std::to_string(first_device + l) : "helper thread " + std::to_string(l - 100);
    out += "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " + std::to_string(pid) +
           ", \"tid\": " + std::to_string(l) + ", \"args\": {\"name\": \"" + name + "\"}}";
  }
  return out;
}

}  // namespace shard::detail
