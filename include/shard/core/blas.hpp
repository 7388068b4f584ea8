#pragma once
/// \file What the BLAS under Shard is (benchmarks print it next to every timing), and the
/// local block product every distributed matmul uses, for baselines and local code.

#include <cstdint>
#include <string>

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

/// Which path bfloat16 products run (the apps and benchmarks print it): "oneDNN matmul (bf16
/// inputs, float32 accumulation)" where oneDNN has a bf16 matmul on this CPU (AVX-512 cores;
/// avx512_bf16 or AMX run it natively), else "bf16 -> float32 + OpenBLAS sgemm" (the same
/// results, slower), which SHARD_BF16_PRODUCTS=convert forces.
std::string bf16_products_path();

/// c[m x n] += a[m x k] @ b[k x n] on row-major buffers with leading dims lda, ldb, ldc:
/// OpenBLAS (cblas_sgemm / cblas_dgemm) for float and double, bf16_products_path() for
/// bfloat16 (float32 accumulation, rounded once per call), a plain loop for the integer
/// types. Local: no communication. What Shard's matmuls run on each block. Defined in the
/// library (src/core/blas.cpp): no BLAS header reaches a user's program (OpenBLAS's declares a
/// global `bfloat16`).
template <typename T>
void gemm_acc(std::int64_t m, std::int64_t n, std::int64_t k, const T* a, std::int64_t lda, const T* b,
              std::int64_t ldb, T* c, std::int64_t ldc);

}  // namespace shard
