#pragma once
/// \file Distributed matrix products on 2-D block layouts (layer 6).

#include <cstdint>
#include <string>

#include "shard/linalg/algorithm.hpp"
#include "shard/array/sharded_array.hpp"

namespace shard::linalg {

using shard::Algorithm;  // matmul(a, b, Algorithm::kCannon) etc. (algorithm.hpp; matmul itself is in ops/matmul.hpp)

struct CannonOptions {
  /// Row panels each block product is split into, with MPI_Testall between them so the
  /// shift of the next blocks progresses during the product (Open MPI has no progress
  /// thread). 0: choose from the block size.
  int panels = 0;
  /// false: wait for each shift right after posting it, before the product (the same
  /// transfers, unhidden: what the overlap saves is the difference).
  bool overlap = true;
};

/// Cannon's algorithm for C = A @ B with A and B sharded P(r, c) on mesh axes r and c of
/// equal size q (taken from A's spec; B is resharded to P(r, c) if needed); C is P(r, c).
/// Batched: A[.., M, K] sharded P(.., r, c) (leading dims over other mesh axes or None) with
/// B[K, N] (P(r, c)) or B[.., K, N] (A's spec); C[.., M, N] has A's spec.
/// Collective over all ranks. The skew and the q-1 shifts move blocks device to device
/// (memory copies between devices of one rank, MPI_Isend/Irecv otherwise); the next shift is
/// posted before the current block product, which runs in panels with MPI_Testall between
/// them. Uneven sizes are padded internally with zeros (the result is unchanged).
template <typename T>
ShardedArray<T> cannon(const ShardedArray<T>& a, const ShardedArray<T>& b, CannonOptions options = {});

struct SummaOptions {
  /// Width of the K panels broadcast per step (clipped to block boundaries). 0: 256.
  std::int64_t panel = 0;
  /// false: wait for each panel's broadcasts right after posting them (see CannonOptions).
  bool overlap = true;
};

/// SUMMA for C = A @ B on any p x q pair of mesh axes (r, c) (taken from A's spec P(r, c);
/// B is resharded to P(r, c) if needed); C is P(r, c). Collective over all ranks. For each
/// K panel, the device column holding A's panel broadcasts it along its mesh row and the
/// device row holding B's panel along its mesh column (MPI_Ibcast on the mesh's cached
/// row / column communicators, devices of one rank share one copy); the next panel's
/// broadcasts are posted before the current update C += A_panel @ B_panel.
template <typename T>
ShardedArray<T> summa(const ShardedArray<T>& a, const ShardedArray<T>& b, SummaOptions options = {});

}  // namespace shard::linalg
