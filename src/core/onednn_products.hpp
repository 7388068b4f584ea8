#pragma once
// bfloat16 block products on oneDNN (private to the library: no oneDNN header reaches a user).

#include <cstdint>

#include "shard/core/bfloat16.hpp"

namespace shard::detail {

/// c[m x n] (= or += when accumulate) op(a)[m x k] @ op(b)[k x n] on row-major buffers with
/// leading dims lda, ldb, ldc; op(x) is x transposed when its flag is set (then x is stored
/// k x m, resp. n x k). bfloat16 inputs, float32 accumulation, float32 or bfloat16 output
/// (rounded once). Local; thread-safe (a primitive cache per thread).
/// Where oneDNN has no bf16 matmul on this CPU (it needs AVX-512), or SHARD_BF16_PRODUCTS=convert,
/// the same product widens the operands to float32 and runs OpenBLAS's sgemm.
void bf16_gemm(std::int64_t m, std::int64_t n, std::int64_t k, const bfloat16* a, bool ta, std::int64_t lda,
               const bfloat16* b, bool tb, std::int64_t ldb, float* c, std::int64_t ldc, bool accumulate);
void bf16_gemm(std::int64_t m, std::int64_t n, std::int64_t k, const bfloat16* a, bool ta, std::int64_t lda,
               const bfloat16* b, bool tb, std::int64_t ldb, bfloat16* c, std::int64_t ldc, bool accumulate);

/// Which path bf16_gemm runs ("oneDNN matmul ..." or "bf16 -> float32 + OpenBLAS sgemm"): the
/// apps print it.
const char* bf16_products_path();

}  // namespace shard::detail
