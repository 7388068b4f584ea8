#pragma once
/// \file The ways shard::matmul (ops/matmul.hpp) can multiply: its sharding rules, or one of
/// linalg's distributed algorithms.

#include <string>

namespace shard {

/// How matmul multiplies: kAuto picks by the operands' layouts (ops/matmul.hpp); kRules forces the sharding
/// rules; kCannon, kSumma and kScaLAPACK force linalg::cannon, linalg::summa, scalapack_matmul.
enum class Algorithm { kAuto, kRules, kCannon, kSumma, kScaLAPACK };

/// "auto", "rules", "cannon", "summa", "scalapack".
std::string algorithm_name(Algorithm algorithm);
/// The inverse of algorithm_name; ValueError naming the choices otherwise.
Algorithm parse_algorithm(const std::string& name);

}  // namespace shard
