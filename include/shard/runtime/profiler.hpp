#pragma once
/// \file A timeline of every rank (jax.profiler.start_trace / stop_trace; PyTorch's profiler
/// with export_chrome_trace): what each rank's threads ran and when, written as one Chrome-trace
/// JSON file that Perfetto (ui.perfetto.dev) or chrome://tracing opens.
///
///     shard::start_trace();                    // on every rank (no communication)
///     // ... training steps ...
///     shard::stop_trace("step.trace.json");    // collective: rank 0 writes every rank's events
///
/// Each rank is a process of the trace ("rank r"), each local device thread a thread ("device
/// d"). Spans: "op" (each primitive run eagerly, on ShardedArrays or on a device's blocks in a
/// shard_map), "jit" (each equation of a replayed program; "fused" for a fused chain),
/// "products" (block products), "attention", "optimizer" (Optimizer::update), "collective" (each
/// collective and reshard transfer, with its bytes), "start" and "wait" (a collective started
/// early and the wait for it). Spans nest on a thread as the calls do. The ranks' clocks are
/// aligned at stop_trace (each rank's offset to rank 0's, taken right after a barrier; on one host
/// they share a clock). At most 4 million spans are kept per rank; past that they are counted
/// ("dropped_events" in the file's otherData).

#include <string>
#include <vector>

namespace shard {

/// Where one rank's time went while the trace recorded (from its spans: each instant of a thread
/// is its innermost span's). `communication_ms`: some thread of the rank in a collective, a
/// reshard's transfer, or posting or waiting for one started early; `compute_ms`: some thread in
/// any other span (an op, a jit equation, products, attention, the optimizer);
/// `exposed_communication_ms`: communicating while no thread of the rank computes (the
/// communication that overlap did not hide). Untraced time (the app's own loop) is in neither.
struct RankTimeSplit {
  double wall_ms = 0, compute_ms = 0, communication_ms = 0, exposed_communication_ms = 0;
};
/// What stop_trace returns on every rank: one split per rank, in rank order.
struct TraceSummary {
  std::vector<RankTimeSplit> ranks;
  /// One line per rank: "rank 0: 120.3 ms traced, computing 98.1, communicating 20.2 (exposed 15.0)".
  std::string to_string() const;
};

/// Starts recording this rank's timeline (clears an earlier one). Not collective: call it on
/// every rank at the same point of the program.
void start_trace();
/// Whether a trace is being recorded.
bool tracing();
/// Collective over all ranks: stops recording and writes every rank's timeline to `path` (rank 0
/// writes; IoError on every rank when it cannot). Raises ValueError when no trace was started.
/// Returns where each rank's time went (TraceSummary). Both raise ValueError inside a shard_map or
/// pmap body (the timeline is the rank's).
TraceSummary stop_trace(const std::string& path);

}  // namespace shard
