#pragma once
/// \file The passes jit runs on a traced, propagated program before it replays it (DESIGN.md "jit
/// and vmap": optimizations). Each can be switched off (JitOptions); a transformation around the
/// jitted function (vmap, grad, an outer jit) replays the program as traced, op by op.
///
/// - Dead code: an op of the table whose results nothing uses is dropped (a shard_map body or an
///   optimizer update is kept: they may have effects).
/// - Common subexpressions: an op of the table that computes what an earlier op computes (the
///   same primitive and parameters on the same operands, laid out the same way, moving no data) is
///   dropped and its readers read the earlier result (as XLA's CSE). Primitives whose parameters
///   jit can compare: trivially copyable ones (elementwise, scalar ops, comparisons, where, casts)
///   and those with a `cse_key()` (transpose, matmul, matmul_t, reductions); the rest are never merged.
/// - Elementwise fusion: a run of consecutive elementwise equations (binary ops, scalar ops,
///   comparisons, unary math, where, casts, axpy) whose operands all have the result's shape and
///   layout becomes one equation, `fused[...]`. It runs the chain tile by tile (a few thousand
///   elements of each block at a time, the intermediates in a scratch buffer that stays in cache):
///   one read of each input and one write of each result the rest of the program uses, instead of
///   one pass over memory per op. Each op's kernel is the eager one, on the same elements in the
///   same order, so the results are bit for bit the unfused program's.
/// - Communication scheduling: a reshard that is one all_gather over a mesh axis (an explicit
///   reshard, or an operand of a planned op or a fused chain that the op re-lays out, such as a
///   weight split over 'data' that a global-view product gathers) becomes `all_gather_start`
///   where its operand is ready (the gathers one op reads first start together, no earlier than
///   the first use of the group before: one group ahead, as FSDP's prefetch of the next layer's
///   weights) and `all_gather_done` before the op that first
///   reads it; the transfer is in flight while the ops between them run (the replay progresses
///   it between ops). Same values, bit for bit.

#include <cstdint>
#include <memory>

#include "shard/array/detail/program.hpp"

namespace shard::detail {

struct OptimizeOptions {
  bool dead_code = true;
  bool cse = true;
  bool fuse = true;
  bool schedule = true;
};

/// What the passes did to one program.
struct OptimizeStats {
  int dead = 0;          ///< equations dropped
  int merged = 0;        ///< equations merged into an earlier equal one
  int fused_groups = 0;  ///< fused equations made
  int ops_fused = 0;     ///< equations they replace
  int scheduled = 0;     ///< all_gathers started early (a start and a done equation each)
};

/// Sets program.release: after each equation, the values it was the last to read (or made for
/// no one), so a replay holds only the live values (an eager program's peak memory, not the sum
/// of every intermediate).
void plan_release(Program& program);

/// The program jit replays: `program` with the passes `options` asks for applied.
std::shared_ptr<Program> optimize(const Program& program, const OptimizeOptions& options,
                                  OptimizeStats* stats = nullptr);

}  // namespace shard::detail
