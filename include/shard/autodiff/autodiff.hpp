#pragma once
/// \file Reverse-mode automatic differentiation of programs written with Shard's ops (JAX's
/// jax.grad, jax.value_and_grad, jax.vjp, jax.lax.stop_gradient), in both views.
///
/// How it works. grad(f)(params, args...) makes a tape, hands f aliases of the parameters
/// that the tape tracks, and runs f. Every op kernel that receives a tracked array (Tensor or
/// ShardedArray: the same op set) records a node with its vector-Jacobian product, the rule
/// written next to the op in terms of the same ops (its primitive's vjp(), ops/*.hpp). The backward
/// pass runs the rules in reverse order from a cotangent of 1 and returns the parameters'
/// cotangents. Residuals are aliases of the arrays' memory (Tensor::alias), never copies; a
/// node frees them as soon as its rule has run. Arrays that do not depend on the parameters
/// (the batch, the labels) are constants: nothing is recorded for them.
///
/// Semantics, as JAX's:
///   - A cotangent has its primal's sharding. The backward pass of a ShardedArray op is the
///     same ops on sharded arrays, so its communication follows from the sharding rules: for
///     x P('data', None) @ W P(None, None), dW = x^T @ dy contracts over 'data', one psum;
///     nothing gathers a whole array.
///   - Through shard_map (differentiating a function that calls a shard_map from outside):
///     each value in the body carries the mesh axes it varies over (JAX's "vma"): an
///     argument varies over the axes of its in_spec, axis_index over its axes, an op's result
///     over the union of its operands'. An invariant value meeting a varying one is
///     implicitly broadcast (pvary), whose transpose is a psum: a cotangent that varies over
///     axes its primal does not is psummed over them, once per primal. Transposes: psum ->
///     pvary (no communication); pmean -> pvary / n; all_gather <-> psum_scatter (same axes,
///     dim, tiled; all_gather's result varies over its axes, as in JAX); all_to_all ->
///     all_to_all with split and concat swapped; ppermute -> the inverse permutation;
///     axis_index is a constant. An out_spec that omits an axis requires the output to be
///     invariant over it. So a data-parallel body psum(loss(x_block, W), "data") with W
///     replicated gets dW summed over 'data' by the transpose, in one psum.
///   - Gradient reduction overlaps the backward pass (ops/detail/grad_reduce.hpp, settings in
///     shard::gradient_reduction()): a parameter's gradient whose product contracts over mesh
///     axes is summed in row chunks (buckets) started as soon as their rows are computed and
///     progressed behind the rest of the pass; grad returns once they completed. The values
///     are the same as a blocking psum's (float32/float64 sums in MPI's order), or, with
///     bfloat16 on, rounded to bfloat16 and accumulated in float32.
///   - grad inside a shard_map body differentiates the device's local program (its own
///     blocks; collectives transpose as above); reduce the gradients across devices yourself,
///     e.g. pmean over 'data' (seed 004).
///   - Only float32 and float64 arrays are differentiable; integer and bool arrays (labels,
///     masks, argmax) are constants. An op without a rule for a tracked input (map, pmax of a
///     tracked value, a strided slice of a sharded array) raises ValueError naming the op:
///     a wrong gradient is never returned.
///   - A shard_map body must receive every differentiated array as an argument: one it
///     captures instead raises ValueError (its gradient could not flow back). axis_index
///     returns an int, so arrays built from it inside a body (full, arange) are constants
///     invariant over every axis; a varying value should come from an argument.
///   - Arrays a differentiated function uses must not be modified in place while the tape
///     lives (residuals alias them, as in JAX where arrays are immutable).

#include <array>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <source_location>
#include <type_traits>
#include <utility>
#include <vector>

#include "shard/error.hpp"  // shard::source_location
#include "shard/core/detail/tape.hpp"
#include "shard/core/tree.hpp"
#include "shard/autodiff/detail/ad_node.hpp"
#include "shard/ops/detail/grad_reduce.hpp"
#include "shard/ops/elementwise.hpp"
#include "shard/ops/reduce.hpp"
#include "shard/ops/ops.hpp"
#include "shard/spmd/shard_map.hpp"

