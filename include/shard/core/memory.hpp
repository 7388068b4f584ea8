#pragma once
/// \file The process's policy for freed memory (local, process-wide; no communication).

#include <cstdint>

namespace shard {

/// The most bytes of arrays (Tensor buffers, what tensor_memory_stats().live_bytes counts) this
/// process may hold at once; an allocation past it raises AllocationError naming the limit, the
/// bytes asked for and those live (0: no limit, the default). Set from the environment variable
/// SHARD_MEMORY_LIMIT at start-up (bytes, or with a suffix K, M, G: powers of 1024; e.g. 512M):
/// a rank's memory budget, to check that a configuration fits a smaller machine. Process-wide,
/// local (each rank checks its own).
void set_memory_limit(std::int64_t bytes);
std::int64_t memory_limit();

/// Switches glibc's policy for freed memory and the reuse of freed Tensor buffers (see
/// RuntimeOptions::keep_freed_memory). Local, process-wide; the Runtime calls it at start-up.
void set_keep_freed_memory(bool keep);
/// Whether the policy is on.
bool keep_freed_memory();

}  // namespace shard
