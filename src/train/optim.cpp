// shard::optim (optim.hpp): schedules, the global norm, and the in-place updates.

#include "shard/train/optim.hpp"

#include <cmath>
#include <limits>
#include <numbers>
#include <tuple>

#include "shard/array/reshard.hpp"
#include "shard/comm/detail/collective.hpp"
#include "shard/core/time_split.hpp"
#include "shard/error.hpp"
#include "shard/ops/ops.hpp"

namespace shard::optim {

// ---------------------------------------------------------------- schedules

Schedule::Schedule(double lr) : fn_([lr](std::int64_t) { return lr; }) {
  detail::check_finite_in("optim: a constant learning rate", lr, -1e30, 1e30);
}

Schedule constant(double lr) { return Schedule(lr); }

Schedule cosine_decay(double lr, std::int64_t decay_steps, double alpha) {
  if (decay_steps < 1) raise<ValueError>("cosine_decay: decay_steps must be >= 1, got ", decay_steps);
  detail::check_finite_in("cosine_decay: lr", lr, -1e30, 1e30);
  detail::check_finite_in("cosine_decay: alpha", alpha, 0, 1);
  return Schedule([=](std::int64_t t) {
    const double frac = static_cast<double>(std::min(t, decay_steps)) / static_cast<double>(decay_steps);
    return lr * ((1.0 - alpha) * 0.5 * (1.0 + std::cos(std::numbers::pi * frac)) + alpha);
  });
}

Schedule linear_warmup(Schedule after, std::int64_t warmup_steps, double init) {
  if (warmup_steps < 0) raise<ValueError>("linear_warmup: warmup_steps must be >= 0, got ", warmup_steps);
  detail::check_finite_in("linear_warmup: init", init, -1e30, 1e30);
  return Schedule([after = std::move(after), warmup_steps, init](std::int64_t t) {
    if (t >= warmup_steps) return after(t - warmup_steps);
    const double peak = after(0);
    return init + (peak - init) * static_cast<double>(t) / static_cast<double>(warmup_steps);
  });
}

Schedule warmup_cosine_decay(double init, double peak, std::int64_t warmup_steps, std::int64_t decay_steps,
                             double end) {
  if (decay_steps <= warmup_steps)
    raise<ValueError>("warmup_cosine_decay: decay_steps (", decay_steps, ") must exceed warmup_steps (",
                      warmup_steps, ")");
  return linear_warmup(cosine_decay(peak, decay_steps - warmup_steps, peak != 0 ? end / peak : 0.0),
                       warmup_steps, init);
}

// ---------------------------------------------------------------- construction

Optimizer& Optimizer::mask_weight_decay(std::function<bool(const Shape&)> decays) {
  c_.decay_mask = std::move(decays);
  return *this;
}

Optimizer& Optimizer::clip_by_global_norm(double max_norm) {
  detail::check_finite_in("clip_by_global_norm: max_norm", max_norm, 0, 1e30, true);
  c_.max_norm = max_norm;
  return *this;
}

Optimizer& Optimizer::apply_if_finite() {
  c_.if_finite = true;
  return *this;
}

Optimizer& Optimizer::shard_state_over(std::string axis) {
  c_.state_axis = std::move(axis);
  return *this;
}

Optimizer sgd(Schedule lr, double momentum, bool nesterov, double weight_decay) {
  detail::check_finite_in("sgd: momentum", momentum, 0, 1);
  detail::check_finite_in("sgd: weight_decay", weight_decay, 0, 1e30);
  if (nesterov && momentum == 0) raise<ValueError>("sgd: nesterov needs a momentum > 0");
  Optimizer::Config c;
  c.kind = Optimizer::Kind::kSgd;
  c.lr = std::move(lr);
  c.momentum = momentum;
  c.nesterov = nesterov;
  c.weight_decay = weight_decay;
  return Optimizer(std::move(c));
}

Optimizer adam(Schedule lr, double b1, double b2, double eps) {
  detail::check_finite_in("adam: b1", b1, 0, 1, false, true);
  detail::check_finite_in("adam: b2", b2, 0, 1, false, true);
  detail::check_finite_in("adam: eps", eps, 0, 1e30);
  Optimizer::Config c;
  c.kind = Optimizer::Kind::kAdam;
  c.lr = std::move(lr);
  c.b1 = b1;
  c.b2 = b2;
  c.eps = eps;
  return Optimizer(std::move(c));
}

Optimizer adamw(Schedule lr, double weight_decay, double b1, double b2, double eps) {
  detail::check_finite_in("adamw: weight_decay", weight_decay, 0, 1e30);
  Optimizer o = adam(std::move(lr), b1, b2, eps);
  Optimizer::Config c = o.config();
  c.kind = Optimizer::Kind::kAdamW;
  c.weight_decay = weight_decay;
  return Optimizer(std::move(c));
}

namespace {

/// The state's slots for the optimizer.
std::vector<std::string> slots(const Optimizer::Config& c) {
  if (c.kind == Optimizer::Kind::kSgd)
    return c.momentum > 0 ? std::vector<std::string>{"momentum"} : std::vector<std::string>{};
  return {"mu", "nu"};
}

/// The sharding of a parameter's state: the parameter's, plus `axis` on its first dim when the
/// blocks' rows divide (ZeRO-1).
NamedSharding state_sharding(const NamedSharding& s, const Shape& shape, const std::string& axis) {
  if (axis.empty() || shape.empty()) return s;
  const Mesh& mesh = s.mesh();
  if (!mesh.has_axis(axis))
    raise<ValueError>("optimizer: shard_state_over('", axis, "') but the parameters' mesh has axes ",
                      mesh.to_string());
  for (const auto& a : s.spec().axes())
    if (a == axis) return s;  // already split over it
  const int n = mesh.axis_size(axis);
  if (n <= 1 || shape[0] % (static_cast<std::int64_t>(s.num_parts(0)) * n) != 0) return s;
  std::vector<SpecEntry> e = s.spec().entries();
  if (e.empty()) e.emplace_back();
  std::vector<std::string> axes = e[0].axes();
  axes.push_back(axis);
  e[0] = SpecEntry(axes);
  return NamedSharding(mesh, PartitionSpec(e));
}

std::string key(const std::string& slot, std::size_t i) { return slot + "/" + std::to_string(i); }

// The elementwise loops, compiled for AVX2 too (chosen at load time, as the op set's kernels)
// and without errno (optim.cpp is built with -fno-math-errno) so that sqrt vectorizes.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define SHARD_OPTIM_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SHARD_OPTIM_CLONES
#endif

// Each loop computes in C = compute_t<T> (float32 for bfloat16 parameters, whose state is
// stored in bfloat16 and each value rounded once per step) and stores T.
template <typename T, typename C = compute_t<T>>
SHARD_OPTIM_CLONES void sgd_plain(std::int64_t n, T* __restrict w, const T* __restrict g, C l, C sc, C wd) {
  for (std::int64_t k = 0; k < n; ++k) {
    const C wk = static_cast<C>(w[k]);
    w[k] = static_cast<T>(wk - l * (static_cast<C>(g[k]) * sc + wd * wk));
  }
}
template <typename T, typename C = compute_t<T>>
SHARD_OPTIM_CLONES void sgd_momentum(std::int64_t n, T* __restrict w, const T* __restrict g, T* __restrict v,
                                     C l, C sc, C wd, C mu, bool nesterov) {
  if (nesterov) {
    for (std::int64_t k = 0; k < n; ++k) {
      const C wk = static_cast<C>(w[k]);
      const C gk = static_cast<C>(g[k]) * sc + wd * wk;
      const C vk = mu * static_cast<C>(v[k]) + gk;
      v[k] = static_cast<T>(vk);
      w[k] = static_cast<T>(wk - l * (gk + mu * vk));
    }
  } else {
    for (std::int64_t k = 0; k < n; ++k) {
      const C wk = static_cast<C>(w[k]);
      const C vk = mu * static_cast<C>(v[k]) + static_cast<C>(g[k]) * sc + wd * wk;
      v[k] = static_cast<T>(vk);
      w[k] = static_cast<T>(wk - l * vk);
    }
  }
}
/// Adam; `l2` is added to the gradient (Adam's weight decay), `dw` decoupled (AdamW's).
template <typename T, typename C = compute_t<T>>
SHARD_OPTIM_CLONES void adam_loop(std::int64_t n, T* __restrict w, const T* __restrict g, T* __restrict m,
                                  T* __restrict v, C l, C sc, C l2, C dw, C b1, C b2, C eps, C ic1, C ic2) {
  for (std::int64_t k = 0; k < n; ++k) {
    const C wk = static_cast<C>(w[k]);
    const C gk = static_cast<C>(g[k]) * sc + l2 * wk;
    const C mk = b1 * static_cast<C>(m[k]) + (C(1) - b1) * gk;
    const C vk = b2 * static_cast<C>(v[k]) + (C(1) - b2) * gk * gk;
    m[k] = static_cast<T>(mk);
    v[k] = static_cast<T>(vk);
    w[k] = static_cast<T>(wk - l * ((mk * ic1) / (std::sqrt(vk * ic2) + eps) + dw * wk));
  }
}

/// The elementwise update of n elements of w from g and the state slots s0, s1.
template <typename T>
void update_block(const Optimizer::Config& c, bool decays, std::int64_t n, T* w, const T* g, T* s0, T* s1,
                  double lr, double scale, std::int64_t t) {
  using C = compute_t<T>;
  const C l = static_cast<C>(lr), sc = static_cast<C>(scale),
          wd = decays ? static_cast<C>(c.weight_decay) : C(0);
  if (c.kind == Optimizer::Kind::kSgd) {
    if (!s0)
      sgd_plain(n, w, g, l, sc, wd);
    else
      sgd_momentum(n, w, g, s0, l, sc, wd, static_cast<C>(c.momentum), c.nesterov);
    return;
  }
  const C ic1 = static_cast<C>(1.0 / (1.0 - std::pow(c.b1, static_cast<double>(t + 1))));
  const C ic2 = static_cast<C>(1.0 / (1.0 - std::pow(c.b2, static_cast<double>(t + 1))));
  const bool decoupled = c.kind == Optimizer::Kind::kAdamW;
  adam_loop(n, w, g, s0, s1, l, sc, decoupled ? C(0) : wd, decoupled ? wd : C(0), static_cast<C>(c.b1),
            static_cast<C>(c.b2), static_cast<C>(c.eps), ic1, ic2);
}

/// x's blocks in buffers of their own (a borrowed block copied).
template <typename T>
void own_blocks(ShardedArray<T>& x) {
  for (auto& s : x.addressable_shards())
    if (!s.data.owns_memory() && s.data.size() > 0) s.data = Tensor<T>(s.data);
}

template <typename T>
Tensor<T>& own(Tensor<T>& t) {
  t.detach_if_aliased();  // a live vjp's residual keeps the old values
  return t;
}

/// The step count this rank's copy of the replicated count holds (0 on a rank with no device
/// of the mesh: it updates nothing).
std::int64_t count_of(const ShardedArray<std::int64_t>& step) {
  const auto& sh = step.addressable_shards();
  return sh.empty() ? 0 : sh.front().data.flat(0);
}

void advance(ShardedArray<std::int64_t>& step) {
  for (auto& s : step.addressable_shards()) own(s.data).flat(0) += 1;
}

/// Sum of x^2 in double, in eight independent lanes (the loop vectorizes; one chain of adds
/// would take four cycles an element).
template <typename T>
double sum_of_squares(const T* x, std::int64_t n) {
  constexpr int kLanes = 8;
  double lane[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] += static_cast<double>(x[i + l]) * static_cast<double>(x[i + l]);
  double acc = 0;
  for (; i < n; ++i) acc += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  for (const double l : lane) acc += l;
  return acc;
}

}  // namespace

template <typename T>
double global_norm(const std::vector<ShardedArray<T>>& xs) {
  if (xs.empty()) return 0.0;
  const Mesh& mesh = xs.front().mesh();
  const std::vector<int> ids = mesh.device_ids();
  std::map<int, double> partial;
  for (int d : mesh.local_device_ids()) partial[d] = 0.0;
  for (const auto& x : xs) {
    detail::check_same_devices(mesh, x.mesh(), "global_norm");
    for (const auto& s : x.addressable_shards()) {
      if (x.sharding().replica_index(s.device) != 0) continue;  // each element once
      partial[s.device] += sum_of_squares(s.data.data(), s.data.size());
    }
  }
  // One psum: a 1-D array with one element per device, sharded over every mesh axis.
  std::vector<std::string> axes = mesh.axis_names();
  const NamedSharding per_device(mesh, PartitionSpec({SpecEntry(axes)}));
  const auto n = static_cast<std::int64_t>(ids.size());
  const ShardedArray<double> parts = generate<double>(Shape{n}, per_device, [&](const Box& b) {
    Tensor<double> t(b.extent, 0.0);
    for (std::int64_t i = 0; i < b.extent[0]; ++i) {
      const int dev = ids[static_cast<std::size_t>(b.offset[0] + i)];
      const auto it = partial.find(dev);
      if (it != partial.end()) t.flat(i) = it->second;
    }
    return t;
  });
  const ShardedArray<double> total = sum(parts);
  const auto& sh = total.addressable_shards();
  return std::sqrt(sh.empty() ? 0.0 : sh.front().data.flat(0));
}

GradSharding Optimizer::grad_sharding() const {
  return [axis = c_.state_axis](const NamedSharding& s, const Shape& shape) {
    return state_sharding(s, shape, axis);
  };
}

template <typename T>
State<T> Optimizer::init(const std::vector<ShardedArray<T>>& params, shard::source_location where) const {
  const detail::CallScope scope("Optimizer::init", where);
  static_assert(FloatDtype<T>, "optimizers update float32 or float64 parameters");
  State<T> s;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const NamedSharding sh = state_sharding(params[i].sharding(), params[i].shape(), c_.state_axis);
    for (const auto& slot : slots(c_)) s.arrays.emplace(key(slot, i), zeros<T>(params[i].shape(), sh));
  }
  if (!params.empty())
    s.step = zeros<std::int64_t>(Shape{}, NamedSharding(params.front().mesh(), PartitionSpec()));
  return s;
}

