// The products' Tensor kernels (the primitives are ops/matmul.hpp's): matmul (numpy's rules: 1-D promotion, broadcast batch dims),
// dot and vdot. float32 and float64 go to OpenBLAS (one gemm for a batched A times a matrix
// B); integers and bool use plain loops. vdot of float32 accumulates in float64 (dsdot).

#include <cblas.h>

#include <cstring>

#include "shard/error.hpp"
#include "shard/core/tensor_ops.hpp"
#include "shard/core/trace.hpp"
#include "shard/core/detail/int_wrap.hpp"
#include "core/gemm.hpp"
#include "core/tensor_kernels.hpp"

namespace shard {

namespace {

/// c[m x n] = a[m x k] @ b[k x n], all row-major and contiguous.
template <typename T>
void product(std::int64_t m, std::int64_t n, std::int64_t k, const T* a, const T* b, T* c) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    std::fill(c, c + m * n, T(0));
    return;
  }
  if constexpr (FloatDtype<T>) {
    detail::gemm(false, false, m, n, k, a, k, b, n, c, n);
  } else {
    std::fill(c, c + m * n, T(0));
    for (std::int64_t r = 0; r < m; ++r)
      for (std::int64_t q = 0; q < k; ++q) {
        const T v = a[r * k + q];
        T* __restrict crow = c + r * n;
        const T* __restrict brow = b + q * n;
        if constexpr (std::is_same_v<T, bool>) {
          if (v)
            for (std::int64_t j = 0; j < n; ++j) crow[j] = crow[j] || brow[j];
        } else {
          for (std::int64_t j = 0; j < n; ++j) crow[j] = detail::add_wrap(crow[j], detail::mul_wrap(v, brow[j]));
        }
      }
  }
}

void check_int_limit(std::int64_t m, std::int64_t n, std::int64_t k) {
  constexpr std::int64_t kMax = 2147483647;
  if (m > kMax || n > kMax || k > kMax)
    raise<ValueError>("matmul: a dim of ", m, "x", k, " @ ", k, "x", n, " exceeds BLAS's int limit");
}

}  // namespace

template <Dtype T>
Tensor<T> detail::vdot_kernel(const Tensor<T>& a, const Tensor<T>& b) {
  if (a.size() != b.size())
    raise<ShapeError>("vdot: arrays of shapes ", to_string(a.shape()), " and ", to_string(b.shape()),
                      " have different sizes (", a.size(), " and ", b.size(), ")");
  Tensor<T> out(Shape{});
  const std::int64_t n = a.size();
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    double acc = 0;
    constexpr std::int64_t kChunk = std::int64_t{1} << 30;  // BLAS counts are int
    for (std::int64_t i = 0; i < n; i += kChunk) {
      const int len = static_cast<int>(std::min(kChunk, n - i));
      if constexpr (std::is_same_v<T, float>) acc += cblas_dsdot(len, a.data() + i, 1, b.data() + i, 1);
      else acc += cblas_ddot(len, a.data() + i, 1, b.data() + i, 1);
    }
    out.flat(0) = static_cast<T>(acc);
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    double acc = 0;  // exact products of bfloat16 values, summed in float64, rounded once
    for (std::int64_t i = 0; i < n; ++i) acc += double(float(a.flat(i)) * float(b.flat(i)));
    out.flat(0) = static_cast<T>(static_cast<float>(acc));
  } else if constexpr (std::is_same_v<T, bool>) {
    bool r = false;
    for (std::int64_t i = 0; i < n; ++i) r = r || (a.flat(i) && b.flat(i));
    out.flat(0) = r;
  } else {
    std::int64_t acc = 0;  // wraps as numpy's and JAX's integer products do
    for (std::int64_t i = 0; i < n; ++i)
      acc = detail::add_wrap(acc, detail::mul_wrap(static_cast<std::int64_t>(a.flat(i)), static_cast<std::int64_t>(b.flat(i))));
    out.flat(0) = static_cast<T>(acc);
  }
  return out;
}

