#include "common/cli.hpp"

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <thread>

#include "shard/error.hpp"
#include "shard/mpi/agree.hpp"
#include "shard/mpi/communicator.hpp"
#include "shard/runtime/profiler.hpp"

namespace shard::apps {

namespace {
std::string g_trace_path;
bool g_trace_written = false;
}  // namespace

const std::string& trace_path() { return g_trace_path; }

void finish_trace(const Runtime& rt) {
  if (g_trace_path.empty() || g_trace_written) return;
  g_trace_written = true;
  const shard::TraceSummary summary = shard::stop_trace(g_trace_path);
  if (rt.process_index() == 0)  // stderr: --json output stays one JSON object per line
    std::fprintf(stderr,
                 "timeline of %d ranks written to %s (Chrome-trace JSON: ui.perfetto.dev, chrome://tracing); "
                 "where each rank's traced time went:\n%s",
                 rt.process_count(), g_trace_path.c_str(), summary.to_string().c_str());
}

void TracedSteps::before(std::int64_t done) const {
  if (!g_trace_path.empty() && !g_trace_written && done == 1) shard::start_trace();  // drops the first step
}

void TracedSteps::after(std::int64_t done) const {
  if (done == 1 + steps_) finish_trace(rt_);
}

int run_app(int argc, char** argv, const std::function<int(Runtime&)>& body, RuntimeOptions options) {
  return guarded_main(
      argc, argv,
      [&](Runtime& rt) {
        const int rc = body(rt);
        if (rc == 0) finish_trace(rt);
        return rc;
      },
      options);
}

void add_common_options(po::options_description& options) {
  options.add_options()("help,h", "print this help and exit")(
      "devices-per-rank", po::value<int>(),
      "logical devices per MPI rank (default: env SHARD_DEVICES_PER_RANK, else 1)")(
      "trace", po::value<std::string>(),
      "write a timeline of every rank (ops, products, collectives, waits) to this file as Chrome-trace JSON "
      "(ui.perfetto.dev, chrome://tracing)");
}

namespace {
/// Every rank must run with the same flags (mpirun's MPMD form, or a wrapper script that differs
/// per rank, could give them others: replicated parameters would then differ between the ranks,
/// silently). Collective: ValueError on every rank naming rank 0's flags and this rank's.
void agree_on_command_line(int argc, char** argv, const Runtime& rt) {
  std::string line;
  for (int i = 1; i < argc; ++i) line += (i > 1 ? " " : "") + std::string(argv[i]);
  std::uint64_t h = 1469598103934665603ULL;
  for (const unsigned char c : line) h = (h ^ c) * 1099511628211ULL;
  const auto mine = static_cast<std::int64_t>(h >> 1);
  const mpi::Communicator& world = rt.world();
  const std::int64_t root = world.broadcast<std::int64_t>(mine, 0);
  // The lowest rank whose flags differ from rank 0's tells every rank.
  mpi::agreed(world, [&] {
    if (mine != root)
      raise<ValueError>("rank ", world.rank(), " was started with other flags than rank 0: '", line,
                        "'; every rank must run with the same command line");
  });
}
}  // namespace

bool parse_command_line(int argc, char** argv, const po::options_description& options, po::variables_map& vm,
                        const Runtime& rt, const std::string& usage) {
  agree_on_command_line(argc, argv, rt);
  try {
    // No positional arguments: a stray word (a flag without its dashes, a value after a flag
    // that takes none) is an error, not silently ignored.
    const po::positional_options_description none;
    po::store(po::command_line_parser(argc, argv).options(options).positional(none).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    raise<ValueError>("bad command line: ", e.what(), "; run with --help for the options");
  }
  if (vm.count("help")) {
    std::ostringstream os;
    os << usage << "\n\n" << options << "\n";
    print0(rt, os.str());
    return false;
  }
  if (vm.count("trace")) {
    g_trace_path = vm["trace"].as<std::string>();
    if (g_trace_path.empty()) raise<ValueError>("--trace needs a file name");
    g_trace_written = false;
    // Rank 0 writes the file at the end: find out now (on every rank) whether it can.
    mpi::agreed(rt.world(), [&] {
      if (rt.process_index() != 0) return;
      std::FILE* f = std::fopen(g_trace_path.c_str(), "w");
      if (f == nullptr)
        raise<IoError>("--trace ", g_trace_path, ": cannot write the timeline there: ", std::strerror(errno));
      std::fclose(f);
    });
    shard::start_trace();
  }
  return true;
}

void prepare_directory(const Runtime& rt, const std::string& dir, const std::string& flag) {
  mpi::agreed(rt.world(), [&] {
    if (rt.process_index() != 0) return;
    std::error_code ec;
    const std::filesystem::path p(dir);
    if (std::filesystem::exists(p, ec) && !std::filesystem::is_directory(p, ec))
      raise<IoError>("--", flag, " ", dir, " is not a directory");
    if (std::filesystem::create_directories(p, ec); ec)
      raise<IoError>("--", flag, " ", dir, ": cannot create the directory: ", ec.message());
  });
}

void print0(const Runtime& rt, const std::string& text) {
  if (rt.process_index() != 0) return;
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace shard::apps
