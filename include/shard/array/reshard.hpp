#pragma once
/// \file reshard: any NamedSharding to any other over the same set of devices (the same mesh,
/// or another mesh over those devices in any shape or order), moving the fewest bytes (JAX's
/// with_sharding_constraint / device_put of a committed array).

#include <algorithm>
#include <cstdint>
#include <string>
#include <source_location>
#include <vector>

#include "shard/error.hpp"  // shard::source_location
#include "shard/core/dtype.hpp"
#include "shard/core/primitive.hpp"
#include "shard/core/trace.hpp"
#include "shard/core/tree.hpp"
#include "shard/array/sharded_array.hpp"

namespace shard {

/// How a reshard runs, computed from metadata alone (identical on every rank).
struct ReshardPlan {
  enum class Kind {
    kNone,       ///< same sharding: a copy of the local shards
    kLocal,      ///< every device's new box lies in its old one: local slices
    kAllGather,  ///< a mesh axis stops splitting a dim: all_gather over that axis
    kAllToAll,   ///< a mesh axis moves from one dim to another: all_to_all over that axis
    kGeneral,    ///< anything else: one MPI_Alltoallv of the box intersections
  };
  Kind kind = Kind::kNone;
  Shape shape;
  std::string dtype;
  std::string from, to;            ///< the two specs, printed
  std::string axis;                ///< the mesh axis of kAllGather / kAllToAll
  int dim = -1;                    ///< gathered dim, or all_to_all's concat dim (the axis leaves it)
  int dim2 = -1;                   ///< all_to_all's split dim (the axis joins it)
  std::vector<std::int64_t> bytes_sent;  ///< per rank, what it hands to MPI for other ranks
  std::int64_t pieces = 0;         ///< kGeneral: box intersections moved between ranks
  /// Across meshes: the source layout spelled on the target mesh (equivalent_sharding), when
  /// it has such a spelling: the plan above then starts from it, and no data moved to get there.
  std::string translated;

