#pragma once
/// \file jit's step of the op driver (array/driver.hpp includes this at its end): a primitive on
/// traced operands is run on their shadows and appended to the trace's program
/// (array/detail/program.hpp); replaying the program binds it again.

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "shard/array/detail/program.hpp"
#include "shard/array/driver.hpp"
#include "shard/core/detail/remat.hpp"
#include "shard/core/tree.hpp"

namespace shard::detail {

/// The factor rule jit's propagation lays the primitive out by: rule() for a primitive the driver
/// plans by its rule, layout_rule() for one that plans itself but lines up with a factor rule
/// (matmul); none for the others, which replay as they ran when traced.
template <typename P, typename... X>
constexpr bool plans_by_rule() {
  if constexpr (!(is_sharded_v<X> && ...) || MovesAcross<P, X...>)
    return false;
  else if constexpr (requires(const P& p, const X&... xs) { p.sharded(xs...); })
    return false;
  else
    return requires(const P& p) { p.rule(); };
}
template <typename P, typename... X>
constexpr bool lines_up_by_rule() {
  if constexpr (!(is_sharded_v<X> && ...) || MovesAcross<P, X...>)
    return false;
  else
    return requires(const P& p, const X&... xs) { p.layout_rule(xs...); };
}

/// The operand x lined up with `want` (as it is when it already is, or when want is none).
template <Dtype T>
ShardedArray<T> lined_with(const ShardedArray<T>& x, const std::optional<NamedSharding>& want) {
  if (!want || x.sharding() == *want) return x.alias();
  return reshard(x, *want);
}

/// Operand k of equation `eqn` on replay: as it is under an outer transformation (or for a Tensor),
/// else lined up with the sharding it had when traced.
template <typename X>
X replay_operand(const ReplayEnv& env, const ProgramEqn& eqn, std::size_t k, const X& x) {
  if constexpr (is_sharded_v<X>)
    if (!env.plain) return lined_with(x, eqn.in_shardings[k]);
  return x.alias();
}

/// One equation of a replay: bound as an eager op is, or with the layouts propagation chose.
template <typename Out, typename P, ArrayLike... X>
Out replay_primitive(const P& p, const shard::source_location& where, const ReplayEnv& env,
                     const ProgramEqn& eqn, const X&... xs) {
  if constexpr (!(is_sharded_v<X> && ...)) {
    return bind_at(p, where, xs...);
  } else {
    if (env.plain) return bind_at(p, where, xs...);
    if constexpr (plans_by_rule<P, X...>()) {
      if (eqn.plan) {
        // Operands already laid out as the plan's result (an elementwise op whose layout
        // propagation kept): the blocks as they are, as eager's fast path runs them.
        if (p.rule().elementwise() && all_like(xs...) &&
            std::get<0>(std::forward_as_tuple(xs...)).sharding() == *eqn.out_sharding)
          return run_aligned(p, xs...);
        return run_blocks<P, elem_t<Out>>(p, *eqn.plan, eqn.factors->factors.result_shape,
                                          std::index_sequence_for<X...>{}, xs...);
      }
    }
    // Each operand as the equation wants it: the plan's layout, else as it was when traced.
    const Mesh* mesh = nullptr;
    if (eqn.plan) {
      const std::array<const Mesh*, sizeof...(X)> meshes{&xs.mesh()...};
      mesh = meshes[eqn.plan->base];
    }
    std::size_t i = 0;
    auto want = [&]() -> std::optional<NamedSharding> {
      const std::size_t k = i++;
      if (eqn.plan) {
        if (!eqn.plan->want[k]) return std::nullopt;
        return NamedSharding(*mesh, *eqn.plan->want[k]);
      }
      return eqn.in_shardings[k];
    };
    const std::tuple<X...> lined{lined_with(xs, want())...};
    Out out = std::apply([&](const auto&... l) { return bind_at(p, where, l...); }, lined);
    if constexpr (is_sharded_v<Out>) {
      if (eqn.out_sharding && !(out.sharding() == *eqn.out_sharding)) return reshard(out, *eqn.out_sharding);
    }
    return out;
  }
}

/// The equation's Pointwise (jit/fuse.hpp) when p has a span kernel for these operands and every
/// operand has the result's shape and layout (no broadcasting, no reshard); none otherwise.
template <typename Out, typename P, ArrayLike... X>
std::shared_ptr<const Pointwise> pointwise_of(const P& p, const Out& out, const X&... xs) {
  if constexpr (requires(std::int64_t n, const elem_t<X>*... in, elem_t<Out>* o) { p.span(n, in..., o); }) {
    if (!((xs.shape() == out.shape()) && ...)) return nullptr;
    if constexpr (is_sharded_v<Out>) {
      if (!((xs.sharding() == out.sharding()) && ...)) return nullptr;
    }
    auto pw = std::make_shared<Pointwise>();
    pw->span = [p](std::int64_t n, const void* const* in, void* o) {
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        p.span(n, static_cast<const elem_t<X>*>(in[I])..., static_cast<elem_t<Out>*>(o));
      }
      (std::index_sequence_for<X...>{});
    };
    pw->in = {&value_access<X>()...};
    pw->out = &value_access<Out>();
    return pw;
  } else {
    return nullptr;
  }
}

