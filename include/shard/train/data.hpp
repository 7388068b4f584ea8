#pragma once
/// \file Data loading for language models: windows of a token stream as sharded batches, each
/// device building only its own block (as a tf.data / grain pipeline sharded by process would).
///
///   // given: Mesh mesh = make_mesh({rt.device_count(), 1}, {"data", "model"});
///   // given: std::vector<std::uint8_t> tokens; std::uint64_t seed = 0; std::int64_t step = 0, batch = 8, context = 64;
///   auto offsets = data::random_window_offsets(seed, step, batch, tokens.size(), context);
///   auto [x, y] = data::token_windows(tokens, offsets, context, NamedSharding(mesh, P("data", "model")));
///
/// x[i] = tokens[offsets[i] : offsets[i] + T], y[i] the same shifted by one (the next-token
/// targets). Every rank holds the same host stream; a device reads only the rows and columns
/// of its box, so nothing is communicated and no rank builds the whole batch.

#include <cstdint>
#include <utility>
#include <vector>

#include "shard/sharding/named_sharding.hpp"
#include "shard/array/sharded_array.hpp"

namespace shard::data {

/// splitmix64 (Steele, Lea and Flood): a 64-bit mixing function, the same on every platform,
/// so a host program in any language can reproduce the batches.
std::uint64_t splitmix64(std::uint64_t z);

/// Offsets of a batch of random windows of length `context` + 1 in a stream of `n` tokens:
/// row i of step s starts at splitmix64(splitmix64(seed) + s * batch + i) mod (n - context)
/// (uint64 arithmetic). The same on every rank; ValueError if n <= context.
std::vector<std::int64_t> random_window_offsets(std::uint64_t seed, std::int64_t step, std::int64_t batch,
                                                std::int64_t n, std::int64_t context);

/// Inputs and next-token targets of the windows starting at `offsets`, both int32 of shape
/// (offsets.size(), context) laid out by `s` (e.g. P('data') or P('data', 'model') for
/// sequence parallelism). Local: each device copies only its box. ValueError if a window
/// runs past the stream.
std::pair<ShardedArray<std::int32_t>, ShardedArray<std::int32_t>> token_windows(
    const std::vector<std::uint8_t>& tokens, const std::vector<std::int64_t>& offsets, std::int64_t context,
    const NamedSharding& s);

}  // namespace shard::data
