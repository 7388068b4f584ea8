#include "common/cli.hpp"

#include <chrono>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <thread>

#include "shard/error.hpp"

namespace shard::apps {

int run_app(int argc, char** argv, const std::function<int(Runtime&)>& body, RuntimeOptions options) {
  return guarded_main(argc, argv, body, options);
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
