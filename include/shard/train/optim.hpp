#pragma once
/// \file shard::optim: optimizers that update sharded parameters in place (optax's sgd, adam,
/// adamw, its schedules and clip_by_global_norm, with PyTorch's in-place update).
///
///   // given: std::map<std::string, ShardedArray<float>> params; ShardedArray<float> batch;
///   // given: auto loss_fn = [](const auto& p, const auto& b) { return mean(matmul(b, p.at("w"))); };
///   auto opt = optim::adam(optim::warmup_cosine_decay(0.0, 1e-3, 100, 10000)).clip_by_global_norm(1.0);
///   auto state = opt.init(params);                 // sharded like the parameters
///   auto [loss, grads] = value_and_grad(loss_fn)(params, batch);
///   opt.update(params, grads, state);              // in place on every local shard
///
/// Semantics:
///   - The gradients have the parameters' shardings (what grad returns) or, with a state axis,
///     the state's (what grad returns with grad_sharding(): ZeRO's psum_scatter); another
///     sharding is resharded first. The update is elementwise on each local shard: no communication,
///     except clip_by_global_norm (one psum of the squared norms of all gradients, each
///     element counted once however it is replicated) and the all_gather of sharded state.
///   - State (momentum, Adam's moments) is sharded like each parameter. With
///     shard_state_over("data") (ZeRO-1) a parameter whose first dim divides also splits its
///     state over that mesh axis: each replica keeps and updates its rows only, then the new
///     rows are all_gathered over the axis. The gradient arrives summed over 'data' whole (a
///     contraction over a sharded dim is one psum) unless grad was asked for grad_sharding():
///     then each replica receives only its rows, summed (one psum_scatter).
///   - The state is a named set of ShardedArrays (State::arrays): save it with a
///     CheckpointWriter and load it back onto any mesh (State::load), like the parameters.
///   - Updates follow optax / PyTorch: SGD v = mu v + g (+ wd w, L2), w -= lr v (Nesterov:
///     w -= lr (g + mu v)); Adam with bias correction; AdamW's decoupled decay w -= lr wd w.
///     Steps count from 0; the schedule is evaluated at the count before the update.

#include <cstdint>
#include <functional>
#include <map>
#include <source_location>
#include <string>
#include <tuple>
#include <vector>

#include "shard/array/sharded_array.hpp"
#include "shard/core/tree.hpp"
#include "shard/error.hpp"  // shard::source_location
#include "shard/io/checkpoint.hpp"

namespace shard::optim {

/// A learning rate as a function of the step count (0 for the first update).
class Schedule {
 public:
  Schedule(double lr);  // NOLINT: a constant rate converts
  explicit Schedule(std::function<double(std::int64_t)> fn) : fn_(std::move(fn)) {}
  double operator()(std::int64_t step) const { return fn_(step); }

 private:
  std::function<double(std::int64_t)> fn_;
};

/// optax.constant_schedule.
Schedule constant(double lr);
/// optax.cosine_decay_schedule: lr * ((1 - alpha) (1 + cos(pi t / decay_steps)) / 2 + alpha),
/// held at lr * alpha after decay_steps.
Schedule cosine_decay(double lr, std::int64_t decay_steps, double alpha = 0.0);
/// Linear warm-up from `init` to schedule(0) over `warmup_steps`, then schedule(t - warmup_steps).
Schedule linear_warmup(Schedule after, std::int64_t warmup_steps, double init = 0.0);
/// optax.warmup_cosine_decay_schedule: init -> peak linearly over warmup_steps, then cosine
/// from peak to end over the remaining decay_steps - warmup_steps.
Schedule warmup_cosine_decay(double init, double peak, std::int64_t warmup_steps, std::int64_t decay_steps,
                             double end = 0.0);

/// An optimizer's state: the step count and its arrays, named "<slot>/<i>" (slot "momentum",
/// "mu" or "nu"; i the parameter's position), sharded like the parameters. The count is a 0-d
/// int64 array replicated on the parameters' mesh (optax's `count`, PyTorch's `state['step']`),
/// so that a jitted training step takes the state and returns the next one without tracing
/// again: read it with `state.step.item()`. A tree (shard/core/tree.hpp): `.step`, `.arrays`.
template <typename T>
struct State {
  ShardedArray<std::int64_t> step;
  std::map<std::string, ShardedArray<T>> arrays;

