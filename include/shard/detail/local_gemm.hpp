#pragma once
/// \file The local block product every distributed matmul uses (linalg internals).

#include <cblas.h>

#include <cstdint>
#include <type_traits>

namespace shard::detail {

/// c[m x n] += a[m x k] @ b[k x n], row-major with leading dims lda, ldb, ldc. OpenBLAS for
/// float and double, a plain loop for integer types. Local only.
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

}  // namespace shard::detail