template <typename T>
double Optimizer::update(std::vector<ShardedArray<T>>& params, const std::vector<ShardedArray<T>>& grads,
                         State<T>& state, shard::source_location where) const {
  const detail::CallScope scope("Optimizer::update", where);
  const detail::ScopedTime timed(detail::TimeKind::kOptimizer);
  const auto batched = [](const ShardedArray<T>& x) { return x.batch() && !x.batch()->trace; };
  for (std::size_t i = 0; i < params.size() + grads.size(); ++i)
    if (batched(i < params.size() ? params[i] : grads[i - params.size()]))
      raise<ValueError>(
          located("Optimizer::update", where),
          ": called inside vmap on batched parameters or gradients; update outside the vmapped function");
  if (const std::uint64_t level = detail::trace_level_of(params, grads, state.arrays, state.step)) {
    // Inside jit: one equation whose run is the update below on copies of its operands.
    // By value: the trace's shadows are copied (the program's values stay as they are); on replay
    // parameters and state the program reads last here (donated ones) are moved in and updated in
    // place (update copies a buffer another array still shares).
    auto run = [this, where](std::vector<ShardedArray<T>> p, const std::vector<ShardedArray<T>>& g,
                             std::map<std::string, ShardedArray<T>> arrays, ShardedArray<std::int64_t> step) {
      // A block over memory the program does not own (Tensor::borrow: group-shared memory, a
      // caller's buffer) is copied: the jitted update writes only buffers of its own.
      for (auto& x : p) own_blocks(x);
      for (auto& [name, a] : arrays) own_blocks(a);
      own_blocks(step);
      State<T> s{std::move(step), std::move(arrays)};
      update(p, g, s, where);
      return std::tuple{std::move(p), std::move(s.arrays), std::move(s.step)};
    };
    auto [p, arrays, step] =
        detail::trace_opaque("optimizer_update", run, level, params, grads, state.arrays, state.step);
    params = std::move(p);
    state.arrays = std::move(arrays);
    state.step = std::move(step);
    return std::numeric_limits<double>::quiet_NaN();
  }
  if (grads.size() != params.size())
    raise<ValueError>("optimizer update: ", grads.size(), " gradients for ", params.size(), " parameters");
  const auto names = slots(c_);
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (grads[i].shape() != params[i].shape())
      raise<ShapeError>("optimizer update: gradient ", i, " has shape ", to_string(grads[i].shape()),
                        " but its parameter has shape ", to_string(params[i].shape()));
    const NamedSharding want = state_sharding(params[i].sharding(), params[i].shape(), c_.state_axis);
    for (const auto& slot : names) {
      const auto it = state.arrays.find(key(slot, i));
      if (it == state.arrays.end())
        raise<ValueError>("optimizer update: the state has no '", key(slot, i),
                          "': make it with init(params) of this optimizer and these parameters");
      // A state made for other parameters (or laid out otherwise) would be read out of bounds.
      if (it->second.shape() != params[i].shape())
        raise<ShapeError>("optimizer update: state '", key(slot, i), "' has shape ",
                          to_string(it->second.shape()), " but parameter ", i, " has shape ",
                          to_string(params[i].shape()),
                          ": the state belongs to other parameters; make it with init(params)");
      if (!(it->second.sharding() == want))
        raise<ShardingError>(
            "optimizer update: state '", key(slot, i), "' is laid out ", it->second.sharding().to_string(),
            " but parameter ", i, " (", params[i].sharding().to_string(), ") needs its state laid out ",
            want.to_string(), ": reshard the state with the parameters, or make it with init(params)");
    }
  }
  if (!params.empty() && state.step.empty())
    raise<ValueError>("optimizer update: the state has no step count: make it with init(params)");
  const std::int64_t t = count_of(state.step);
  if (t < 0)
    raise<ValueError>(
        "optimizer update: the state's step count is ", t,
        " (negative: a damaged state or checkpoint); make it with init(params) or load a good one");
  double norm = 0, scale = 1;
  if (c_.max_norm > 0 || c_.if_finite) norm = global_norm(grads);
  if (c_.if_finite && !std::isfinite(norm)) return norm;  // parameters, state and step count unchanged
  if (c_.max_norm > 0 && norm > c_.max_norm) scale = c_.max_norm / norm;
  const double lr = c_.lr(t);
  if (!std::isfinite(lr)) [[unlikely]]
    raise<ValueError>("optimizer update: the learning-rate schedule gave ", lr, " at step ", t);
  for (std::size_t i = 0; i < params.size(); ++i) {
    ShardedArray<T>& p = params[i];
    ShardedArray<T>* s0 = names.empty() ? nullptr : &state.arrays.at(key(names[0], i));
    ShardedArray<T>* s1 = names.size() > 1 ? &state.arrays.at(key(names[1], i)) : nullptr;
    const bool split = s0 && !(s0->sharding() == p.sharding());
    const bool decays = !c_.decay_mask || c_.decay_mask(p.shape());
    // Each device reads the gradient's rows of its state: from a gradient sharded like the
    // state (grad_sharding()) directly, else from its parameter-sharded block.
    const bool rows_only = split && grads[i].sharding() == s0->sharding();
    std::optional<ShardedArray<T>> resharded;
    const ShardedArray<T>& g = grads[i].sharding() == p.sharding() || rows_only
                                   ? grads[i]
                                   : resharded.emplace(reshard(grads[i], p.sharding()));
    auto& ps = p.addressable_shards();
    for (std::size_t k = 0; k < ps.size(); ++k) {
      Tensor<T>& w = own(ps[k].data);
      const Tensor<T>& gk = g.addressable_shards()[k].data;
      T* m0 = s0 ? own(s0->addressable_shards()[k].data).data() : nullptr;
      T* m1 = s1 ? own(s1->addressable_shards()[k].data).data() : nullptr;
      if (!split) {
        update_block(c_, decays, w.size(), w.data(), gk.data(), m0, m1, lr, scale, t);
        continue;
      }
      // ZeRO-1: this device's rows of the state are rows [r0, r0 + nr) of its parameter block.
      const Box& sb = s0->addressable_shards()[k].box;
      const std::int64_t row = w.shape().empty() ? 1 : w.size() / std::max<std::int64_t>(w.shape()[0], 1);
      const std::int64_t r0 = sb.offset[0] - ps[k].box.offset[0];
      const std::int64_t nr = sb.extent[0];
      update_block(c_, decays, nr * row, w.data() + r0 * row, gk.data() + (rows_only ? 0 : r0 * row), m0, m1,
                   lr, scale, t);
    }
    if (split) {  // all_gather the updated rows over the state axis, in place in each block
      std::vector<Tensor<T>*> blocks;
      std::vector<int> devices;
      for (auto& s : ps) {
        blocks.push_back(&s.data);
        devices.push_back(s.device);
      }
      detail::CollectiveSpec spec = detail::all_gather_spec(
          p.mesh(), SpecEntry(c_.state_axis), s0->addressable_shards().front().data.shape(), 0, true);
      spec.dtype = dtype_name<T>();
      detail::execute_all_gather_in_place<T>(p.mesh(), spec, devices, blocks);
    }
  }
  advance(state.step);
  return norm;
}

