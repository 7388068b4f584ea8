#include "shard/runtime/runtime.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <set>
#include <stdexcept>
#include <string>

#include "comm/collective_cma.hpp"
#include "comm/collective_shared.hpp"
#include "shard/comm/detail/collective_guard.hpp"
#include "shard/core/blas.hpp"
#include "shard/error.hpp"
#include "shard/runtime/detail/device_executor.hpp"
#include "shard/runtime/detail/env.hpp"

namespace shard {

namespace {

Runtime* g_current = nullptr;

int parse_positive(const std::string& text, const char* source) {
  return static_cast<int>(
      detail::parse_integer(text, detail::cat("devices per rank from ", source), 1, 4096));
}

/// Devices per rank: the option, else `--devices-per-rank` in argv, else the environment.
int devices_per_rank_from(const RuntimeOptions& options, int argc, char** argv) {
  if (options.devices_per_rank > 0) return options.devices_per_rank;
  if (options.devices_per_rank < 0)
    raise<RuntimeError>("RuntimeOptions::devices_per_rank must be >= 0, got ", options.devices_per_rank);
  const std::string flag = "--devices-per-rank";
  for (int i = 1; argv && i < argc; ++i) {
    const std::string a = argv[i];
    if (a == flag) {
      if (i + 1 >= argc) raise<RuntimeError>("--devices-per-rank needs a value");
      return parse_positive(argv[i + 1], "--devices-per-rank");
    }
    if (a.rfind(flag + "=", 0) == 0) return parse_positive(a.substr(flag.size() + 1), "--devices-per-rank");
  }
  return static_cast<int>(detail::env_integer("SHARD_DEVICES_PER_RANK", 1, 4096).value_or(1));
}

}  // namespace

bool keep_freed_memory_from_env() { return detail::env_flag("SHARD_KEEP_FREED_MEMORY").value_or(true); }

Runtime::Runtime(int& argc, char**& argv, RuntimeOptions options) { init(&argc, &argv, options); }
Runtime::Runtime(RuntimeOptions options) { init(nullptr, nullptr, options); }

void Runtime::init(int* argc, char*** argv, RuntimeOptions options) {
  if (g_current) raise<RuntimeError>("a shard::Runtime already exists; create exactly one per process");
  uncaught_at_start_ = std::uncaught_exceptions();
  // Read before MPI starts (its buffers follow the policy); a bad value is raised once MPI is up.
  std::string keep_error;
  bool keep = options.keep_freed_memory;
  try {
    keep = keep && keep_freed_memory_from_env();
  } catch (const Error& e) {
    keep_error = e.message();
  }
  if (keep) set_keep_freed_memory(true);
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) {
    MPI_Query_thread(&thread_level_);
  } else {
    mpi::check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &thread_level_), "MPI_Init_thread");
    owns_mpi_ = true;
  }
  g_current = this;  // from here on the destructor cleans up, even if init throws below
  try {
    // One barrier under the handler MPI_COMM_WORLD has now (MPI_ERRORS_ARE_FATAL unless the
    // caller changed it) before errors become return codes: ranks that cannot reach each other
    // (e.g. hosts joined only by a shared-memory BTL) end the job here with Open MPI's
    // "unable to reach each other" message. Open MPI 4.1's communicator creation, reached
    // first otherwise, spins forever on that error instead of returning it.
    mpi::check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    world_ = mpi::Communicator::attach(MPI_COMM_WORLD).dup();
    if (thread_level_ < MPI_THREAD_FUNNELED)
      raise<RuntimeError>("MPI provides thread level ", thread_level_,
                          " but Shard needs MPI_THREAD_FUNNELED or better");
    topology_.process_index = world_.rank();
    detail::remember_world_rank(topology_.process_index);
    topology_.process_count = world_.size();

    // Devices per rank: a local decision that every rank must agree on.
    int k = 0;
    std::string local_error;
    try {
      k = devices_per_rank_from(options, argc ? *argc : 0, argv ? *argv : nullptr);
    } catch (const Error& e) {
      local_error = e.message();
    }
    const int kmin = world_.allreduce(local_error.empty() ? k : 0, MPI_MIN);
    const int kmax = world_.allreduce(local_error.empty() ? k : 0, MPI_MAX);
    if (!local_error.empty()) raise<RuntimeError>(local_error);
    if (kmin != kmax)
      raise<RuntimeError>(
          kmin == 0 ? "another rank has an invalid devices-per-rank setting"
                    : "ranks disagree on devices per rank (between " + std::to_string(kmin) + " and " +
                          std::to_string(kmax) +
                          "); pass the same --devices-per-rank or SHARD_DEVICES_PER_RANK to all ranks");
    topology_.devices_per_rank = k;

    // The environment's settings that change which MPI calls a collective makes (checking, the
    // watchdog, group-shared memory) must be the same on every rank: the most checking, the
    // longest timeout and grace any rank asked for, shared memory off if any rank turned it off.
    bool check = false, shared_reduce = true;
    double timeout = -1, grace = 5.0;
    std::string env_error;
    try {
      detail::configure_collective_guard_from_env(check, timeout);
      grace = detail::env_seconds("SHARD_ABORT_GRACE", 1e6).value_or(5.0);
      shared_reduce = detail::env_flag("SHARD_SHARED_REDUCE").value_or(true);
    } catch (const Error& e) {
      env_error = e.message();
    }
    if (!keep_error.empty()) env_error = keep_error;
    long long env[5] = {check ? 1 : 0, static_cast<long long>(timeout * 1000.0 + 0.5),
                        static_cast<long long>(grace * 1000.0 + 0.5), shared_reduce ? 0 : 1,
                        env_error.empty() ? 0 : 1};
    mpi::check(MPI_Allreduce(MPI_IN_PLACE, env, 5, MPI_LONG_LONG, MPI_MAX, world_.get()), "MPI_Allreduce");
    if (!env_error.empty()) raise<RuntimeError>(env_error);
    if (env[4])
      raise<RuntimeError>("another rank has an invalid SHARD_* environment variable (see its error)");
    // Timeout: unset on every rank (-1) is the watcher thread's default; 0 turns both off.
    detail::set_collective_guard(env[0] != 0, static_cast<double>(env[1]) / 1000.0);
    if (env[1] < 0) detail::start_collective_watch(detail::kDefaultCollectiveTimeout);
    detail::set_abort_grace_seconds(static_cast<double>(env[2]) / 1000.0);
    detail::set_shared_reduce(env[3] == 0);
    detail::open_watchdog_comm(world_);
    // Device threads call OpenBLAS at the same time: one OpenBLAS thread per call (DESIGN.md).
    if (k > 1) set_blas_threads(1);

    // Hosts: processor names, and a dense node id per shared-memory domain.
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int len = 0;
    mpi::check(MPI_Get_processor_name(name, &len), "MPI_Get_processor_name");
    std::vector<char> names(static_cast<std::size_t>(MPI_MAX_PROCESSOR_NAME) * process_count());
    mpi::check(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME,
                             MPI_CHAR, world_.get()),
               "MPI_Allgather");
    for (int p = 0; p < process_count(); ++p)
      topology_.host_of_process.emplace_back(&names[static_cast<std::size_t>(p) * MPI_MAX_PROCESSOR_NAME]);

    const mpi::Communicator node = world_.split_shared();
    const int leader = node.allreduce(process_index(), MPI_MIN);
    std::vector<int> leaders(process_count());
    mpi::check(MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, world_.get()), "MPI_Allgather");
    std::vector<int> unique = leaders;
    std::sort(unique.begin(), unique.end());
    unique.erase(std::unique(unique.begin(), unique.end()), unique.end());
    for (int p = 0; p < process_count(); ++p)
      topology_.node_of_process.push_back(
          static_cast<int>(std::lower_bound(unique.begin(), unique.end(), leaders[p]) - unique.begin()));

    // Whether a rank may read another rank's memory on its node (process_vm_readv; containers
    // may forbid it): each reads a word of the next rank of its node; the world agrees.
    long long mine[2] = {static_cast<long long>(getpid()),
                         static_cast<long long>(reinterpret_cast<std::uintptr_t>(detail::cma_probe_word()))};
    std::vector<long long> peers(2 * static_cast<std::size_t>(node.size()));
    mpi::check(MPI_Allgather(mine, 2, MPI_LONG_LONG, peers.data(), 2, MPI_LONG_LONG, node.get()),
               "MPI_Allgather");
    const int next = (node.rank() + 1) % node.size();
    int cma_ok = node.size() < 2 || detail::cma_probe(peers[2 * next], peers[2 * next + 1]) ? 1 : 0;
    mpi::check(MPI_Allreduce(MPI_IN_PLACE, &cma_ok, 1, MPI_INT, MPI_MIN, world_.get()), "MPI_Allreduce");
    detail::set_cma_allowed(cma_ok != 0);
  } catch (...) {
    g_current = nullptr;
    detail::stop_collective_watch();
    detail::close_watchdog_comm();
    world_ = mpi::Communicator();
    throw;
  }
}

