#pragma once
// The apps' parsers of flag values that need no runtime (parse.cpp; fuzzed by fuzz/fuzz_int_list.cpp).

#include <cstdint>
#include <string>
#include <vector>

namespace shard::apps {

/// "784,1024,10" -> {784, 1024, 10}: comma-separated integers, each at least `min`; otherwise
/// ValueError "bad --<flag> '<text>': write sizes like <example>" (the same on every rank).
std::vector<std::int64_t> parse_int_list(const std::string& text, const std::string& flag, const std::string& example,
                                         std::int64_t min);

}  // namespace shard::apps
