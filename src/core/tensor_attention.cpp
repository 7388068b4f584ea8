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
#include "core/row_kernels.hpp"
#include "shard/core/trace.hpp"
#include "shard/error.hpp"
#include "shard/core/tensor_ops.hpp"

namespace shard::detail {

namespace {

/// Rows of the scores handled by one product when the mask is causal: smaller blocks skip
/// more of the masked triangle, larger ones run the products nearer the BLAS's peak.
constexpr std::int64_t kCausalBlock = 32;

template <Dtype T>
void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a, std::int64_t lda,
          const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  const auto tra = ta ? CblasTrans : CblasNoTrans, trb = tb ? CblasTrans : CblasNoTrans;
  const auto M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(k);
  if constexpr (std::is_same_v<T, double>)
    cblas_dgemm(CblasRowMajor, tra, trb, M, N, K, alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta, c,
                static_cast<int>(ldc));
  else
    cblas_sgemm(CblasRowMajor, tra, trb, M, N, K, alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta, c,
                static_cast<int>(ldc));
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

/// Forward for one (batch row, head): p (T, S) <- probabilities; out's (T, H) block <- p v.
template <Dtype T>
void forward_head(const Problem& d, T scale, const T* q, const T* k, const T* v, T* p, T* out) {
  const std::int64_t ldq = d.N * d.H, ldk = d.K * d.H;
  for (std::int64_t r0 = 0; r0 < d.T; r0 += d.block()) {
    const std::int64_t r1 = std::min(r0 + d.block(), d.T), c = d.cols(r1);
    gemm<T>(false, true, r1 - r0, c, d.H, scale, q + r0 * ldq, ldq, k, ldk, T(0), p + r0 * d.S, d.S);
    softmax_rows(p, d, r0, r1);
    gemm<T>(false, false, r1 - r0, d.H, c, T(1), p + r0 * d.S, d.S, v, ldk, T(0), out + r0 * ldq, ldq);
  }
}

/// Backward for one (batch row, head) given its probabilities p and output cotangent g:
/// dq's block (written), dk's and dv's blocks (accumulated: heads of a group share them).
/// ds (T, S) is scratch.
template <Dtype T>
void backward_head(const Problem& d, T scale, const T* q, const T* k, const T* v, const T* p, const T* g, T* ds, T* dq,
                   T* dk, T* dv) {
  const std::int64_t ldq = d.N * d.H, ldk = d.K * d.H, bs = d.block();
  // dv = p^T g and dp = g v^T, by blocks of the scores.
  for (std::int64_t c0 = 0; c0 < d.S; c0 += d.col_block()) {
    const std::int64_t c1 = std::min(c0 + d.col_block(), d.S), i0 = d.first_row(c0);
    gemm<T>(true, false, c1 - c0, d.H, d.T - i0, T(1), p + i0 * d.S + c0, d.S, g + i0 * ldq, ldq, T(1),
            dv + c0 * ldk, ldk);
  }
  for (std::int64_t r0 = 0; r0 < d.T; r0 += bs) {
    const std::int64_t r1 = std::min(r0 + bs, d.T), c = d.cols(r1);
    gemm<T>(false, true, r1 - r0, c, d.H, T(1), g + r0 * ldq, ldq, v, ldk, T(0), ds + r0 * d.S, d.S);
    for (std::int64_t i = r0; i < r1; ++i) {  // ds = p (dp - rowsum(dp p)); 0 where masked
      T* row = ds + i * d.S;
      const T* pr = p + i * d.S;
      const std::int64_t n = d.valid(i);
      double dot = 0;
      for (std::int64_t j = 0; j < n; ++j) dot += static_cast<double>(row[j]) * pr[j];
      const T s = static_cast<T>(dot);
      for (std::int64_t j = 0; j < n; ++j) row[j] = pr[j] * (row[j] - s);
      std::fill(row + n, row + d.S, T(0));
    }
    // dq = scale ds k (this row block's columns only).
    gemm<T>(false, false, r1 - r0, d.H, c, scale, ds + r0 * d.S, d.S, k, ldk, T(0), dq + r0 * ldq, ldq);
  }
  // dk = scale ds^T q.
  for (std::int64_t c0 = 0; c0 < d.S; c0 += d.col_block()) {
    const std::int64_t c1 = std::min(c0 + d.col_block(), d.S), i0 = d.first_row(c0);
    gemm<T>(true, false, c1 - c0, d.H, d.T - i0, scale, ds + i0 * d.S + c0, d.S, q + i0 * ldq, ldq, T(1),
            dk + c0 * ldk, ldk);
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

template <Dtype T>
Tensor<T> attention_forward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const Problem& d, T scale,
                            Tensor<T>* probs) {
  Tensor<T> out(q.shape());
  if (q.size() == 0) return out;
  Tensor<T> scratch;
  if (probs) *probs = Tensor<T>(Shape{d.B, d.N, d.T, d.S});
  else scratch = Tensor<T>(Shape{d.T, d.S});
  each_head(d, [&](std::int64_t b, std::int64_t n, std::int64_t qo, std::int64_t ko) {
    T* p = probs ? probs->data() + (b * d.N + n) * d.T * d.S : scratch.data();
    forward_head(d, scale, q.data() + qo, k.data() + ko, v.data() + ko, p, out.data() + qo);
  });
  return out;
}

}  // namespace

void check_attention_shapes(const Shape& q, const Shape& k, const Shape& v) { check(q, k, v, false); }

template <Dtype T>
Tensor<T> fused_attention(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, double scale, bool causal,
                          Tensor<T>* probs) {
  const ScopedTime timed(TimeKind::kAttention);
  const Problem d = check(q.shape(), k.shape(), v.shape(), causal);
  return attention_forward(q, k, v, d, static_cast<T>(scale), probs);
}

template <Dtype T>
std::array<Tensor<T>, 3> fused_attention_vjp(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                             const Tensor<T>& probs, const Tensor<T>& ct, double scale_in,
                                             bool causal) {
  const ScopedTime timed(TimeKind::kAttention);
  const Problem d = check(q.shape(), k.shape(), v.shape(), causal);
  const T scale = static_cast<T>(scale_in);
  Tensor<T> dq(q.shape()), dk(k.shape(), T(0)), dv(v.shape(), T(0));
  if (q.size() > 0) {
    Tensor<T> ds(Shape{d.T, d.S});
    each_head(d, [&](std::int64_t b, std::int64_t n, std::int64_t qo, std::int64_t ko) {
      backward_head(d, scale, q.data() + qo, k.data() + ko, v.data() + ko, probs.data() + (b * d.N + n) * d.T * d.S,
                    ct.data() + qo, ds.data(), dq.data() + qo, dk.data() + ko, dv.data() + ko);
    });
  }
  return {std::move(dq), std::move(dk), std::move(dv)};
}

// bfloat16 attention computes in float32 (scores, softmax, both products and the backward's
// row sums) and rounds its outputs once: the operands are widened, the probabilities kept for
// the backward are stored in bfloat16.
template <>
Tensor<bfloat16> fused_attention<bfloat16>(const Tensor<bfloat16>& q, const Tensor<bfloat16>& k,
                                           const Tensor<bfloat16>& v, double scale, bool causal,
                                           Tensor<bfloat16>* probs) {
  const ScopedTime timed(TimeKind::kAttention);
  Tensor<float> wide_probs;
  const Tensor<float> out = fused_attention<float>(astype_kernel<float>(q), astype_kernel<float>(k),
                                                   astype_kernel<float>(v), scale, causal, probs ? &wide_probs : nullptr);
  if (probs) *probs = astype_kernel<bfloat16>(wide_probs);
  return astype_kernel<bfloat16>(out);
}

template <>
std::array<Tensor<bfloat16>, 3> fused_attention_vjp<bfloat16>(const Tensor<bfloat16>& q, const Tensor<bfloat16>& k,
                                                               const Tensor<bfloat16>& v, const Tensor<bfloat16>& probs,
                                                               const Tensor<bfloat16>& ct, double scale, bool causal) {
  const ScopedTime timed(TimeKind::kAttention);
  auto g = fused_attention_vjp<float>(astype_kernel<float>(q), astype_kernel<float>(k), astype_kernel<float>(v),
                                      astype_kernel<float>(probs), astype_kernel<float>(ct), scale, causal);
  return {astype_kernel<bfloat16>(g[0]), astype_kernel<bfloat16>(g[1]), astype_kernel<bfloat16>(g[2])};
}

#define SHARD_INSTANTIATE_ATTENTION(T)                                                                          \
  template Tensor<T> fused_attention<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, double, bool,      \
                                        Tensor<T>*);                                                             \
  template std::array<Tensor<T>, 3> fused_attention_vjp<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, \
                                                           const Tensor<T>&, const Tensor<T>&, double, bool);
SHARD_FOR_EACH_FLOAT_DTYPE(SHARD_INSTANTIATE_ATTENTION)
#undef SHARD_INSTANTIATE_ATTENTION

}  // namespace shard::detail
