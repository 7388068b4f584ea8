#include "common/parse.hpp"

#include <exception>
#include <sstream>

#include "shard/error.hpp"

namespace shard::apps {

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

}  // namespace shard::apps