namespace shard {

/// jax.lax.stop_gradient: x as a constant (an alias of its memory, not tracked). Inside a
/// differentiated shard_map body the value keeps the mesh axes it varies over.
template <ArrayLike X>
X stop_gradient(const X& x) {
  X out = x.alias();
  const auto& a = x.ad();
  out.set_ad(a && a->vma ? std::make_shared<detail::AdValue>(detail::AdValue{a->tape, a->vma, nullptr}) : nullptr);
  return out;
}

/// Tag: the function returns std::pair(value, aux) and only the value is differentiated.
struct HasAux {};
inline constexpr HasAux has_aux{};

namespace detail {

/// A parameter as the tape's leaf: an alias of its memory, tracked.
template <ArrayLike A>
A make_leaf(const A& p, Tape& tape, const char* what, const GradSharding* gs = nullptr) {
  using T = elem_t<A>;
  if constexpr (!FloatDtype<T>) {
    raise<ValueError>(what, " with respect to a ", dtype_name<T>(), " array of shape ", to_string(p.shape()),
                      ": only float32 and float64 arrays are differentiable (pass integer arrays such as labels as "
                      "the other arguments)");
  } else {
    A leaf = p.alias();
    auto node = std::make_shared<Node<A>>("parameter", tape, 0, NodeMeta<A>(leaf));
    node->leaf = true;
    if constexpr (is_sharded_v<A>) {
      if (gs && *gs) {  // the cotangent is kept (and its producers place it) as asked
        NamedSharding want = (*gs)(p.sharding(), p.shape());
        check_same_devices(p.mesh(), want.mesh(), std::string(what) + ": grad_sharding's sharding of a gradient");
        want.check_shape(p.shape());
        node->meta.sharding = std::move(want);
      }
    }
    leaf.set_ad(std::make_shared<AdValue>(AdValue{tape.id(), 0, std::move(node)}));
    return leaf;
  }
}

/// The cotangent the backward pass left at a leaf (zeros, sharded like the gradient, when the
/// output does not depend on it).
template <ArrayLike A>
A leaf_cotangent(const A& leaf, const A& primal) {
  const auto& a = leaf.ad();
  if (a && a->node) {
    auto node = std::static_pointer_cast<Node<A>>(a->node);
    if (!node->has_cotangent()) return zeros_like(node->meta);
    A g = std::move(node->total());
    node->reset();
    g.set_ad(nullptr);
    return g;
  }
  if constexpr (is_tensor_v<A>) return Tensor<elem_t<A>>(primal.shape(), elem_t<A>(0));
  else return zeros<elem_t<A>>(primal.shape(), primal.sharding());
}

/// Seeds the output's node with `ct` and runs the tape backward.
template <ArrayLike V>
void backward_from(const V& value, const V& ct, Tape& tape, bool keep = false) {
  if (ct.shape() != value.shape())
    raise<ShapeError>("vjp: the cotangent has shape ", to_string(ct.shape()), " but the function's output has shape ",
                      to_string(value.shape()));
  if (auto n = node_of(value, tape)) {
    V c = ct.alias();
    n->add(std::move(c), n->vma);
  }
  tape.backward(keep);
}

/// A 0-d 1 like the output (replicated when sharded).
template <ArrayLike V>
V ones_like_value(const V& value) {
  using T = elem_t<V>;
  if constexpr (is_tensor_v<V>) return Tensor<T>(Shape{}, T(1));
  else return full<T>(Shape{}, T(1), value.sharding());
}

/// Gives a returned array storage of its own: inside the function arrays may share memory
/// (a reshape aliases its operand, residuals alias their arrays), and what the caller gets back
/// must not write through to its inputs or to a live vjp's residuals.
template <typename X>
void own_storage(X& x) {
  if constexpr (is_tensor_v<X>) {
    x.detach_if_aliased();
  } else if constexpr (is_sharded_v<X>) {
    if (x.batch()) return;  // a batched value (vmap(grad)): vmap gives its result storage of its own
    for (auto& s : x.addressable_shards()) s.data.detach_if_aliased();
  }
}

/// Drops autodiff's records from what a function returns beside its value (has_aux), each
/// array with storage of its own.
template <typename X>
void strip_ad(X& x) {
  if constexpr (ArrayLike<X>) {
    own_storage(x);
    x.set_ad(nullptr);
  } else if constexpr (requires { std::tuple_size<X>::value; }) {
    std::apply([](auto&... e) { (strip_ad(e), ...); }, x);
  } else if constexpr (requires { x.begin(); x.end(); typename X::value_type; }) {
    for (auto& e : x) {
      if constexpr (requires { e.second; }) strip_ad(e.second);
      else strip_ad(e);
    }
  }
}

/// What grad differentiates with respect to: a parameter tree (shard/core/tree.hpp: an array,
/// a std::vector / std::map<std::string, ...> / std::tuple / SHARD_TREE struct of them, nested).
/// The leaves are tracked; static data in the tree is passed through; the gradients form a
/// tree of the same type.
template <typename P>
struct ParamTraits {
  static_assert(!std::is_void_v<tree_leaf_t<P>>,
                "grad differentiates with respect to a parameter tree: a Tensor, a ShardedArray, or a std::vector, "
                "std::map<std::string, ...>, std::tuple or SHARD_TREE struct of them (shard/core/tree.hpp)");
  using Grads = P;
  static P track(const P& p, Tape& tape, const char* what, const GradSharding* gs = nullptr) {
    return tree_map([&](const auto& x) { return make_leaf(x, tape, what, gs); }, p);
  }
  static Grads grads(const P& leaves, const P& primals) {
    return tree_map([](const auto& leaf, const auto& primal) { return leaf_cotangent(leaf, primal); }, leaves,
                    primals);
  }
  template <typename F>
  static void each(const P& p, F&& f) {
    tree_for_each(f, p);
  }
};

/// The parameters' arrays must live on one set of devices (MeshMismatchError naming both).
template <typename P>
void check_one_device_set(const P& params, const char* what) {
  const Mesh* first = nullptr;
  ParamTraits<P>::each(params, [&](const auto& p) {
    if constexpr (is_sharded_v<std::remove_cvref_t<decltype(p)>>) {
      if (!first) first = &p.mesh();
      else check_same_devices(*first, p.mesh(), std::string(what) + ": the parameters");
    }
  });
}

/// f's value checked: a 0-d floating array.
template <typename V>
void check_scalar_output(const V& value, const char* what) {
  static_assert(ArrayLike<V>, "grad: the function must return a Tensor or a ShardedArray (and an aux with has_aux)");
  using T = elem_t<V>;
  if constexpr (!FloatDtype<T>) {
    raise<ValueError>(what, " of a function returning a ", dtype_name<T>(), " array: only float32 and float64 "
                      "outputs are differentiable");
  } else {
    if (value.ndim() != 0)
      raise<ValueError>(what, " of a function whose output has shape ", to_string(value.shape()),
                        ": grad needs a scalar (0-d) output; use vjp with a cotangent of that shape");
  }
}

/// ArrayLike<R> as a plain bool (a failed static_assert on it prints one note, not the concept's).
template <typename R>
inline constexpr bool is_array_v = ArrayLike<R>;

template <typename T>
struct is_std_pair : std::false_type {};
template <typename A, typename B>
struct is_std_pair<std::pair<A, B>> : std::true_type {};

/// The compile-time checks of grad / value_and_grad, first and alone (so the first error is the
/// one naming the fix, and nothing follows it from the library): the parameters' leaves are
/// floating arrays and f returns a 0-d array (std::pair(array, aux) with has_aux).
template <bool kAux, typename F, typename P, typename... Args>
constexpr bool grad_call_ok() {
  using Leaf = tree_leaf_t<P>;
  if constexpr (std::is_void_v<Leaf>) {
    static_assert(!std::is_void_v<Leaf>,
                  "grad differentiates with respect to a parameter tree: a Tensor, a ShardedArray, or a "
                  "std::vector, std::map<std::string, ...>, std::tuple or SHARD_TREE struct of them "
                  "(shard/core/tree.hpp)");
    return false;
  } else if constexpr (!is_floating_v<elem_t<Leaf>>) {
    static_assert(is_floating_v<elem_t<Leaf>>,
                  "grad: the differentiated arguments hold integer or bool arrays; only float32, float64 and "
                  "bfloat16 arrays are differentiable: astype<float>(x) them, or pass them as an argument grad "
                  "does not differentiate (argnums)");
    return false;
  } else if constexpr (!std::is_invocable_v<const F&, const P&, const Args&...>) {
    static_assert(std::is_invocable_v<const F&, const P&, const Args&...>,
                  "grad: the function cannot be called with the arguments given (the parameter tree first, then "
                  "the other arguments): check its parameter types, const& included");
    return false;
  } else {
    using R = std::remove_cvref_t<std::invoke_result_t<const F&, const P&, const Args&...>>;
    if constexpr (kAux) {
      if constexpr (!is_std_pair<R>::value) {
        static_assert(is_std_pair<R>::value,
                      "grad(f, has_aux): f must return std::pair(0-d array, aux), e.g. std::make_pair(loss, logits)");
        return false;
      } else {
        static_assert(is_array_v<typename R::first_type>,
                      "grad(f, has_aux): the pair's first element must be a 0-d Tensor or ShardedArray (the value "
                      "differentiated), not a C++ number");
        return ArrayLike<typename R::first_type>;
      }
    } else {
      static_assert(is_array_v<R>,
                    "grad: the function must return a 0-d Tensor or ShardedArray (e.g. sum(x) or mean(x)), not a C++ "
                    "number read from one (.item() ends differentiation); with has_aux, std::pair(value, aux)");
      return ArrayLike<R>;
    }
  }
}

/// What run_value_and_grad returns when grad_call_ok failed: shaped so that its callers'
/// `.second` / `.first.second` compile and the checks' error stays the only one.
using FailedGrad = std::pair<std::pair<int, int>, int>;

template <bool kAux, typename F, typename P, typename... Args>
auto run_value_and_grad_checked(const F& f, const GradSharding& gs, const P& params, const Args&... args) {
  check_one_device_set(params, "grad");
  // grad inside a function an enclosing grad differentiates, of values it tracks (grad(grad(f)),
  // a Hessian): the inner pass does not record on the outer tape, so its result would be a
  // constant there and the outer derivative silently 0. Refused until it is supported. (A device
  // tape, a shard_map body's, is not an enclosing grad: grad inside a body differentiates the
  // device's local program.)
  if (const Tape* outer = recording_tape(); outer && !outer->device_view()) {
    bool tracked = false;
    auto look = [&](const auto& leaf) { tracked = tracked || ad_on(leaf, outer) != nullptr; };
    tree_for_each(look, params);
    (tree_for_each(look, args), ...);
    if (tracked)
      raise<ValueError>(
          "grad: called inside a function that an enclosing grad differentiates, on values it tracks "
          "(grad(grad(f)), a Hessian, a gradient penalty): higher-order derivatives are not supported yet, and the "
          "inner gradient would be a constant to the outer one (its derivative silently 0). Differentiate once, "
          "or compute the inner gradient outside the outer grad");
  }
  Tape tape;
  TapeScope scope(&tape);
  const auto leaves = ParamTraits<P>::track(params, tape, "grad", &gs);
  auto result = f(leaves, args...);
  auto& value = [&]() -> auto& {
    if constexpr (kAux) return result.first;
    else return result;
  }();
  check_scalar_output(value, "grad");
  const DeferredReductionScope deferred;  // the parameters' sums run behind the pass
  backward_from(value, ones_like_value(value), tape);
  auto grads = ParamTraits<P>::grads(leaves, params);
  auto plain = stop_gradient(value);
  own_storage(plain);
  plain.set_ad(nullptr);
  if constexpr (kAux) {
    strip_ad(result.second);
    return std::make_pair(std::make_pair(std::move(plain), std::move(result.second)), std::move(grads));
  } else {
    return std::make_pair(std::move(plain), std::move(grads));
  }
}

template <bool kAux, typename F, typename P, typename... Args>
auto run_value_and_grad(const F& f, const GradSharding& gs, const P& params, const Args&... args) {
  if constexpr (!grad_call_ok<kAux, F, P, Args...>()) {
    return FailedGrad{};
  } else {
    return run_value_and_grad_checked<kAux>(f, gs, params, args...);
  }
}

}  // namespace detail

/// jax.grad's argnums: `grad(f, argnums<0, 2>)` differentiates f's arguments 0 and 2.
template <std::size_t... I>
struct Argnums {
  static_assert(sizeof...(I) >= 1, "argnums: name at least one argument");
};
template <std::size_t... I>
inline constexpr Argnums<I...> argnums{};

namespace detail {

/// The position of J among I... (sizeof...(I) if absent).
template <std::size_t J, std::size_t... I>
constexpr std::size_t argnum_position() {
  std::size_t p = 0, r = sizeof...(I);
  ((r = (I == J && r == sizeof...(I)) ? p : r, ++p), ...);
  return r;
}

/// value_and_grad over the arguments I... of f: each is a parameter tree, tracked; the others
/// are passed untouched. The gradients: that argument's tree for one index, else a std::tuple.
template <bool kAux, std::size_t... I, typename F, typename... Args>
auto run_value_and_grad_argnums(const F& f, const GradSharding& gs, const Args&... args) {
  static_assert(((I < sizeof...(Args)) && ...), "argnums names an argument position the function is not called with");
  const auto all = std::forward_as_tuple(args...);
  // The differentiated arguments, as aliases (the same memory).
  auto params = std::make_tuple(
      tree_map([](const auto& x) { return x.alias(); }, std::get<I>(all))...);
  auto call = [&](const auto& leaves) -> decltype(auto) {
    return [&]<std::size_t... J>(std::index_sequence<J...>) -> decltype(auto) {
      auto pick = [&]<std::size_t K>(std::integral_constant<std::size_t, K>) -> const auto& {
        constexpr std::size_t p = argnum_position<K, I...>();
        if constexpr (p < sizeof...(I)) return std::get<p>(leaves);
        else return std::get<K>(all);
      };
      return f(pick(std::integral_constant<std::size_t, J>())...);
    }(std::index_sequence_for<Args...>());
  };
  auto r = run_value_and_grad<kAux>(call, gs, params);
  if constexpr (sizeof...(I) == 1) return std::make_pair(std::move(r.first), std::move(std::get<0>(r.second)));
  else return r;
}

}  // namespace detail

/// jax.value_and_grad(f)(params, args...): (f(params, args...), d f / d params). `params` is
/// a parameter tree (an array, or a std::vector, std::map<std::string, ...>, std::tuple or
/// SHARD_TREE struct of them, nested: shard/core/tree.hpp); the other arguments
/// are passed to f untouched (constants: the batch, int labels). f returns a 0-d float array.
/// The gradients have the parameters' types and shardings. Collective over all ranks when f is.
///
/// grad_sharding (optional, last): where each ShardedArray gradient should land instead,
/// as JAX's out_shardings of a jitted grad. The backward pass then places it there directly:
/// a weight gradient whose contraction runs over 'data' and that is asked for split over
/// 'data' as well is one psum_scatter instead of a psum (ZeRO; Optimizer::grad_sharding).
template <typename F>
auto value_and_grad(F f, GradSharding grad_sharding = {},
          shard::source_location where = shard::source_location::current()) {
  return [f = std::move(f), gs = std::move(grad_sharding), where](const auto& params, const auto&... args) {
    const detail::CallScope scope("grad", where);
    return detail::run_value_and_grad<false>(f, gs, params, args...);
  };
}
/// With has_aux: f returns std::pair(value, aux); the result is ((value, aux), grads).
template <typename F>
auto value_and_grad(F f, HasAux, GradSharding grad_sharding = {},
          shard::source_location where = shard::source_location::current()) {
  return [f = std::move(f), gs = std::move(grad_sharding), where](const auto& params, const auto&... args) {
    const detail::CallScope scope("grad", where);
    return detail::run_value_and_grad<true>(f, gs, params, args...);
  };
}
/// jax.grad(f)(params, args...): d f / d params.
template <typename F>
auto grad(F f, GradSharding grad_sharding = {},
          shard::source_location where = shard::source_location::current()) {
  return [f = std::move(f), gs = std::move(grad_sharding), where](const auto& params, const auto&... args) {
    const detail::CallScope scope("grad", where);
    return detail::run_value_and_grad<false>(f, gs, params, args...).second;
  };
}
/// With has_aux: (grads, aux).
template <typename F>
auto grad(F f, HasAux, GradSharding grad_sharding = {},
          shard::source_location where = shard::source_location::current()) {
  return [f = std::move(f), gs = std::move(grad_sharding), where](const auto& params, const auto&... args) {
    const detail::CallScope scope("grad", where);
    auto r = detail::run_value_and_grad<true>(f, gs, params, args...);
    return std::make_pair(std::move(r.second), std::move(r.first.second));
  };
}

/// jax.value_and_grad(f, argnums=(i, ...)): the gradients of the arguments named (each a
/// parameter tree, keeping its shardings); one index gives that argument's gradient, several a
/// std::tuple of them in argnums' order. `grad(f, argnums<0>)` is `grad(f)`.
template <typename F, std::size_t... I>
auto value_and_grad(F f, Argnums<I...>, GradSharding grad_sharding = {},
          shard::source_location where = shard::source_location::current()) {
  return [f = std::move(f), gs = std::move(grad_sharding), where](const auto&... args) {
    const detail::CallScope scope("grad", where);
    return detail::run_value_and_grad_argnums<false, I...>(f, gs, args...);
  };
}
template <typename F, std::size_t... I>
auto value_and_grad(F f, HasAux, Argnums<I...>, GradSharding grad_sharding = {},
          shard::source_location where = shard::source_location::current()) {
  return [f = std::move(f), gs = std::move(grad_sharding), where](const auto&... args) {
    const detail::CallScope scope("grad", where);
    return detail::run_value_and_grad_argnums<true, I...>(f, gs, args...);
  };
}
template <typename F, std::size_t... I>
auto grad(F f, Argnums<I...>, GradSharding grad_sharding = {},
          shard::source_location where = shard::source_location::current()) {
  return [f = std::move(f), gs = std::move(grad_sharding), where](const auto&... args) {
    const detail::CallScope scope("grad", where);
    return detail::run_value_and_grad_argnums<false, I...>(f, gs, args...).second;
  };
}
template <typename F, std::size_t... I>
auto grad(F f, HasAux, Argnums<I...>, GradSharding grad_sharding = {},
          shard::source_location where = shard::source_location::current()) {
  return [f = std::move(f), gs = std::move(grad_sharding), where](const auto&... args) {
    const detail::CallScope scope("grad", where);
    auto r = detail::run_value_and_grad_argnums<true, I...>(f, gs, args...);
    return std::make_pair(std::move(r.second), std::move(r.first.second));
  };
}

/// jax.vjp(f, primals...): (f(primals...), vjp_fn) where vjp_fn(ct) returns a std::tuple with
/// the cotangent of each primal (arrays, or std::vector / std::map of arrays). f returns one
/// float array; ct has its shape (and, for a ShardedArray, is resharded to its sharding).
/// vjp_fn can be called several times (the tape keeps its residuals while vjp_fn lives).
template <typename F, typename... Ps>
auto vjp(F f, const Ps&... primals) {
  auto tape = std::make_shared<detail::Tape>();
  (detail::check_one_device_set(primals, "vjp"), ...);
  auto leaves = std::make_tuple(detail::ParamTraits<Ps>::track(primals, *tape, "vjp")...);
  auto out = [&] {
    detail::TapeScope scope(tape.get());
    return std::apply([&](const auto&... l) { return f(l...); }, leaves);
  }();
  static_assert(ArrayLike<decltype(out)>, "vjp: the function must return one Tensor or ShardedArray");
  static_assert(FloatDtype<elem_t<decltype(out)>>, "vjp: the function must return a float32 or float64 array");
  auto plain = stop_gradient(out);
  detail::own_storage(plain);
  plain.set_ad(nullptr);
  auto fn = [tape, out, leaves, prims = std::make_tuple(primals...)](const decltype(out)& ct) {
    const detail::DeferredReductionScope deferred;
    detail::backward_from(out, ct, *tape, /*keep=*/true);
    auto grads = std::apply(
        [&](const auto&... l) {
          return std::apply(
              [&](const auto&... p) {
                return std::make_tuple(detail::ParamTraits<std::remove_cvref_t<decltype(p)>>::grads(l, p)...);
              },
              prims);
        },
        leaves);
    tape->reset();
    return grads;
  };
  return std::make_pair(std::move(plain), std::move(fn));
}

namespace detail {

/// Drops autodiff's records from the arrays of a custom_vjp's residuals (constants of its bwd).
template <typename X>
void drop_records(X& x) {
  if constexpr (ArrayLike<X>) {
    x.set_ad(nullptr);
  } else if constexpr (requires { std::tuple_size<X>::value; }) {
    std::apply([](auto&... e) { (drop_records(e), ...); }, x);
  } else if constexpr (requires { x.begin(); x.end(); typename X::value_type; }) {
    for (auto& e : x) {
      if constexpr (requires { e.second; }) drop_records(e.second);
      else drop_records(e);
    }
  }
}

/// Pushes bwd's cotangent for argument i to its node (nothing for a constant or an integer
/// argument), after checking it has the argument's type and shape.
template <ArrayLike A, typename C>
void push_custom_cotangent(const NodePtr<A>& node, C&& ct, std::uint32_t vma, const Tape* scratch, std::size_t i,
                           const Shape& shape) {
  if constexpr (FloatDtype<elem_t<A>>) {
    static_assert(std::is_same_v<std::remove_cvref_t<C>, A>,
                  "custom_vjp: bwd must return, for each floating argument, a cotangent of the argument's type "
                  "(Tensor<T> for a Tensor<T>, ShardedArray<T> for a ShardedArray<T>)");
    if (!node) return;
    if (ct.shape() != shape)
      raise<ShapeError>("custom_vjp: bwd returned a cotangent of shape ", to_string(ct.shape()), " for argument ", i,
                        ", whose shape is ", to_string(shape), " (bwd returns one cotangent per argument, each shaped "
                        "like it)");
    if (scratch) vma = vma_of(ct, *scratch);  // what bwd computed it from
    push(node, A(std::forward<C>(ct)), vma);
  }
}

/// An alias of x carrying only its vma, on `scratch` (a tape that makes no nodes).
template <ArrayLike A>
A with_vma(const A& x, std::uint32_t vma, const Tape& scratch) {
  A out = x.alias();
  out.set_ad(vma ? std::make_shared<AdValue>(AdValue{scratch.id(), vma, nullptr}) : nullptr);
  return out;
}

/// custom_vjp's call. Inside a differentiated shard_map body (a device tape) fwd and bwd run on a
/// scratch device tape that makes no nodes, so their values' vma is exact (a psum inside fwd
/// makes the output invariant; a cotangent bwd returns varies over what it was computed from)
/// and the cotangents are summed over the axes their arguments do not vary over, as JAX does.
template <typename F, typename Fwd, typename Bwd, ArrayLike... A>
auto run_custom_vjp(const F& f, const Fwd& fwd, const Bwd& bwd, const A&... args) {
  Tape* tape = recording_tape_for(args...);
  // Not differentiated (no argument has a node; a shard_map body's values may still carry their
  // vma, which f's own ops then compute): the primal function, as JAX calls it.
  if (!tape || !(node_of(args, *tape) || ...)) return f(args...);
  std::shared_ptr<Tape> scratch;
  // fwd's arguments on a device tape: aliases carrying the arguments' vma on the scratch tape,
  // kept alive by the rule (residuals may alias them).
  std::shared_ptr<std::tuple<A...>> wrapped;
  if (tape->device_view()) {
    scratch = std::make_shared<Tape>(true, 0);
    scratch->set_axis_names(tape->axis_names());
    wrapped = std::make_shared<std::tuple<A...>>(with_vma(args, vma_of(args, *tape), *scratch)...);
  }
  auto [out, res] = [&] {
    if (!scratch) return paused([&] { return fwd(args...); });
    TapeScope scope(scratch.get());
    return std::apply(fwd, *wrapped);
  }();
  using Out = std::remove_cvref_t<decltype(out)>;
  static_assert(ArrayLike<Out>, "custom_vjp: fwd must return std::pair(output array, residuals)");
  const std::uint32_t vma = scratch ? vma_of(out, *scratch) : 0;
  out.set_ad(nullptr);
  if (!scratch) drop_records(res);  // on a device tape the residuals keep their vma (scratch's)
  if constexpr (FloatDtype<elem_t<Out>>) {
    if ((node_of(args, *tape) || ...)) {
      auto node = std::make_shared<Node<Out>>("custom_vjp", *tape, vma, NodeMeta<Out>(out));
      const std::array<Shape, sizeof...(A)> shapes{args.shape()...};
      node->rule = [bwd, res = std::move(res), scratch, wrapped, shapes,
                    nodes = std::make_tuple(node_of(args, *tape)...)](const Out& ct, std::uint32_t v) {
        auto cts = [&] {
          if (!scratch) return paused([&] { return bwd(res, ct); });
          TapeScope scope(scratch.get());
          return bwd(res, with_vma(ct, v, *scratch));
        }();
        static_assert(std::tuple_size_v<decltype(cts)> == sizeof...(A),
                      "custom_vjp: bwd must return a std::tuple with one cotangent per argument");
        [&]<std::size_t... I>(std::index_sequence<I...>) {
          (push_custom_cotangent(std::get<I>(nodes), std::move(std::get<I>(cts)), v, scratch.get(), I, shapes[I]), ...);
        }(std::make_index_sequence<sizeof...(A)>{});
      };
      tape->append(node);
      out.set_ad(std::make_shared<AdValue>(AdValue{tape->id(), vma, std::move(node)}));
      return std::move(out);
    }
  }
  out.set_ad(vma ? std::make_shared<AdValue>(AdValue{tape->id(), vma, nullptr}) : nullptr);
  return std::move(out);
}

}  // namespace detail

/// jax.custom_vjp: f with the VJP the user defines. `custom_vjp(f, fwd, bwd)(args...)` runs
/// f(args...) when nothing is differentiated; while autodiff records it runs fwd(args...),
/// which returns std::pair(output, residuals) (its ops are not recorded), and the backward pass
/// calls bwd(residuals, output_cotangent), which returns a std::tuple with one cotangent per
/// argument, each of its argument's type and shape (an integer argument's entry is ignored).
/// Residuals are values, as in JAX: keep arrays (x.alias() shares an array's memory without
/// a copy), not references to fwd's arguments.
/// Arguments and the output are arrays of one view (Tensor or ShardedArray); inside a
/// differentiated shard_map body fwd's and bwd's values carry their vma as every op's do (the
/// output varies over what fwd computes it from; a psum inside fwd makes it invariant), and a
/// cotangent bwd returns for an argument that varies over fewer axes is psummed over the rest,
/// as for every op. Collective where f, fwd and bwd are.
template <typename F, typename Fwd, typename Bwd>
auto custom_vjp(F f, Fwd fwd, Bwd bwd) {
  return [f = std::move(f), fwd = std::move(fwd), bwd = std::move(bwd)](const auto&... args) {
    static_assert((ArrayLike<std::remove_cvref_t<decltype(args)>> && ...),
                  "custom_vjp: call the function with arrays (Tensor or ShardedArray)");
    return detail::run_custom_vjp(f, fwd, bwd, args...);
  };
}

}  // namespace shard
