#pragma once
/// \file Runtime: the RAII MPI environment, logical devices per rank and hosts.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "shard/core/device.hpp"
#include "shard/core/memory.hpp"  // set_keep_freed_memory, keep_freed_memory
#include "shard/mpi/communicator.hpp"

namespace shard {

namespace detail {
class DeviceExecutor;
}

struct RuntimeOptions {
  /// Devices per rank; 0 means: the `--devices-per-rank` flag, else env
  /// SHARD_DEVICES_PER_RANK, else 1.
  int devices_per_rank = 0;
  /// Keep freed memory in the process instead of handing it back to the OS (glibc: no mmap
  /// for large blocks, no trimming; Shard: up to 16 freed tensor buffers >= 16 KiB, 1 GiB in
  /// all, reused at exactly their size), so the large temporary buffers of MPI collectives
  /// and of Shard are not page-faulted in again on every call and keep their addresses. Env
  /// SHARD_KEEP_FREED_MEMORY=0 turns it off. Measured here: a 64 MiB MPI_Reduce_scatter on 2 ranks took 19 ms
  /// instead of 51.
  bool keep_freed_memory = true;
};

/// Whether a Runtime with RuntimeOptions::keep_freed_memory = true switches the policy on:
/// env SHARD_KEEP_FREED_MEMORY (1/0, on/off, true/false, yes/no; default on). RuntimeError
/// naming the variable and its value when it is none of these.
bool keep_freed_memory_from_env();

/// The process-wide runtime: initialises MPI (thread level funneled or better) unless it is
/// already initialised, sets MPI_ERRORS_RETURN, discovers hosts and owns the device list.
/// Exactly one may be alive at a time. Constructing it is collective over MPI_COMM_WORLD.
/// Destroying it while an exception is in flight aborts the whole job (so one rank's failure
/// never leaves the others waiting in a collective); otherwise it finalises MPI if it
/// initialised it.
class Runtime {
 public:
  Runtime(int& argc, char**& argv, RuntimeOptions options = {});
  explicit Runtime(RuntimeOptions options = {});
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  /// The live runtime; throws RuntimeError if none exists.
  static Runtime& current();
  static bool exists();

  int process_index() const { return topology_.process_index; }
  int process_count() const { return topology_.process_count; }
  int devices_per_rank() const { return topology_.devices_per_rank; }
  int device_count() const { return topology_.device_count(); }
  int node_count() const;
  std::vector<Device> devices() const { return topology_.devices(); }
  std::vector<Device> local_devices() const { return topology_.local_devices(); }
  const Topology& topology() const { return topology_; }
  /// This runtime's duplicate of MPI_COMM_WORLD (all ranks).
  const mpi::Communicator& world() const { return world_; }
  /// The MPI thread level MPI provided.
  int thread_level() const { return thread_level_; }
  /// The executor that runs shard_map bodies on this rank's device threads.
  detail::DeviceExecutor& executor();

 private:
  void init(int* argc, char*** argv, RuntimeOptions options);

  Topology topology_;
  mpi::Communicator world_;
  int thread_level_ = 0;
  bool owns_mpi_ = false;
  int uncaught_at_start_ = 0;
  std::unique_ptr<detail::DeviceExecutor> executor_;
};

/// Runs `body` under a Runtime and turns anything that escapes it (any exception, also one
/// that is not a std::exception) into "[rank r] error: ..." on stderr and exit code 1, so no
/// rank ever waits for a failed one: the failing rank announces its error to the others (a
/// rank waiting in a collective under SHARD_CHECK_COLLECTIVES or the watchdog raises it as
/// "rank R failed: ..."), then waits at most SHARD_ABORT_GRACE seconds (default 5) for every
/// rank to fail too -- then every rank has printed its line and they all exit 1 -- and
/// otherwise ends the job with MPI_Abort. Returns body's result. The standard main() of every
/// Shard app.
int guarded_main(int argc, char** argv, const std::function<int(Runtime&)>& body,
                 RuntimeOptions options = {});

/// Prints "[rank r] error: <message>" for `e` to stderr and aborts the job with `code`.
[[noreturn]] void abort_job(const std::exception& e, int code = 1);

}  // namespace shard
