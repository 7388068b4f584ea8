#pragma once
/// \file A shard_map in a jit trace that a grad inside the jit differentiates (jit(grad(f)) with f
/// calling shard_map; internals of shard_map.hpp). It becomes two equations, as a primitive with
/// forward_vjp does (array/detail/trace_primitive.hpp):
/// - `shard_map_forward_vjp`: the shard_map run with every floating array of its arguments a leaf
///   of a private tape; its outputs and that tape (the pullback: the body's device tapes and their
///   residuals) are values of the program;
/// - `shard_map_vjp`, traced where the grad's backward pass reaches the shard_map: the pullback
///   applied to the outputs' cotangents, which gives the arguments' cotangents (the body's
///   backward on every device, its psums, the sums over the axes an argument is invariant over).
/// On replay each call runs both again on its own values; the pullback lives from the forward
/// equation to the backward one (the program's liveness drops it there).

#include <algorithm>
#include <any>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "shard/array/detail/program.hpp"
#include "shard/array/detail/trace_primitive.hpp"
#include "shard/core/detail/tape.hpp"
#include "shard/core/tree.hpp"
#include "shard/ops/detail/grad_reduce.hpp"
#include "shard/spmd/detail/shard_map_ad.hpp"

namespace shard::detail {

/// What a forward leaves for its backward: the private tape, the arguments as its leaves, the
/// outputs with their nodes there.
template <typename Out, typename... Args>
struct ShardMapPullback {
  std::shared_ptr<Tape> tape;
  std::optional<std::tuple<Args...>> leaves;
  std::optional<Out> outs;
};

/// Per array of the arguments (tree order): whether the grad's `tape` differentiates it (a
/// floating array with a node there).
template <typename... Args>
std::vector<bool> tracked_arrays(const Tape& tape, const Args&... args) {
  std::vector<bool> tracked;
  (tree_for_each(
       [&](const auto& x) {
         using X = std::remove_cvref_t<decltype(x)>;
         if constexpr (FloatDtype<elem_t<X>>)
           tracked.push_back(JitAdLinks<elem_t<X>>::tracked(x, tape));
         else
           tracked.push_back(false);
       },
       args),
   ...);
  return tracked;
}

/// True when a floating array of the arguments has a node on `tape`.
template <typename... Args>
bool any_tracked(const Tape& tape, const Args&... args) {
  const std::vector<bool> t = tracked_arrays(tape, args...);
  return std::find(t.begin(), t.end(), true) != t.end();
}

/// fn(args...) with the arrays `tracked` marks (tree order) leaves of a fresh tape (the others are
/// constants there, as they are for the grad: an op without a VJP may read them): the outputs
/// (without records) and the pullback.
template <typename Fn, typename... Args>
auto forward_with_pullback(const Fn& fn, const std::vector<bool>& tracked, const Args&... args) {
  using Out = decltype(fn(args...));
  using Pb = ShardMapPullback<Out, Args...>;
  auto pb = std::make_shared<Pb>();
  pb->tape = std::make_shared<Tape>();
  Tape& tape = *pb->tape;
  std::size_t i = 0;
  auto leaf = [&](const auto& x) {
    using X = std::remove_cvref_t<decltype(x)>;
    if (tracked[i++]) return JitAdLinks<elem_t<X>>::leaf(x, tape);
    X c = x.alias();
    c.set_ad(nullptr);
    return c;
  };
  pb->leaves.emplace(std::tuple<Args...>{tree_map(leaf, args)...});  // braces: in order
  {
    TapeScope scope(&tape);
    pb->outs.emplace(std::apply(fn, *pb->leaves));
  }
  Out plain = tree_map(
      [](const auto& y) {
        auto c = y.alias();
        c.set_ad(nullptr);
        return c;
      },
      *pb->outs);
  return std::pair<Out, std::shared_ptr<Pb>>(std::move(plain), std::move(pb));
}

/// The pullback applied: `cts` holds one entry per array of the outputs in tree order (null: no
/// cotangent reached it); returns the cotangent of each floating array of the arguments, in tree
/// order (zeros for one the outputs do not depend on). `keep`: the pullback can be applied again
/// (its residuals kept; the last application frees them, and skips the copies keeping costs).
template <typename Out, typename... Args>
std::vector<std::any> apply_pullback(ShardMapPullback<Out, Args...>& pb,
                                     const std::vector<const std::any*>& cts,
                                     const std::vector<bool>& tracked, bool keep) {
  const DeferredReductionScope deferred;
  std::size_t k = 0;
  tree_for_each(
      [&](const auto& y) {
        using Y = std::remove_cvref_t<decltype(y)>;
        if (const std::any* c = cts[k++]) JitAdLinks<elem_t<Y>>::seed(y, *std::any_cast<Y>(c), *pb.tape);
      },
      *pb.outs);
  pb.tape->backward(keep);
  std::vector<std::any> grads;
  std::size_t i = 0;
  std::apply(
      [&](const auto&... l) {
        (tree_for_each(
             [&](const auto& x) {
               using X = std::remove_cvref_t<decltype(x)>;
               if constexpr (FloatDtype<elem_t<X>>) {
                 if (tracked[i]) grads.emplace_back(JitAdLinks<elem_t<X>>::cotangent(x));
               }
               ++i;
             },
             l),
         ...);
      },
      *pb.leaves);
  pb.tape->reset();
  return grads;
}

/// The shard_map as a node of the grad's tape (appended after its arguments' nodes, before its
/// outputs' collectors, so it runs after every output's cotangent arrived): traces the backward
/// equation and pushes the arguments' traced cotangents to their nodes.
template <typename Out, typename... Args>
struct ShardMapJitNode final : NodeBase {
  using Pb = ShardMapPullback<Out, Args...>;
  ShardMapJitNode(std::uint64_t level_, int res_id_, Tape& tape_, std::shared_ptr<Pb> shadow_pb_,
                  std::shared_ptr<const std::vector<bool>> tracked_, const Args&... args)
      : NodeBase("shard_map"),
        level(level_),
        res_id(res_id_),
        tape(&tape_),
        shadow_pb(std::move(shadow_pb_)),
        tracked(std::move(tracked_)),
        traced_args(tree_map([](const auto& x) { return x.alias(); }, args)...) {}

