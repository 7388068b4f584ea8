#pragma once
// Collectives through group-shared memory (collective_shared.cpp): when a group's ranks share a
// node with one device each, psum / pmean and a psum_scatter over dim 0 go through an MPI-3
// shared window instead of MPI's transfers. Used by collective_exec.cpp only.

#include <cstddef>
#include <source_location>

#include "shard/error.hpp"  // shard::source_location
#include "shard/comm/detail/collective.hpp"
#include "shard/comm/group_shared.hpp"
#include "shard/core/tensor.hpp"

namespace shard::detail {

/// Blocks of at least this many bytes go through group-shared memory when the group allows it.
inline constexpr std::size_t kSharedReduceMin = std::size_t{64} << 10;
/// ... and a psum / pmean at most this many: above it MPI_Allreduce was faster. Measured with
/// `mpirun -n 2 collectives_bench --collectives psum,psum_scatter` (float64, 2 ranks on one node,
/// 2026-11-28; shard/raw with SHARD_SHARED_REDUCE=1 vs =0 in alternating runs): psum through the
/// window 1.10-1.26x MPI's time at 2-16 MiB and level with it at 64 KiB-1 MiB; psum_scatter
/// through the window 0.60-0.89x from 256 KiB to 64 MiB, so it has no upper bound.
inline constexpr std::size_t kSharedPsumMax = std::size_t{1} << 20;

/// Whether a block of `bytes` of collective kind `kind` goes through the window (given
/// use_shared_memory): the same on every rank of a group, whose blocks have the same size.
inline bool shared_pays(CollectiveKind kind, std::size_t bytes) {
  return bytes >= kSharedReduceMin && (kind != CollectiveKind::kReduce || bytes <= kSharedPsumMax);
}

/// SHARD_SHARED_REDUCE=0 turns the group-shared collectives off (the Runtime sets this, agreed
/// over the ranks: off if any rank asked).
void set_shared_reduce(bool on);
/// False under SHARD_SHARED_REDUCE=0: no transfer between ranks of a node bypasses MPI.
bool shared_memory_allowed();

/// Whether collective `s` may go through group-shared memory (see the definition). Collective
/// over the mesh's ranks the first time for s.axes.
bool use_shared_memory(const Mesh& mesh, const CollectiveSpec& s, bool is_bool);

/// The window for the next collective through group-shared memory on s.axes (`advance` false:
/// the one the next collective will use, without taking it).
SharedWindow& next_shared_window(const Mesh& mesh, const CollectiveSpec& s, std::size_t bytes, bool advance = true);
/// Drops the turn counters of next_shared_window for a MeshComms that is being destroyed.
void forget_shared_calls(const void* comms);

template <typename T>
T* window_slot(const SharedWindow& w, int slot) {
  return reinterpret_cast<T*>(w.base + static_cast<std::size_t>(slot) * w.bytes);
}

/// psum of acc over the group, in place.
template <typename T>
void shared_reduce(const Mesh& mesh, const CollectiveSpec& s, Tensor<T>& acc, const shard::source_location& where);

/// psum_scatter over dim 0 of acc into out (this rank's chunk, at group position pos).
template <typename T>
void shared_psum_scatter(const Mesh& mesh, const CollectiveSpec& s, int pos, const Tensor<T>& acc, Tensor<T>& out,
                         const shard::source_location& where);

}  // namespace shard::detail
