#pragma once
/// \file Gradient accumulation over micro-batches (optax.MultiSteps; PyTorch's micro-batches
/// under DDP's no_sync): one optimizer step's gradients from k smaller batches, in the memory of
/// one.
///
/// `accumulate_value_and_grad(f, k, batch)(params)` returns the mean over i < k of
/// value_and_grad(f)(params, batch(i)...) (batch(i) returns a std::tuple of f's other arguments
/// for micro-batch i): for a loss that is a mean over equal micro-batches, the value and the
/// gradients of the whole batch, to float rounding. The gradients are summed in place in their
/// own dtype (float32 master parameters: float32), one micro-batch's activations alive at a time.
///
/// Communication: a parameter's gradient whose sum over mesh axes the backward pass defers
/// (shard::gradient_reduction(): the weights' products contracting over 'data', the gradients of
/// a shard_map's invariant arguments, also when the argument is the parameter laid out by a
/// reshard, FSDP's all_gather) is not summed over the mesh per micro-batch: each rank adds
/// its partial blocks over the micro-batches and the one sum over the mesh starts during the last
/// micro-batch's backward pass, overlapped with it (as DDP under no_sync, then the last
/// backward). Other sums (activations', or those the deferred path does not take: group-shared
/// memory within a node, bfloat16 products, uneven blocks) run per micro-batch as without
/// accumulation; so do all of them inside jit (the program sums per micro-batch). Another
/// value_and_grad run inside f or batch(i) shares the step's sums (its gradients would be zeros
/// until the last micro-batch): keep those outside. Collective: every rank calls it with the
/// same k and shapes.

#include <cstddef>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

#include "shard/autodiff/autodiff.hpp"
#include "shard/ops/detail/grad_reduce.hpp"

namespace shard {

/// The mean over `micro_batches` micro-batches of value_and_grad(f, grad_sharding)(params,
/// batch(i)...): (value, gradients of params' type). ValueError for micro_batches < 1.
template <typename F, typename Batch>
auto accumulate_value_and_grad(F f, int micro_batches, Batch batch, GradSharding grad_sharding = {},
                               shard::source_location where = shard::source_location::current()) {
  return [f = std::move(f), k = micro_batches, batch = std::move(batch), gs = std::move(grad_sharding),
          where](const auto& params) {
    const detail::CallScope scope("accumulate_value_and_grad", where);
    if (k < 1) raise<ValueError>("accumulate_value_and_grad: micro_batches is ", k, "; expected >= 1");
    using Params = std::remove_cvref_t<decltype(params)>;
    const double scale = 1.0 / static_cast<double>(k);
    // Each micro-batch's loss scaled by 1/k: the gradients are the mean's as they are summed.
    const auto scaled = [&f, scale](const Params& p, const auto&... args) { return f(p, args...) * scale; };
    using Result = decltype(std::apply(
        [&](const auto&... a) { return detail::run_value_and_grad<false>(scaled, gs, params, a...); },
        batch(0)));
    std::optional<Result> total;
    std::optional<detail::AccumulationScope> acc;
    if (k > 1) acc.emplace();
    for (int i = 0; i < k; ++i) {
      if (acc) acc->begin(i, k);
      Result r = std::apply(
          [&](const auto&... a) { return detail::run_value_and_grad<false>(scaled, gs, params, a...); },
          batch(i));
      if (!total) {
        total.emplace(std::move(r));
        continue;
      }
      total->first = total->first + r.first;
      tree_for_each([](auto& sum, const auto& g) { detail::add_in_place(sum, g); }, total->second, r.second);
    }
    if (acc) acc->finish();
    return std::move(*total);
  };
}

}  // namespace shard