  bool has_cotangent() const override { return seeded; }
  void reset() override {
    for (auto& c : cts) c.reset();
    seeded = false;
  }

  void backward(bool) override {
    if (!seeded) return;
    TraceFrame* f = trace_frame(level);
    if (!f) raise_escaped_trace("shard_map");
    Program& pr = *f->program;
    ProgramEqn b;
    b.op = "shard_map_vjp";
    b.in = {res_id};
    b.in_shardings = {std::nullopt};
    std::vector<int> ct_ids;
    std::vector<std::any> ct_shadows;
    std::size_t k = 0;
    tree_for_each(
        [&](const auto& y) {
          using Y = std::remove_cvref_t<decltype(y)>;
          const std::optional<std::any>& c = cts[k++];
          if (!c) {
            ct_ids.push_back(-1);
            return;
          }
          const Y& ct = *std::any_cast<Y>(&*c);
          const int id = trace_operand(*f, ct, "shard_map");
          ct_ids.push_back(id);
          b.in.push_back(id);
          b.in_shardings.push_back(sharding_if_sharded(shadow_of(ct, level)));
          ct_shadows.emplace_back(shadow_of(ct, level).alias());
        },
        *shadow_pb->outs);
    std::vector<const std::any*> ptrs;
    std::size_t s = 0;
    for (const int id : ct_ids) ptrs.push_back(id >= 0 ? &ct_shadows[s++] : nullptr);
    const CommSnapshot before = comm_snapshot();
    std::vector<std::any> shadow_grads = apply_pullback(*shadow_pb, ptrs, *tracked, /*keep=*/true);
    b.comms = comms_since(before);
    // One result per floating argument array the grad tracks; pushed to its node once the
    // equation is in the program (a reshard the push adds reads it).
    std::vector<int> outs;
    std::vector<std::function<void()>> pushes;
    std::size_t g = 0, a = 0;
    const int producer = static_cast<int>(pr.eqns.size());
    std::apply(
        [&](const auto&... l) {
          (tree_for_each(
               [&](const auto& x) {
                 using X = std::remove_cvref_t<decltype(x)>;
                 using T = elem_t<X>;
                 if constexpr (FloatDtype<T>) {
                   if (!(*tracked)[a++]) return;
                   const X& sg = *std::any_cast<X>(&shadow_grads[g++]);
                   ProgramValue cv = value_of(sg, ProgramValue::Kind::kResult);
                   cv.producer = producer;
                   const int id = add_value(pr, std::move(cv));
                   outs.push_back(id);
                   b.out.push_back(id);
                   pushes.push_back([this, x = x.alias(), traced = make_traced(sg.alias(), level, id)] {
                     JitAdLinks<T>::push(x, *tape, traced);
                   });
                 } else {
                   ++a;
                 }
               },
               l),
           ...);
        },
        traced_args);
    // The replay's pullback is applied as often as the trace applied it (a vjp_fn called twice
    // inside the jit): every application but the last keeps it.
    const int index = (*applications)++;
    b.run = [res_id = res_id, ct_ids, outs, index, applications = applications, tracked = tracked](
                ReplayEnv& env, const ProgramEqn& eqn) {
      Pb& pb = *env.get<std::shared_ptr<Pb>>(res_id);
      std::vector<const std::any*> in;
      std::size_t next = 1;  // the cotangents follow the residual in eqn.in (common subexpressions renamed)
      for (const int id : ct_ids)
        in.push_back(id >= 0 ? &env.slots[static_cast<std::size_t>(eqn.in[next++])] : nullptr);
      std::vector<std::any> grads = apply_pullback(pb, in, *tracked, /*keep=*/index + 1 < *applications);
      for (std::size_t i = 0; i < outs.size(); ++i)
        if (outs[i] >= 0) env.slots[static_cast<std::size_t>(outs[i])] = std::move(grads[i]);
    };
    pr.eqns.push_back(std::move(b));
    reset();
    for (auto& push : pushes) push();
  }

