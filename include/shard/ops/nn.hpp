#pragma once
/// \file The nn family: composite ops (jax.nn's and optax's), each a composition of primitives
/// written once for both views (Tensor blocks and ShardedArrays): logsumexp, softmax and
/// log_softmax, gelu, logaddexp, softplus and log_sigmoid, standardize and layer_norm,
/// softmax_cross_entropy_with_integer_labels, dot_product_attention. Their VJPs are their
/// primitives'; their communication on ShardedArrays is their primitives' rules'. On Tensors
/// (shard_map bodies) softmax, standardize and attention are primitives of their own (below):
/// one pass a row, a VJP that reads what the forward pass kept.

#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <source_location>
#include <type_traits>
#include <utility>

#include "shard/array/driver.hpp"
#include "shard/core/array_ops.hpp"
#include "shard/core/primitive.hpp"
#include "shard/core/shape_ops.hpp"
#include "shard/core/tensor_ops.hpp"
#include "shard/core/trace.hpp"
#include "shard/error.hpp"
#include "shard/ops/batching.hpp"

namespace shard {

/// The fused Tensor primitives of the family: each computes its result and keeps what its VJP
/// reads in one call (forward_vjp; kernels in src/core/tensor_rows.cpp, tensor_attention.cpp).
namespace prim {

/// softmax along `axis`; its VJP reads the result.
struct Softmax : Primitive {
  int axis;
  static constexpr bool kernel_validates = true;
  const char* name() const { return "softmax"; }
  template <Dtype T>
  Tensor<T> kernel(const Tensor<T>& x) const {
    return detail::fused_softmax(x, axis);
  }
  template <Dtype T>
  std::pair<Tensor<T>, KernelVjp<Tensor<T>, Tensor<T>>> forward_vjp(const VjpNeed&,
                                                                    const Tensor<T>& x) const {
    Tensor<T> y = detail::fused_softmax(x, axis);
    KernelVjp<Tensor<T>, Tensor<T>> vjp = [yk = detail::keep(y), axis = axis](const Tensor<T>& ct,
                                                                              const VjpNeed&) {
      return cotangents<Tensor<T>>(detail::fused_softmax_vjp(yk, ct, axis));
    };
    return {std::move(y), std::move(vjp)};
  }
  /// Batching: the same primitive along the axis past the batch dim.
  Softmax batched(int rank) const { return Softmax{{}, detail::past_batch(axis, rank, name())}; }
  template <typename... A>
  auto batch(const shard::source_location& where, std::int64_t size, const A&... a) const {
    return detail::batch_shifted(*this, where, size, a...);
  }
};

/// (x - mean) / sqrt(var + epsilon) along `axis`; its VJP reads the result and 1/std.
struct Standardize : Primitive {
  int axis;
  double epsilon;
  static constexpr bool kernel_validates = true;
  const char* name() const { return "standardize"; }
  template <Dtype T>
  Tensor<T> kernel(const Tensor<T>& x) const {
    return detail::fused_standardize(x, axis, epsilon);
  }
  template <Dtype T>
  std::pair<Tensor<T>, KernelVjp<Tensor<T>, Tensor<T>>> forward_vjp(const VjpNeed&,
                                                                    const Tensor<T>& x) const {
    Tensor<T> rstd;
    Tensor<T> y = detail::fused_standardize(x, axis, epsilon, &rstd);
    KernelVjp<Tensor<T>, Tensor<T>> vjp = [yk = detail::keep(y), rk = std::move(rstd), axis = axis](
                                              const Tensor<T>& ct, const VjpNeed&) {
      return cotangents<Tensor<T>>(detail::fused_standardize_vjp(yk, rk, ct, axis));
    };
    return {std::move(y), std::move(vjp)};
  }
  Standardize batched(int rank) const {
    return Standardize{{}, detail::past_batch(axis, rank, name()), epsilon};
  }
  template <typename... A>
  auto batch(const shard::source_location& where, std::int64_t size, const A&... a) const {
    return detail::batch_shifted(*this, where, size, a...);
  }
};

/// dot_product_attention on (B, T, N, H) blocks; its VJP reads the operands and the
/// attention probabilities.
struct Attention : Primitive {
  double scale;
  bool causal;
  /// Leading dims merged into B first (a batched attention under vmap: (N, B, T, N, H)).
  int lead = 0;
  static constexpr bool kernel_validates = true;
  const char* name() const { return "dot_product_attention"; }
  template <Dtype T>
  Tensor<T> kernel(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v) const {
    if (lead) return unmerge(bare().kernel(merged(q), merged(k), merged(v)), q.shape());
    return detail::fused_attention(q, k, v, scale, causal);
  }
  template <Dtype T>
  std::pair<Tensor<T>, KernelVjp<Tensor<T>, Tensor<T>>> forward_vjp(const VjpNeed& need, const Tensor<T>& q,
                                                                    const Tensor<T>& k,
                                                                    const Tensor<T>& v) const {
    if (lead) {
      auto [out, vjp] = bare().forward_vjp(need, merged(q), merged(k), merged(v));
      KernelVjp<Tensor<T>, Tensor<T>> outer = [vjp = std::move(vjp), this_ = *this, qs = q.shape(),
                                               ks = k.shape(),
                                               vs = v.shape()](const Tensor<T>& ct, const VjpNeed& n) {
        Cotangents<Tensor<T>> c = vjp(this_.merged(ct), n);
        const Shape* shapes[3] = {&qs, &ks, &vs};
        for (std::size_t i = 0; i < c.size() && i < 3; ++i)
          if (c[i]) {
            Tensor<T> u = this_.unmerge(std::move(*c[i]), *shapes[i]);
            c[i] = std::move(u);
          }
        return c;
      };
      return {unmerge(std::move(out), q.shape()), std::move(outer)};
    }
    Tensor<T> probs;
    Tensor<T> out = detail::fused_attention(q, k, v, scale, causal, &probs);
    KernelVjp<Tensor<T>, Tensor<T>> vjp = [qk = detail::keep(q), kk = detail::keep(k), vk = detail::keep(v),
                                           pk = std::move(probs), scale = scale,
                                           causal = causal](const Tensor<T>& ct, const VjpNeed&) {
      auto [dq, dk, dv] = detail::fused_attention_vjp(qk, kk, vk, pk, ct, scale, causal);
      return cotangents<Tensor<T>>(std::move(dq), std::move(dk), std::move(dv));
    };
    return {std::move(out), std::move(vjp)};
  }
  /// Batching: (T, N, H) examples make the batch B; (B, T, N, H) examples have it merged into B
  /// (the kernel's blocks are (B, T, N, H)).
  Attention batched(int rank) const { return Attention{{}, scale, causal, rank == 3 ? lead : lead + 1}; }
  template <typename... A>
  auto batch(const shard::source_location& where, std::int64_t size, const A&... a) const {
    return detail::batch_shifted(*this, where, size, a...);
  }

