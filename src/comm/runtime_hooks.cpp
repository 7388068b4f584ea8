// The comm layer's part in the Runtime's start and end (shard/runtime/detail/layer_hooks.hpp):
// at start-up, the settings of the collective check, the watchdog, the abort grace and
// group-shared memory (agreed over the world), the watchdog's duplicates of the world and the
// probe of single-copy reads between the ranks of a node; at the end, the program's agreement;
// and guarded_main's failure protocol.

#include "comm/runtime_hooks.hpp"

#include <unistd.h>

#include <cstdint>
#include <exception>
#include <vector>

#include "comm/collective_cma.hpp"
#include "comm/collective_guard_internal.hpp"
#include "comm/collective_shared.hpp"
#include "shard/comm/detail/collective_guard.hpp"
#include "shard/mpi/communicator.hpp"
#include "shard/runtime/detail/env.hpp"
#include "shard/runtime/detail/layer_hooks.hpp"

namespace shard::detail {

namespace {

// The settings that change which MPI calls a collective makes must be the same on every rank:
// each word is agreed as its maximum over the ranks, so the job takes the most checking, the
// longest timeout and grace any rank asked for, and no group-shared memory if any rank turned
// it off.
enum Setting : int { kCheck, kTimeoutMs, kGraceMs, kSharedOff, kFault, kFaultComplement, kSettings };

void read_comm_settings(std::int64_t* words) {
  bool check = false;
  double timeout = -1;
  configure_collective_guard_from_env(check, timeout);
  const double grace = env_seconds("SHARD_ABORT_GRACE", 1e6).value_or(5.0);
  const bool shared_reduce = env_flag("SHARD_SHARED_REDUCE").value_or(true);
  words[kCheck] = check ? 1 : 0;
  words[kTimeoutMs] = static_cast<std::int64_t>(timeout * 1000.0 + 0.5);
  words[kGraceMs] = static_cast<std::int64_t>(grace * 1000.0 + 0.5);
  words[kSharedOff] = shared_reduce ? 0 : 1;
  // SHARD_FAULT_COLLECTIVE must be the same everywhere: the maxima of h and ~h tell.
  words[kFault] = fault_setting_hash();
  words[kFaultComplement] = ~words[kFault];
}

void start_comm(const RuntimeStart& s) {
  const std::int64_t* words = s.settings;
  if (words[kFaultComplement] != ~words[kFault])
    raise<ValueError>(
        "SHARD_FAULT_COLLECTIVE differs between the ranks (unset on some): give every rank the same "
        "setting (mpirun -x SHARD_FAULT_COLLECTIVE)");
  // Timeout: unset on every rank (-1) is the watcher thread's default; 0 turns both off.
  set_collective_guard(words[kCheck] != 0, static_cast<double>(words[kTimeoutMs]) / 1000.0);
  if (words[kTimeoutMs] < 0) start_collective_watch(kDefaultCollectiveTimeout);
  set_abort_grace_seconds(static_cast<double>(words[kGraceMs]) / 1000.0);
  set_shared_reduce(words[kSharedOff] == 0);
  open_watchdog_comm(s.world);

  // Whether a rank may read another rank's memory on its node (process_vm_readv; containers
  // may forbid it): each reads a word of the next rank of its node; the world agrees.
  const mpi::Communicator& node = s.node;
  long long mine[2] = {static_cast<long long>(getpid()),
                       static_cast<long long>(reinterpret_cast<std::uintptr_t>(cma_probe_word()))};
  std::vector<long long> peers(2 * static_cast<std::size_t>(node.size()));
  mpi::check(MPI_Allgather(mine, 2, MPI_LONG_LONG, peers.data(), 2, MPI_LONG_LONG, node.get()),
             "MPI_Allgather");
  const int next = (node.rank() + 1) % node.size();
  int cma_ok = node.size() < 2 || cma_probe(peers[2 * next], peers[2 * next + 1]) ? 1 : 0;
  mpi::check(MPI_Allreduce(MPI_IN_PLACE, &cma_ok, 1, MPI_INT, MPI_MIN, s.world.get()), "MPI_Allreduce");
  set_cma_allowed(cma_ok != 0);
}

/// The Runtime ends (or its start-up failed): no watcher, no checks, no duplicates of the world.
void stop_comm() {
  stop_collective_watch();
  set_collective_guard(false, 0);
  close_watchdog_comm();
}

/// guarded_main's failure: announce it to the other ranks (and join their next exchange with a
/// failure mark), then wait for them to fail too.
bool fail_comm(const std::exception_ptr& err) {
  mark_failure_for_exit(err);
  return wait_for_every_rank_to_fail(abort_grace_seconds());
}

}  // namespace

void register_comm_runtime_hooks() {
  RuntimeHooks hooks;
  hooks.layer = "comm";
  hooks.setting_words = kSettings;
  hooks.read_settings = read_comm_settings;
  hooks.start = start_comm;
  hooks.agree_at_end = agree_at_end_of_program;
  hooks.stop = stop_comm;
  hooks.fail_program = fail_comm;
  register_runtime_hooks(hooks);
}

}  // namespace shard::detail