  /// Adds every array to `w` as "<prefix><name>" (names with '/' become '.'), and the step as
  /// metadata "<prefix>step".
  void save(CheckpointWriter& w, const std::string& prefix = "opt.") const;
  /// Loads the arrays `save` wrote onto the shardings `like` has (the state of init(params) on
  /// the mesh to resume on): any mesh, any rank count. Collective.
  void load(const std::string& checkpoint_path, const CheckpointManifest& m,
            const std::string& prefix = "opt.",
            shard::source_location where = shard::source_location::current());
};

/// State is a parameter tree (jit's arguments and results): its count, then its arrays.
template <typename T>
[[maybe_unused]] inline auto shard_tree_fields(const State<T>*) {
  return ::shard::detail::StructFields{"step, arrays", [](auto& s) { return std::tie(s.step, s.arrays); }};
}

class Optimizer {
 public:
  enum class Kind { kSgd, kAdam, kAdamW };
  struct Config {
    Kind kind = Kind::kSgd;
    Schedule lr = 1e-3;
    double momentum = 0.0;
    bool nesterov = false;
    double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    double weight_decay = 0.0;  ///< SGD and Adam: L2 (added to the gradient); AdamW: decoupled
    double max_norm = 0.0;      ///< clip_by_global_norm (0: off)
    std::string state_axis;     ///< shard_state_over (empty: off)
    bool if_finite = false;     ///< apply_if_finite
    std::function<bool(const Shape&)> decay_mask;  ///< mask_weight_decay (empty: every parameter decays)
  };
  explicit Optimizer(Config c) : c_(std::move(c)) {}

  /// optax's weight-decay `mask`: only parameters whose shape `decays` accepts are decayed
  /// (e.g. `[](const Shape& s) { return s.size() >= 2; }`: matrices and embeddings, not biases
  /// or LayerNorm gains, as PyTorch users do with two parameter groups). The same on every rank.
  Optimizer& mask_weight_decay(std::function<bool(const Shape&)> decays);
  /// optax.clip_by_global_norm before the update: g *= max_norm / max(norm, max_norm).
  Optimizer& clip_by_global_norm(double max_norm);
  /// optax.apply_if_finite: an update whose gradients hold a NaN or an infinity (their global
  /// norm, one psum) changes nothing (parameters, state, step count) and returns that norm,
  /// so a diverging step is skipped on every rank alike.
  Optimizer& apply_if_finite();
  /// ZeRO-1: state split over mesh axis `axis` too, where a parameter's first dim divides.
  Optimizer& shard_state_over(std::string axis);

  /// The state for `params`: zeros sharded like each parameter (and over the state axis).
  /// Local (no communication).
  template <typename T>
  State<T> init(const std::vector<ShardedArray<T>>& params,
                shard::source_location where = shard::source_location::current()) const;
  /// One update of `params` in place from `grads`. Returns the gradients' global norm when
  /// clipping or with apply_if_finite (else 0). Collective over all ranks when clipping, with
  /// apply_if_finite or with a state axis.
  ///
  /// Inside jit the parameters and the state are the function's values: the update is one
  /// equation of the program ("optimizer_update", its communication listed under it) whose
  /// results replace them, and the function returns the new ones (optax's functional update):
  ///
  ///   auto step = jit([&](Params p, optim::State<float> s, const Batch& b) {
  ///     auto [loss, g] = value_and_grad(loss_fn)(p, b);
  ///     opt.update(p, g, s);
  ///     return std::tuple{p, s, loss};
  ///   });
  ///   std::tie(params, state, loss) = step(params, state, batch);  // traced once
  ///
  /// There the norm is a value of each run, not of the trace: update returns NaN (compute it
  /// outside jit with global_norm(grads) if it is needed on the host).
  template <typename T>
  double update(std::vector<ShardedArray<T>>& params, const std::vector<ShardedArray<T>>& grads,
                State<T>& state, shard::source_location where = shard::source_location::current()) const;

