// Fused row ops on Tensors: softmax and standardize along one axis, each one pass over a row
// forward and one backward (their VJPs are kernels too), instead of the five to eight
// elementwise and reduction passes (and as many temporaries) the composed forms take. The
// values equal the composed forms' to rounding: sums accumulate in double.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/row_kernels.hpp"
#include "shard/error.hpp"
#include "shard/core/tensor_ops.hpp"

namespace shard::detail {

namespace {

/// The array as rows along `axis`: outer x n x inner, element (o, i, j) at (o n + i) inner + j.
struct Rows {
  std::int64_t outer = 1, n = 1, inner = 1;
};
Rows rows_of(const Shape& shape, int axis) {
  Rows r;
  for (int d = 0; d < static_cast<int>(shape.size()); ++d) {
    if (d < axis) r.outer *= shape[d];
    else if (d == axis) r.n = shape[d];
    else r.inner *= shape[d];
  }
  return r;
}

int resolve_axis(int axis, int rank, const char* op) {
  const int a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank)
    raise<ValueError>(op, ": axis ", axis, " is out of range for an array of ", rank, " dims");
  return a;
}

/// Calls f(base, stride) for every row: element i of the row at base + i * stride.
template <typename F>
void each_row(const Rows& r, F&& f) {
  for (std::int64_t o = 0; o < r.outer; ++o)
    for (std::int64_t j = 0; j < r.inner; ++j) f(o * r.n * r.inner + j, r.inner);
}

template <Dtype T>
Tensor<T> softmax_kernel(const Tensor<T>& x, int axis) {
  Tensor<T> y(x.shape());
  const Rows r = rows_of(x.shape(), axis);
  const T* in = x.data();
  T* out = y.data();
  if (r.inner == 1 && r.n > 0) {  // the last axis: contiguous rows
    for (std::int64_t o = 0; o < r.outer; ++o) softmax_row(in + o * r.n, out + o * r.n, r.n);
    return y;
  }
  each_row(r, [&](std::int64_t b, std::int64_t s) {
    if (r.n == 0) return;
    T m = in[b];  // a nan anywhere in the row makes the sum, and so every output, nan
    for (std::int64_t i = 1; i < r.n; ++i) m = std::max(m, in[b + i * s]);
    double sum = 0;
    for (std::int64_t i = 0; i < r.n; ++i) {
      const T e = exp_nonpositive(in[b + i * s] - m);
      out[b + i * s] = e;
      sum += e;
    }
    const T inv = static_cast<T>(1.0 / sum);
    for (std::int64_t i = 0; i < r.n; ++i) out[b + i * s] *= inv;
  });
  return y;
}

/// dx = y (ct - sum(ct y)) along the row.
template <Dtype T>
Tensor<T> softmax_grad_kernel(const Tensor<T>& y, const Tensor<T>& ct, int axis) {
  Tensor<T> dx(y.shape());
  const Rows r = rows_of(y.shape(), axis);
  const T *py = y.data(), *pc = ct.data();
  T* out = dx.data();
  each_row(r, [&](std::int64_t b, std::int64_t s) {
    double dot = 0;
    for (std::int64_t i = 0; i < r.n; ++i) dot += static_cast<double>(pc[b + i * s]) * py[b + i * s];
    const T d = static_cast<T>(dot);
    for (std::int64_t i = 0; i < r.n; ++i) out[b + i * s] = py[b + i * s] * (pc[b + i * s] - d);
  });
  return dx;
}

/// y = (x - mean) rstd, rstd = 1 / sqrt(var + eps) (biased variance); rstd has one value a row.
template <Dtype T>
Tensor<T> standardize_kernel(const Tensor<T>& x, int axis, double eps, Tensor<T>& rstd) {
  Tensor<T> y(x.shape());
  const Rows r = rows_of(x.shape(), axis);
  rstd = Tensor<T>(Shape{r.outer * r.inner});
  const T* in = x.data();
  T* out = y.data();
  std::int64_t row = 0;
  each_row(r, [&](std::int64_t b, std::int64_t s) {
    double sum = 0;
    for (std::int64_t i = 0; i < r.n; ++i) sum += in[b + i * s];
    const double mean = sum / static_cast<double>(r.n);
    double sq = 0;
    for (std::int64_t i = 0; i < r.n; ++i) {
      const double d = in[b + i * s] - mean;
      sq += d * d;
    }
    const double inv = 1.0 / std::sqrt(sq / static_cast<double>(r.n) + eps);
    rstd.flat(row++) = static_cast<T>(inv);
    for (std::int64_t i = 0; i < r.n; ++i) out[b + i * s] = static_cast<T>((in[b + i * s] - mean) * inv);
  });
  return y;
}

/// dx = rstd (ct - mean(ct) - y mean(ct y)) along the row.
template <Dtype T>
Tensor<T> standardize_grad_kernel(const Tensor<T>& y, const Tensor<T>& rstd, const Tensor<T>& ct, int axis) {
  Tensor<T> dx(y.shape());
  const Rows r = rows_of(y.shape(), axis);
  const T *py = y.data(), *pc = ct.data();
  T* out = dx.data();
  std::int64_t row = 0;
  each_row(r, [&](std::int64_t b, std::int64_t s) {
    double sc = 0, scy = 0;
    for (std::int64_t i = 0; i < r.n; ++i) {
      sc += pc[b + i * s];
      scy += static_cast<double>(pc[b + i * s]) * py[b + i * s];
    }
    const auto n = static_cast<double>(r.n);
    const T mc = static_cast<T>(sc / n), mcy = static_cast<T>(scy / n), k = rstd.flat(row++);
    for (std::int64_t i = 0; i < r.n; ++i) out[b + i * s] = k * (pc[b + i * s] - mc - py[b + i * s] * mcy);
  });
  return dx;
}

}  // namespace

