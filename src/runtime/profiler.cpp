#include "shard/runtime/profiler.hpp"

#include <mpi.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "shard/core/timeline.hpp"
#include "shard/error.hpp"
#include "shard/runtime/detail/device_executor.hpp"
#include "shard/runtime/runtime.hpp"

namespace shard {

namespace {
std::int64_t g_started_ns = -1;
}

namespace {
/// ValueError inside a shard_map body: the trace is the rank's, started and written once.
void check_not_in_body(const char* call) {
  if (detail::in_device_function())
    raise<ValueError>(call,
                      " inside a shard_map (or pmap) body: the timeline belongs to the rank, "
                      "not to a device; call it outside the body, on every rank");
}
}  // namespace

void start_trace() {
  check_not_in_body("start_trace()");
  g_started_ns = detail::timeline_start();
}

bool tracing() { return detail::trace_on(); }

std::string TraceSummary::to_string() const {
  std::string out;
  char buf[200];
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const RankTimeSplit& s = ranks[r];
    std::snprintf(buf, sizeof buf,
                  "rank %zu: %.1f ms traced, computing %.1f, communicating %.1f (exposed %.1f)\n", r,
                  s.wall_ms, s.compute_ms, s.communication_ms, s.exposed_communication_ms);
    out += buf;
  }
  return out;
}

TraceSummary stop_trace(const std::string& path) {
  check_not_in_body("stop_trace()");
  Runtime& rt = Runtime::current();
  const mpi::Communicator& world = rt.world();
  // Agreed first: a rank that never started would otherwise send nothing while others wait.
  const bool missing = world.any(g_started_ns < 0);
  if (missing)
    raise<ValueError>("stop_trace(\"", path, "\"): ", g_started_ns < 0 ? "this rank" : "another rank",
                      " never called start_trace() (call it on every rank before stop_trace)");
  detail::timeline_stop();
  // Clock offsets: every rank reads its clock right after a barrier; rank 0's reading is the
  // reference.
  world.barrier();
  const std::int64_t now = detail::timeline_now_ns();
  const std::int64_t offset = world.broadcast(now, 0) - now;  // add to a local time: rank 0's
  const std::int64_t origin = world.allreduce<std::int64_t>(g_started_ns + offset, MPI_MIN);
  g_started_ns = -1;
  // Rank 0 opens the file before anything is sent, and every rank hears whether it could.
  std::FILE* f = nullptr;
  std::string open_error;
  if (world.rank() == 0) {
    f = std::fopen(path.c_str(), "w");
    if (f == nullptr) open_error = std::strerror(errno);
  }
  if (world.any(f == nullptr && world.rank() == 0)) {
    const std::string why = world.rank() == 0 ? open_error : "rank 0 could not open it";
    raise<IoError>("stop_trace: cannot write the timeline to ", path, ": ", why);
  }
  // Where this rank's time went, before its spans are taken; every rank's on every rank.
  const detail::TimelineTotals totals = detail::timeline_totals();
  const std::vector<double> all = world.allgather(std::vector<double>{
      static_cast<double>(totals.wall_ns) / 1e6, static_cast<double>(totals.compute_ns) / 1e6,
      static_cast<double>(totals.communication_ns) / 1e6,
      static_cast<double>(totals.exposed_communication_ns) / 1e6});
  TraceSummary summary;
  for (std::size_t r = 0; r + 3 < all.size(); r += 4)
    summary.ranks.push_back(RankTimeSplit{all[r], all[r + 1], all[r + 2], all[r + 3]});
  std::int64_t dropped = 0;
  const int pid = world.rank();
  std::string mine = detail::timeline_lanes_json(pid, pid * rt.devices_per_rank());
  const std::string events = detail::timeline_take_json(pid, origin - offset, dropped);
  if (!mine.empty() && !events.empty()) mine += ",\n";
  mine += events;
  const std::string head =
      "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " + std::to_string(pid) +
      ", \"args\": {\"name\": \"rank " + std::to_string(pid) + "\"}}," +
      "\n{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": " + std::to_string(pid) +
      ", \"args\": {\"sort_index\": " + std::to_string(pid) + "}}";
  mine = head + (mine.empty() ? "" : ",\n" + mine);
  const std::int64_t all_dropped = world.allreduce<std::int64_t>(dropped, MPI_SUM);
  bool ok = true;
  world.gather_texts(mine, 0, [&](int r, const std::string& text) {
    if (!ok) return;
    const char* sep = r == 0 ? "{\"traceEvents\": [\n" : ",\n";
    ok = std::fputs(sep, f) >= 0 && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  });
  if (world.rank() == 0) {
    const std::string tail =
        "\n], \"displayTimeUnit\": \"ms\", \"otherData\": {\"ranks\": " + std::to_string(world.size()) +
        ", \"devices_per_rank\": " + std::to_string(rt.devices_per_rank()) +
        ", \"dropped_events\": " + std::to_string(all_dropped) + "}}\n";
    ok = ok && std::fputs(tail.c_str(), f) >= 0;
    ok = std::fclose(f) == 0 && ok;
  }
  if (world.any(!ok))
    raise<IoError>("stop_trace: writing the timeline to ", path, " failed",
                   world.rank() == 0 ? "" : " on rank 0", " (disk full?)");
  return summary;
}

}  // namespace shard