/// What ProgramEqn::identity holds for p: its type and its bytes when it is trivially copyable
/// (every parameter a value in the object), else its type and `cse_key()` (a primitive that holds
/// a vector or a pointer spells out its parameters; empty: not merged), nothing otherwise (never
/// merged). Padding bytes may differ between two equal primitives: that only misses a merge.
template <typename P>
std::string primitive_identity(const P& p) {
  if constexpr (std::is_trivially_copyable_v<P>) {
    std::string id = typeid(P).name();
    id.push_back('\0');
    id.append(reinterpret_cast<const char*>(&p), sizeof(P));
    return id;
  } else if constexpr (requires {
                         { p.cse_key() } -> std::convertible_to<std::string>;
                       }) {
    std::string key = p.cse_key();
    if (key.empty()) return {};
    return std::string(typeid(P).name()) + '\0' + key;
  } else {
    return {};
  }
}

/// The trace step of bind: the primitive on the shadows, appended to the program of `level`.
template <typename P, ArrayLike... X>
bind_result_t<P, X...> trace_primitive(const P& p, const shard::source_location& where, std::uint64_t level,
                                       const X&... xs) {
  using Out = bind_result_t<P, X...>;
  TraceFrame* frame = trace_frame(level);
  if (!frame) raise_escaped_trace(p.name());
  Program& prog = *frame->program;
  const std::array<int, sizeof...(X)> ids{trace_operand(*frame, xs, p.name())...};
  ProgramEqn e;
  e.op = p.name();
  if constexpr (requires { p.params_text(); }) e.params = p.params_text();
  e.identity = primitive_identity(p);
  if (const RematState* r = t_remat; r && r->replay && !e.identity.empty()) e.identity += r->salt;
  e.where = where;
  e.in.assign(ids.begin(), ids.end());
  if constexpr (requires { P::any_input_layout; })
    e.in_shardings.assign(sizeof...(X), std::nullopt);
  else
    (e.in_shardings.push_back(sharding_if_sharded(shadow_of(xs, level))), ...);
  const CommSnapshot before = comm_snapshot();
  Out shadow = bind_at(p, where, shadow_of(xs, level)...);
  e.comms = comms_since(before);
  if constexpr (plans_by_rule<P, X...>() || lines_up_by_rule<P, X...>()) {
    const FactorRule* rule = nullptr;
    if constexpr (plans_by_rule<P, X...>())
      rule = &p.rule();
    else
      rule = p.layout_rule(shadow_of(xs, level)...);
    if (rule) {
      EqnFactors f{std::make_shared<const FactorRule>(*rule), {}};
      f.factors = f.rule->expand({&shadow_of(xs, level).shape()...}, p.name(), where);
      e.factors = std::move(f);
    }
  }
  ProgramValue v = value_of(shadow, ProgramValue::Kind::kResult);
  v.producer = static_cast<int>(prog.eqns.size());
  e.out_sharding = v.sharding;
  const int out_id = add_value(prog, std::move(v));
  e.out = {out_id};
  e.pure = true;
  e.pointwise = pointwise_of(p, shadow, shadow_of(xs, level)...);
  e.run = [p, where, out_id](ReplayEnv& env, const ProgramEqn& eqn) {
    env.set(
        out_id, [&]<std::size_t... I>(std::index_sequence<I...>) {
          return replay_primitive<Out>(p, where, env, eqn, env.get<X>(eqn.in[I])...);
        }(std::index_sequence_for<X...>{}));
  };
  prog.eqns.push_back(std::move(e));
  return make_traced(std::move(shadow), level, out_id);
}

