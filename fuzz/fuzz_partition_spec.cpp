// libFuzzer target: PartitionSpec::parse ("P('data', None)", "('a','b'), None", ...), and the
// parsed spec printed and parsed again (the round trip must give the same spec).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "shard/error.hpp"
#include "shard/sharding/partition_spec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const shard::PartitionSpec p = shard::PartitionSpec::parse(text);
    if (!(shard::PartitionSpec::parse(p.to_string()) == p)) std::abort();
  } catch (const shard::Error&) {
  }
  return 0;
}
