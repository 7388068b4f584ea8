#pragma once
/// \file NamedSharding(mesh, spec): which box of a global array each mesh device holds.
/// Pure index math, no communication.

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "shard/error.hpp"  // shard::source_location
#include "shard/core/box.hpp"
#include "shard/sharding/mesh.hpp"
#include "shard/sharding/partition_spec.hpp"

namespace shard {

class NamedSharding {
 public:
  /// Validates the spec against the mesh (unknown axis, axis used twice); throws
  /// ShardingError naming the rank, the spec and the mesh axes.
  NamedSharding(Mesh mesh, PartitionSpec spec, shard::source_location where = shard::source_location::current());
  /// An empty sharding (an empty mesh): what a default-constructed ShardedArray holds.
  NamedSharding() = default;

  const Mesh& mesh() const { return mesh_; }
  const PartitionSpec& spec() const { return spec_; }

  /// Throws ShardingError if the spec has more entries than `shape` has dims.
  void check_shape(const Shape& shape) const;
  /// Number of pieces dim `dim` is split into (product of its mesh axes' sizes).
  int num_parts(int dim) const;
  /// Which piece of dim `dim` the device holds (row-major over the entry's axes).
  int part_index(int device_id, int dim) const;
  /// JAX's shard_shape: ceil(n / parts) per dim (the largest shard).
  Shape shard_shape(const Shape& global) const;
  /// The box of the global array that `device_id` holds (uneven rule; may be empty).
  Box box(int device_id, const Shape& global) const;
  /// Mesh axes named by no spec entry: devices differing only along them hold replicas.
  AxisMask replica_axes() const;
  /// Devices holding the same box as `device_id` (itself included), in mesh order.
  std::vector<int> replicas(int device_id) const;
  /// Position of `device_id` among its replicas (0 = the primary copy).
  int replica_index(int device_id) const;
  /// True if every device holds the whole array.
  bool is_fully_replicated() const { return mesh_.axes_size(used_) == 1; }
  /// Devices of the mesh (mesh order) whose replica_index is 0.
  std::vector<int> primary_devices() const;

  /// "NamedSharding(Mesh('a': 4, 'b': 2), P('a', None))".
  std::string to_string() const;
  /// Same mesh (devices, order, names) and same spec.
  bool operator==(const NamedSharding& other) const;

 private:
  Mesh mesh_;
  PartitionSpec spec_;
  std::vector<std::vector<int>> dim_axes_;  // mesh axis positions per spec entry
  AxisMask used_ = 0;
};

/// Metadata only: a sharding on `mesh` that gives every device the same box of an array of
/// `shape` as `s` does (the same layout spelled on another mesh over the same devices), if
/// one exists. How arrays on, e.g., PositionalSharding(...).reshape(4, 2).replicate(1) and
/// .replicate(0) meet without moving anything.
std::optional<NamedSharding> equivalent_sharding(const NamedSharding& s, const Shape& shape, const Mesh& mesh);

/// Where a gradient lands, given its parameter's sharding and shape (autodiff's grad_sharding
/// option; shard::optim::Optimizer::grad_sharding gives the one its update reads best).
using GradSharding = std::function<NamedSharding(const NamedSharding& param, const Shape& shape)>;

}  // namespace shard