 private:
  Attention bare() const { return Attention{{}, scale, causal, 0}; }
  /// x with its first lead + 1 dims merged (a copy-free reshape of a contiguous block).
  template <Dtype T>
  Tensor<T> merged(const Tensor<T>& x) const {
    if (x.ndim() < lead + 4)
      raise<ShapeError>("dot_product_attention: operands are (B, T, N, H) per example; got shape ",
                        to_string(x.shape()));
    Shape s(x.shape().begin() + lead, x.shape().end());
    for (int d = 0; d < lead; ++d) s[0] *= x.shape()[d];
    return reshape(x, s);
  }
  /// y (merged B) with the leading dims of `like` back.
  template <Dtype T>
  Tensor<T> unmerge(Tensor<T> y, const Shape& like) const {
    Shape s(like.begin(), like.begin() + lead);
    s.insert(s.end(), y.shape().begin(), y.shape().end());
    s[lead] = like[lead];
    return std::move(y).reshaped(s);
  }
};

}  // namespace prim

/// log(sum(exp(x))) over dims, computed stably (the max is subtracted first).
template <ArrayLike X>
auto logsumexp(const X& x, const Dims& dims = {}, bool keepdims = false) {
  using R = float_of_t<elem_t<X>>;
  const auto& xf = as_dtype<R>(x);
  if (detail::reduces_nothing(xf, dims, "logsumexp"))  // log of an empty sum: -inf, as JAX's
    return log(sum(exp(xf), dims, keepdims));
  const auto m = max(xf, dims, true);
  const auto safe_m = where(isfinite(m), m, R(0));  // an all -inf row stays -inf, not nan
  auto out = log(sum(exp(xf - safe_m), dims, true)) + safe_m;
  if (keepdims) return out;
  return squeeze(out, dims.is_all() ? Dims() : dims);
}
/// exp(x) / sum(exp(x)) along `axis` (jax.nn.softmax).
template <ArrayLike X>
auto softmax(const X& x, int axis = -1) {
  using R = float_of_t<elem_t<X>>;
  const auto& xf = as_dtype<R>(x);
  if (detail::reduces_nothing(xf, Dims(axis), "softmax")) return exp(xf);  // empty rows: an empty result
  if constexpr (detail::is_tensor_v<X>) {
    return detail::bind_at(prim::Softmax{{}, axis}, shard::source_location{}, xf);  // one pass a row
  } else {
    const auto e = exp(xf - max(xf, axis, true));
    return e / sum(e, axis, true);
  }
}
/// x - logsumexp(x) along `axis` (jax.nn.log_softmax).
template <ArrayLike X>
auto log_softmax(const X& x, int axis = -1) {
  using R = float_of_t<elem_t<X>>;
  const auto& xf = as_dtype<R>(x);
  if (detail::reduces_nothing(xf, Dims(axis), "log_softmax")) return exp(xf);  // empty rows: an empty result
  const auto shifted = xf - max(xf, axis, true);
  return shifted - log(sum(exp(shifted), axis, true));
}

/// jax.nn.gelu: x Phi(x). approximate (JAX's default): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715
/// x^3))); otherwise the exact 0.5 x (1 + erf(x / sqrt(2))). Elementwise: no communication.
template <ArrayLike X>
auto gelu(const X& x, bool approximate = true) {
  using R = float_of_t<elem_t<X>>;
  const auto& xf = as_dtype<R>(x);
  if (approximate) return unary(xf, UnaryOp::kGelu);  // one pass; its VJP one more
  return xf * R(0.5) * (erf(xf * static_cast<R>(0.7071067811865476)) + R(1));
}

namespace detail {
/// log(exp(a) + exp(b)) of a floating array and an array or scalar of its type, as
/// jnp.logaddexp computes it: max(a, b) + log1p(exp(-|a - b|)), and a + b where a - b is nan
/// (a nan operand, or infinities of one sign: -inf, -inf gives -inf). That branch's |a - b| is
/// replaced by 0 so its derivative stays finite (JAX's custom rule gives 1 and 1 at +inf, +inf).
template <ArrayLike X, typename B>
auto logaddexp_floating(const X& a, const B& b) {
  using R = elem_t<X>;
  const auto delta = a - b;
  const auto same_inf = isnan(delta);
  const auto finite_delta = where(same_inf, R(0), delta);
  return where(same_inf, a + b, maximum(a, b) + log1p(exp(-abs(finite_delta))));
}
}  // namespace detail

/// jnp.logaddexp: log(exp(a) + exp(b)) elementwise without overflow, broadcast and promoted like
/// a binary op (integers and bool become floating, float_of_t). Either operand may be a scalar.
/// Gradients: exp(a - out) and exp(b - out) (a sigmoid of a - b), 1/2 each at a == b; with
/// infinities (0, 1) at (-inf, b), (1, 0) at (+inf, b), (1, 1) at (+inf, +inf) and (-inf, -inf).
template <ArrayLike X, ArrayLike Y>
auto logaddexp(const X& a, const Y& b) {
  using R = float_of_t<promote_t<elem_t<X>, elem_t<Y>>>;
  return detail::logaddexp_floating(detail::in_view_of<R>(a, b), detail::in_view_of<R>(b, a));
}
template <ArrayLike X, Scalar S>
auto logaddexp(const X& a, S s) {
  using R = float_of_t<weak_promote_t<elem_t<X>, S>>;
  return detail::logaddexp_floating(as_dtype<R>(a), static_cast<R>(s));
}
template <ArrayLike X, Scalar S>
auto logaddexp(S s, const X& a) {
  return logaddexp(a, s);
}

/// jax.nn.softplus: log(1 + exp(x)) as logaddexp(x, 0), so it neither overflows for large x
/// (softplus(100) is 100) nor rounds to 0 early for very negative x (softplus(-100) is
/// exp(-100)). Integers and bool become floating. Its derivative is sigmoid(x) (1/2 at 0).
/// Elementwise: no communication.
template <ArrayLike X>
auto softplus(const X& x) {
  return logaddexp(x, 0);
}
/// jax.nn.log_sigmoid: log(sigmoid(x)) = -softplus(-x), stable at both ends (log_sigmoid(-100)
/// is -100, log_sigmoid(100) is -exp(-100)). Its derivative is sigmoid(-x). Elementwise.
template <ArrayLike X>
auto log_sigmoid(const X& x) {
  using R = float_of_t<elem_t<X>>;
  return -softplus(-as_dtype<R>(x));
}
/// jax.nn.standardize: (x - mean) / sqrt(var + epsilon) along `axis` (a layer norm without
/// its scale and bias). A split axis costs two small reductions.
template <ArrayLike X>
auto standardize(const X& x, int axis = -1, double epsilon = 1e-5) {
  using R = float_of_t<elem_t<X>>;
  const auto& xf = as_dtype<R>(x);
  if constexpr (detail::is_tensor_v<X>) {
    return detail::bind_at(prim::Standardize{{}, axis, epsilon}, shard::source_location{},
                           xf);  // one pass a row
  } else {
    const auto centred = xf - mean(xf, axis, true);
    return centred * rsqrt(mean(square(centred), axis, true) + static_cast<R>(epsilon));
  }
}

namespace detail {
/// A layer_norm parameter lined up with dim `a` of a rank-`r` array: a 1-D p becomes
/// (n, 1, ..., 1) unless `a` is the last dim; other shapes broadcast as numpy's.
template <ArrayLike P>
auto along_dim(const P& p, int a, int r) {
  using A = std::remove_cvref_t<P>;
  if (p.ndim() != 1 || a == r - 1) return A(p.alias());
  Shape s(static_cast<std::size_t>(r - a), 1);
  s[0] = p.shape()[0];
  return A(reshape(p, s));
}
}  // namespace detail

/// Layer normalisation (flax.linen.LayerNorm, haiku.LayerNorm): standardize(x, axis, epsilon)
/// * gain + bias. A 1-D gain or bias lies along the normalised axis (shape (D,) for x (B, T, D)
/// and axis -1, and for x (B, D, T) and axis 1); other shapes broadcast against x as numpy's.
/// Promoted like the ops it is made of (integer x becomes floating). A split axis costs
/// standardize's two small reductions; gain and bias line up with x's blocks like any operand.
template <ArrayLike X, ArrayLike G, ArrayLike B>
auto layer_norm(const X& x, const G& gain, const B& bias, int axis = -1, double epsilon = 1e-5) {
  const int r = x.ndim();
  const int a = resolve_dim(axis, r, "layer_norm");
  return standardize(x, a, epsilon) * detail::along_dim(gain, a, r) + detail::along_dim(bias, a, r);
}

/// optax.softmax_cross_entropy_with_integer_labels: the per-example losses
/// logsumexp(logits) - logits[label] along `axis` (the classes), shaped like labels, which must
/// have the logits' shape without `axis` (ShapeError otherwise; a label out of range is
/// take_along_axis's ShapeError). Computed as optax does, the row max subtracted first, so large
/// logits lose no precision. d/dlogits = softmax(logits) - one_hot(labels); labels (int32 or
/// int64) have no gradient. On ShardedArrays a split class dim (vocabulary-parallel logits)
/// costs three small reductions (the max, the picked logits' psum, the sum of exponentials).
template <ArrayLike X, ArrayLike L>
auto softmax_cross_entropy_with_integer_labels(const X& logits, const L& labels, int axis = -1) {
  using T = elem_t<X>;
  using I = elem_t<L>;
  static_assert(is_floating_v<T>, "softmax_cross_entropy_with_integer_labels: logits must be floating");
  static_assert(std::is_same_v<I, std::int32_t> || std::is_same_v<I, std::int64_t>,
                "softmax_cross_entropy_with_integer_labels: labels must be int32 or int64");
  const int a = resolve_dim(axis, logits.ndim(), "softmax_cross_entropy_with_integer_labels");
  Shape want = logits.shape();
  want.erase(want.begin() + a);
  if (labels.shape() != want)
    raise<ShapeError>("softmax_cross_entropy_with_integer_labels: labels of shape ",
                      to_string(labels.shape()), " for logits of shape ", to_string(logits.shape()),
                      "; the labels need the logits' shape without", " the class dim ", a, ": ",
                      to_string(want));
  const auto& l = detail::in_view_of<T>(logits, labels);  // a Tensor meeting sharded labels joins their mesh
  const auto& y = detail::in_view_of<I>(labels, logits);
  const auto shifted = l - max(l, a, true);
  const auto picked = squeeze(take_along_axis(shifted, expand_dims(y, a), a), Dims{a});
  return log(sum(exp(shifted), a)) - picked;
}

/// jax.nn.dot_product_attention(query, key, value, scale=scale, is_causal=is_causal):
/// query (B, T, N, H) or (T, N, H), key and value (B, S, K, H) with N a multiple of K (grouped
/// heads: query head n reads key/value head n / (N / K)); softmax(q k^T * scale [+ causal
/// mask]) v per batch row and head, (B, T, N, H). scale defaults to 1 / sqrt(H); is_causal lets
/// position i attend to j <= i only. On Tensors (a shard_map body) it is one fused op: products
/// straight on the head blocks, the masked half of a causal product skipped, the VJP in the
/// same blocks; on ShardedArrays it is the composed form (any axis may be split: the products
/// and the softmax communicate as their own rules say; split B or N only keeps it local).
template <ArrayLike X, ArrayLike Y, ArrayLike Z>
auto dot_product_attention(const X& query, const Y& key, const Z& value, bool is_causal = false,
                           std::optional<double> scale = std::nullopt) {
  static_assert(
      detail::is_tensor_v<X> == detail::is_tensor_v<Y> && detail::is_tensor_v<X> == detail::is_tensor_v<Z>,
      "dot_product_attention: query, key and value must all be Tensors or all ShardedArrays");
  using R = float_of_t<promote_t<promote_t<elem_t<X>, elem_t<Y>>, elem_t<Z>>>;
  const auto& q = as_dtype<R>(query);
  const auto& k = as_dtype<R>(key);
  const auto& v = as_dtype<R>(value);
  const auto head = q.shape().empty() ? std::int64_t{0} : q.shape().back();
  const double s = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(head));
  if constexpr (detail::is_tensor_v<X>) {
    return detail::bind_at(prim::Attention{{}, s, is_causal}, shard::source_location{}, q, k, v);
  } else {
    using A = std::decay_t<decltype(q)>;
    const auto& qs = q.shape();
    const auto& ks = k.shape();
    detail::check_attention_shapes(qs, ks, v.shape());
    const std::size_t o = qs.size() - 3;
    if (qs[o + 1] == 0) return A(q);  // no query heads: an empty result, as on Tensors
    const A q4 = o ? A(q) : expand_dims(q, 0), k4 = o ? A(k) : expand_dims(k, 0),
            v4 = o ? A(v) : expand_dims(v, 0);
    const std::int64_t B = q4.shape()[0], T = qs[o], N = qs[o + 1], H = qs[o + 2], S = ks[o], K = ks[o + 1];
    const auto repeat = [&](const A& x) {  // (B, S, K, H) -> (B, S, N, H), each head N / K times
      if (N == K) return x;
      return reshape(stack(std::vector<A>(static_cast<std::size_t>(N / K), x), 3), {B, S, N, H});
    };
    auto logits =
        matmul(transpose(q4, {0, 2, 1, 3}), transpose(repeat(k4), {0, 2, 3, 1})) * static_cast<R>(s);
    if (is_causal) logits = logits + detail::causal_bias<R>(T, S);
    const auto out =
        transpose(matmul(softmax(logits, -1), transpose(repeat(v4), {0, 2, 1, 3})), {0, 2, 1, 3});
    if (o) return out;
    return squeeze(out, Dims{0});
  }
}

}  // namespace shard