/// The trace step of bind_list (concatenate, stack): replayed as it ran when traced.
template <typename P, ArrayLike X>
X trace_list_primitive(const P& p, const shard::source_location& where, std::uint64_t level,
                       const std::vector<X>& xs) {
  TraceFrame* frame = trace_frame(level);
  if (!frame) raise_escaped_trace(p.name());
  Program& prog = *frame->program;
  ProgramEqn e;
  e.op = p.name();
  e.where = where;
  std::vector<X> shadows;
  shadows.reserve(xs.size());
  for (const auto& x : xs) {
    e.in.push_back(trace_operand(*frame, x, p.name()));
    shadows.push_back(shadow_of(x, level).alias());
    e.in_shardings.push_back(sharding_if_sharded(shadows.back()));
  }
  const CommSnapshot before = comm_snapshot();
  X shadow = bind_list_at(p, where, shadows);
  e.comms = comms_since(before);
  ProgramValue v = value_of(shadow, ProgramValue::Kind::kResult);
  v.producer = static_cast<int>(prog.eqns.size());
  e.out_sharding = v.sharding;
  const int out_id = add_value(prog, std::move(v));
  e.out = {out_id};
  e.pure = true;
  e.run = [p, where, out_id](ReplayEnv& env, const ProgramEqn& eqn) {
    std::vector<X> in;
    in.reserve(eqn.in.size());
    for (std::size_t k = 0; k < eqn.in.size(); ++k) {
      in.push_back(replay_operand(env, eqn, k, env.get<X>(eqn.in[k])));
    }
    env.set(out_id, bind_list_at(p, where, in));
  };
  prog.eqns.push_back(std::move(e));
  return make_traced(std::move(shadow), level, out_id);
}