  /// The same for any parameter tree (shard/core/tree.hpp: one ShardedArray, a std::map of
  /// them, a SHARD_TREE struct, nested; all leaves of one dtype): the state's arrays follow the
  /// tree's leaves in its visiting order. update checks that `grads` has the structure of
  /// `params` (ValueError naming the first difference) and replaces the leaves in place.
  template <typename Tree>
  auto init(const Tree& params, shard::source_location where = shard::source_location::current()) const {
    using A = tree_leaf_t<Tree>;
    if constexpr (!detail::is_sharded_v<A>) {
      static_assert(
          detail::is_sharded_v<A>,
          "optimizer init: the parameters must be a tree of ShardedArrays (shard/core/tree.hpp); place "
          "host Tensors first with device_put(tree, sharding)");
      return State<float>{};
    } else {
      return init(tree_leaves<A>(params), where);
    }
  }
  template <typename Tree, typename S>
  double update(Tree& params, const Tree& grads, S& state,
                shard::source_location where = shard::source_location::current()) const {
    using A = tree_leaf_t<Tree>;
    if constexpr (!detail::is_sharded_v<A>) {
      static_assert(detail::is_sharded_v<A>,
                    "optimizer update: the parameters must be a tree of ShardedArrays (shard/core/tree.hpp)");
      return 0.0;
    } else if constexpr (!std::is_same_v<S, State<elem_t<A>>>) {
      static_assert(std::is_same_v<S, State<elem_t<A>>>,
                    "optimizer update: the state must be what init(params) returned for these parameters "
                    "(State<T> with T the parameters' dtype)");
      return 0.0;
    } else {
      const detail::CallScope scope("Optimizer::update", where);
      tree_check_same_structure(params, grads);
      const std::vector<A*> leaves = tree_leaf_pointers<A>(params);
      std::vector<A> p, g = tree_leaves<A>(grads);
      for (A* x : leaves) p.push_back(x->alias());
      const double norm = update(p, g, state, where);
      for (std::size_t i = 0; i < leaves.size(); ++i) *leaves[i] = std::move(p[i]);
      return norm;
    }
  }

  /// Where update reads each gradient best (value_and_grad's grad_sharding option): with a
  /// state axis, split like the parameter's state, so the backward pass psum_scatters the
  /// gradient over the axis instead of psumming it whole, and each replica's update reads
  /// only its rows; otherwise the parameter's sharding.
  GradSharding grad_sharding() const;

  const Config& config() const { return c_; }

 private:
  Config c_;
};

/// optax.sgd (PyTorch's SGD: momentum, nesterov, weight_decay as L2).
Optimizer sgd(Schedule lr, double momentum = 0.0, bool nesterov = false, double weight_decay = 0.0);
/// optax.adam.
Optimizer adam(Schedule lr, double b1 = 0.9, double b2 = 0.999, double eps = 1e-8);
/// optax.adamw (decoupled weight decay, 1e-4 as in optax).
Optimizer adamw(Schedule lr, double weight_decay = 1e-4, double b1 = 0.9, double b2 = 0.999,
                double eps = 1e-8);

/// The global L2 norm of a list of arrays: one psum of the squared norms (each element counted
/// once). Collective over all ranks.
template <typename T>
double global_norm(const std::vector<ShardedArray<T>>& xs);

}  // namespace shard::optim
