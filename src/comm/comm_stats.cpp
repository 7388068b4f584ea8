#include "shard/comm/comm_stats.hpp"

#include <cstdio>

namespace shard {

void CommStats::record(const std::string& kind, const std::string& axes, std::int64_t bytes) {
  std::lock_guard lock(mutex_);
  auto& r = records_[{kind, axes}];
  r.calls += 1;
  r.bytes += bytes;
}

void CommStats::record_in_process(const std::string& kind, const std::string& axes, std::int64_t bytes) {
  std::lock_guard lock(mutex_);
  auto& r = records_[{kind, axes}];
  r.in_process_calls += 1;
  r.in_process_bytes += bytes;
}

CommRecord CommStats::get(const std::string& kind, const std::string& axes) const {
  std::lock_guard lock(mutex_);
  CommRecord out;
  for (const auto& [key, r] : records_)
    if (key.first == kind && (axes.empty() || key.second == axes)) {
      out.calls += r.calls;
      out.bytes += r.bytes;
      out.in_process_calls += r.in_process_calls;
      out.in_process_bytes += r.in_process_bytes;
    }
  return out;
}

CommRecord CommStats::total() const {
  std::lock_guard lock(mutex_);
  CommRecord out;
  for (const auto& [key, r] : records_) {
    out.calls += r.calls;
    out.bytes += r.bytes;
    out.in_process_calls += r.in_process_calls;
    out.in_process_bytes += r.in_process_bytes;
  }
  return out;
}

void CommStats::record_wait(const std::string& kind, double seconds) {
  std::lock_guard lock(mutex_);
  waits_[kind] += seconds;
}

double CommStats::wait_seconds(const std::string& kind) const {
  std::lock_guard lock(mutex_);
  const auto it = waits_.find(kind);
  return it == waits_.end() ? 0.0 : it->second;
}

void CommStats::reset() {
  std::lock_guard lock(mutex_);
  records_.clear();
  waits_.clear();
}

std::map<std::pair<std::string, std::string>, CommRecord> CommStats::entries() const {
  std::lock_guard lock(mutex_);
  return records_;
}

std::string CommStats::to_string() const {
  std::string out =
      "collective      axes          MPI calls          bytes sent  in-process calls    bytes in memory\n";
  char line[200];
  for (const auto& [key, r] : entries()) {
    std::snprintf(line, sizeof line, "%-15s %-15s %8lld %18lld %17lld %18lld\n", key.first.c_str(),
                  key.second.c_str(), static_cast<long long>(r.calls), static_cast<long long>(r.bytes),
                  static_cast<long long>(r.in_process_calls), static_cast<long long>(r.in_process_bytes));
    out += line;
  }
  std::lock_guard lock(mutex_);
  for (const auto& [kind, seconds] : waits_) {
    std::snprintf(line, sizeof line, "%-15s in MPI_Testall/Waitall for %.6f s\n", kind.c_str(), seconds);
    out += line;
  }
  return out;
}

CommStats& comm_stats() {
  static CommStats stats;
  return stats;
}

}  // namespace shard
