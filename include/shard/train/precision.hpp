#pragma once
/// \file Mixed precision as a policy (jmp's `Policy(param_dtype, compute_dtype, output_dtype)`;
/// what PyTorch's `torch.autocast` does implicitly, written out): master parameters and the
/// optimizer's state stay in the parameter dtype, each parameter is cast to the compute dtype
/// once per step inside the differentiated function (the cast is recorded: its VJP casts the
/// cotangent back, so gradients reach the optimizer in the parameter dtype), and what must be
/// precise (the loss, its log-softmax) is cast to the output dtype.
///
///     // given: std::vector<ShardedArray<float>> params; ShardedArray<float> x;
///     // given: ShardedArray<std::int32_t> y;
///     // given: auto model = [](const auto& p, const auto& x) { return matmul(astype<bfloat16>(x), p[0]); };
///     using Policy = shard::MixedBfloat16;                      // float32 / bfloat16 / float32
///     auto loss = [&](const std::vector<ShardedArray<float>>& params) {
///       const auto p = Policy::cast_to_compute(params);         // std::vector<ShardedArray<bfloat16>>
///       const auto logits = Policy::cast_to_output(model(p, x)); // float32
///       return mean(softmax_cross_entropy_with_integer_labels(logits, y));
///     };
///     auto [l, grads] = shard::value_and_grad(loss)(params);     // grads: float32, like params
///
/// bfloat16 needs no loss scaling (float32's exponent range), as in JAX and PyTorch.

#include <string>
#include <vector>

#include "shard/core/array_ops.hpp"
#include "shard/core/dtype.hpp"

namespace shard {

template <FloatDtype Param = float, FloatDtype Compute = Param, FloatDtype Output = Param>
struct Precision {
  using param_type = Param;
  using compute_type = Compute;
  using output_type = Output;

  /// x in the compute dtype (x itself when it already is one); differentiable.
  template <ArrayLike X>
  static decltype(auto) cast_to_compute(const X& x) {
    return as_dtype<Compute>(x);
  }
  /// x in the output dtype (x itself when it already is one); differentiable.
  template <ArrayLike X>
  static decltype(auto) cast_to_output(const X& x) {
    return as_dtype<Output>(x);
  }
  /// x in the parameter dtype; differentiable.
  template <ArrayLike X>
  static decltype(auto) cast_to_param(const X& x) {
    return as_dtype<Param>(x);
  }
  /// Each array of a list (a model's parameters) in the compute dtype.
  template <ArrayLike X>
  static std::vector<rebind_t<X, Compute>> cast_to_compute(const std::vector<X>& xs) {
    std::vector<rebind_t<X, Compute>> out;
    out.reserve(xs.size());
    for (const auto& x : xs) out.push_back(as_dtype<Compute>(x));
    return out;
  }
  /// "params float32, compute bfloat16, output float32".
  static std::string to_string() {
    return std::string("params ") + dtype_name<Param>() + ", compute " + dtype_name<Compute>() + ", output " +
           dtype_name<Output>();
  }
};

/// Everything in float32.
using Float32Policy = Precision<float, float, float>;
/// float32 master parameters and outputs, bfloat16 compute (products at bfloat16's rate).
using MixedBfloat16 = Precision<float, bfloat16, float>;

}  // namespace shard
