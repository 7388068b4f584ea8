#include "shard/train/data.hpp"

#include <string>

#include "shard/error.hpp"

namespace shard::data {

std::uint64_t splitmix64(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

std::vector<std::int64_t> random_window_offsets(std::uint64_t seed, std::int64_t step, std::int64_t batch,
                                                std::int64_t n, std::int64_t context) {
  if (context < 1 || n <= context)
    raise<ValueError>("random_window_offsets: a stream of ", n, " tokens holds no window of ", context,
                      " tokens and its next-token targets (it needs at least ", context + 1, ")");
  if (batch < 0 || step < 0) raise<ValueError>("random_window_offsets: batch ", batch, " and step ", step, " must be >= 0");
  const std::uint64_t base = splitmix64(seed);
  const auto span = static_cast<std::uint64_t>(n - context);
  std::vector<std::int64_t> out(static_cast<std::size_t>(batch));
  for (std::int64_t i = 0; i < batch; ++i) {
    const std::uint64_t c = base + static_cast<std::uint64_t>(step) * static_cast<std::uint64_t>(batch) +
                            static_cast<std::uint64_t>(i);
    out[static_cast<std::size_t>(i)] = static_cast<std::int64_t>(splitmix64(c) % span);
  }
  return out;
}

std::pair<ShardedArray<std::int32_t>, ShardedArray<std::int32_t>> token_windows(
    const std::vector<std::uint8_t>& tokens, const std::vector<std::int64_t>& offsets, std::int64_t context,
    const NamedSharding& s) {
  const auto n = static_cast<std::int64_t>(tokens.size());
  for (std::size_t i = 0; i < offsets.size(); ++i)
    if (offsets[i] < 0 || offsets[i] + context + 1 > n)
      raise<ValueError>("token_windows: window ", i, " at offset ", offsets[i], " of ", context + 1,
                        " tokens runs past the stream of ", n, " tokens");
  const Shape shape{static_cast<std::int64_t>(offsets.size()), context};
  auto make = [&](std::int64_t shift) {
    return generate<std::int32_t>(shape, s, [&, shift](const Box& b) {
      Tensor<std::int32_t> t(b.extent);
      std::int32_t* out = t.data();
      for (std::int64_t r = 0; r < b.extent[0]; ++r) {
        const std::uint8_t* src = tokens.data() + offsets[static_cast<std::size_t>(b.offset[0] + r)] + b.offset[1] + shift;
        for (std::int64_t c = 0; c < b.extent[1]; ++c) *out++ = src[c];
      }
      return t;
    });
  };
  return {make(0), make(1)};
}

}  // namespace shard::data