// bfloat16 rows compute in float32 (the row's values widened, sums and scales in float32 and
// double as for float32) and round each output once.
template <typename T>
Tensor<float> wide(const Tensor<T>& x) {
  return astype_kernel<float>(x);
}
static Tensor<bfloat16> narrow(const Tensor<float>& x) { return astype_kernel<bfloat16>(x); }

template <Dtype T>
Tensor<T> fused_softmax(const Tensor<T>& x, int axis) {
  if constexpr (std::is_same_v<T, bfloat16>) return narrow(fused_softmax(wide(x), axis));
  else return softmax_kernel(x, resolve_axis(axis, x.rank(), "softmax"));
}

template <Dtype T>
Tensor<T> fused_softmax_vjp(const Tensor<T>& y, const Tensor<T>& ct, int axis) {
  if constexpr (std::is_same_v<T, bfloat16>) return narrow(fused_softmax_vjp(wide(y), wide(ct), axis));
  else return softmax_grad_kernel(y, ct, resolve_axis(axis, y.rank(), "softmax"));
}

template <Dtype T>
Tensor<T> fused_standardize(const Tensor<T>& x, int axis, double eps, Tensor<T>* rstd) {
  if constexpr (std::is_same_v<T, bfloat16>) {
    Tensor<float> wide_rstd;
    Tensor<bfloat16> y = narrow(fused_standardize(wide(x), axis, eps, rstd ? &wide_rstd : nullptr));
    if (rstd) *rstd = narrow(wide_rstd);
    return y;
  } else {
    Tensor<T> unused;
    return standardize_kernel(x, resolve_axis(axis, x.rank(), "standardize"), eps, rstd ? *rstd : unused);
  }
}

template <Dtype T>
Tensor<T> fused_standardize_vjp(const Tensor<T>& y, const Tensor<T>& rstd, const Tensor<T>& ct, int axis) {
  if constexpr (std::is_same_v<T, bfloat16>) return narrow(fused_standardize_vjp(wide(y), wide(rstd), wide(ct), axis));
  else return standardize_grad_kernel(y, rstd, ct, resolve_axis(axis, y.rank(), "standardize"));
}

#define SHARD_INSTANTIATE_ROWS(T)                                                    \
  template Tensor<T> fused_softmax<T>(const Tensor<T>&, int);                        \
  template Tensor<T> fused_softmax_vjp<T>(const Tensor<T>&, const Tensor<T>&, int);  \
  template Tensor<T> fused_standardize<T>(const Tensor<T>&, int, double, Tensor<T>*); \
  template Tensor<T> fused_standardize_vjp<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, int);
SHARD_FOR_EACH_FLOAT_DTYPE(SHARD_INSTANTIATE_ROWS)
#undef SHARD_INSTANTIATE_ROWS

}  // namespace shard::detail
