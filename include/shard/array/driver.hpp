#pragma once
/// \file The op driver (DESIGN.md "Ops: one op table, one driver, two views"): `shard::bind`
/// runs a primitive (core/primitive.hpp) on Tensors or on ShardedArrays, in one order:
///
///   1. record: when a tape records one of the operands, the op runs with recording paused and
///      its VJP is recorded through the trace hook (core/detail/tape.hpp, record_vjp): autodiff
///      and the vma of shard_map bodies reach the op only there;
///   2. validate: the operands' devices and the rule's ranks and sizes, naming the caller's line;
///   3. plan: the result's sharding, each operand's reshard and the closing collective's axes,
///      from the rule's factors (cached by the operands' signatures; a plan is data, so jit can
///      record it instead of running it);
///   4. reshard the operands the plan names, run the kernel on each device's blocks, close with
///      the collective over the axes that split a reduced factor, wrap the blocks.
///
/// The Tensor view is the same with one block and no plan.

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <source_location>
#include <span>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "shard/array/detail/op_plan.hpp"
#include "shard/array/detail/program.hpp"
#include "shard/array/reshard.hpp"
#include "shard/array/sharded_array.hpp"
#include "shard/comm/detail/collective.hpp"
#include "shard/core/array_ops.hpp"
#include "shard/core/detail/remat.hpp"
#include "shard/core/detail/tape.hpp"
#include "shard/core/primitive.hpp"
#include "shard/core/tensor.hpp"
#include "shard/core/timeline.hpp"
#include "shard/core/trace.hpp"
#include "shard/error.hpp"  // shard::source_location

