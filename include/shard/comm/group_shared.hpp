#pragma once
/// \file Group-shared memory: one slot per device of an axis group whose ranks share a node,
/// which every device of the group can read in place (an MPI-3 shared-memory window,
/// MPI_Win_allocate_shared, on the group's communicator).
///
/// What it is for: work that the devices of a group split between them on data they all read,
/// with no collective in between. For example a data-parallel step on one node: the replicas
/// write their rows of each layer's activations into their slots (stacked, the slots are the
/// whole batch), and after one barrier each computes its own rows of the summed weight
/// gradient from all of them, and updates them in place in one copy of the parameters that the
/// group shares (Tensor::borrow): no gradient is ever summed or copied through MPI.
///
/// Availability (group_shared_available): every device of the mesh on its own rank, and all
/// of each group's ranks on one node (MPI_Comm_split_type SHARED); a group of one device always
/// qualifies (its memory is its own). Otherwise use the collectives; DeviceContext::group_shared
/// raises ShardingError when it is not available.
///
/// Layout: the slots are back to back in one segment (slot(i) == stacked() + i * count()), so
/// the group's slots also form one array of size() * count() elements, e.g. the rows of every
/// replica's batch as one matrix that a single gemm reads.
///
/// Windows are created on first use (collective over the group) and cached on the mesh by
/// (axes, name, bytes per slot); they are freed with the mesh, so a mesh that used one must be
/// destroyed at the same point of the program on every rank (as any SPMD object). A barrier
/// of any buffer over `axes` orders the writes to all of them (MPI_Win_sync on each).

#include <mpi.h>

#include <cstdint>
#include <source_location>
#include <stdexcept>
#include <string>
#include <vector>

#include "shard/error.hpp"  // shard::source_location
#include "shard/sharding/mesh.hpp"
#include "shard/sharding/partition_spec.hpp"

namespace shard {

namespace detail {
/// One cached window: a slot of `bytes` per device of this rank's group, by axis index, back
/// to back in the segment of the group's first rank.
struct SharedWindow {
  MPI_Win win = MPI_WIN_NULL;
  char* base = nullptr;  ///< slot 0; slot i starts i * bytes after it
  int size = 0;          ///< devices in the group
  int index = 0;
  std::size_t bytes = 0;
  std::vector<int> axes;
  std::string axes_text;
};
/// MPI_Win_sync, a barrier of the window's group (under SHARD_CHECK_COLLECTIVES and
/// SHARD_COLLECTIVE_TIMEOUT like any collective), MPI_Win_sync.
void shared_window_barrier(const Mesh& mesh, const SharedWindow& w, const std::string& name,
                           const shard::source_location& where);
}  // namespace detail

/// Collective over the mesh's ranks (cached): whether group-shared memory over `axes` is
/// available (see the top of this file). The answer is the same on every rank.
bool group_shared_available(const Mesh& mesh, const SpecEntry& axes);

/// A view of one group-shared buffer from one device (cheap to copy; the memory lives as long
/// as the mesh).
template <typename T>
class GroupShared {
 public:
  GroupShared(const Mesh& mesh, detail::SharedWindow* w, std::string name)
      : mesh_(&mesh), w_(w), name_(std::move(name)) {}

  /// Devices in the group (N) and this device's axis index.
  int size() const { return w_->size; }
  int index() const { return w_->index; }
  /// Elements per slot.
  std::int64_t count() const { return static_cast<std::int64_t>(w_->bytes / sizeof(T)); }
  /// This device's slot (write it between barriers; the others read it after the next one).
  T* mine() const { return stacked() + static_cast<std::int64_t>(w_->index) * count(); }
  /// The slot of the device with axis index i.
  const T* slot(int i) const {
    if (i < 0 || i >= size()) throw std::out_of_range("GroupShared::slot: no device " + std::to_string(i) + " in the group");
    return stacked() + static_cast<std::int64_t>(i) * count();
  }

  /// Every slot as one writable array: size() * count() elements, slot i at i * count().
  T* stacked() const { return reinterpret_cast<T*>(w_->base); }

  /// Collective over the group: every device's writes before it are visible to every device
  /// after it. Between two barriers, an element that one device writes is neither read nor
  /// written by another (e.g. each writes its own slot, or its own rows of stacked()).
  void barrier(shard::source_location where = shard::source_location::current()) const {
    detail::shared_window_barrier(*mesh_, *w_, name_, where);
  }

 private:
  const Mesh* mesh_;
  detail::SharedWindow* w_;
  std::string name_;
};

}  // namespace shard
