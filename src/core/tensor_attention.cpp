// Fused scaled dot-product attention on Tensors (jax.nn.dot_product_attention's layout:
// query (B, T, N, H), key and value (B, S, K, H), N a multiple of K): per batch row and head
// the scores, the softmax and the weighted sum are products straight on the strided (T, H)
// blocks of q, k and v (no transposes), the scale rides in the products' alpha, and a causal
// mask is the loop bounds: row blocks of the scores only reach the columns they may see, so
// about half of the masked products are skipped. The VJP is four such products and one pass
// over each row of the probabilities (dS = P (dP - rowsum(dP P))), in the same blocks.

#include <algorithm>
#include <cblas.h>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "shard/core/time_split.hpp"
#include "core/onednn_products.hpp"
#include "core/row_kernels.hpp"
#include "shard/core/trace.hpp"
#include "shard/error.hpp"
#include "shard/core/tensor_ops.hpp"

namespace shard::detail {

namespace {

/// Rows of the scores handled by one product when the mask is causal: smaller blocks skip
/// more of the masked triangle, larger ones run the products nearer the BLAS's peak.
constexpr std::int64_t kCausalBlock = 32;

/// c = alpha op(a) op(b) (+ c when beta is 1) with operands of type S and a result in C =
/// compute_t<S>: float32 / float64 on OpenBLAS, bfloat16 operands on bf16_gemm (oneDNN's matmul
/// with float32 accumulation where the CPU has it, else widen + sgemm), which has no alpha: it
/// scales the result, so callers accumulate (beta 1) with alpha 1 only.
template <typename S>
void prod(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, compute_t<S> alpha, const S* a,
          std::int64_t lda, const S* b, std::int64_t ldb, compute_t<S> beta, compute_t<S>* c, std::int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if constexpr (std::is_same_v<S, bfloat16>) {
    bf16_gemm(m, n, k, a, ta, lda, b, tb, ldb, c, ldc, /*accumulate=*/beta != 0);
    if (alpha != 1.0f)
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t j = 0; j < n; ++j) c[i * ldc + j] *= alpha;
  } else {
    const auto tra = ta ? CblasTrans : CblasNoTrans, trb = tb ? CblasTrans : CblasNoTrans;
    const auto M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(k);
    if constexpr (std::is_same_v<S, double>)
      cblas_dgemm(CblasRowMajor, tra, trb, M, N, K, alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
                  c, static_cast<int>(ldc));
    else
      cblas_sgemm(CblasRowMajor, tra, trb, M, N, K, alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
                  c, static_cast<int>(ldc));
  }
}

/// Rows [r0, r1) of `from` (width w) rounded into `to` (S narrower than C: bfloat16), or
/// nothing when S is C (then `to` is `from`).
template <typename S>
void narrow_rows(const compute_t<S>* from, S* to, std::int64_t r0, std::int64_t r1, std::int64_t w) {
  if constexpr (!std::is_same_v<S, compute_t<S>>)
    for (std::int64_t e = r0 * w; e < r1 * w; ++e) to[e] = S(from[e]);
}

/// The problem's sizes: batch B (1 for 3-D operands), query positions T, key positions S,
/// query heads N, key/value heads K (N = K G), head size H.
struct Problem {
  std::int64_t B = 1, T = 0, S = 0, N = 0, K = 0, H = 0;
  bool causal = false;
  /// Columns of the scores row i may attend to (JAX's causal mask: j <= i).
  std::int64_t valid(std::int64_t i) const { return causal ? std::min(i + 1, S) : S; }
  /// Row blocks of the scores: [r0, r1) reaches columns [0, cols(r1)).
  std::int64_t block() const { return causal ? kCausalBlock : std::max<std::int64_t>(T, 1); }
  /// Column blocks of the transposed products (dk, dv): whole rows of keys without a mask.
  std::int64_t col_block() const { return causal ? kCausalBlock : std::max<std::int64_t>(S, 1); }
  std::int64_t cols(std::int64_t r1) const { return causal ? std::min(r1, S) : S; }
  /// First row whose scores reach column c (the column blocks of the transposed products).
  std::int64_t first_row(std::int64_t c) const { return causal ? std::min(c, T) : 0; }
};

Problem check(const Shape& q, const Shape& k, const Shape& v, bool causal) {
  const auto name = [](const Shape& s) { return to_string(s); };
  if (q.size() != 3 && q.size() != 4)
    raise<ShapeError>("dot_product_attention: query must be (B, T, N, H) or (T, N, H), got ", name(q));
  if (k.size() != q.size() || v.size() != q.size())
    raise<ShapeError>("dot_product_attention: query, key and value must have the same number of dims, got ",
                      name(q), ", ", name(k), " and ", name(v));
  if (k != v)
    raise<ShapeError>("dot_product_attention: key and value must have the same shape (B, S, K, H), got ", name(k),
                      " and ", name(v));
  const std::size_t o = q.size() - 3;
  Problem d;
  d.B = o ? q[0] : 1;
  d.T = q[o];
  d.N = q[o + 1];
  d.H = q[o + 2];
  d.S = k[o];
  d.K = k[o + 1];
  d.causal = causal;
  if (o && k[0] != q[0])
    raise<ShapeError>("dot_product_attention: query and key have different batch sizes, ", name(q), " and ",
                      name(k));
  if (k[o + 2] != d.H)
    raise<ShapeError>("dot_product_attention: query and key have different head sizes, ", name(q), " and ",
                      name(k));
  if (d.K == 0 || d.N % d.K != 0)
    raise<ShapeError>("dot_product_attention: the query's heads (", d.N,
                      ") must be a multiple of the key's and value's heads (", d.K, "); shapes ", name(q), " and ",
                      name(k));
  if (d.S == 0 && d.T > 0) raise<ShapeError>("dot_product_attention: key has no positions, shape ", name(k));
  return d;
}

/// probs[i, :valid(i)] = softmax of the row, 0 beyond (the row was scores on [0, cols)).
template <Dtype T>
void softmax_rows(T* p, const Problem& d, std::int64_t r0, std::int64_t r1) {
  for (std::int64_t i = r0; i < r1; ++i) {
    T* row = p + i * d.S;
    const std::int64_t n = d.valid(i);
    softmax_row(row, row, n);
    std::fill(row + n, row + d.S, T(0));
  }
}

/// Forward for one (batch row, head): pc (T, S) <- probabilities in the compute type, ps <- the
/// same rounded to the operands' type (ps is pc when they are one type); out's (T, H) block <-
/// ps v, in the compute type.
template <typename S, typename C = compute_t<S>>
void forward_head(const Problem& d, C scale, const S* q, const S* k, const S* v, C* pc, S* ps, C* out) {
  const std::int64_t ldq = d.N * d.H, ldk = d.K * d.H;
  for (std::int64_t r0 = 0; r0 < d.T; r0 += d.block()) {
    const std::int64_t r1 = std::min(r0 + d.block(), d.T), c = d.cols(r1);
    prod<S>(false, true, r1 - r0, c, d.H, scale, q + r0 * ldq, ldq, k, ldk, C(0), pc + r0 * d.S, d.S);
    softmax_rows(pc, d, r0, r1);
    narrow_rows<S>(pc, ps, r0, r1, d.S);
    prod<S>(false, false, r1 - r0, d.H, c, C(1), ps + r0 * d.S, d.S, v, ldk, C(0), out + r0 * ldq, ldq);
  }
}

/// Backward for one (batch row, head) given its probabilities p and output cotangent g, in the
/// compute type C: dq's block (written), dk's and dv's blocks (accumulated: heads of a group
/// share them; with bfloat16 operands dk accumulates unscaled, the caller scales it once).
/// ds (T, S) is scratch, dsn its rounding to the operands' type (ds itself when they are one).
template <typename S, typename C = compute_t<S>>
void backward_head(const Problem& d, C scale, const S* q, const S* k, const S* v, const S* p, const S* g, C* ds,
                   S* dsn, C* dq, C* dk, C* dv) {
  constexpr bool kNarrow = !std::is_same_v<S, C>;
  const std::int64_t ldq = d.N * d.H, ldk = d.K * d.H, bs = d.block();
  // dv = p^T g and dp = g v^T, by blocks of the scores.
  for (std::int64_t c0 = 0; c0 < d.S; c0 += d.col_block()) {
    const std::int64_t c1 = std::min(c0 + d.col_block(), d.S), i0 = d.first_row(c0);
    prod<S>(true, false, c1 - c0, d.H, d.T - i0, C(1), p + i0 * d.S + c0, d.S, g + i0 * ldq, ldq, C(1),
            dv + c0 * ldk, ldk);
  }
  for (std::int64_t r0 = 0; r0 < d.T; r0 += bs) {
    const std::int64_t r1 = std::min(r0 + bs, d.T), c = d.cols(r1);
    prod<S>(false, true, r1 - r0, c, d.H, C(1), g + r0 * ldq, ldq, v, ldk, C(0), ds + r0 * d.S, d.S);
    for (std::int64_t i = r0; i < r1; ++i) {  // ds = p (dp - rowsum(dp p)); 0 where masked
      C* row = ds + i * d.S;
      const S* pr = p + i * d.S;
      const std::int64_t n = d.valid(i);
      double dot = 0;
      for (std::int64_t j = 0; j < n; ++j) dot += static_cast<double>(row[j]) * static_cast<C>(pr[j]);
      const C s = static_cast<C>(dot);
      for (std::int64_t j = 0; j < n; ++j) row[j] = static_cast<C>(pr[j]) * (row[j] - s);
      std::fill(row + n, row + d.S, C(0));
    }
    narrow_rows<S>(ds, dsn, r0, r1, d.S);
    // dq = scale ds k (this row block's columns only).
    prod<S>(false, false, r1 - r0, d.H, c, scale, dsn + r0 * d.S, d.S, k, ldk, C(0), dq + r0 * ldq, ldq);
  }
  // dk = scale ds^T q (unscaled with bfloat16 operands: bf16_gemm has no alpha when accumulating).
  for (std::int64_t c0 = 0; c0 < d.S; c0 += d.col_block()) {
    const std::int64_t c1 = std::min(c0 + d.col_block(), d.S), i0 = d.first_row(c0);
    prod<S>(true, false, c1 - c0, d.H, d.T - i0, kNarrow ? C(1) : scale, dsn + i0 * d.S + c0, d.S, q + i0 * ldq, ldq,
            C(1), dk + c0 * ldk, ldk);
  }
}

/// Calls f(b, n, q, k, v, out) with the (T, H) blocks' first elements of every (batch, head).
template <typename F>
void each_head(const Problem& d, F&& f) {
  const std::int64_t G = d.N / d.K;
  for (std::int64_t b = 0; b < d.B; ++b)
    for (std::int64_t n = 0; n < d.N; ++n) {
      const std::int64_t qoff = b * d.T * d.N * d.H + n * d.H, koff = b * d.S * d.K * d.H + (n / G) * d.H;
      f(b, n, qoff, koff);
    }
}

/// A tensor of S's compute type shaped like `shape`, or `same` itself when that is one type.
template <typename S>
struct Wide {
  using C = compute_t<S>;
  std::conditional_t<std::is_same_v<S, C>, Tensor<S>*, Tensor<C>> t;
  Wide(Tensor<S>& same, const Shape& shape, C fill) {
    if constexpr (std::is_same_v<S, C>) t = &same;
    else t = Tensor<C>(shape, fill);
  }
  C* data() {
    if constexpr (std::is_same_v<S, C>) return t->data();
    else return t.data();
  }
  /// Rounds into `same` (nothing when it is `same`), after multiplying by `factor`.
  void store(Tensor<S>& same, C factor = C(1)) {
    if constexpr (!std::is_same_v<S, C>) {
      const C* w = t.data();
      S* o = same.data();
      for (std::int64_t e = 0; e < same.size(); ++e) o[e] = S(w[e] * factor);
    }
  }
};

// Attention with bfloat16 operands runs its four products (six in the backward) on bf16_gemm,
// with float32 scores, softmax, row sums and accumulators: the probabilities and ds are rounded
// to bfloat16 as the operands of the products that follow (PyTorch's autocast does the same),
// the outputs and gradients once at the end.
template <Dtype T>
Tensor<T> attention_forward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const Problem& d,
                            compute_t<T> scale, Tensor<T>* probs) {
  using C = compute_t<T>;
  constexpr bool kNarrow = !std::is_same_v<T, C>;
  Tensor<T> out(q.shape());
  if (q.size() == 0) return out;
  Wide<T> wide_out(out, q.shape(), C(0));
  Tensor<C> pc;
  Tensor<T> ps;
  if (probs) *probs = Tensor<T>(Shape{d.B, d.N, d.T, d.S});
  if (kNarrow || !probs) pc = Tensor<C>(Shape{d.T, d.S});
  if (kNarrow && !probs) ps = Tensor<T>(Shape{d.T, d.S});
  each_head(d, [&](std::int64_t b, std::int64_t n, std::int64_t qo, std::int64_t ko) {
    T* p = probs ? probs->data() + (b * d.N + n) * d.T * d.S : ps.data();
    C* pw = nullptr;
    if constexpr (kNarrow) pw = pc.data();
    else pw = probs ? p : pc.data();
    if constexpr (!kNarrow) p = pw;
    forward_head<T>(d, scale, q.data() + qo, k.data() + ko, v.data() + ko, pw, p, wide_out.data() + qo);
  });
  wide_out.store(out);
  return out;
}

}  // namespace

