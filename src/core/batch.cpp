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

void raise_batched_access(const char* what, const BatchBase& record) {
  if (record.trace)
    raise<ValueError>(
        "jit: ", what,
        " of a traced array: inside jit an array is abstract (its shape, dtype and sharding are "
        "known, its elements exist only when the program runs), so they cannot be read or printed "
        "(JAX's ConcretizationTypeError); compute with Shard's ops inside the jitted function, "
        "return the array and read the result, or pass the value as a static (non-array) argument");
  raise<ValueError>("vmap: ", what,
                    " of a batched value: inside vmap an array is one example of the batch and its elements "
                    "exist only batched, so they cannot be read (as JAX's tracers cannot be made concrete); "
                    "compute with Shard's ops inside the vmapped function and read the elements of vmap's "
                    "result");
}

}  // namespace shard::detail
