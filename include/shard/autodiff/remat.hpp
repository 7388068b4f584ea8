#pragma once
/// \file Rematerialization (JAX's jax.checkpoint / jax.remat and jax.checkpoint_policies): a
/// function whose intermediate values are not kept for the backward pass but computed again from
/// its arguments when the pass reaches it.
///
/// `shard::checkpoint(f, policy)(args...)` returns f(args...). When autodiff records (inside
/// grad, value_and_grad, vjp, in either view or in a differentiated shard_map body, also under
/// jit), f runs without recording and the tape keeps one node for the whole call: it holds the
/// arguments (aliases of their memory) and the outputs of the primitives `policy` saves, nothing
/// else. The backward pass runs f again on a tape of its own, the saved primitives' outputs
/// taken as they were (their kernels not run again), and passes the arguments' cotangents on.
/// The values and gradients are those of f without checkpoint (the same kernels on the same
/// operands; to rounding where a cotangent is summed at the checkpoint's node instead of inside
/// f); the cost is one more forward run of what the policy does not save.
///
/// Semantics, as JAX's:
///   - args: arrays, or parameter trees of them (shard/core/tree.hpp: a std::vector,
///     std::map<std::string, ...>, std::tuple or SHARD_TREE struct, nested), or static values
///     (ints, flags) passed as they are. f returns one array (Tensor or ShardedArray).
///   - f must use the arrays being differentiated only through its arguments: one it captures
///     raises ValueError (its gradient could not flow back), as in a shard_map body; so does a
///     value of a differentiated shard_map body that varies over mesh axes (pass it: its axes
///     then flow through). Constants (the batch outside a body, masks) may be captured.
///   - f is copied into the tape's node and runs again in the backward pass: capture by value
///     what it needs (a reference to a local of a scope that has ended by then dangles).
///   - f must compute the same ops from the same arguments each time (a pure function, as JAX
///     traces it): a replay that binds other primitives raises ValueError.
///   - Policies (checkpoint_policies): nothing_saveable (the default: only the arguments are
///     kept), dots_saveable (the products' outputs: matmul, matmul_t, vdot; the elementwise ops,
///     norms and attention run again), everything_saveable (every primitive whose result the
///     record step computes alone; attention and softmax, which keep their VJP's residuals as they
///     run, run again, as does standardize, LayerNorm's), or a RematPolicy with a predicate on
///     the primitive's name
///     (`RematPolicy{[](std::string_view op) { return op == "matmul"; }}`).
///   - Under jit the recomputation is part of the traced program (jit's common-subexpression
///     pass does not merge it into the forward's values, as XLA's optimization barrier).
///   - Not differentiated (no argument tracked by a recording tape): plain f(args...). A
///     checkpoint inside a checkpointed function is part of the outer one (runs as plain f in
///     both of its runs).
///   - Collective where f is: every rank runs f again in the same backward step.

#include <any>
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "shard/autodiff/detail/ad_node.hpp"
#include "shard/core/detail/remat.hpp"
#include "shard/core/detail/tape.hpp"
#include "shard/core/tree.hpp"
#include "shard/error.hpp"

