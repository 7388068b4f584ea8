#include "common/cli.hpp"

#include <cstdio>
#include <iostream>
#include <sstream>

#include "shard/error.hpp"

namespace shard::apps {

void add_common_options(po::options_description& options) {
  options.add_options()("help,h", "print this help and exit")(
      "devices-per-rank", po::value<int>(),
      "logical devices per MPI rank (default: env SHARD_DEVICES_PER_RANK, else 1)");
}

bool parse_command_line(int argc, char** argv, const po::options_description& options, po::variables_map& vm,
                        const Runtime& rt, const std::string& usage) {
  try {
    po::store(po::parse_command_line(argc, argv, options), vm);
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

std::vector<std::int64_t> parse_int_list(const std::string& text, const std::string& flag, const std::string& example,
                                         std::int64_t min) {
  std::vector<std::int64_t> out;
  std::stringstream ss(text);
  for (std::string t; std::getline(ss, t, ',');) {
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(t, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (t.empty() || used != t.size() || v < min)
      raise<ValueError>("bad --", flag, " '", text, "': write sizes like ", example);
    out.push_back(v);
  }
  return out;
}

void print0(const Runtime& rt, const std::string& text) {
  if (rt.process_index() != 0) return;
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace shard::apps
