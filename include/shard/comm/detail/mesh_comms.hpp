#pragma once
/// \file The per-axis-set communicator cache of a Mesh (comm layer internals).

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "shard/comm/group_shared.hpp"
#include "shard/mpi/communicator.hpp"
#include "shard/sharding/mesh.hpp"

namespace shard::detail {

/// The devices that differ only along a list of mesh axes form a group. For a collective,
/// each group's devices are ordered by their row-major index over those axes (in the order
/// the axes were named: JAX's axis_index of a tuple); the group's ranks are ordered by their
/// first device in that order.
struct DeviceGroup {
  int id = 0;                ///< row-major index over the other axes
  std::vector<int> devices;  ///< device ids in axis-index order
  std::vector<int> ranks;    ///< distinct owning ranks, by first device
  mpi::Communicator comm;    ///< over `ranks` in that order; null if it is only this rank
};

class MeshComms {
 public:
  MeshComms(std::vector<int> shape, std::vector<int> devices, Topology topology);
  /// Frees the windows and the cached handles (BLACS grids) while MPI is still active.
  ~MeshComms();
  MeshComms(const MeshComms&) = delete;
  MeshComms& operator=(const MeshComms&) = delete;

  /// The groups over `axes` (mesh axis positions, major to minor) that contain a device of
  /// this rank, in group-id order. The first call for an axis list is collective over the
  /// ranks of those groups (MPI_Comm_create_group, in group-id order on every rank, so it
  /// cannot deadlock); later calls return the cached groups.
  const std::vector<DeviceGroup>& groups(const std::vector<int>& axes);

  /// The group of all the mesh's devices, on a communicator of its own over every rank that
  /// holds one (null when that is only this rank): where the consistency check and the
  /// watchdog's arrival messages run. Collective over those ranks on first use; not counted
  /// in communicators_created().
  const DeviceGroup& guard_group();
  /// Whether guard_group's communicator exists yet (creating it waits for every rank).
  bool guard_group_built() {
    std::lock_guard lock(mutex_);
    return guard_built_;
  }
  /// Whether the mesh's devices are spread over all `world_size` ranks (then the consistency
  /// check runs on the world). No communication.
  bool spans_world(int world_size) const { return ranks_ == world_size; }
  /// The next number of the per-mesh collective sequence (consistency check and watchdog).
  long next_sequence() { return ++sequence_; }

  /// Whether group-shared memory over `axes` is available (group_shared.hpp): collective over
  /// the mesh's ranks on first call (one MPI_Allreduce on guard_group's communicator), cached.
  bool groups_share_node(const std::vector<int>& axes);
  /// The window `name` with `bytes` per slot over the group (over `axes`) of this rank's one
  /// device, created on first use (collective over that group; the slot sizes must agree)
  /// and cached. Requires groups_share_node(axes).
  SharedWindow& shared_window(const std::vector<int>& axes, const std::string& name, std::size_t bytes);
  /// MPI_Win_sync on every window over `axes` (no communication): before and after the
  /// barrier of a group-shared buffer, so one barrier orders the writes to all of them.
  void sync_windows(const std::vector<int>& axes);
  /// Number of shared-memory windows created so far (for tests of the cache).
  int windows_created() const { return static_cast<int>(windows_.size()); }

  /// Number of MPI communicators created so far (for tests of the cache).
  int communicators_created() const { return created_; }

  /// A handle that a later layer builds over the mesh's ranks and keeps as long as the mesh
  /// (linalg's BLACS grids), cached by `kind` and `key`. The first call for a (kind, key) runs
  /// `create` (collective as that layer says) and caches its result; the destructor passes
  /// each cached handle to its `release` while MPI is still active.
  int cached_handle(const std::string& kind, std::pair<int, int> key, const std::function<int()>& create,
                    void (*release)(int));
  /// Number of handles of `kind` created so far (for tests of the caches).
  int handles_created(const std::string& kind) const;

  /// The BLACS context of the process grid keyed by (mesh axis of the grid's process rows,
  /// mesh axis of its process columns): a cached_handle of kind "blacs". The first call for a
  /// key runs `create` (collective over all ranks; it returns -1 on ranks outside the grid);
  /// the grid is freed (Cblacs_gridexit) with the mesh. Defined in the linalg layer, which
  /// owns BLACS (src/linalg/blacs_context.cpp).
  int blacs_context(std::pair<int, int> key, const std::function<int()>& create);
  /// Number of BLACS grids created so far (for tests of the cache).
  int blacs_grids_created() const { return handles_created("blacs"); }

 private:
  std::vector<int> shape_;
  std::vector<int> devices_;
  Topology topology_;
  int ranks_ = 0;  // distinct ranks owning a device of the mesh
  mutable std::mutex mutex_;
  std::vector<DeviceGroup> build_groups(const std::vector<int>& axes, bool count);

  std::map<std::vector<int>, std::vector<DeviceGroup>> cache_;
  std::vector<DeviceGroup> guard_;  // empty until first use; then the one group (see guard_group)
  bool guard_built_ = false;
  long sequence_ = 0;
  int created_ = 0;
  std::map<std::vector<int>, bool> share_node_;
  std::map<std::tuple<std::vector<int>, std::string, std::size_t>, std::unique_ptr<SharedWindow>> windows_;
  struct Handle {
    int value;
    void (*release)(int);
  };
  std::map<std::pair<std::string, std::pair<int, int>>, Handle> handles_;  // (kind, key) -> handle
};

}  // namespace shard::detail