  std::int64_t total_bytes() const;
  /// A short explanation, e.g. "P('a', None) -> P(None, 'a'): all_to_all over 'a' (split
  /// dim 1, concat dim 0); 4194304 bytes sent per rank".
  std::string to_string() const;
};

/// Metadata only: the plan reshard(x, to) would follow for an array of `shape` and element
/// size `elem_size` sharded as `from`. Throws MeshMismatchError if the meshes hold different
/// sets of devices.
ReshardPlan plan_reshard(const Shape& shape, const NamedSharding& from, const NamedSharding& to,
                         std::size_t elem_size, const std::string& dtype = "");

/// Metadata only: the plan reshard(x, to) would follow.
template <typename T>
ReshardPlan reshard_plan(const ShardedArray<T>& x, const NamedSharding& to) {
  return plan_reshard(x.shape(), x.sharding(), to, sizeof(T), dtype_name<T>());
}

/// Collective over all ranks: x with sharding `to` (any mesh over x's devices), following reshard_plan.
/// Peak extra memory per rank: its new shards plus one send and one receive buffer.
template <typename T>
ShardedArray<T> reshard(const ShardedArray<T>& x, const NamedSharding& to, shard::source_location where = shard::source_location::current());

namespace prim {

/// reshard as a primitive of the op driver: moves x to the sharding `to` (no move, local
/// slices, an all_gather, an all_to_all or the general exchange, as the cached plan says). VJP:
/// the cotangent as it comes, which the operand's node reshards back to the operand's sharding.
struct Reshard : Primitive {
  static constexpr bool kernel_validates = true;
  static constexpr bool any_input_layout = true;  ///< jit: its operand may come in any layout
  /// Shared, not pointed to: jit keeps the primitive in its program.
  std::shared_ptr<const NamedSharding> to;
  const char* name() const { return "reshard"; }
  std::string params_text() const { return "to: " + to->spec().to_string(); }
  /// One block holds the whole array: nothing moves.
  template <Dtype T>
  Tensor<T> kernel(const Tensor<T>& x) const {
    return x;
  }
  template <Dtype T>
  ShardedArray<T> sharded(const ShardedArray<T>& x) const;
  template <typename X>
  detail::KernelVjp<X, X> vjp(const VjpNeed&, const X&, const X&) const {
    return [](const X& ct, const VjpNeed&) { return cotangents<X>(ct.alias()); };
  }
  /// Batching: `to` for the example's dims; the batch dim keeps its own sharding (a mesh axis
  /// the batch is split over: vmap's spmd_axis_name) unless `to` uses that axis.
  template <Dtype T>
  BatchOut<Tensor<T>> batch(const shard::source_location&, std::int64_t, const BatchArg<Tensor<T>>& a) const {
    return {a.x.alias(), a.bdim};
  }
  template <Dtype T>
  BatchOut<ShardedArray<T>> batch(const shard::source_location& where, std::int64_t,
                                  const BatchArg<ShardedArray<T>>& a) const {
    std::vector<SpecEntry> e = to->spec().entries();
    if (static_cast<int>(e.size()) < a.bdim) e.resize(static_cast<std::size_t>(a.bdim));
    SpecEntry keep;
    if (a.bdim < a.x.spec().size() && to->mesh() == a.x.mesh()) {
      keep = a.x.spec()[a.bdim];
      const auto used = to->spec().axes();
      for (const auto& ax : keep.axes())
        if (std::find(used.begin(), used.end(), ax) != used.end()) keep = SpecEntry();
    }
    e.insert(e.begin() + a.bdim, keep);
    return {reshard(a.x, NamedSharding(to->mesh(), PartitionSpec(std::move(e))), where), a.bdim};
  }
};

}  // namespace prim

/// JAX's name for the same operation.
template <typename T>
ShardedArray<T> with_sharding_constraint(const ShardedArray<T>& x, const NamedSharding& to, shard::source_location where = shard::source_location::current()) {
  return reshard(x, to, where);
}

/// jax.device_put of an array that is already placed: a reshard.
template <typename T>
ShardedArray<T> device_put(const ShardedArray<T>& x, const NamedSharding& to, shard::source_location where = shard::source_location::current()) {
  return reshard(x, to, where);
}
template <typename T>
ShardedArray<T> device_put(const ShardedArray<T>& x, const PositionalSharding& to, shard::source_location where = shard::source_location::current()) {
  const detail::CallScope scope("device_put", where);
  return reshard(x, to.to_named(x.ndim()), where);
}

/// jax.device_put(tree, sharding): every leaf of a parameter tree (shard/core/tree.hpp; host
/// Tensors or ShardedArrays) placed with `to` (a spec that fits each leaf's rank). Containers
/// and tuples of Tensors become the same containers of ShardedArrays; a SHARD_TREE struct keeps
/// its members' types (so its leaves must already be ShardedArrays: a reshard of each).
template <typename Tree>
  requires(!ArrayLike<Tree>)
auto device_put(const Tree& tree, const NamedSharding& to, shard::source_location where = shard::source_location::current()) {
  const detail::CallScope scope("device_put", where);
  return tree_map([&](const auto& leaf) { return device_put(leaf, to, where); }, tree);
}

/// reshard / with_sharding_constraint to a PositionalSharding, converted for x's rank.
template <typename T>
ShardedArray<T> reshard(const ShardedArray<T>& x, const PositionalSharding& to, shard::source_location where = shard::source_location::current()) {
  const detail::CallScope scope("reshard", where);
  return reshard(x, to.to_named(x.ndim()), where);
}
template <typename T>
ShardedArray<T> with_sharding_constraint(const ShardedArray<T>& x, const PositionalSharding& to) {
  return reshard(x, to.to_named(x.ndim()));
}

namespace detail {
/// Throws MeshMismatchError naming both device lists unless the meshes are equal (same
/// devices in the same order, same axis names), as JAX does for incompatible devices.
void check_same_mesh(const Mesh& a, const Mesh& b, const std::string& what);
/// Throws MeshMismatchError naming both device sets unless the meshes hold the same devices
/// (in any shape or order): what every op needs to combine arrays.
void check_same_devices(const Mesh& a, const Mesh& b, const std::string& what);
}  // namespace detail

#define SHARD_DECLARE_RESHARD(T) \
  extern template ShardedArray<T> reshard<T>(const ShardedArray<T>&, const NamedSharding&, shard::source_location);
SHARD_FOR_EACH_DTYPE(SHARD_DECLARE_RESHARD)
#undef SHARD_DECLARE_RESHARD

}  // namespace shard
