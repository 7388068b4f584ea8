// vmap's records (core/detail/batch.hpp): the transformation ids, the error for reading a
// batched value's elements.

#include "shard/core/detail/batch.hpp"

#include <atomic>

#include "shard/error.hpp"

namespace shard::detail {

namespace {
std::atomic<std::uint64_t> g_next_transform{1};
}  // namespace

std::uint64_t next_transform_id() { return g_next_transform.fetch_add(1, std::memory_order_relaxed); }

void raise_batched_access(const char* what) {
  raise<ValueError>("vmap: ", what,
                    " of a batched value: inside vmap an array is one example of the batch and its elements "
                    "exist only batched, so they cannot be read (as JAX's tracers cannot be made concrete); "
                    "compute with Shard's ops inside the vmapped function and read the elements of vmap's "
                    "result");
}

}  // namespace shard::detail
