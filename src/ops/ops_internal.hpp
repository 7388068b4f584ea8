#pragma once
// Helpers shared by the sharded op files not yet bound through the driver (internal): result
// shardings and lining operands up (assemble and combine_over are the driver's, array/driver.hpp).

#include <optional>
#include <vector>

#include "shard/array/driver.hpp"
#include "shard/comm/detail/collective.hpp"
#include "shard/ops/ops.hpp"

namespace shard::detail {

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

/// The mesh axes that split any of `dims`, in mesh order.
SpecEntry axes_of_dims(const NamedSharding& s, const std::vector<int>& dims);

}  // namespace shard::detail