namespace shard {

/// Which primitives' outputs a checkpointed function keeps for its backward pass (JAX's
/// checkpoint policies): `saveable(name)` true keeps the output of the primitive `name`.
struct RematPolicy {
  std::function<bool(std::string_view)> saveable;
};

/// JAX's jax.checkpoint_policies.
namespace checkpoint_policies {
/// Keep nothing but the arguments (the default).
inline const RematPolicy nothing_saveable{};
/// Keep the products' outputs (matmul, matmul_t, vdot).
inline const RematPolicy dots_saveable{
    [](std::string_view op) { return op == "matmul" || op == "matmul_t" || op == "vdot"; }};
/// JAX's alias of dots_saveable.
inline const RematPolicy& checkpoint_dots = dots_saveable;
/// Keep every output the policy can keep (see remat.hpp): checkpoint then saves only the
/// recomputation of attention and softmax.
inline const RematPolicy everything_saveable{[](std::string_view) { return true; }};
}  // namespace checkpoint_policies

namespace detail {

/// Calls g(leaf) for each array of an argument (an array, or the leaves of a parameter tree).
template <typename A, typename G>
void each_array(const A& a, G&& g) {
  if constexpr (ArrayLike<A>)
    g(a);
  else if constexpr (has_leaves<A>)
    tree_for_each([&](const auto& x) { g(x); }, a);
}

/// An argument with each array replaced by what `leaf(x)` makes of it (static values copied).
template <typename A, typename L>
A map_leaves(const A& a, L&& leaf) {
  if constexpr (ArrayLike<A>)
    return leaf(a);
  else if constexpr (has_leaves<A>)
    return tree_map([&](const auto& x) { return leaf(x); }, a);
  else
    return a;
}

/// Moves a run's leaf's cotangent (its own part, the parts that vary over more axes, the
/// reductions in flight) to the argument's node on the outer tape, unsummed: the outer node sums
/// them with its other uses as it would have without checkpoint.
template <ArrayLike X>
void pass_cotangent(Node<X>& from, Node<X>& to, std::uint32_t vma) {
  for (auto& take : from.deferred) to.defer(std::move(take));
  from.deferred.clear();
  if (from.ct) to.add(std::move(*from.ct), vma);
  from.ct.reset();
  for (auto& [mask, part] : from.pending) to.add(std::move(part), vma | mask);
  from.pending.clear();
}

/// What a checkpoint keeps of its arguments: aliases of them (no records), and for each array in
/// them, in order, the mesh axes it varies over and its node on the outer tape (null for a
/// constant or an integer array).
template <typename... A>
struct RematArgs {
  std::tuple<A...> kept;
  std::vector<std::uint32_t> vma;
  std::vector<std::shared_ptr<NodeBase>> outer;