namespace shard {

/// The cotangents of a primitive's operands from its result's (entry i for operand i; empty
/// where `need[i]` is false): what a primitive's vjp() returns.
template <typename Out, typename In>
using KernelVjp = detail::KernelVjp<Out, In>;

namespace detail {

/// The plan of `rule` on these operands (cached by their signatures). The result follows one
/// operand, the base: the first committed one with the result's shape, else the first with
/// it, else the first committed one, else the first (JAX's uncommitted arrays never decide);
/// each factor is split as the base splits it, and every operand is lined up with that.
std::shared_ptr<const OpPlan> plan_op(const FactorRule& rule, const FactorRule::Factors& factors,
                                      const std::vector<OperandLayout>& operands);

/// x itself when it already has sharding `want` (no copy), else its reshard, kept in `keep`.
template <typename T>
const ShardedArray<T>& lined_up(const ShardedArray<T>& x, const std::optional<PartitionSpec>& want,
                                const Mesh& mesh, std::optional<ShardedArray<T>>& keep) {
  if (!want || (x.spec() == *want && x.mesh() == mesh)) return x;
  return keep.emplace(reshard(x, NamedSharding(mesh, *want)));
}

/// An array from one block per local device of `sharding`'s mesh (local mesh order).
template <typename T>
ShardedArray<T> assemble(const Shape& shape, const NamedSharding& sharding, std::vector<Tensor<T>> blocks) {
  const auto local = sharding.mesh().local_device_ids();
  std::vector<Shard<T>> shards;
  shards.reserve(local.size());
  for (std::size_t i = 0; i < local.size(); ++i)
    shards.push_back(Shard<T>{local[i], sharding.box(local[i], shape), std::move(blocks[i])});
  return ShardedArray<T>(shape, sharding, std::move(shards));
}

/// The collective that combines partial blocks over `axes` into blocks of `out`: a reduction
/// with `op`, or a psum_scatter along scatter_dim (OpPlan).
CollectiveSpec closing_spec(const SpecEntry& axes, ReduceKind op, const NamedSharding& out,
                            const Shape& out_shape, int scatter_dim);

/// Collective over the devices that differ along `axes` (local when axes is None): combines
/// per-device partial blocks with `op` and assembles the result sharded as `out`.
template <typename T>
ShardedArray<T> combine_over(std::vector<Tensor<T>> partial, const SpecEntry& axes, ReduceKind op,
                             const NamedSharding& out, const Shape& out_shape, int scatter_dim = -1) {
  if (axes.is_none()) return assemble(out_shape, out, std::move(partial));
  std::vector<Tensor<T>> outs;
  CollectiveSpec spec = closing_spec(axes, op, out, out_shape, scatter_dim);
  spec.dtype = dtype_name<T>();
  execute_collective<T>(out.mesh(), spec, out.mesh().local_device_ids(), partial, outs);
  return assemble(out_shape, out, std::move(outs));
}

/// The element type a primitive's kernel gives on blocks of these element types.
template <typename P, typename... T>
using kernel_result_t =
    elem_t<decltype(std::declval<const P&>().kernel(std::declval<const Tensor<T>&>()...))>;

/// The collective that combines partial blocks of a reduced factor: closing_kind(), else the
/// static `closing`, else a psum.
template <typename P>
ReduceKind closing_of(const P& p) {
  if constexpr (requires { p.closing_kind(); })
    return p.closing_kind();
  else if constexpr (requires { P::closing; })
    return P::closing;
  else
    return ReduceKind::kSum;
}

/// The primitive's node passes varying cotangents through (a linear op without communication).
template <typename P>
constexpr bool linear_local_of() {
  if constexpr (requires { P::linear_local; })
    return P::linear_local;
  else
    return false;
}

/// The kernel validates its operands itself (the built-in elementwise kernels): the Tensor view
/// skips the rule's check.
template <typename P>
constexpr bool kernel_validates() {
  if constexpr (requires { P::kernel_validates; })
    return P::kernel_validates;
  else
    return false;
}

template <typename P, typename Out, typename... X>
concept HasVjp = requires(const P& p, const VjpNeed& need, const Out& out, const X&... xs) {
  p.vjp(need, out, xs...);
};

/// The primitive computes its result and its VJP in one call (forward_vjp(need, xs...) returns
/// both: JAX's custom_vjp fwd with its residuals).
template <typename P, typename... X>
concept HasForwardVjp = requires(const P& p, const VjpNeed& need, const X&... xs) {
  p.forward_vjp(need, xs...);
};

/// The primitive moves its operand from one view to the other (to_host, uncommitted):
/// across(x) is the whole op, its result's type the bound result's.
template <typename P, typename... X>
concept MovesAcross = requires(const P& p, const X&... xs) {
  p.across(xs...);
};

/// What binding P to operands of these types gives: across()'s result, else the operands'
/// view with the kernel's dtype.
template <typename P, typename X0, typename... X>
auto bind_result_of() {
  if constexpr (MovesAcross<P, X0, X...>)
    return std::type_identity<decltype(std::declval<const P&>().across(std::declval<const X0&>(),
                                                                       std::declval<const X&>()...))>{};
  else
    return std::type_identity<rebind_t<X0, kernel_result_t<P, elem_t<X0>, elem_t<X>...>>>{};
}
template <typename P, typename... X>
using bind_result_t = typename decltype(bind_result_of<P, X...>())::type;

template <typename P, ArrayLike... X>
bind_result_t<P, X...> bind_at(const P& p, const shard::source_location& where, const X&... xs);

// vmap's step: the primitive's batching rule (a member batch(), ops/batching.hpp) on the physical
// arrays of the operands batched at `level`.
/// The logical shape and sharding of a batched value made from `physical`.
template <typename X>
X make_batched(X physical, int bdim, std::uint64_t level) {
  if (bdim < 0) return physical;
  Shape shape = physical.shape();
  shape.erase(shape.begin() + bdim);
  if constexpr (is_tensor_v<X>) {
    return X::batched_value(std::move(shape), std::make_shared<Batched<X>>(level, bdim, std::move(physical)));
  } else {
    std::vector<SpecEntry> entries = physical.spec().entries();
    if (bdim < static_cast<int>(entries.size())) entries.erase(entries.begin() + bdim);
    NamedSharding sharding(physical.mesh(), PartitionSpec(std::move(entries)));
    const bool committed = physical.committed();
    return X::batched_value(std::move(shape), std::move(sharding), committed,
                            std::make_shared<Batched<X>>(level, bdim, std::move(physical)));
  }
}

template <typename P, typename... A>
concept HasBatchRule = requires(const P& p, const shard::source_location& w, std::int64_t n, const A&... a) {
  p.batch(w, n, a...);
};

/// ValueError: a batched value reached an op after its vmap returned.
[[noreturn]] void raise_escaped_batch(const char* op);
/// NotImplementedError-like ValueError: the primitive has no batching rule.
[[noreturn]] void raise_no_batch_rule(const char* op);
/// Says once per primitive name on stderr that a loop runs instead of a batching rule.
void note_loop_fallback(const char* op, std::int64_t size);

/// The loop over the examples for a primitive without a batching rule (ops/batching.hpp).
template <typename P, typename... A>
auto batch_by_loop(const P& p, const shard::source_location& where, std::int64_t size, const A&... a);

/// x as an operand of a batching rule at `level`.
template <typename X>
BatchArg<X> batch_arg(const X& x, std::uint64_t level) {
  int bdim = -1;
  const X& phys = physical_at(x, level, bdim);
  return BatchArg<X>{phys, bdim};
}

template <typename P, ArrayLike... X>
bind_result_t<P, X...> batch_primitive(const P& p, const shard::source_location& where, std::uint64_t level,
                                       const X&... xs) {
  const BatchFrame* frame = batch_frame(level);
  if (!frame) raise_escaped_batch(p.name());
  const std::int64_t size = frame->size;
  if constexpr (HasBatchRule<P, BatchArg<X>...>) {
    auto out = p.batch(where, size, batch_arg(xs, level)...);
    return make_batched(std::move(out.value), out.bdim, level);
  } else {
    if (!frame->loop_fallback) raise_no_batch_rule(p.name());
    auto out = batch_by_loop(p, where, size, batch_arg(xs, level)...);
    return make_batched(std::move(out.value), out.bdim, level);
  }
}

template <typename P, ArrayLike X>
X batch_list_primitive(const P& p, const shard::source_location& where, std::uint64_t level,
                       const std::vector<X>& xs);
/// forward_vjp of a primitive on batched operands under a tape (vmap(grad(f))): the batched
/// primitive's forward_vjp on the physical arrays, its VJP mapping batched cotangents.
template <typename P, ArrayLike... X>
auto batch_forward_vjp(const P& p, const VjpNeed& need, std::uint64_t level, const X&... xs)
    -> decltype(p.forward_vjp(need, xs...));

// jit's step (array/detail/trace_primitive.hpp, included at the end of this file).
template <typename P, ArrayLike... X>
bind_result_t<P, X...> trace_primitive(const P& p, const shard::source_location& where, std::uint64_t level,
                                       const X&... xs);
template <typename P, ArrayLike X>
X trace_list_primitive(const P& p, const shard::source_location& where, std::uint64_t level,
                       const std::vector<X>& xs);
template <typename P, ArrayLike... X>
auto trace_forward_vjp(const P& p, const VjpNeed& need, std::uint64_t level, const X&... xs)
    -> decltype(p.forward_vjp(need, xs...));

/// forward_vjp of a primitive on its operands: batched (vmap), traced (jit) or as they are.
template <typename P, ArrayLike... X>
auto forward_vjp_at(const P& p, const VjpNeed& need, const X&... xs) -> decltype(p.forward_vjp(need, xs...)) {
  if (const BatchBase* top = top_record(xs...)) {
    if (top->trace) return trace_forward_vjp(p, need, top->level, xs...);
    return batch_forward_vjp(p, need, top->level, xs...);
  }
  return p.forward_vjp(need, xs...);
}

/// The record step of a one-operand primitive whose result has another dtype (astype): the
/// operand is the differentiable one when both dtypes are floating.
template <typename P, ArrayLike X>
bind_result_t<P, X> record_conversion(Tape& tape, const P& p, const shard::source_location& where,
                                      const X& x) {
  using Out = bind_result_t<P, X>;
  Out out = paused([&] { return bind_at(p, where, x); });
  const std::uint32_t vma = vma_of(x, tape);
  if constexpr (FloatDtype<elem_t<Out>> && FloatDtype<elem_t<X>>) {
    if (differentiable_on(x, tape)) {
      if constexpr (HasVjp<P, Out, X>) {
        const X* in = &x;
        KernelVjp<Out, X> vjp = p.vjp(VjpNeed{1, 1}, out, x);
        return record_vjp<Out, X>(tape, p.name(), std::move(out), std::span<const X* const>(&in, 1),
                                  std::move(vjp), vma, 0, linear_local_of<P>());
      } else {
        raise_not_differentiable(p.name(), "the primitive has no vjp()");
      }
    }
  }
  return with_vma(tape, std::move(out), vma);
}

template <typename P, ArrayLike... X>
bind_result_t<P, X...> record_same(Tape& tape, const P& p, const shard::source_location& where,
                                   const bind_result_t<P, X...>* precomputed, const X&... xs);

/// The record step: the op with recording paused, then its VJP on the tape. The operands of the
/// result's type are the differentiable ones (in order, what vjp() returns cotangents for);
/// the others (a where's condition) give their vma only.
template <typename P, ArrayLike... X>
bind_result_t<P, X...> record_primitive(Tape& tape, const P& p, const shard::source_location& where,
                                        const X&... xs) {
  using Out = bind_result_t<P, X...>;
  if constexpr (sizeof...(X) == 1 && !(std::is_same_v<X, Out> && ...) && FloatDtype<elem_t<Out>>)
    return record_conversion(tape, p, where, xs...);
  else
    return record_same(tape, p, where, nullptr, xs...);
}

/// record_primitive for a result of the differentiable operands' type. `precomputed`: the result
/// a checkpointed function's forward run kept (its replay records the VJP without the kernel).
template <typename P, ArrayLike... X>
bind_result_t<P, X...> record_same(Tape& tape, const P& p, const shard::source_location& where,
                                   const bind_result_t<P, X...>* precomputed, const X&... xs) {
  using Out = bind_result_t<P, X...>;
  auto run = [&]() -> Out {
    if (precomputed) return precomputed->alias();
    return paused([&]() -> Out {
      if constexpr (requires { p.view(xs...); })
        return p.view(xs...);  // a result that shares its operand's memory (a Tensor reshape)
      else
        return bind_at(p, where, xs...);
    });
  };
  std::array<const Out*, sizeof...(X)> ins{};
  std::size_t n = 0;
  std::uint32_t vma = 0;
  (
      [&] {
        if constexpr (std::is_same_v<X, Out>) ins[n++] = &xs;
        vma |= vma_of(xs, tape);
      }(),
      ...);
  const std::span<const Out* const> inputs(ins.data(), n);
  if constexpr (FloatDtype<elem_t<Out>>) {
    if (any_differentiable(tape, inputs)) {
      VjpNeed need{0, n};
      for (std::size_t i = 0; i < n; ++i)
        if (differentiable_on(*ins[i], tape)) need.bits |= std::uint64_t{1} << i;
      if constexpr (HasForwardVjp<P, X...>) {
        // A kernel that keeps what its VJP reads as it runs (softmax's output, attention's
        // probabilities): the result and the VJP from one call (batched inside vmap).
        auto [out, vjp] = paused([&] { return forward_vjp_at(p, need, xs...); });
        return record_vjp<Out, Out>(tape, p.name(), std::move(out), inputs, std::move(vjp), vma, 0,
                                    linear_local_of<P>());
      } else if constexpr (HasVjp<P, Out, X...>) {
        Out out = run();
        KernelVjp<Out, Out> vjp = p.vjp(need, out, xs...);
        if (!vjp) vjp = [](const Out&, const VjpNeed&) { return Cotangents<Out>(); };  // zero
        return record_vjp<Out, Out>(tape, p.name(), std::move(out), inputs, std::move(vjp), vma, 0,
                                    linear_local_of<P>());
      } else {
        raise_not_differentiable(p.name(), "the primitive has no vjp()");
      }
    }
  }
  return with_vma(tape, run(), vma);
}

/// The blocks of the kernel on each device, wrapped as `plan` says (closing collective included).
template <typename P, typename R, Dtype... T, std::size_t... I>
ShardedArray<R> run_blocks(const P& p, const OpPlan& plan, const Shape& out_shape, std::index_sequence<I...>,
                           const ShardedArray<T>&... xs) {
  const std::array<const Mesh*, sizeof...(T)> meshes{&xs.mesh()...};
  const Mesh& mesh = *meshes[plan.base];
  const NamedSharding out(mesh, plan.out);
  std::tuple<std::optional<ShardedArray<T>>...> keep;
  const auto lined = std::forward_as_tuple(lined_up(xs, plan.want[I], mesh, std::get<I>(keep))...);
  std::vector<Tensor<R>> blocks;
  const std::size_t n = std::get<0>(lined).addressable_shards().size();
  blocks.reserve(n);
  if constexpr (requires { p.partial(std::get<I>(lined).addressable_shards()[0].data...); }) {
    // partial() on each block, the closing collective over the partials, finalize() on each.
    using A = elem_t<decltype(p.partial(std::get<I>(lined).addressable_shards()[0].data...))>;
    std::vector<Tensor<A>> partials;
    partials.reserve(n);
    for (std::size_t b = 0; b < n; ++b)
      partials.push_back(p.partial(std::get<I>(lined).addressable_shards()[b].data...));
    ShardedArray<A> combined =
        combine_over(std::move(partials), plan.closing, closing_of(p), out, out_shape, plan.scatter_dim);
    for (const auto& s : combined.addressable_shards()) blocks.push_back(p.finalize(s.data));
    return assemble(out_shape, out, std::move(blocks));
  } else {
    for (std::size_t b = 0; b < n; ++b)
      blocks.push_back(p.kernel(std::get<I>(lined).addressable_shards()[b].data...));
    if (plan.closing.is_none()) return assemble(out_shape, out, std::move(blocks));
    return combine_over(std::move(blocks), plan.closing, closing_of(p), out, out_shape, plan.scatter_dim);
  }
}

/// True when every operand has x's shape and sharding: an elementwise op then runs on the
/// blocks as they are (no plan to look up).
template <Dtype T0, Dtype... T>
bool all_like(const ShardedArray<T0>& x, const ShardedArray<T>&... xs) {
  return ((xs.shape() == x.shape() && xs.committed() == x.committed() &&
           (&xs.sharding() == &x.sharding() || xs.sharding() == x.sharding())) &&
          ...);
}

template <typename P, Dtype... T>
auto run_factored(const P& p, const shard::source_location& where, const ShardedArray<T>&... xs);

template <typename P, Dtype... T>
auto run_sharded(const P& p, const shard::source_location& where, const ShardedArray<T>&... xs) {
  const auto& first = std::get<0>(std::forward_as_tuple(xs...));
  if constexpr (sizeof...(T) > 1) {
    (
        [&] {
          if (!(first.mesh() == xs.mesh()))
            check_same_devices(first.mesh(), xs.mesh(), located(p.name(), where));
        }(),
        ...);
  }
  if constexpr (requires { p.sharded(xs...); }) {
    // A primitive whose layout rule is not a factor rule (a reshape, a slice) or whose
    // communication is not a closing collective (a scan).
    return p.sharded(xs...);
  } else {
    return run_factored(p, where, xs...);
  }
}

/// An elementwise primitive on operands that all_like() lines up: the kernel on each device's
/// blocks as they are, the result laid out as the first.
template <typename P, Dtype... T>
auto run_aligned(const P& p, const ShardedArray<T>&... xs) {
  using R = kernel_result_t<P, T...>;
  const auto& first = std::get<0>(std::forward_as_tuple(xs...));
  const auto& in = first.addressable_shards();
  std::vector<Shard<R>> shards;
  shards.reserve(in.size());
  for (std::size_t b = 0; b < in.size(); ++b)
    shards.push_back(Shard<R>{in[b].device, in[b].box, p.kernel(xs.addressable_shards()[b].data...)});
  return ShardedArray<R>(first.shape(), first.sharding(), std::move(shards));
}

template <typename P, Dtype... T>
auto run_factored(const P& p, const shard::source_location& where, const ShardedArray<T>&... xs) {
  using R = kernel_result_t<P, T...>;
  const FactorRule& rule = p.rule();
  if (rule.elementwise() && all_like(xs...)) return run_aligned(p, xs...);  // the common case
  const FactorRule::Factors factors = rule.expand({&xs.shape()...}, p.name(), where);
  const std::shared_ptr<const OpPlan> plan = plan_op(rule, factors, {layout_of(xs)...});
  return run_blocks<P, R>(p, *plan, factors.result_shape, std::index_sequence_for<T...>{}, xs...);
}

/// ValueError for an empty (default-constructed, never assigned) ShardedArray operand.
template <ArrayLike X>
void check_not_empty(const X& x, const char* op) {
  if constexpr (is_sharded_v<X>) {
    if (x.empty()) [[unlikely]]
      raise<ValueError>(op,
                        ": an operand is an empty ShardedArray (default-constructed and never assigned an "
                        "array); assign one before using it");
    // Every rank knows it (donation is collective): raised before any communication, also on a
    // rank whose part of the op would not read the shards.
    if (x.is_deleted()) [[unlikely]]
      (void)x.addressable_shards();  // raises the deleted array's ValueError
  }
}

/// The primitives bound on this thread so far (each bind, also those a batching rule or a VJP
/// makes): what the tests compare between a vmapped program at two batch sizes.
inline thread_local std::uint64_t t_bind_calls = 0;
inline std::uint64_t bind_calls() { return t_bind_calls; }

template <typename P, ArrayLike... X>
bind_result_t<P, X...> bind_at(const P& p, const shard::source_location& where, const X&... xs);

/// Whether a checkpoint's policy can keep P's result: one the record step computes on its own
/// (not with its VJP's residuals, forward_vjp; not a conversion, not a move between views).
template <typename P, typename... X>
constexpr bool remat_keepable() {
  using Out = bind_result_t<P, X...>;
  if constexpr (MovesAcross<P, X...> || HasForwardVjp<P, X...>)
    return false;
  else
    return !(sizeof...(X) == 1 && !(std::is_same_v<X, Out> && ...));
}

/// A primitive f binds inside shard::checkpoint (core/detail/remat.hpp): the forward run keeps
/// the result when the policy saves it; the replay records the kept result's VJP instead of
/// running the kernel again (under a vmap or jit level newer than the replay's tape the op runs,
/// and the kept result is only passed over).
template <typename P, ArrayLike... X>
bind_result_t<P, X...> remat_bind(RematState& r, const P& p, const shard::source_location& where,
                                  const X&... xs) {
  using Out = bind_result_t<P, X...>;
  const RematDepth inside(&r);
  if constexpr (remat_keepable<P, X...>()) {
    if (r.saves(p.name())) {
      if (!r.replay) {
        Out out = bind_at(p, where, xs...);
        Out kept = out.alias();
        kept.set_ad(nullptr);
        r.saved.push_back({p.name(), std::any(std::move(kept))});
        return out;
      }
      const Out kept = r.take<Out>(p.name());
      Tape* tape = recording_tape_for(xs...);
      const BatchBase* top = top_record(xs...);
      if (tape && !(top && tape->id() < top->level)) return record_same(*tape, p, where, &kept, xs...);
      if (!tape && !top) return kept.alias();
    }
  }
  return bind_at(p, where, xs...);
}

template <typename P, ArrayLike... X>
bind_result_t<P, X...> bind_at(const P& p, const shard::source_location& where, const X&... xs) {
  static_assert(std::is_base_of_v<Primitive, P>, "shard::bind: a primitive derives from shard::Primitive");
  if (RematState* r = t_remat; r && r->depth == 0) [[unlikely]]
    return remat_bind(*r, p, where, xs...);
  ++t_bind_calls;
  (check_not_empty(xs, p.name()), ...);
  Tape* tape = recording_tape_for(xs...);
  // The innermost transformation handles the op first: a vmap level or a jit trace newer than the
  // tape (or no tape) batches or records it; a tape newer than every level records it
  // (vmap(grad(f)), jit(grad(f))).
  if (const BatchBase* top = top_record(xs...); top && (!tape || tape->id() < top->level)) {
    if (top->trace) return trace_primitive(p, where, top->level, xs...);
    return batch_primitive(p, where, top->level, xs...);
  }
  if (tape) return record_primitive(*tape, p, where, xs...);
  const TimelineScope traced("op", p.name());
  if constexpr (MovesAcross<P, X...>) {
    return p.across(xs...);
  } else if constexpr ((is_tensor_v<X> && ...)) {
    if constexpr (!kernel_validates<P>()) (void)p.rule().expand({&xs.shape()...}, p.name(), where);
    return p.kernel(xs...);
  } else {
    static_assert((is_sharded_v<X> && ...), "shard::bind: operands are all Tensors or all ShardedArrays");
    return run_sharded(p, where, xs...);
  }
}

/// A primitive over a list of operands of one type (concatenate, stack): kernel(xs) on Tensors,
/// sharded(xs) on ShardedArrays, vjp(out, xs) for the cotangents of all of them (required: a
/// list primitive without vjp() does not compile, where bind() raises when differentiated).
template <typename P, ArrayLike X>
X bind_list_at(const P& p, const shard::source_location& where, const std::vector<X>& xs) {
  static_assert(std::is_base_of_v<Primitive, P>, "shard::bind: a primitive derives from shard::Primitive");
  const RematDepth inside(t_remat);  // the ops it binds inside are not a checkpointed function's own
  ++t_bind_calls;
  if (xs.empty()) raise<ValueError>(located(p.name(), where), ": need at least one array");
  const BatchBase* top = nullptr;
  for (const auto& x : xs)
    if (const auto& b = x.batch(); b && (!top || b->level > top->level)) top = b.get();
  Tape* list_tape = recording_tape_for_list(xs);
  if (top && (!list_tape || list_tape->id() < top->level)) {
    if (top->trace) return trace_list_primitive(p, where, top->level, xs);
    return batch_list_primitive(p, where, top->level, xs);
  }
  if (Tape* tape = list_tape) {
    X out = paused([&] { return bind_list_at(p, where, xs); });
    std::vector<const X*> ins;
    ins.reserve(xs.size());
    for (const auto& x : xs) ins.push_back(&x);
    const std::span<const X* const> inputs(ins);
    if constexpr (FloatDtype<elem_t<X>>) {
      if (any_differentiable(*tape, inputs)) {
        KernelVjp<X, X> vjp = p.vjp(out, xs);
        return record_vjp<X, X>(*tape, p.name(), std::move(out), inputs, std::move(vjp), std::nullopt, 0,
                                linear_local_of<P>());
      }
    }
    return with_vma(*tape, std::move(out), vma_of_all(*tape, inputs));
  }
  const TimelineScope traced("op", p.name());
  if constexpr (is_tensor_v<X>) {
    return p.kernel(xs);
  } else {
    for (const auto& x : xs)
      if (!(xs[0].mesh() == x.mesh())) check_same_devices(xs[0].mesh(), x.mesh(), located(p.name(), where));
    return p.sharded(xs);
  }
}

}  // namespace detail

/// Runs primitive `p` on its operands (Tensors or ShardedArrays; core/primitive.hpp says what
/// a primitive gives). Errors name the caller's line.
template <typename P, ArrayLike X>
auto bind(const P& p, const X& x, shard::source_location where = shard::source_location::current()) {
  const detail::CallScope scope("bind", where);
  return detail::bind_at(p, where, x);
}
template <typename P, ArrayLike X, ArrayLike Y>
auto bind(const P& p, const X& x, const Y& y,
          shard::source_location where = shard::source_location::current()) {
  const detail::CallScope scope("bind", where);
  return detail::bind_at(p, where, x, y);
}
/// Runs primitive `p` over a list of operands of one type (concatenate's shape: p gives
/// kernel(xs) on Tensors, sharded(xs) on ShardedArrays, vjp(out, xs) for their cotangents).
template <typename P, ArrayLike X>
X bind_list(const P& p, const std::vector<X>& xs,
            shard::source_location where = shard::source_location::current()) {
  const detail::CallScope scope("bind", where);
  return detail::bind_list_at(p, where, xs);
}
template <typename P, ArrayLike X, ArrayLike Y, ArrayLike Z>
auto bind(const P& p, const X& x, const Y& y, const Z& z,
          shard::source_location where = shard::source_location::current()) {
  const detail::CallScope scope("bind", where);
  return detail::bind_at(p, where, x, y, z);
}

}  // namespace shard

#include "shard/array/detail/trace_primitive.hpp"  // IWYU pragma: export
