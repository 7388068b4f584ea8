#pragma once
/// \file What the op driver decides for one op of a factor rule (array/driver.hpp): the plan, as
/// data, so that jit's propagation (jit/propagate.hpp) can choose another one and replay it.

#include <cstddef>
#include <optional>
#include <vector>

#include "shard/array/sharded_array.hpp"
#include "shard/core/primitive.hpp"
#include "shard/sharding/partition_spec.hpp"

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

/// What the driver does for one op, on the mesh of operand `base`: the result's spec, the spec
/// each operand must be resharded to first (none: as it is), the mesh axes the closing
/// collective combines over. Specs only: a cached plan keeps no Mesh (whose communicators must
/// not outlive the user's last copy).
///
/// `scatter_dim` >= 0: the closing collective is a psum_scatter along that dim (the result's
/// spec splits it further over the closing axes, after its own: each device sums only the rows
/// it keeps). Every dim then splits evenly. A planner that is not plan_op (matmul's cost model)
/// chooses it.
struct OpPlan {
  std::size_t base = 0;
  PartitionSpec out;
  std::vector<std::optional<PartitionSpec>> want;
  SpecEntry closing;
  int scatter_dim = -1;
  bool operator==(const OpPlan&) const = default;
};

/// The plan that splits each factor of `f` over `axes[factor]` (on `mesh`; base: the operand whose
/// mesh the result takes): the operands lined up with it, the reduced factors' axes closing.
OpPlan plan_with_axes(const FactorRule::Factors& f, const std::vector<OperandLayout>& operands,
                      const Mesh& mesh, const std::vector<SpecEntry>& axes, std::size_t base);

}  // namespace shard::detail
