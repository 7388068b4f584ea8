// libFuzzer target: the apps' integer-list flags (--layers 784,1024,10, --sizes, --mesh 2x2
// style lists go through parse_int_list).
#include <cstdint>
#include <string>

#include "common/parse.hpp"
#include "shard/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto v = shard::apps::parse_int_list(text, "layers", "784,1024,10", 1);
    for (const auto x : v)
      if (x < 1) __builtin_trap();  // below the minimum it was asked to enforce
  } catch (const shard::Error&) {
  }
  return 0;
}
