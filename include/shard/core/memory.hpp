#pragma once
/// \file The process's policy for freed memory (local, process-wide; no communication).

namespace shard {

/// Switches glibc's policy for freed memory and the reuse of freed Tensor buffers (see
/// RuntimeOptions::keep_freed_memory). Local, process-wide; the Runtime calls it at start-up.
void set_keep_freed_memory(bool keep);
/// Whether the policy is on.
bool keep_freed_memory();

}  // namespace shard
