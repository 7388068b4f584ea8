// libFuzzer target: shard::io::parse_npy_header on arbitrary bytes. A shard::Error is the
// expected answer to bad input; anything else (a crash, a sanitizer report, another
// exception) is a bug.
#include <cstdint>
#include <string>

#include "shard/error.hpp"
#include "shard/io/io.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    const shard::io::NpyHeader h = shard::io::parse_npy_header(bytes, "fuzz.npy");
    (void)h;
  } catch (const shard::Error&) {
  }
  return 0;
}
