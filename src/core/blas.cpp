#include "shard/core/blas.hpp"

#include <cblas.h>

#include <cstdlib>
#include <type_traits>

#include "shard/core/dtype.hpp"

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

template <typename T>
void gemm_acc(std::int64_t m, std::int64_t n, std::int64_t k, const T* a, std::int64_t lda, const T* b,
              std::int64_t ldb, T* c, std::int64_t ldc) {
  if (m == 0 || n == 0 || k == 0) return;
  if constexpr (std::is_same_v<T, double>) {
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.0, a, static_cast<int>(lda), b, static_cast<int>(ldb), 1.0, c,
                static_cast<int>(ldc));
  } else if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.0f, a, static_cast<int>(lda), b, static_cast<int>(ldb), 1.0f, c,
                static_cast<int>(ldc));
  } else {
    for (std::int64_t r = 0; r < m; ++r)
      for (std::int64_t q = 0; q < k; ++q) {
        const T v = a[r * lda + q];
        for (std::int64_t col = 0; col < n; ++col) c[r * ldc + col] += v * b[q * ldb + col];
      }
  }
}

#define SHARD_INSTANTIATE_GEMM_ACC(T)                                                                   \
  template void gemm_acc<T>(std::int64_t, std::int64_t, std::int64_t, const T*, std::int64_t, const T*, \
                            std::int64_t, T*, std::int64_t);
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_GEMM_ACC)
#undef SHARD_INSTANTIATE_GEMM_ACC

}  // namespace shard