/// forward_vjp of a primitive on traced operands under a tape (jit(grad(f))): two equations, the
/// forward (the result and the VJP's residuals, held as a value of the program) and, when the
/// backward pass reaches it, the VJP on the cotangent.
template <typename P, ArrayLike... X>
auto trace_forward_vjp(const P& p, const VjpNeed& need, std::uint64_t level, const X&... xs)
    -> decltype(p.forward_vjp(need, xs...)) {
  using Pair = decltype(p.forward_vjp(need, xs...));
  using Out = typename Pair::first_type;
  using Vjp = typename Pair::second_type;
  TraceFrame* frame = trace_frame(level);
  if (!frame) raise_escaped_trace(p.name());
  Program& prog = *frame->program;
  const std::array<int, sizeof...(X)> ids{trace_operand(*frame, xs, p.name())...};
  ProgramEqn e;
  e.op = std::string(p.name()) + "_forward_vjp";
  e.in.assign(ids.begin(), ids.end());
  (e.in_shardings.push_back(sharding_if_sharded(shadow_of(xs, level))), ...);
  const CommSnapshot before = comm_snapshot();
  auto [shadow, shadow_vjp] = forward_vjp_at(p, need, shadow_of(xs, level)...);
  e.comms = comms_since(before);
  ProgramValue v = value_of(shadow, ProgramValue::Kind::kResult);
  const int producer = static_cast<int>(prog.eqns.size());
  v.producer = producer;
  e.out_sharding = v.sharding;
  const int out_id = add_value(prog, std::move(v));
  ProgramValue r;
  r.kind = ProgramValue::Kind::kVjp;
  r.dtype = "vjp";
  r.producer = producer;
  const int res_id = add_value(prog, std::move(r));
  e.out = {out_id, res_id};
  const std::uint64_t bits = need.bits;
  const std::size_t n = need.n;
  e.run = [p, out_id, res_id, bits, n](ReplayEnv& env, const ProgramEqn& eqn) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      const std::tuple<X...> lined{replay_operand(env, eqn, I, env.get<X>(eqn.in[I]))...};
      auto [o, vjp] = forward_vjp_at(p, VjpNeed{bits, n}, std::get<I>(lined)...);
      env.set(out_id, std::move(o));
      env.set(res_id, std::make_shared<const Vjp>(std::move(vjp)));
    }
    (std::index_sequence_for<X...>{});
  };
  prog.eqns.push_back(std::move(e));
  auto held = std::make_shared<const Vjp>(std::move(shadow_vjp));
  Vjp traced_vjp = [held, res_id, level, name = p.name()](const Out& ct, const VjpNeed& nd) {
    TraceFrame* f = trace_frame(level);
    if (!f) raise_escaped_trace(name);
    Program& pr = *f->program;
    const int ct_id = trace_operand(*f, ct, name);
    ProgramEqn b;
    b.op = std::string(name) + "_vjp";
    b.in = {res_id, ct_id};
    b.in_shardings = {std::nullopt, sharding_if_sharded(shadow_of(ct, level))};
    const CommSnapshot before_b = comm_snapshot();
    Cotangents<Out> sc = (*held)(shadow_of(ct, level), nd);
    for (auto& [i, take] : sc.deferred()) sc[i].emplace(take());
    b.comms = comms_since(before_b);
    std::vector<int> outs;
    for (std::size_t i = 0; i < sc.size(); ++i) {
      if (!sc[i]) {
        outs.push_back(-1);
        continue;
      }
      ProgramValue cv = value_of(*sc[i], ProgramValue::Kind::kResult);
      cv.producer = static_cast<int>(pr.eqns.size());
      const int id = add_value(pr, std::move(cv));
      outs.push_back(id);
      b.out.push_back(id);
    }
    const std::uint64_t nbits = nd.bits;
    const std::size_t nn = nd.n;
    b.run = [res_id, outs, nbits, nn](ReplayEnv& env, const ProgramEqn& eqn) {
      const auto& vjp = *env.get<std::shared_ptr<const Vjp>>(res_id);
      Cotangents<Out> c = vjp(env.get<Out>(eqn.in[1]), VjpNeed{nbits, nn});
      for (auto& [i, take] : c.deferred()) c[i].emplace(take());
      for (std::size_t i = 0; i < outs.size(); ++i)
        if (outs[i] >= 0) env.set(outs[i], Out(*c[i]));
    };
    pr.eqns.push_back(std::move(b));
    Cotangents<Out> made(sc.size());
    for (std::size_t i = 0; i < sc.size(); ++i)
      if (outs[i] >= 0) made[i].emplace(make_traced(Out(*sc[i]), level, outs[i]));
    return made;
  };
  return Pair{make_traced(std::move(shadow), level, out_id), std::move(traced_vjp)};
}

/// The highest jit trace level among the arrays of these trees (0: none is traced).
template <typename... Args>
std::uint64_t trace_level_of(const Args&... args) {
  std::uint64_t level = 0;
  (tree_for_each(
       [&](const auto& leaf) {
         if (const auto& b = leaf.batch(); b && b->trace && b->level > level) level = b->level;
       },
       args),
   ...);
  return level;
}

