#pragma once
/// \file Where a rank's time goes: seconds spent in products, attention, communication and the
/// optimizer, measured where those run (the block products' gemm, the fused attention kernels,
/// the collectives' execution and waits, Optimizer::update): for each, the wall time some thread
/// of this rank spent in it (the union over the rank's threads, e.g. several devices' threads).
/// Off by default (one relaxed load per measured call); the apps turn it on for --time-split.
///
///     shard::time_split_enable(true);
///     shard::time_split_reset();
///     // ... a training step ...
///     const shard::TimeSplit t = shard::time_split();  // t.products, t.communication, ...
///
/// What is not in a category (elementwise ops, norms, softmax, shape ops, planning) is the
/// step's wall time minus their sum. Nested measurements of one kind count once, and the products
/// inside attention's kernels are attention's; categories can overlap in time (a gradient's sum
/// in flight while the next product runs counts in both).

#include <atomic>
#include <chrono>

namespace shard {

struct TimeSplit {
  double products = 0;       ///< matmul / dot block products (gemm: OpenBLAS or oneDNN)
  double attention = 0;      ///< dot_product_attention's fused kernels, forward and backward
  double communication = 0;  ///< collectives and reshards' transfers, and waits for deferred ones
  double optimizer = 0;      ///< Optimizer::update
};

void time_split_enable(bool on);
bool time_split_enabled();
void time_split_reset();
/// The times since the last reset (seconds of wall time per category, over the rank's threads).
TimeSplit time_split();

namespace detail {
enum class TimeKind { kProducts, kAttention, kCommunication, kOptimizer };
extern std::atomic<bool> g_time_split_on;
/// Adds its lifetime to `kind` when the split is on, unless one of the same kind encloses it
/// (as the union over the rank's threads).
class ScopedTime {
 public:
  explicit ScopedTime(TimeKind kind);
  ~ScopedTime();
  ScopedTime(const ScopedTime&) = delete;
  ScopedTime& operator=(const ScopedTime&) = delete;

 private:
  TimeKind kind_;
  bool active_ = false;
  bool counted_ = false;  ///< in the split (not only on the timeline)
  std::chrono::steady_clock::time_point start_;
};
}  // namespace detail

}  // namespace shard
