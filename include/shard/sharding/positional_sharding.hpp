#pragma once
/// \file PositionalSharding: an N-D array whose elements are sets of devices, reshaped and
/// reduced with replicate() as in JAX's "Distributed arrays and automatic parallelization"
/// tutorial. Converts to a NamedSharding. Metadata only, no communication.

#include <string>
#include <vector>

#include "shard/core/device.hpp"
#include "shard/sharding/named_sharding.hpp"

namespace shard {

class PositionalSharding {
 public:
  /// A 1-D sharding over the devices in the given order, on the Runtime's topology.
  explicit PositionalSharding(std::vector<int> device_ids);
  /// The same on an explicit topology.
  PositionalSharding(std::vector<int> device_ids, Topology topology);
  /// The mesh's device array (its shape and order).
  static PositionalSharding from_mesh(const Mesh& mesh);

  const std::vector<int>& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  /// Device sets in row-major order; each set is sorted.
  const std::vector<std::vector<int>>& device_sets() const { return sets_; }

  /// Same elements in a new shape (one entry may be -1); sizes must match.
  PositionalSharding reshape(std::vector<int> shape) const;
  /// Set union along `axis` (all axes when axis is kAllAxes); keepdims=true keeps it as size 1.
  PositionalSharding replicate(int axis = kAllAxes, bool keepdims = true) const;
  /// Permutes the axes (reverses them when perm is empty), like numpy's transpose.
  PositionalSharding transpose(std::vector<int> perm = {}) const;

  /// A NamedSharding with the same device → box map: mesh axes 'p0', 'p1', ... of this
  /// sharding's shape plus a minor 'replica' axis when sets hold several devices; the spec
  /// maps array dim i to 'pi' (None where the sharding has size 1). Throws ShardingError if
  /// the sets are not disjoint or differ in size.
  NamedSharding to_named() const;
  /// The same for an array of `rank` dims: an array of lower rank than the sharding takes its
  /// trailing dims (a 1-D bias under sharding.replicate(0) of a 4x2 sharding splits like the
  /// columns of a matrix there), the leading ones replicate; device_put and reshard of a
  /// PositionalSharding use this.
  NamedSharding to_named(int rank) const;
  operator NamedSharding() const { return to_named(); }  // NOLINT: converts like JAX's Sharding

  /// "PositionalSharding([[{CPU 0} {CPU 1}] [{CPU 2} {CPU 3}]])".
  std::string to_string() const;

  static constexpr int kAllAxes = -1000;

 private:
  PositionalSharding(std::vector<int> shape, std::vector<std::vector<int>> sets, Topology topology);

  std::vector<int> shape_;
  std::vector<std::vector<int>> sets_;
  Topology topology_;
};

}  // namespace shard
