#pragma once
/// \file What the collectives' execution (collective_exec.cpp) uses of the consistency check
/// and the watchdog (collective_guard.cpp). Private to the library.

#include <mpi.h>

#include <source_location>
#include <vector>

#include "shard/detail/collective.hpp"
#include "shard/detail/collective_guard.hpp"
#include "shard/detail/mesh_comms.hpp"
#include "shard/mpi/communicator.hpp"

namespace shard::detail {

/// Before a collective: the watchdog's arrival messages and the consistency check (each only
/// when on), on the communicator of all the mesh's ranks. `devices`: this rank's devices in it.
void guard_collective(const Mesh& mesh, const CollectiveSpec& s, const std::vector<int>& devices,
                      const std::source_location& where);

/// Waits for requests of a collective's MPI call under the watchdog; aborts on timeout.
void watchdog_wait(int n, MPI_Request* r, const CollectiveSpec& s, const DeviceGroup& g, const char* routine);

/// Runs a collective's MPI call: the blocking form, or under the watchdog the nonblocking
/// form polled until the deadline.
template <typename Blocking, typename Start>
void mpi_call(const CollectiveSpec& s, const DeviceGroup& g, const char* routine, Blocking&& blocking,
              Start&& start) {
  if (!collective_watchdog_on()) [[likely]] {
    mpi::check(blocking(), routine);
    return;
  }
  MPI_Request r = MPI_REQUEST_NULL;
  mpi::check(start(&r), routine);
  watchdog_wait(1, &r, s, g, routine);
}


}  // namespace shard::detail
