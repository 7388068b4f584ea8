#pragma once
/// \file Group-shared memory: one slot per device of an axis group whose ranks share a node,
/// which every device of the group can read in place (an MPI-3 shared-memory window,
/// MPI_Win_allocate_shared, on the group's communicator).
///
/// What it is for: a reduction fused with the code that consumes it. A data-parallel
/// optimizer step writes each replica's gradient into its own slot, calls barrier(), and then
/// every replica sums the slots for the rows it owns while it updates them (no psum, no
/// copy through MPI), writes the new rows into another group-shared buffer, and after a second
/// barrier() reads the other replicas' rows straight from their slots. On one node this moves
/// half the bytes of a psum_scatter + all_gather and none of them through MPI's copies.
///
/// Availability (group_shared_available): every device of the mesh on its own rank and, for
/// the groups over `axes`, more than one device and all of the group's ranks on one node
/// (MPI_Comm_split_type SHARED). Otherwise use the collectives; DeviceContext::group_shared
/// raises ShardingError when it is not available.
///
/// Layout: the slots are back to back in one segment (slot(i) == stacked() + i * count()), so
/// the group's slots also form one array of size() * count() elements, e.g. the rows of every
/// replica's batch as one matrix that a single gemm reads.
///
/// Windows are created on first use (collective over the group) and cached on the mesh by
/// (axes, name, elements); they are freed with the mesh, so a mesh that used one must be
/// destroyed at the same point of the program on every rank (as any SPMD object). A barrier
/// of any buffer over `axes` orders the writes to all of them (MPI_Win_sync on each).

#include <mpi.h>

#include <cstdint>
#include <source_location>
#include <string>
#include <vector>

#include "shard/mesh.hpp"
#include "shard/partition_spec.hpp"

namespace shard {

namespace detail {
struct CollectiveSpec;
/// One cached window: a slot of `bytes` per device of this rank's group, by axis index, back
/// to back in the segment of the group's first rank.
struct SharedWindow {
  MPI_Win win = MPI_WIN_NULL;
  std::vector<void*> slots;
  int index = 0;
  std::size_t bytes = 0;
  std::vector<int> axes;
  std::string axes_text;
};
/// MPI_Win_sync, a barrier of the window's group (under SHARD_CHECK_COLLECTIVES and
/// SHARD_COLLECTIVE_TIMEOUT like any collective), MPI_Win_sync.
void shared_window_barrier(const Mesh& mesh, const SharedWindow& w, const std::string& name,
                           const std::source_location& where);
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
  int size() const { return static_cast<int>(w_->slots.size()); }
  int index() const { return w_->index; }
  /// Elements per slot.
  std::int64_t count() const { return static_cast<std::int64_t>(w_->bytes / sizeof(T)); }
  /// This device's slot (write it between barriers; the others read it after the next one).
  T* mine() const { return static_cast<T*>(w_->slots[static_cast<std::size_t>(w_->index)]); }
  /// The slot of the device with axis index i.
  const T* slot(int i) const { return static_cast<const T*>(w_->slots.at(static_cast<std::size_t>(i))); }

  /// Every slot as one writable array: size() * count() elements, slot i at i * count().
  T* stacked() const { return static_cast<T*>(w_->slots.front()); }

  /// Collective over the group: every device's writes before it are visible to every device
  /// after it. Between two barriers, an element that one device writes is neither read nor
  /// written by another (e.g. each writes its own slot, or its own rows of stacked()).
  void barrier(std::source_location where = std::source_location::current()) const {
    detail::shared_window_barrier(*mesh_, *w_, name_, where);
  }

 private:
  const Mesh* mesh_;
  detail::SharedWindow* w_;
  std::string name_;
};

}  // namespace shard