/// The operands of an equation that takes trees of arrays (every array of `args`, in tree
/// order): their ids and shardings appended to `e`; returns the trees of their shadows.
template <typename... Args>
std::tuple<Args...> trace_tree_operands(TraceFrame& frame, ProgramEqn& e, const char* name,
                                        const Args&... args) {
  (tree_for_each(
       [&](const auto& leaf) {
         e.in.push_back(trace_operand(frame, leaf, name));
         e.in_shardings.push_back(sharding_if_sharded(shadow_of(leaf, frame.level)));
       },
       args),
   ...);
  return std::tuple<Args...>{
      tree_map([&](const auto& leaf) { return shadow_of(leaf, frame.level).alias(); }, args)...};
}

/// The equation's results from the trees it gave on the shadows: each array a value of `prog` made
/// by `e` (its id appended to e.out), returned traced.
template <typename Out>
Out traced_tree_results(TraceFrame& frame, ProgramEqn& e, const Out& shadow) {
  Program& prog = *frame.program;
  const int producer = static_cast<int>(prog.eqns.size());
  return tree_map(
      [&](const auto& leaf) {
        ProgramValue v = value_of(leaf, ProgramValue::Kind::kResult);
        v.producer = producer;
        const int id = add_value(prog, std::move(v));
        e.out.push_back(id);
        return make_traced(leaf.alias(), frame.level, id);
      },
      shadow);
}

/// The trees of arrays shaped like `skeleton` as the equation's replay reads them (operand ids
/// `ins`, in tree order), each lined up as it was when traced. An operand the program reads last
/// here is moved out of its slot: a function that takes it by value and updates it in place (the
/// optimizer's update of donated parameters) then copies nothing.
template <typename... Args>
std::tuple<Args...> replayed_tree_operands(ReplayEnv& env, const ProgramEqn& eqn, const std::vector<int>& ins,
                                           const std::tuple<Args...>& skeleton) {
  std::size_t k = 0;
  auto fill = [&](const auto& arg) {
    return tree_map(
        [&](const auto& leaf) {
          using X = std::remove_cvref_t<decltype(leaf)>;
          const std::size_t i = k++;
          const auto uses = static_cast<std::size_t>(std::count(ins.begin(), ins.end(), ins[i]));
          return replay_operand(env, eqn, i, env.take<X>(ins[i], uses));
        },
        arg);
  };
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    return std::tuple<Args...>{fill(std::get<I>(skeleton))...};  // braces: in order
  }
  (std::index_sequence_for<Args...>{});
}

/// The trees' structure without their arrays (what a replay fills).
template <typename... Args>
std::shared_ptr<const std::tuple<Args...>> tree_skeleton(const Args&... args) {
  return std::make_shared<const std::tuple<Args...>>(
      tree_map([](const auto& leaf) { return std::remove_cvref_t<decltype(leaf)>(); }, args)...);
}

/// A call jit records as one equation instead of op by op (a shard_map: its body runs per device
/// on blocks): `fn` runs on the shadows now and on the program's values when it replays, its
/// arguments lined up as they were when traced.
template <typename Fn, typename... Args>
auto trace_opaque(const char* name, Fn fn, std::uint64_t level, const Args&... args) {
  using Out = decltype(fn(args...));
  TraceFrame* frame = trace_frame(level);
  if (!frame) raise_escaped_trace(name);
  ProgramEqn e;
  e.op = name;
  const std::tuple<Args...> shadows = trace_tree_operands(*frame, e, name, args...);
  const CommSnapshot before = comm_snapshot();
  Out shadow = std::apply(fn, shadows);
  e.comms = comms_since(before);
  Out out = traced_tree_results(*frame, e, shadow);
  e.run = [fn, skeleton = tree_skeleton(args...), outs = e.out](ReplayEnv& env, const ProgramEqn& eqn) {
    Out r = std::apply(fn, replayed_tree_operands(env, eqn, eqn.in, *skeleton));
    std::size_t o = 0;
    tree_for_each([&](const auto& leaf) { env.set(outs[o++], leaf.alias()); }, r);
  };
  frame->program->eqns.push_back(std::move(e));
  return out;
}

}  // namespace shard::detail
