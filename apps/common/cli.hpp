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

/// Adds --help and --devices-per-rank (read by the Runtime itself) to `options`.
void add_common_options(po::options_description& options);

/// Parses argv into `vm`. A bad flag or value throws shard::ValueError (every rank parses the
/// same argv, so every rank throws). Returns false after printing the help on rank 0 when
/// --help was given: the app should then return 0.
bool parse_command_line(int argc, char** argv, const po::options_description& options, po::variables_map& vm,
                        const Runtime& rt, const std::string& usage);


/// Prints on rank 0 only.
void print0(const Runtime& rt, const std::string& text);

}  // namespace shard::apps
