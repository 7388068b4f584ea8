#pragma once
// Redistribution of box pieces (array layer internals): builds an array sharded as `to` from
// source pieces that devices hold, each device receiving exactly the intersections of its
// box with pieces it does not hold (from a holder on its own rank when there is one). One
// MPI_Alltoallv of the packed intersections, skipped on every rank when the plan moves
// nothing between ranks. The general reshard, slicing and concatenation are this with
// different pieces and copy functions.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "shard/array/sharded_array.hpp"

namespace shard::detail {

/// A piece of the result, in the result's coordinates, that `device` can produce; `source`
/// tags which input it comes from (e.g. the operand of a concatenation). Every rank lists
/// the pieces of every device, in the same order.
struct SourcePiece {
  int device = 0;
  int source = 0;
  Box box;
};

/// One transfer of the plan: `box` (result coordinates) from `src` (a piece's holder) to `dst`.
struct Transfer {
  int src;
  int dst;
  int source;
  Box box;
};

/// The plan: for each target device's box and each distinct piece box meeting it, one holder
/// (the target itself, else a device on its rank, else the holders taken in turn). Target
/// devices whose box another device of the same rank already receives get nothing here:
/// they copy it locally afterwards.
std::vector<Transfer> plan_transfers(const Shape& shape, const NamedSharding& to, const std::vector<SourcePiece>& pieces);

/// Per rank: the bytes it sends to other ranks under `plan`.
std::vector<std::int64_t> transfer_bytes(const std::vector<Transfer>& plan, const Topology& topo, std::size_t elem_size);

/// Copies `box` (result coordinates) of what `device` holds of input `source` into the
/// contiguous row-major buffer `out` (box.size() elements).
template <typename T>
using FetchPiece = std::function<void(int device, int source, const Box& box, T* out)>;

/// Collective over all ranks (a no-op for communication when the plan keeps every transfer
/// on its rank): the array of `shape` sharded as `to`, assembled by the plan. `name` is
/// CommStats' kind for the bytes sent.
/// `zero_fill`: elements no piece covers are zero (otherwise the pieces must cover the array).
template <typename T>
ShardedArray<T> redistribute(const Shape& shape, const NamedSharding& to, const std::vector<SourcePiece>& pieces,
                             const FetchPiece<T>& fetch, const std::string& name, bool zero_fill = false);

}  // namespace shard::detail
