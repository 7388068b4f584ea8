// train_mlp's model written once, forward only, on global arrays: the Megatron layout is in
// the parameters' shardings (model.hpp), the batch is P('data', None), and the op set's
// sharding rules place every product and collective. grad supplies the backward pass (its
// collectives come from the same rules: each weight gradient is one psum over 'data', a
// column-parallel layer's input gradient one psum over 'model'); shard::optim updates the
// parameters and the optimizer state in place.

#include <cmath>

#include "model.hpp"

namespace train {

namespace {

using Array = shard::ShardedArray<float>;

/// The logits: ReLU between the layers, in the parameters' element type.
template <typename X>
X logits_of(const std::vector<X>& p, const X& x) {
  if (p.size() == 2) return shard::matmul(x, p[0]) + p[1];
  X h = shard::relu(shard::matmul(x, p[0]) + p[1]);
  for (std::size_t i = 2; i + 2 < p.size(); i += 2) h = shard::relu(shard::matmul(h, p[i]) + p[i + 1]);
  return shard::matmul(h, p[p.size() - 2]) + p.back();
}

/// The logits in float32: computed in float32, or under --dtype bfloat16 in bfloat16 from the
/// float32 master parameters cast once per step (shard::MixedBfloat16; gradients come back in
/// float32 through the casts).
Array forward(const std::vector<Array>& p, const Array& x, const Hyper& h) {
  if (h.dtype != "bfloat16") return logits_of(p, x);
  using Policy = shard::MixedBfloat16;
  return Policy::cast_to_output(logits_of(Policy::cast_to_compute(p), Policy::cast_to_compute(x)));
}

/// Per-row losses of the logits z for labels y [B, 1] (-1: padding, loss 0) or targets y [B, n].
Array row_losses(const Array& z, const Array& y, bool classify) {
  if (!classify) return shard::sum(shard::square(z - y), 1);
  const auto valid = shard::greater_equal(y, 0.0f);
  const auto labels = shard::astype<std::int32_t>(shard::where(valid, y, 0.0f));
  const Array picked = shard::take_along_axis(shard::log_softmax(z, 1), labels, 1);
  return -shard::squeeze(picked * shard::astype<float>(valid), 1);
}

/// The optimizer --optimizer names, at learning rate `lr` (the eager step's h.lr, or --jit's schedule).
shard::optim::Optimizer optimizer_of(const Hyper& h, const shard::optim::Schedule& lr) {
  if (h.optimizer == "adam") return shard::optim::adamw(lr, h.weight_decay, h.beta1, h.beta2, h.eps);
  return shard::optim::sgd(lr, h.momentum, false, h.weight_decay);
}

/// The model's optimizer state (Adam's m and v, or SGD's momentum) as the optimizer's State, and
/// back: the arrays move, nothing is copied.
shard::optim::State<float> take_state(Model& m, const Hyper& h) {
  shard::optim::State<float> state;
  state.step = shard::full<std::int64_t>(shard::Shape{}, m.step,
                                        shard::NamedSharding(m.params.front().mesh(), shard::PartitionSpec()));
  const std::size_t np = m.params.size();
  for (std::size_t i = 0; i < np; ++i) {
    if (h.optimizer == "adam") {
      state.arrays.emplace("mu/" + std::to_string(i), std::move(m.state[i]));
      state.arrays.emplace("nu/" + std::to_string(i), std::move(m.state[np + i]));
    } else if (h.momentum > 0) {
      state.arrays.emplace("momentum/" + std::to_string(i), std::move(m.state[i]));
    }
  }
  return state;
}

void give_state(Model& m, const Hyper& h, shard::optim::State<float>& state) {
  const std::size_t np = m.params.size();
  for (std::size_t i = 0; i < np; ++i) {
    if (h.optimizer == "adam") {
      m.state[i] = std::move(state.arrays.at("mu/" + std::to_string(i)));
      m.state[np + i] = std::move(state.arrays.at("nu/" + std::to_string(i)));
    } else if (h.momentum > 0) {
      m.state[i] = std::move(state.arrays.at("momentum/" + std::to_string(i)));
    }
  }
  m.step = state.step.item();
}

/// The jitted step's function: value_and_grad of the mean loss, then the optimizer's update.
auto jitted_step(const Hyper& h, const shard::optim::Optimizer& opt) {
  return shard::jit(
      [h, opt](const std::vector<Array>& p, const shard::optim::State<float>& s0, const Array& x, const Array& y) {
        const float total = static_cast<float>(x.shape()[0]);
        auto loss = [&](const std::vector<Array>& q) {
          return shard::sum(row_losses(forward(q, x, h), y, h.classify)) / total;
        };
        auto [value, grads] = shard::value_and_grad(loss, opt.grad_sharding())(p);
        std::vector<Array> params = p;
        shard::optim::State<float> s = s0;
        opt.update(params, grads, s);
        return std::make_tuple(params, s, value);
      },
      shard::JitOptions{.donate_argnums = {0, 1}});
}

shard::optim::Optimizer jit_optimizer(const Hyper& h, bool shard_state, bool cosine, std::int64_t total_steps) {
  const shard::optim::Schedule lr =
      cosine ? shard::optim::cosine_decay(h.lr, total_steps) : shard::optim::constant(h.lr);
  auto opt = optimizer_of(h, lr);
  if (shard_state) opt.shard_state_over("data");
  if (h.skip_nonfinite) opt.apply_if_finite();
  return opt;
}

}  // namespace

struct JitStep::Impl {
  Hyper h;
  shard::optim::Optimizer opt;
  decltype(jitted_step(h, opt)) fn;
  Impl(const Hyper& hyper, shard::optim::Optimizer o) : h(hyper), opt(std::move(o)), fn(jitted_step(h, opt)) {}
};

JitStep::JitStep(const Hyper& h, bool shard_state, bool cosine, std::int64_t total_steps)
    : impl_(std::make_unique<Impl>(h, jit_optimizer(h, shard_state, cosine, total_steps))) {}
JitStep::~JitStep() = default;

double JitStep::operator()(Model& m, const Array& x, const Array& y) {
  shard::optim::State<float> state = take_state(m, impl_->h);
  const std::int64_t before = m.step;
  auto [p, s, value] = impl_->fn(m.params, state, x, y);
  m.params = std::move(p);
  give_state(m, impl_->h, s);
  const double loss = value.to_host().item();
  // --on-nan skip: apply_if_finite left the parameters, the state and the count unchanged.
  return impl_->h.skip_nonfinite && (!std::isfinite(loss) || m.step == before) ? std::nan("") : loss;
}

double train_step_autodiff(Model& m, const Hyper& h, const Array& x, const Array& y) {
  const float total = static_cast<float>(x.shape()[0]);
  auto loss = [&](const std::vector<Array>& p) { return shard::sum(row_losses(forward(p, x, h), y, h.classify)) / total; };
  auto opt = optimizer_of(h, h.lr);
  if (m.shard_state) opt.shard_state_over("data");
  // With the state over 'data' (ZeRO-1) each replica receives only its rows of each gradient
  // (one psum_scatter each instead of a psum).
  auto [value, grads] = shard::value_and_grad(loss, opt.grad_sharding())(m.params);
  const double loss_value = value.to_host().item();
  // --on-nan skip: a non-finite loss (checked here, the same on every rank) or gradient
  // (apply_if_finite) leaves the model as it was; the caller sees NaN.
  if (h.skip_nonfinite && !std::isfinite(loss_value)) return std::nan("");
  if (h.skip_nonfinite) opt.apply_if_finite();
  // The optimizer's state is the model's (checkpointed with it): Adam's m and v, or SGD's momentum.
  shard::optim::State<float> state = take_state(m, h);
  const double norm = opt.update(m.params, grads, state);
  give_state(m, h, state);
  return h.skip_nonfinite && !std::isfinite(norm) ? std::nan("") : loss_value;
}

EvalResult evaluate_autodiff(const Model& m, const Hyper& h, const Array& x, const Array& y) {
  const Array z = forward(m.params, x, h);
  const double loss = shard::sum(row_losses(z, y, h.classify)).to_host().item();
  if (!h.classify) return EvalResult{loss, 0, static_cast<double>(x.shape()[0])};
  const auto valid = shard::greater_equal(shard::squeeze(y, 1), 0.0f);
  const auto hit = shard::equal(shard::astype<float>(shard::argmax(z, 1)), shard::squeeze(y, 1));
  const double correct = shard::sum(shard::logical_and(hit, valid)).to_host().item();
  const double count = shard::sum(valid).to_host().item();
  return EvalResult{loss, correct, count};
}

}  // namespace train
