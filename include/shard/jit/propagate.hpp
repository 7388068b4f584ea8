#pragma once
/// \file Sharding propagation over a traced program (jit/jit.hpp; DESIGN.md "jit and vmap").
///
/// The program's fixed points are its inputs' shardings (the arguments', or in_shardings), its
/// out_shardings, every explicit reshard / with_sharding_constraint, and every op that is not a
/// factor-rule op (a reshape, a slice, a shard_map, a collective: they keep the operand layouts
/// they were traced with). Each factor-rule op (elementwise, reductions, matmul, ...) is free: a
/// layout is an assignment of mesh axes to its factors (Shardy's factors: the operands' and the
/// result's specs and the closing collective follow from it). Propagation is a descent on the
/// time the program spends moving data by the cost model (jit/cost_model.hpp): per move, the
/// bytes per device (for a reshard, what the busiest device receives: the part of its new block
/// its old block does not hold; for a closing psum, a ring's 2 (n-1)/n of the block, the same at
/// any number of ranks) at the rate of the collective it runs as (all_gather, all_to_all, a
/// general exchange, psum) plus its latency. It starts from the layouts eager execution picks and
/// moves one op at a time to the candidate layout (one per operand's and per consumer's layout,
/// forward and backward) that lowers the total, until no op improves. A reshard is kept only
/// where an op's rule cannot take what its producer gives.

#include "shard/array/detail/program.hpp"
#include "shard/jit/cost_model.hpp"

namespace shard::detail {

/// Chooses the layout of every factor-rule equation of `program` (their plans and result
/// shardings) by `model`; the total bytes before and after are kept in the program.
void propagate(Program& program, const CostModel& model);

}  // namespace shard::detail
