#include "shard/core/blas.hpp"

#include <cblas.h>

#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "core/gemm.hpp"
#include "core/onednn_products.hpp"
#include "shard/core/detail/int_wrap.hpp"
#include "shard/core/dtype.hpp"
#include "shard/core/time_split.hpp"

namespace shard {

std::string blas_core_name() { return openblas_get_corename(); }
std::string blas_config() { return openblas_get_config(); }
int blas_threads() { return openblas_get_num_threads(); }
void set_blas_threads(int threads) { openblas_set_num_threads(threads); }

std::string blas_summary() {
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  const int t = blas_threads();
  return "OpenBLAS core " + blas_core_name() + ", " + std::to_string(t) + (t == 1 ? " thread" : " threads") +
         " (OPENBLAS_CORETYPE=" + (env && *env ? env : "unset: auto-detected") + ")";
}

std::string bf16_products_path() { return detail::bf16_products_path(); }

template <typename T>
void gemm_acc(std::int64_t m, std::int64_t n, std::int64_t k, const T* a, std::int64_t lda, const T* b,
              std::int64_t ldb, T* c, std::int64_t ldc) {
  if (m == 0 || n == 0 || k == 0) return;
  const detail::ScopedTime timed(detail::TimeKind::kProducts);
  if constexpr (std::is_same_v<T, double>) {
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.0, a, static_cast<int>(lda), b, static_cast<int>(ldb), 1.0, c,
                static_cast<int>(ldc));
  } else if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.0f, a, static_cast<int>(lda), b, static_cast<int>(ldb), 1.0f, c,
                static_cast<int>(ldc));
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    detail::bf16_gemm(m, n, k, a, false, lda, b, false, ldb, c, ldc, /*accumulate=*/true);
  } else {
    for (std::int64_t r = 0; r < m; ++r)
      for (std::int64_t q = 0; q < k; ++q) {
        const T v = a[r * lda + q];
        for (std::int64_t col = 0; col < n; ++col)
          c[r * ldc + col] = detail::add_wrap(c[r * ldc + col], detail::mul_wrap(v, b[q * ldb + col]));
      }
  }
}

namespace detail {

template <FloatDtype T>
void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const T* a, std::int64_t lda,
          const T* b, std::int64_t ldb, T* c, std::int64_t ldc, bool accumulate) {
  if (m <= 0 || n <= 0) return;
  const ScopedTime timed(TimeKind::kProducts);
  if (k <= 0) {
    if (!accumulate)
      for (std::int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, T(0));
    return;
  }
  if constexpr (std::is_same_v<T, bfloat16>) {
    bf16_gemm(m, n, k, a, ta, lda, b, tb, ldb, c, ldc, accumulate);
  } else {
    const auto tra = ta ? CblasTrans : CblasNoTrans, trb = tb ? CblasTrans : CblasNoTrans;
    const auto M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(k);
    const T beta = accumulate ? T(1) : T(0);
    if constexpr (std::is_same_v<T, double>)
      cblas_dgemm(CblasRowMajor, tra, trb, M, N, K, 1.0, a, static_cast<int>(lda), b, static_cast<int>(ldb),
                  beta, c, static_cast<int>(ldc));
    else
      cblas_sgemm(CblasRowMajor, tra, trb, M, N, K, 1.0f, a, static_cast<int>(lda), b, static_cast<int>(ldb),
                  beta, c, static_cast<int>(ldc));
  }
}

#define SHARD_INSTANTIATE_GEMM(T)                                                                     \
  template void gemm<T>(bool, bool, std::int64_t, std::int64_t, std::int64_t, const T*, std::int64_t, \
                        const T*, std::int64_t, T*, std::int64_t, bool);
SHARD_FOR_EACH_FLOAT_DTYPE(SHARD_INSTANTIATE_GEMM)
#undef SHARD_INSTANTIATE_GEMM

}  // namespace detail

#define SHARD_INSTANTIATE_GEMM_ACC(T)                                                                   \
  template void gemm_acc<T>(std::int64_t, std::int64_t, std::int64_t, const T*, std::int64_t, const T*, \
                            std::int64_t, T*, std::int64_t);
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_GEMM_ACC)
#undef SHARD_INSTANTIATE_GEMM_ACC

}  // namespace shard
