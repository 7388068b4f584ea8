#include "common/cli.hpp"

#include <chrono>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <thread>

#include "shard/error.hpp"

namespace shard::apps {

int run_app(int argc, char** argv, const std::function<int(Runtime&)>& body, RuntimeOptions options) {
  return guarded_main(
      argc, argv,
      [&](Runtime& rt) {
        // Made while every rank is here, so the wait below never mixes with the app's collectives.
        MPI_Comm errors = MPI_COMM_NULL;
        if (MPI_Comm_dup(rt.world().get(), &errors) != MPI_SUCCESS)
          raise<RuntimeError>("run_app: MPI_Comm_dup failed");
        struct Free {
          MPI_Comm& comm;
          ~Free() { MPI_Comm_free(&comm); }
        } free_errors{errors};
        try {
          return body(rt);
        } catch (const std::exception& e) {
          const auto* se = dynamic_cast<const Error*>(&e);
          std::fprintf(stderr, "%serror: %s\n", detail::rank_prefix().c_str(), se ? se->message().c_str() : e.what());
          std::fflush(stderr);
          MPI_Request all_failed = MPI_REQUEST_NULL;
          int done = 0;
          if (MPI_Ibarrier(errors, &all_failed) == MPI_SUCCESS) {
            const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
            while (MPI_Test(&all_failed, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done &&
                   std::chrono::steady_clock::now() < deadline)
              std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
          if (!done) MPI_Abort(MPI_COMM_WORLD, 1);  // some rank is still working: end them all
          return 1;
        }
      },
      options);
}

void add_common_options(po::options_description& options) {
  options.add_options()("help,h", "print this help and exit")(
      "devices-per-rank", po::value<int>(),
      "logical devices per MPI rank (default: env SHARD_DEVICES_PER_RANK, else 1)");
}

bool parse_command_line(int argc, char** argv, const po::options_description& options, po::variables_map& vm,
                        const Runtime& rt, const std::string& usage) {
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
  return true;
}

void print0(const Runtime& rt, const std::string& text) {
  if (rt.process_index() != 0) return;
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace shard::apps
