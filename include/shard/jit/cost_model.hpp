#pragma once
/// \file What a move costs, for jit's sharding propagation (jit/propagate.hpp): per kind of
/// collective a line, microseconds = latency + bytes a device receives x µs per byte, fitted
/// from `collectives_bench --cost-model` (apps/collectives_bench), which prints the
/// `SHARD_COST_MODEL` value of the machine it ran on:
///
///   mpirun -n 2 build/release/apps/collectives_bench --cost-model
///   export SHARD_COST_MODEL="psum=1.2+0.000345,all_gather=1.2+0.000257,..."
///
/// Without the variable the defaults are this repository's measurement (docs/performance.md,
/// "jit: what propagation moves"). Bytes are per device: for a reshard the part of a device's
/// new block its old block lacks (an all_gather over n devices receives n-1 blocks); for a
/// psum a ring's 2 (n-1)/n of the block.

#include <cstdint>
#include <string>

namespace shard {

/// One kind of collective: latency_us + bytes * us_per_byte.
struct CollectiveCost {
  double latency_us = 0;
  double us_per_byte = 0;
  double us(std::int64_t bytes) const {
    return bytes <= 0 ? 0.0 : latency_us + static_cast<double>(bytes) * us_per_byte;
  }
};

struct CostModel {
  CollectiveCost psum;        ///< a contraction's closing reduction (ring bytes)
  CollectiveCost all_gather;  ///< a reshard that stops splitting a dim
  CollectiveCost all_to_all;  ///< a reshard that moves an axis between dims
  CollectiveCost exchange;    ///< any other reshard: point to point (collectives_bench's ppermute)

  /// The measured defaults (2 ranks, docs/performance.md), or SHARD_COST_MODEL when it is set
  /// (read once; ValueError naming the variable when it does not parse).
  static const CostModel& current();
  /// "psum=L+S,all_gather=L+S,all_to_all=L+S,exchange=L+S" (L µs, S µs per byte; any subset,
  /// the others keep `base`'s). ValueError naming the bad entry.
  static CostModel parse(const std::string& text, const CostModel& base);
  /// The text parse reads.
  std::string to_string() const;
};

/// The defaults: collectives_bench on 2 ranks of this repository's 2-core reference VM.
CostModel default_cost_model();

}  // namespace shard