  std::uint64_t level;
  int res_id;
  Tape* tape;
  std::shared_ptr<Pb> shadow_pb;  ///< the pullback on the shadows (traces the backward equation)
  std::shared_ptr<const std::vector<bool>> tracked;  ///< per array of the arguments: differentiated
  std::tuple<Args...> traced_args;
  std::vector<std::optional<std::any>> cts;  ///< per array of the outputs: its traced cotangent
  std::shared_ptr<int> applications = std::make_shared<int>(0);  ///< backward equations traced
  bool seeded = false;
};

/// The shard_map `fn` on traced arguments, differentiated by `tape` (a grad inside the jit at
/// `level`): the forward equation now, the backward one when the tape's pass reaches it.
template <typename Fn, typename... Args>
auto trace_shard_map_vjp(Fn fn, std::uint64_t level, Tape& tape, const Args&... args) {
  using Out = decltype(fn(args...));
  TraceFrame* frame = trace_frame(level);
  if (!frame) raise_escaped_trace("shard_map");
  Program& prog = *frame->program;
  ProgramEqn e;
  e.op = "shard_map_forward_vjp";
  const std::tuple<Args...> shadows = trace_tree_operands(*frame, e, "shard_map", args...);
  // Only the arrays the grad differentiates are tracked (the others are constants of the body's
  // tapes, as for the grad outside jit: no cotangent is computed or summed for them).
  auto tracked = std::make_shared<const std::vector<bool>>(tracked_arrays(tape, args...));
  const CommSnapshot before = comm_snapshot();
  auto [shadow, shadow_pb] =
      std::apply([&](const auto&... s) { return forward_with_pullback(fn, *tracked, s...); }, shadows);
  e.comms = comms_since(before);
  Out out = traced_tree_results(*frame, e, shadow);
  const std::vector<int> outs = e.out;
  ProgramValue r;
  r.kind = ProgramValue::Kind::kVjp;
  r.dtype = "vjp";
  r.producer = static_cast<int>(prog.eqns.size());
  const int res_id = add_value(prog, std::move(r));
  e.out.push_back(res_id);
  e.run = [fn, skeleton = tree_skeleton(args...), outs, res_id, tracked](ReplayEnv& env,
                                                                         const ProgramEqn& eqn) {
    auto [o, pb] = std::apply([&](const auto&... a) { return forward_with_pullback(fn, *tracked, a...); },
                              replayed_tree_operands(env, eqn, eqn.in, *skeleton));
    std::size_t j = 0;
    tree_for_each([&](const auto& leaf) { env.set(outs[j++], leaf.alias()); }, o);
    env.set(res_id, std::move(pb));
  };
  prog.eqns.push_back(std::move(e));

  // The grad's side: the shard_map's node, then a collector on each floating output.
  auto node = std::make_shared<ShardMapJitNode<Out, Args...>>(level, res_id, tape, std::move(shadow_pb),
                                                              tracked, args...);
  tape.append(node);
  std::size_t count = 0;
  tree_for_each([&](const auto&) { ++count; }, out);
  node->cts.resize(count);
  std::size_t f = 0;
  tree_for_each(
      [&](auto& y) {
        using Y = std::remove_cvref_t<decltype(y)>;
        const std::size_t i = f++;
        JitAdLinks<elem_t<Y>>::collect(y, tape, [n = node.get(), i](const Y& ct) {
          n->cts[i] = std::any(ct.alias());
          n->seeded = true;
        });
      },
      out);
  return out;
}

}  // namespace shard::detail