void check_attention_shapes(const Shape& q, const Shape& k, const Shape& v) { check(q, k, v, false); }

// bfloat16 operands: attention runs in float32 on the operands widened once (exact), and its
// outputs (the probabilities a backward pass keeps too) are rounded once. Its products are small
// (a causal block of 32 query rows against one head's keys: 32 x 32..T x H) and many: as bfloat16
// products each pays a oneDNN call (1.5x slower end to end than float32 sgemm here, 2026-11-29),
// and the float32 scores are what autocast's softmax reads anyway.
template <Dtype T>
Tensor<T> fused_attention(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, double scale, bool causal,
                          Tensor<T>* probs) {
  const ScopedTime timed(TimeKind::kAttention);
  const Problem d = check(q.shape(), k.shape(), v.shape(), causal);
  if constexpr (std::is_same_v<T, bfloat16>) {
    Tensor<float> pf;
    const Tensor<float> out = attention_forward(astype_kernel<float>(q), astype_kernel<float>(k),
                                                astype_kernel<float>(v), d, static_cast<float>(scale),
                                                probs ? &pf : nullptr);
    if (probs) *probs = astype_kernel<bfloat16>(pf);
    return astype_kernel<bfloat16>(out);
  } else {
    return attention_forward(q, k, v, d, static_cast<compute_t<T>>(scale), probs);
  }
}

