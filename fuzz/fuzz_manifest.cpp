// libFuzzer target: a checkpoint's manifest.json (the JSON parser and the manifest's checks),
// and the integer metadata accessor on whatever parsed.
#include <cstdint>
#include <string>

#include "shard/io/checkpoint.hpp"
#include "shard/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const shard::CheckpointManifest m = shard::detail::parse_manifest_text(text, "fuzz/manifest.json");
    for (const auto& [key, value] : m.metadata) {
      try {
        (void)m.integer(key);
      } catch (const shard::Error&) {
      }
    }
  } catch (const shard::Error&) {
  }
  return 0;
}
