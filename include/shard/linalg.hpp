#pragma once
/// \file Distributed matrix products on 2-D block layouts (layer 6).

#include <string>

#include "shard/sharded_array.hpp"

namespace shard::linalg {

enum class Algorithm { kAuto, kCannon, kSumma, kScaLAPACK };

struct CannonOptions {
  /// Row panels each block product is split into, with MPI_Testall between them so the
  /// shift of the next blocks progresses during the product (Open MPI has no progress
  /// thread). 0: choose from the block size.
  int panels = 0;
};

/// Cannon's algorithm for C = A @ B with A and B sharded P(r, c) on mesh axes r and c of
/// equal size q (taken from A's spec; B is resharded to P(r, c) if needed); C is P(r, c).
/// Collective over all ranks. The skew and the q-1 shifts move blocks device to device
/// (memory copies between devices of one rank, MPI_Isend/Irecv otherwise); the next shift is
/// posted before the current block product, which runs in panels with MPI_Testall between
/// them. Uneven sizes are padded internally with zeros (the result is unchanged).
template <typename T>
ShardedArray<T> cannon(const ShardedArray<T>& a, const ShardedArray<T>& b, CannonOptions options = {});

}  // namespace shard::linalg