template <Dtype T>
std::array<Tensor<T>, 3> fused_attention_vjp(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                             const Tensor<T>& probs, const Tensor<T>& ct, double scale_in,
                                             bool causal) {
  if constexpr (std::is_same_v<T, bfloat16>) {  // in float32, as the forward (fused_attention)
    auto [dq, dk, dv] = fused_attention_vjp<float>(astype_kernel<float>(q), astype_kernel<float>(k),
                                                   astype_kernel<float>(v), astype_kernel<float>(probs),
                                                   astype_kernel<float>(ct), scale_in, causal);
    return {astype_kernel<bfloat16>(dq), astype_kernel<bfloat16>(dk), astype_kernel<bfloat16>(dv)};
  }
  using C = compute_t<T>;
  constexpr bool kNarrow = !std::is_same_v<T, C>;
  const ScopedTime timed(TimeKind::kAttention);
  const Problem d = check(q.shape(), k.shape(), v.shape(), causal);
  const C scale = static_cast<C>(scale_in);
  Tensor<T> dq(q.shape()), dk(k.shape(), T(0)), dv(v.shape(), T(0));
  if (q.size() > 0) {
    Wide<T> wq(dq, q.shape(), C(0)), wk(dk, k.shape(), C(0)), wv(dv, v.shape(), C(0));
    Tensor<C> ds(Shape{d.T, d.S});
    Tensor<T> dsn;
    if constexpr (kNarrow) dsn = Tensor<T>(Shape{d.T, d.S});
    each_head(d, [&](std::int64_t b, std::int64_t n, std::int64_t qo, std::int64_t ko) {
      T* narrow = nullptr;
      if constexpr (kNarrow) narrow = dsn.data();
      else narrow = ds.data();
      backward_head<T>(d, scale, q.data() + qo, k.data() + ko, v.data() + ko, probs.data() + (b * d.N + n) * d.T * d.S,
                       ct.data() + qo, ds.data(), narrow, wq.data() + qo, wk.data() + ko, wv.data() + ko);
    });
    wq.store(dq);
    wk.store(dk, scale);  // bfloat16: dk accumulated unscaled (backward_head)
    wv.store(dv);
  }
  return {std::move(dq), std::move(dk), std::move(dv)};
}

#define SHARD_INSTANTIATE_ATTENTION(T)                                                                          \
  template Tensor<T> fused_attention<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, double, bool,      \
                                        Tensor<T>*);                                                             \
  template std::array<Tensor<T>, 3> fused_attention_vjp<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, \
                                                           const Tensor<T>&, const Tensor<T>&, double, bool);
SHARD_FOR_EACH_FLOAT_DTYPE(SHARD_INSTANTIATE_ATTENTION)
#undef SHARD_INSTANTIATE_ATTENTION

}  // namespace shard::detail
