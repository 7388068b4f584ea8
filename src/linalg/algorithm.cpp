// The names of matmul's algorithms (linalg/algorithm.hpp).

#include "shard/linalg/algorithm.hpp"

#include <utility>

#include "shard/error.hpp"

namespace shard {

namespace {

constexpr std::pair<Algorithm, const char*> kNames[] = {{Algorithm::kAuto, "auto"},
                                                        {Algorithm::kRules, "rules"},
                                                        {Algorithm::kCannon, "cannon"},
                                                        {Algorithm::kSumma, "summa"},
                                                        {Algorithm::kScaLAPACK, "scalapack"}};

}  // namespace

std::string algorithm_name(Algorithm algorithm) {
  for (const auto& [a, name] : kNames)
    if (a == algorithm) return name;
  return "unknown";
}

Algorithm parse_algorithm(const std::string& name) {
  for (const auto& [a, n] : kNames)
    if (name == n) return a;
  raise<ValueError>("unknown matmul algorithm '", name, "'; choose auto, rules, cannon, summa or scalapack");
}

}  // namespace shard
