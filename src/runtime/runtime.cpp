#include "shard/runtime/runtime.hpp"

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

#include "shard/core/blas.hpp"
#include "shard/error.hpp"
#include "shard/mpi/agree.hpp"
#include "shard/runtime/detail/device_executor.hpp"
#include "shard/runtime/detail/env.hpp"
#include "shard/runtime/detail/layer_hooks.hpp"

namespace shard {

namespace {

Runtime* g_current = nullptr;

/// std::exit (or a return from main that skips the Runtime's destructor) while the Runtime runs:
/// the other ranks would wait for this one in their next collective, and the library's threads
/// would meet destroyed statics ("terminate called without an active exception"). One clear
/// line, then the whole job ends.
void exit_while_running() {
  if (!g_current) return;  // the Runtime ended before: a clean exit
  std::fflush(stdout);
  std::fprintf(
      stderr,
      "%serror: exit() was called on this rank while the shard::Runtime was running; the other ranks "
      "cannot finish without it, so the job is ended (return from main, or from guarded_main's body, to "
      "end a program)\n",
      detail::rank_prefix().c_str());
  std::fflush(stderr);
  if (mpi::is_active()) MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

/// The library's own exits after it printed the error (not the user's exit() above).
[[noreturn]] void leave(int code) {
  g_current = nullptr;
  std::exit(code);
}

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

std::vector<detail::RuntimeHooks>& registered_hooks() {
  static auto* hooks = new std::vector<detail::RuntimeHooks>;  // never destroyed: read until exit
  return *hooks;
}

/// The layers' stop hooks, the last registered first (the Runtime ends, or its start-up failed).
void stop_layers() {
  const auto& hooks = registered_hooks();
  for (auto it = hooks.rbegin(); it != hooks.rend(); ++it)
    if (it->stop) it->stop();
}

}  // namespace

namespace detail {

void register_runtime_hooks(const RuntimeHooks& hooks) {
  auto& all = registered_hooks();
  for (const auto& h : all)
    if (std::strcmp(h.layer, hooks.layer) == 0) return;
  all.push_back(hooks);
}

const std::vector<RuntimeHooks>& runtime_hooks() { return registered_hooks(); }

}  // namespace detail

bool keep_freed_memory_from_env() { return detail::env_flag("SHARD_KEEP_FREED_MEMORY").value_or(true); }

Runtime::Runtime(int& argc, char**& argv, RuntimeOptions options) { init(&argc, &argv, options); }
Runtime::Runtime(RuntimeOptions options) { init(nullptr, nullptr, options); }

void Runtime::init(int* argc, char*** argv, RuntimeOptions options) {
  if (g_current) raise<RuntimeError>("a shard::Runtime already exists; create exactly one per process");
  detail::install_layer_hooks();  // what the layers above do at the start and the end
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
  static const bool exit_hook = [] { return std::atexit(exit_while_running) == 0; }();
  (void)exit_hook;
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

    // The layers' environment settings (comm: checking, the watchdog, the abort grace,
    // group-shared memory) change which MPI calls a collective makes, so every rank must use the
    // same: one exchange agrees on each setting word (its maximum over the ranks) and on whether
    // some rank has a bad value.
    const auto& hooks = detail::runtime_hooks();
    std::vector<std::int64_t> env;
    std::string env_error;
    for (const auto& h : hooks) {
      const std::size_t at = env.size();
      env.resize(at + static_cast<std::size_t>(h.setting_words), 0);
      if (!h.read_settings || !env_error.empty()) continue;
      try {
        h.read_settings(env.data() + at);
      } catch (const Error& e) {
        env_error = e.message();
      }
    }
    if (!keep_error.empty()) env_error = keep_error;
    env.push_back(env_error.empty() ? 0 : 1);
    mpi::check(MPI_Allreduce(MPI_IN_PLACE, env.data(), static_cast<int>(env.size()), MPI_INT64_T, MPI_MAX,
                             world_.get()),
               "MPI_Allreduce");
    if (!env_error.empty()) raise<RuntimeError>(env_error);
    if (env.back())
      raise<RuntimeError>("another rank has an invalid SHARD_* environment variable (see its error)");
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

    // The layers above start last, with their agreed settings (comm: the collective check and
    // the watchdog, group-shared memory, single-copy reads between the ranks of a node).
    std::size_t at = 0;
    for (const auto& h : hooks) {
      if (h.start) h.start({world_, node, env.data() + at});
      at += static_cast<std::size_t>(h.setting_words);
    }
  } catch (...) {
    g_current = nullptr;
    stop_layers();
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
  // others waiting forever): with comm's collective check on, one exchange tells.
  bool agreed = true;
  if (std::uncaught_exceptions() <= uncaught_at_start_)
    for (const auto& h : detail::runtime_hooks())
      if (h.agree_at_end) agreed = h.agree_at_end() && agreed;
  executor_.reset();
  stop_layers();
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
  leave(code);
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
  if (!mpi::is_active()) leave(1);
  // The layers tell the other ranks and wait for them (comm: at most SHARD_ABORT_GRACE s).
  int waited = 0, every_rank_failed = 0;
  for (const auto& h : detail::runtime_hooks())
    if (h.fail_program) {
      ++waited;
      every_rank_failed += h.fail_program(err) ? 1 : 0;
    }
  if (waited == 0 || every_rank_failed < waited) MPI_Abort(MPI_COMM_WORLD, 1);
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
  if (!mpi::is_active()) leave(1);
  if (!mpi::barrier_within(MPI_COMM_WORLD, 5.0)) MPI_Abort(MPI_COMM_WORLD, 1);
  MPI_Finalize();
  leave(1);
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
