#pragma once
/// \file What the BLAS under Shard is (benchmarks print it next to every timing), and the
/// local block product every distributed matmul uses, for baselines and local code.

#include <cblas.h>

#include <cstdint>
#include <string>
#include <type_traits>

namespace shard {

/// The OpenBLAS kernel in use ("Haswell", "SkylakeX", ...), as OpenBLAS reports it.
std::string blas_core_name();
/// OpenBLAS's build configuration string.
std::string blas_config();
/// Threads OpenBLAS uses for one call.
int blas_threads();
/// Sets them (openblas_set_num_threads). The Runtime sets 1 when a rank has several devices,
/// whose threads call OpenBLAS concurrently.
void set_blas_threads(int threads);
/// "OpenBLAS core Haswell, 1 thread (OPENBLAS_CORETYPE=Haswell)".
std::string blas_summary();

/// c[m x n] += a[m x k] @ b[k x n] on row-major buffers with leading dims lda, ldb, ldc:
/// OpenBLAS (cblas_sgemm / cblas_dgemm) for float and double, a plain loop for integer types.
/// Local: no communication. What Shard's matmuls run on each block.
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

}  // namespace shard
