#pragma once
/// \file Mesh: an N-D array of device ids with named axes (JAX's jax.sharding.Mesh).
/// Copies are cheap handles to one shared state, which also caches the per-axis
/// sub-communicators (built lazily by the comm layer, once per axis set).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shard/core/device.hpp"
#include "shard/error.hpp"  // shard::source_location

namespace shard {

namespace detail {
class MeshComms;  // per-axis-set communicator cache, defined by the comm layer
}

/// A set of mesh axes as a bit mask over axis positions (bit i = axis i).
using AxisMask = std::uint32_t;

class Mesh {
 public:
  /// An empty mesh: what a default-constructed NamedSharding / ShardedArray holds until an
  /// array is assigned to it. Anything but empty(), to_string() and == raises ValueError.
  Mesh() = default;
  /// A mesh over the given device ids (row-major over `shape`), on the Runtime's topology.
  Mesh(std::vector<int> shape, std::vector<std::string> axis_names, std::vector<int> device_ids);
  /// The same on an explicit topology (single-rank tests, tools that plan for other jobs).
  Mesh(std::vector<int> shape, std::vector<std::string> axis_names, std::vector<int> device_ids,
       Topology topology);

  /// True for a default-constructed (empty) mesh.
  bool empty() const { return state_ == nullptr; }
  int ndim() const;
  const std::vector<int>& shape() const;
  const std::vector<std::string>& axis_names() const;
  /// Device ids in row-major mesh order.
  const std::vector<int>& device_ids() const;
  int size() const;  ///< number of devices
  const Topology& topology() const;

  /// Position of an axis name; throws ShardingError naming the mesh axes if unknown.
  int axis_position(const std::string& name) const;
  bool has_axis(const std::string& name) const;
  int axis_size(const std::string& name) const;
  /// Product of the sizes of the axes in the mask.
  int axes_size(AxisMask axes) const;
  AxisMask mask_of(const std::vector<std::string>& names) const;

  /// Row-major flat position of a device in the mesh, or -1 if it is not in the mesh.
  int flat_index(int device_id) const;
  bool contains(int device_id) const { return flat_index(device_id) >= 0; }
  std::vector<int> coords(int device_id) const;
  int device_at(const std::vector<int>& coords) const;
  /// Mesh devices owned by this process, in mesh order.
  std::vector<int> local_device_ids() const;

  /// "Mesh('a': 4, 'b': 2)".
  std::string to_string() const;
  /// "[0, 1, 2, 3]" — the device list in mesh order.
  std::string devices_string() const;

  /// Same device array (order included) and names.
  bool operator==(const Mesh& other) const;
  bool same_state(const Mesh& other) const { return state_ == other.state_; }

  /// The communicator cache of this mesh (created on first use).
  detail::MeshComms& comms() const;

 private:
  struct State;
  /// The live state equal to `s` (same shape, names, devices, topology) if there is one, else
  /// `s`, remembered: equal meshes share one state and one communicator cache.
  static std::shared_ptr<State> intern(std::shared_ptr<State> s);
  /// The state; ValueError for an empty mesh (a default-constructed array used before assignment).
  const State& st() const;
  std::shared_ptr<State> state_;
};

/// Collective over no one (metadata only): a mesh of all the Runtime's devices with the
/// given shape, ordered so that the devices of one rank, then of one host, are contiguous
/// and so sit on the minor (fastest varying) axes, like JAX's create_hybrid_device_mesh.
Mesh make_mesh(const std::vector<int>& shape, const std::vector<std::string>& axis_names,
               shard::source_location where = shard::source_location::current());
/// The same on an explicit topology.
Mesh make_mesh(const std::vector<int>& shape, const std::vector<std::string>& axis_names,
               const Topology& topology);

}  // namespace shard
