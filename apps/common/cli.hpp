#pragma once
// Command-line handling shared by the apps (Boost.Program_options).

#include <boost/program_options.hpp>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/parse.hpp"
#include "shard/runtime/runtime.hpp"

namespace shard::apps {

namespace po = boost::program_options;

/// shard::guarded_main for the apps: an exception escaping `body` prints "[rank r] error:
/// <message>" on stderr on the rank it escaped from; bad command lines and Shard's usage errors
/// fail on every rank, so every rank prints its line and they all exit with code 1. If some rank
/// does not fail in time (SHARD_ABORT_GRACE), the job is aborted (MPI_Abort): it never hangs and
/// never exits 0 after an error.
int run_app(int argc, char** argv, const std::function<int(Runtime&)>& body, RuntimeOptions options = {});

/// Adds --help, --devices-per-rank (read by the Runtime itself) and --trace FILE to `options`.
void add_common_options(po::options_description& options);

/// --trace FILE: parse_command_line starts recording the timeline (shard::start_trace) and
/// run_app writes it when the body returns (shard::stop_trace). An app that times a loop restarts
/// the recording where its steady state begins (shard::start_trace clears it) and ends it with
/// finish_trace(), which writes the file and prints where. Empty when --trace was not given.
const std::string& trace_path();
/// Writes the timeline to trace_path() (collective; nothing when it is empty or already written).
void finish_trace(const Runtime& rt);

/// --trace in a training loop: the timeline keeps `steps` steps after the first (whose planning
/// and first-touch allocations are not the steady state), then is written. Call before() and
/// after() around each step with the number of steps done so far in this run.
class TracedSteps {
 public:
  TracedSteps(const Runtime& rt, std::int64_t steps) : rt_(rt), steps_(steps) {}
  void before(std::int64_t done) const;
  void after(std::int64_t done) const;

 private:
  const Runtime& rt_;
  std::int64_t steps_;
};

/// Parses argv into `vm`. A bad flag or value throws shard::ValueError (every rank parses the
/// same argv, so every rank throws; ranks started with different flags raise a ValueError on
/// every rank too). Returns false after printing the help on rank 0 when
/// --help was given: the app should then return 0.
bool parse_command_line(int argc, char** argv, const po::options_description& options, po::variables_map& vm,
                        const Runtime& rt, const std::string& usage);

/// Collective: rank 0 makes sure `dir` (--<flag>) is a directory, creating it, before any work
/// that would write there (a checkpoint directory that is a file used to fail after training).
void prepare_directory(const Runtime& rt, const std::string& dir, const std::string& flag);

/// Prints on rank 0 only.
void print0(const Runtime& rt, const std::string& text);

}  // namespace shard::apps