  /// f's inputs for a run on `tape`: each array an alias carrying its vma there; each one with an
  /// outer node a leaf of `tape` (its metadata the outer node's, so a gradient lands where the
  /// outer node keeps it) whose cotangent `passes` move to the outer node after the pass.
  std::tuple<A...> inputs(Tape& tape, std::vector<std::function<void()>>& passes) const {
    std::size_t j = 0;
    const auto make = [&](const auto& x) {
      using X = std::remove_cvref_t<decltype(x)>;
      const std::uint32_t v = vma[j];
      const std::shared_ptr<NodeBase>& o = outer[j++];
      X in = x.alias();
      if constexpr (FloatDtype<elem_t<X>>) {
        if (o) {
          auto to = std::static_pointer_cast<Node<X>>(o);
          auto node = std::make_shared<Node<X>>("checkpoint argument", tape, v, to->meta);
          node->leaf = parameter_like(*to);  // no rule runs on it: its cotangent stays for the pass
          in.set_ad(std::make_shared<AdValue>(AdValue{tape.id(), v, node}));
          passes.push_back([node, to, v] { pass_cotangent(*node, *to, v); });
          return in;
        }
      }
      in.set_ad(v ? std::make_shared<AdValue>(AdValue{tape.id(), v, nullptr}) : nullptr);
      return in;
    };
    // Braces: the arguments are mapped in order (j counts their arrays).
    return std::apply([&](const auto&... a) { return std::tuple<A...>{map_leaves(a, make)...}; }, kept);
  }
};

template <typename F, typename... A>
auto run_checkpoint(const F& f, const RematPolicy& policy, const A&... args) {
  using Out = std::remove_cvref_t<std::invoke_result_t<const F&, const A&...>>;
  static_assert(ArrayLike<Out>, "checkpoint: the function must return one Tensor or ShardedArray");
  Tape* tape = recording_tape();
  bool tracked = false;
  if (tape)
    (each_array(args,
                [&](const auto& x) {
                  if constexpr (FloatDtype<elem_t<std::remove_cvref_t<decltype(x)>>>)
                    tracked = tracked || node_of(x, *tape) != nullptr;
                }),
     ...);
  // Not differentiated here, or inside another checkpointed function's run: f as it is (a nested
  // checkpoint is part of the outer one, whose two runs then bind the same ops).
  if (!tracked || t_remat) return f(args...);

  auto in = std::make_shared<RematArgs<A...>>();
  in->kept = std::tuple<A...>{map_leaves(args, [](const auto& x) {
    auto a = x.alias();
    a.set_ad(nullptr);
    return a;
  })...};
  (each_array(args,
              [&](const auto& x) {
                using X = std::remove_cvref_t<decltype(x)>;
                in->vma.push_back(vma_of(x, *tape));
                std::shared_ptr<NodeBase> o;
                if constexpr (FloatDtype<elem_t<X>>) o = node_of(x, *tape);
                in->outer.push_back(std::move(o));
              }),
   ...);
  auto state = std::make_shared<RematState>();
  state->saveable = policy.saveable;
  state->salt = "#remat" + std::to_string(tape->id()) + "." + std::to_string(tape->size());
  const bool device = tape->device_view();
  // One run of f on a tape of its own (parent: the outer tape, so an array of the outer tape
  // reaching it raises: captured, not passed), its arguments tracked there: the forward run (its
  // nodes dropped when it returns) and the replay run the same code paths, and so bind the same ops.
  auto run = [f, in, state](bool replay, Tape& t, std::vector<std::function<void()>>& passes) {
    state->replay = replay;
    state->next = 0;
    auto inputs = in->inputs(t, passes);
    const TapeScope on(&t);
    const RematScope keeping(state.get());
    return std::apply(f, inputs);
  };
  const auto run_tape = [device](const Tape& outer) {
    auto t = std::make_unique<Tape>(device, outer.id());
    t->set_axis_names(outer.axis_names());
    t->set_context(outer.context());
    t->set_remat();
    return t;
  };
  std::uint32_t vma = 0;
  Out out = [&] {
    const auto forward = run_tape(*tape);
    std::vector<std::function<void()>> unused;
    Out o = run(false, *forward, unused);
    vma = vma_of(o, *forward);
    o.set_ad(nullptr);
    return o;
  }();
  if constexpr (FloatDtype<elem_t<Out>>) {
    auto node = std::make_shared<Node<Out>>("checkpoint", *tape, vma, NodeMeta<Out>(out));
    node->rule = [run, run_tape, state, outer = tape](const Out& ct, std::uint32_t v) {
      const auto replay = run_tape(*outer);
      std::vector<std::function<void()>> passes;
      Out again = run(true, *replay, passes);
      if (state->next != state->saved.size()) state->raise_mismatch("(the end of the function)");
      if (again.shape() != ct.shape())
        raise<ShapeError>("checkpoint: recomputing the function gave shape ", to_string(again.shape()),
                          " where its first run gave ", to_string(ct.shape()));
      if (auto n = node_of(again, *replay)) {
        Out c = ct.alias();
        c.set_ad(nullptr);
        n->add(std::move(c), v);
      }
      replay->backward();
      for (auto& pass : passes) pass();
    };
    tape->append(node);
    out.set_ad(std::make_shared<AdValue>(AdValue{tape->id(), vma, std::move(node)}));
  } else {
    out.set_ad(vma ? std::make_shared<AdValue>(AdValue{tape->id(), vma, nullptr}) : nullptr);
  }
  return out;
}

}  // namespace detail

/// jax.checkpoint(f, policy=...) (also jax.remat): f whose intermediate values are computed again
/// in the backward pass instead of kept (see this header's first comment). Collective where f is.
template <typename F>
auto checkpoint(F f, RematPolicy policy = checkpoint_policies::nothing_saveable) {
  return [f = std::move(f), policy = std::move(policy)](const auto&... args) {
    return detail::run_checkpoint(f, policy, args...);
  };
}
/// jax.remat: checkpoint's other name.
template <typename F>
auto remat(F f, RematPolicy policy = checkpoint_policies::nothing_saveable) {
  return checkpoint(std::move(f), std::move(policy));
}

}  // namespace shard
