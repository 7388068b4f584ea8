#pragma once
// Helpers shared by the sharded op files (internal): result shardings, lining operands up,
// assembling arrays from per-device blocks, and the collective that combines partial results.

#include <optional>
#include <vector>

#include "shard/comm/detail/collective.hpp"
#include "shard/ops/ops.hpp"

namespace shard::detail {

/// What the result-sharding rule needs of an operand.
struct OperandLayout {
  const NamedSharding* sharding;
  const Shape* shape;
  bool committed;
};
template <typename T>
OperandLayout layout_of(const ShardedArray<T>& x) {
  return {&x.sharding(), &x.shape(), x.committed()};
}

/// The result sharding of an elementwise op over `operands` (the rule in ops.hpp).
NamedSharding result_sharding(const std::vector<OperandLayout>& operands, const Shape& out_shape);

/// The sharding an operand of `shape` needs so that each device's block lines up with its
/// block of a result sharded as `out` with shape `out_shape` (None on broadcast dims).
NamedSharding matching_sharding(const NamedSharding& out, const Shape& out_shape, const Shape& shape);

/// x itself when it already has sharding `want` (no copy), else its reshard, kept in `keep`.
template <typename T>
const ShardedArray<T>& lined_up(const ShardedArray<T>& x, const NamedSharding& want,
                                std::optional<ShardedArray<T>>& keep) {
  if (x.sharding() == want) return x;
  return keep.emplace(reshard(x, want));
}

/// An array from one block per local device of `sharding`'s mesh (local mesh order).
template <typename T>
ShardedArray<T> assemble(const Shape& shape, const NamedSharding& sharding, std::vector<Tensor<T>> blocks) {
  const auto local = sharding.mesh().local_device_ids();
  std::vector<Shard<T>> shards;
  for (std::size_t i = 0; i < local.size(); ++i)
    shards.push_back(Shard<T>{local[i], sharding.box(local[i], shape), std::move(blocks[i])});
  return ShardedArray<T>(shape, sharding, std::move(shards));
}

/// The mesh axes that split any of `dims`, in mesh order.
SpecEntry axes_of_dims(const NamedSharding& s, const std::vector<int>& dims);

/// Collective over the devices that differ along `axes` (local when axes is None): combines
/// per-device partial blocks with `op` and assembles the result sharded as `out`.
template <typename T>
ShardedArray<T> combine_over(std::vector<Tensor<T>> partial, const SpecEntry& axes, ReduceKind op,
                             const NamedSharding& out, const Shape& out_shape) {
  if (axes.is_none()) return assemble(out_shape, out, std::move(partial));
  std::vector<Tensor<T>> outs;
  CollectiveSpec spec = reduce_spec(out.mesh(), op, axes, out.shard_shape(out_shape));
  spec.dtype = dtype_name<T>();
  execute_collective<T>(out.mesh(), spec, out.mesh().local_device_ids(), partial, outs);
  return assemble(out_shape, out, std::move(outs));
}

}  // namespace shard::detail