template <typename T>
void State<T>::save(CheckpointWriter& w, const std::string& prefix) const {
  for (const auto& [name, a] : arrays) {
    std::string file = name;
    for (auto& ch : file)
      if (ch == '/') ch = '.';
    w.add(prefix + file, a);
  }
  w.set(prefix + "step", std::to_string(count_of(step)));
}

template <typename T>
void State<T>::load(const std::string& checkpoint_path, const CheckpointManifest& m,
                    const std::string& prefix, shard::source_location where) {
  const detail::CallScope scope("optim::State::load", where);
  for (auto& [name, a] : arrays) {
    std::string file = name;
    for (auto& ch : file)
      if (ch == '/') ch = '.';
    a = load_checkpoint_array<T>(checkpoint_path, m, prefix + file, a.sharding(), a.shape(), where);
  }
  if (!m.metadata.count(prefix + "step"))
    raise<ValueError>("optimizer state: the checkpoint has no '", prefix, "step'");
  const Mesh& mesh = arrays.empty() ? step.mesh() : arrays.begin()->second.mesh();
  if (mesh.empty())
    raise<ValueError>("optimizer state: load into the state of init(params) on the mesh to resume on");
  const std::int64_t count = m.integer(prefix + "step");
  // Above 2^53 a count is no longer exact as the double of the bias corrections, and the next
  // updates would overflow it: no run takes that many steps.
  constexpr std::int64_t kMaxCount = std::int64_t{1} << 53;
  if (count < 0 || count > kMaxCount)
    raise<ValueError>("optimizer state: the checkpoint's '", prefix, "step' is ", count,
                      " (a step count is between 0 and 2^53): the checkpoint is damaged");
  step = full<std::int64_t>(Shape{}, count, NamedSharding(mesh, PartitionSpec()));
}

#define SHARD_INSTANTIATE_OPTIM(T)                                                                         \
  template struct State<T>;                                                                                \
  template double global_norm<T>(const std::vector<ShardedArray<T>>&);                                     \
  template State<T> Optimizer::init<T>(const std::vector<ShardedArray<T>>&, shard::source_location) const; \
  template double Optimizer::update<T>(std::vector<ShardedArray<T>>&, const std::vector<ShardedArray<T>>&, \
                                       State<T>&, shard::source_location) const;
SHARD_FOR_EACH_FLOAT_DTYPE(SHARD_INSTANTIATE_OPTIM)
#undef SHARD_INSTANTIATE_OPTIM

}  // namespace shard::optim
