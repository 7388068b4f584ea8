#pragma once
/// \file What the collectives' execution (collective_exec.cpp) uses of the consistency check
/// and the watchdog (collective_guard.cpp). Private to the library.

#include <mpi.h>

#include <cstdint>
#include <source_location>
#include <vector>

#include "shard/comm/detail/collective.hpp"
#include "shard/comm/detail/collective_guard.hpp"
#include "shard/comm/detail/mesh_comms.hpp"
#include "shard/error.hpp"  // shard::source_location
#include "shard/mpi/communicator.hpp"

namespace shard::detail {

/// Before a collective: the watchdog's arrival messages and the consistency check (each only
/// when on), on the communicator of all the mesh's ranks. `devices`: this rank's devices in it.
void guard_collective(const Mesh& mesh, const CollectiveSpec& s, const std::vector<int>& devices,
                      const shard::source_location& where);

/// The consistency check of a transfer over every rank of the world (the world's exchange).
void check_world_transfer(const CollectiveSpec& s, const shard::source_location& where);
/// The Runtime's world as a group (not owned). RuntimeError without a Runtime.
const DeviceGroup& world_device_group();

/// Waits for requests of a collective's MPI call under the guard: aborts when the watchdog's
/// deadline passes, raises a failure another rank announced (announce_failure).
void watchdog_wait(int n, MPI_Request* r, const CollectiveSpec& s, const DeviceGroup& g, const char* routine);

/// Runs a collective's MPI call in its nonblocking form, polled until it completes (or the
/// watchdog's deadline passes), raising meanwhile a failure another rank announced.
template <typename Start>
void polled_call(const CollectiveSpec& s, const DeviceGroup& g, const char* routine, Start&& start) {
  MPI_Request r = MPI_REQUEST_NULL;
  mpi::check(start(&r), routine);
  watchdog_wait(1, &r, s, g, routine);
}

/// Runs a collective's MPI call: the blocking form, or under the watchdog the polled
/// nonblocking form. (Under the check alone the blocking form too: every rank has passed the
/// check's polled allreduce just before, so none is missing, and a blocking reduction adds in
/// the same order as without the check.)
template <typename Blocking, typename Start>
void mpi_call(const CollectiveSpec& s, const DeviceGroup& g, const char* routine, Blocking&& blocking,
              Start&& start) {
  if (!collective_watchdog_on()) [[likely]] {
    const BlockingWait wait(routine, s, g.ranks);
    mpi::check(blocking(), routine);
    return;
  }
  polled_call(s, g, routine, start);
}

/// The fault hook (SHARD_FAULT_COLLECTIVE, collective_fault.cpp): one rank diverges at its k-th
/// checked collective, as a bug in its code would (tests/adversarial/fault_sweep.sh).
/// Reads the variable (ValueError when malformed, for a rank outside the job, or with the check
/// off: `check`; the Runtime's start).
void configure_fault_hook(bool check);
/// A hash of the setting (> 0; 0 when unset), agreed at start-up: every rank must have the same.
std::int64_t fault_setting_hash();
enum class FaultAction { kNone, kExtra, kRename };
/// Counts a checked collective of this rank (`world_rank`): what the hook does there.
FaultAction fault_at_checked_collective(int world_rank);
/// The collective this rank presents instead of `s` (kRename): a psum becomes a pmax, anything
/// else a psum.
CollectiveSpec renamed_by_fault(const CollectiveSpec& s);
/// The description of the extra collective presented before `s` (kExtra): its fingerprint too.
std::string extra_collective_text(const CollectiveSpec& s);
/// At the program's end: under "count" prints how many collectives this rank checked; false
/// (after an error line) when this rank was to diverge and the fault never fired.
bool report_fault_outcome(int world_rank);

}  // namespace shard::detail
