#pragma once
/// \file CommStats: what this process sent, per collective kind and mesh axes.

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace shard {

struct CommRecord {
  std::int64_t calls = 0;  ///< MPI calls made
  std::int64_t bytes = 0;  ///< bytes this rank handed to MPI to send
  /// Collectives whose whole group is on this rank (several devices per rank): no MPI; the
  /// bytes of the members' blocks they moved in memory.
  std::int64_t in_process_calls = 0;
  std::int64_t in_process_bytes = 0;
};

/// A per-process record of the traffic Shard's collectives caused, keyed by collective kind
/// ("psum", "all_gather", "to_host", ...) and mesh axes ("'a'", "('a','b')"): MPI calls and
/// bytes sent, and apart from them the collectives among devices of this rank (in memory).
/// Local only: reading it never communicates.
class CommStats {
 public:
  void record(const std::string& kind, const std::string& axes, std::int64_t bytes);
  void record_in_process(const std::string& kind, const std::string& axes, std::int64_t bytes);
  /// The record of one kind; over all axes when `axes` is empty.
  CommRecord get(const std::string& kind, const std::string& axes = "") const;
  /// Everything recorded since the last reset.
  CommRecord total() const;
  /// Seconds spent inside MPI_Testall/MPI_Waitall on transfers posted earlier (shared-memory
  /// copies happen there), by kind: Cannon's and SUMMA's ("cannon", "summa": what their block
  /// products did not hide) and the backward pass's gradient sums ("psum": what the rest of
  /// the pass did not hide; shard::gradient_reduction()).
  void record_wait(const std::string& kind, double seconds);
  double wait_seconds(const std::string& kind) const;
  void reset();
  /// A table with one line per (kind, axes).
  std::string to_string() const;
  std::map<std::pair<std::string, std::string>, CommRecord> entries() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, std::string>, CommRecord> records_;
  std::map<std::string, double> waits_;
};

/// This process's CommStats.
CommStats& comm_stats();

}  // namespace shard
