#pragma once
// The checkpoint manifest's format (manifest.cpp): its parser and the name rule it shares with
// CheckpointWriter. Pure string code, no MPI: fuzzed by fuzz/fuzz_manifest.cpp.

#include <cstddef>
#include <string>

#include "shard/io/checkpoint.hpp"

namespace shard::detail {

inline constexpr const char* kManifestFormat = "shard-checkpoint";

/// Letters, digits, '_', '-', '.', not starting with '.': a name that can only mean a file
/// directly inside the checkpoint directory. Array names leave room for ".npy" in NAME_MAX.
bool is_plain_name(const std::string& s, std::size_t max_size = 255);

}  // namespace shard::detail