template <Dtype T>
Tensor<T> detail::matmul_kernel(const Tensor<T>& a_in, const Tensor<T>& b_in) {
  if (a_in.rank() == 0 || b_in.rank() == 0)
    raise<ShapeError>("matmul: operands must have at least one dim, got shapes ", to_string(a_in.shape()), " and ",
                      to_string(b_in.shape()), " (use * or dot for scalars)");
  if (a_in.rank() == 1 && b_in.rank() == 1) {
    if (a_in.size() != b_in.size())
      raise<ShapeError>("matmul: shapes ", to_string(a_in.shape()), " and ", to_string(b_in.shape()),
                        " do not align (", a_in.size(), " != ", b_in.size(), ")");
    return vdot_kernel(a_in, b_in);
  }
  // 1-D operands as matrices: a (K) -> (1, K), b (K) -> (K, 1); the added dims go again below.
  const bool a_vec = a_in.rank() == 1, b_vec = b_in.rank() == 1;
  Shape as = a_in.shape(), bs = b_in.shape();
  if (a_vec) as.insert(as.begin(), 1);
  if (b_vec) bs.push_back(1);
  const std::int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
  if (bs[bs.size() - 2] != k)
    raise<ShapeError>("matmul: shapes ", to_string(a_in.shape()), " and ", to_string(b_in.shape()),
                      " do not align: contracting dims ", k, " and ", bs[bs.size() - 2], " differ");
  check_int_limit(m, n, k);
  const Shape a_batch(as.begin(), as.end() - 2), b_batch(bs.begin(), bs.end() - 2);
  const Shape batch = broadcast_shapes(a_batch, b_batch);
  Shape out_shape = batch;
  if (!a_vec) out_shape.push_back(m);
  if (!b_vec) out_shape.push_back(n);
  Tensor<T> out(out_shape);
  const T* pa = a_in.data();
  const T* pb = b_in.data();
  T* pc = out.data();
  const std::int64_t nb = num_elements(batch);
  if (b_batch.empty() && a_batch == batch) {  // one product of all of A's rows with B
    product(nb * m, n, k, pa, pb, pc);
    return out;
  }
  // Per batch: the broadcast offsets (in matrices) of A and B.
  const std::array<Shape, 2> st{detail::broadcast_strides(a_batch, batch), detail::broadcast_strides(b_batch, batch)};
  detail::broadcast_rows<2>(batch, st, [&](std::int64_t o, auto off, auto step, std::int64_t len) {
    for (std::int64_t j = 0; j < len; ++j)
      product(m, n, k, pa + (off[0] + j * step[0]) * m * k, pb + (off[1] + j * step[1]) * k * n, pc + (o + j) * m * n);
  });
  return out;
}

template <Dtype T>
Tensor<T> dot(const Tensor<T>& a, const Tensor<T>& b) {
  if (a.rank() == 0 || b.rank() == 0) return binary(a, b, BinaryOp::kMul);
  if (b.rank() <= 2) return matmul(a, b);  // numpy's dot and matmul agree here
  // b N-D (a composition of primitives, differentiated through them): contract a's last dim with b's second-to-last; result a.shape[:-1] + b.shape[:-2] + b.shape[-1:].
  const std::int64_t k = a.shape().back();
  if (b.shape()[b.rank() - 2] != k)
    raise<ShapeError>("dot: shapes ", to_string(a.shape()), " and ", to_string(b.shape()), " do not align");
  Tensor<T> b2 = reshape(moveaxis(b, -2, 0), Shape{k, -1});
  Tensor<T> c = matmul(reshape(a, Shape{-1, k}), b2);
  Shape out(a.shape().begin(), a.shape().end() - 1);
  out.insert(out.end(), b.shape().begin(), b.shape().end() - 2);
  out.push_back(b.shape().back());
  return reshape(std::move(c), out);
}

namespace detail {

template <Dtype T>
Tensor<T> matmul_t(const Tensor<T>& a, bool ta, const Tensor<T>& b, bool tb, T* into) {
  if (a.rank() != 2 || b.rank() != 2) raise<ShapeError>("matmul_t: 2-D operands only");
  const std::int64_t m = ta ? a.shape()[1] : a.shape()[0], k = ta ? a.shape()[0] : a.shape()[1];
  const std::int64_t kb = tb ? b.shape()[1] : b.shape()[0], n = tb ? b.shape()[0] : b.shape()[1];
  if (k != kb)
    raise<ShapeError>("matmul_t: contracting dims differ (", k, " and ", kb, ") for shapes ", to_string(a.shape()),
                      " and ", to_string(b.shape()));
  if constexpr (FloatDtype<T>) {
    Tensor<T> c = into ? Tensor<T>::borrow(into, Shape{m, n}) : Tensor<T>(Shape{m, n});
    if (m == 0 || n == 0) return c;
    if (k == 0) {
      std::fill(c.begin(), c.end(), T(0));
      return c;
    }
    gemm(ta, tb, m, n, k, a.data(), a.shape()[1], b.data(), b.shape()[1], c.data(), n);
    return c;
  } else {
    Tensor<T> c = matmul(ta ? transpose(a) : a, tb ? transpose(b) : b);
    if (!into || c.size() == 0) return c;
    std::copy(c.begin(), c.end(), into);
    return Tensor<T>::borrow(into, c.shape());
  }
}

}  // namespace detail

#define SHARD_INSTANTIATE_LINALG(T)                                        \
  template Tensor<T> detail::matmul_kernel<T>(const Tensor<T>&, const Tensor<T>&); \
  template Tensor<T> dot<T>(const Tensor<T>&, const Tensor<T>&);           \
  template Tensor<T> detail::vdot_kernel<T>(const Tensor<T>&, const Tensor<T>&);  \
  template Tensor<T> detail::matmul_t<T>(const Tensor<T>&, bool, const Tensor<T>&, bool, T*);
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_LINALG)
#undef SHARD_INSTANTIATE_LINALG

}  // namespace shard