Runtime::~Runtime() {
  if (std::uncaught_exceptions() > uncaught_at_start_) {
    std::fprintf(stderr, "%sShard runtime destroyed during stack unwinding: aborting the job\n",
                 detail::rank_prefix().c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  // Every rank must be here, not in a collective (a rank that skipped one would leave the
  // others waiting forever): with the check on, one exchange tells.
  const bool agreed = std::uncaught_exceptions() > uncaught_at_start_ || detail::agree_at_end_of_program();
  executor_.reset();
  detail::stop_collective_watch();
  detail::set_collective_guard(false, 0);
  detail::close_watchdog_comm();
  world_ = mpi::Communicator();
  detail::remember_world_rank(-1);
  g_current = nullptr;
  if (owns_mpi_ && mpi::is_active()) MPI_Finalize();
  if (!agreed) std::exit(1);
}

Runtime& Runtime::current() {
  if (!g_current) raise<RuntimeError>("no shard::Runtime exists; create one at the start of main()");
  return *g_current;
}

detail::DeviceExecutor& Runtime::executor() {
  if (!executor_) executor_ = std::make_unique<detail::DeviceExecutor>();
  return *executor_;
}

bool Runtime::exists() { return g_current != nullptr; }

int Runtime::node_count() const {
  return topology_.node_of_process.empty()
             ? 1
             : *std::max_element(topology_.node_of_process.begin(), topology_.node_of_process.end()) + 1;
}

void abort_job(const std::exception& e, int code) {
  const auto* se = dynamic_cast<const Error*>(&e);
  const std::string msg = se ? se->message() : std::string(e.what());
  std::fprintf(stderr, "%serror: %s\n", detail::rank_prefix().c_str(), msg.c_str());
  std::fflush(stderr);
  if (mpi::is_active()) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

namespace {

/// An error escaped the program on this rank: print its line, announce it to the other ranks,
/// and wait (at most SHARD_ABORT_GRACE s) until every rank has failed too. Returns 1 then, so
/// every rank exits 1 after printing its own line (none is lost to another's MPI_Abort);
/// aborts the job if some rank is still working.
int fail_job(const std::exception_ptr& err) {
  const std::string msg = detail::error_message(
      err, "the program threw an exception that is not a std::exception (e.g. throw 42)");
  std::fprintf(stderr, "%serror: %s\n", detail::rank_prefix().c_str(), msg.c_str());
  std::fflush(stderr);
  if (!mpi::is_active()) std::exit(1);
  detail::mark_failure_for_exit(err);
  if (!detail::wait_for_every_rank_to_fail(detail::abort_grace_seconds())) MPI_Abort(MPI_COMM_WORLD, 1);
  return 1;
}

/// The Runtime failed to start: print the line; settings are agreed there, so usually every
/// rank fails: wait (at most 5 s) for all on MPI_COMM_WORLD, then finalize and exit 1 on every
/// rank, or abort the job if some rank started.
[[noreturn]] void fail_start(const std::exception_ptr& err) {
  const std::string msg = detail::error_message(
      err, "an exception that is not a std::exception escaped while starting the runtime");
  std::fprintf(stderr, "%serror: %s\n", detail::rank_prefix().c_str(), msg.c_str());
  std::fflush(stderr);
  if (!mpi::is_active()) std::exit(1);
  if (!detail::wait_for_every_rank_to_fail(5.0, MPI_COMM_WORLD)) MPI_Abort(MPI_COMM_WORLD, 1);
  MPI_Finalize();
  std::exit(1);
}

}  // namespace

int guarded_main(int argc, char** argv, const std::function<int(Runtime&)>& body, RuntimeOptions options) {
  int rc = 0;
  try {
    Runtime rt(argc, argv, options);
    try {
      rc = body(rt);
    } catch (...) {  // also throw 42 or a library's own exception type: still one clear line
      rc = fail_job(std::current_exception());
    }
  } catch (...) {  // the Runtime itself failed to start (a bad flag or environment variable)
    fail_start(std::current_exception());
  }
  return rc;
}

}  // namespace shard
