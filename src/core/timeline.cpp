#include "shard/core/timeline.hpp"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <mutex>
#include <set>
#include <utility>
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

namespace {
using Intervals = std::vector<std::pair<std::int64_t, std::int64_t>>;

/// The union of `v` as sorted, disjoint intervals.
Intervals merged(Intervals v) {
  std::sort(v.begin(), v.end());
  Intervals out;
  for (const auto& [b, e] : v) {
    if (e <= b) continue;
    if (!out.empty() && b <= out.back().second)
      out.back().second = std::max(out.back().second, e);
    else
      out.emplace_back(b, e);
  }
  return out;
}

std::int64_t length(const Intervals& v) {
  std::int64_t n = 0;
  for (const auto& [b, e] : v) n += e - b;
  return n;
}

/// The length of the intersection of two sorted disjoint lists.
std::int64_t overlap(const Intervals& a, const Intervals& b) {
  std::int64_t n = 0;
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const std::int64_t lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (hi > lo) n += hi - lo;
    if (a[i].second < b[j].second)
      ++i;
    else
      ++j;
  }
  return n;
}

bool communicates(const std::string& category) {
  return category == "collective" || category == "start" || category == "wait";
}
}  // namespace

TimelineTotals timeline_totals(std::vector<TimelineSpan> spans) {
  TimelineTotals t;
  if (spans.empty()) return t;
  std::int64_t first = spans.front().begin_ns, last = spans.front().end_ns;
  for (const auto& s : spans) {
    first = std::min(first, s.begin_ns);
    last = std::max(last, s.end_ns);
  }
  t.wall_ns = last - first;
  // Per lane, outer spans before the spans they contain; each stretch of time goes to the
  // innermost span open then.
  std::sort(spans.begin(), spans.end(), [](const TimelineSpan& a, const TimelineSpan& b) {
    if (a.lane != b.lane) return a.lane < b.lane;
    if (a.begin_ns != b.begin_ns) return a.begin_ns < b.begin_ns;
    return a.end_ns > b.end_ns;
  });
  Intervals compute, comm;
  auto emit = [&](const TimelineSpan& s, std::int64_t b, std::int64_t e) {
    if (e > b) (communicates(s.category) ? comm : compute).emplace_back(b, e);
  };
  std::vector<const TimelineSpan*> open;
  std::int64_t at = 0;
  auto close_until = [&](std::int64_t until) {  // closes the open spans that end by `until`
    while (!open.empty() && open.back()->end_ns <= until) {
      emit(*open.back(), at, open.back()->end_ns);
      at = std::max(at, open.back()->end_ns);
      open.pop_back();
    }
  };
  for (std::size_t i = 0; i < spans.size(); ++i) {
    const TimelineSpan& s = spans[i];
    if (i > 0 && s.lane != spans[i - 1].lane) {
      close_until(INT64_MAX);
      open.clear();
    }
    close_until(s.begin_ns);
    if (!open.empty()) emit(*open.back(), at, s.begin_ns);
    at = s.begin_ns;
    // A span that outlives the one around it (clock noise at the ends): clipped to it.
    TimelineSpan* clipped = &spans[i];
    if (!open.empty()) clipped->end_ns = std::min(clipped->end_ns, open.back()->end_ns);
    open.push_back(clipped);
  }
  close_until(INT64_MAX);
  const Intervals cu = merged(std::move(compute)), mu = merged(std::move(comm));
  t.compute_ns = length(cu);
  t.communication_ns = length(mu);
  t.exposed_communication_ns = t.communication_ns - overlap(mu, cu);
  return t;
}

TimelineTotals timeline_totals() {
  std::vector<TimelineSpan> spans;
  {
    const std::lock_guard<std::mutex> lock(g_mutex);
    spans.reserve(g_events.size());
    for (const auto& e : g_events) spans.push_back(TimelineSpan{e.category, e.begin_ns, e.end_ns, e.lane});
  }
  return timeline_totals(std::move(spans));
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
