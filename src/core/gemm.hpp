#pragma once
// The one local product every floating kernel calls (private to the library: no BLAS or oneDNN
// header reaches a user's program).

#include <cstdint>

#include "shard/core/dtype.hpp"

namespace shard::detail {

/// c[m x n] = op(a)[m x k] @ op(b)[k x n] (+ c when `accumulate`) on row-major buffers with
/// leading dims lda, ldb, ldc; op(x) is x transposed when its flag is set (then x is stored
/// k x m, resp. n x k). float32 and float64 run OpenBLAS's sgemm / dgemm; bfloat16 runs
/// bf16_gemm (onednn_products.hpp: oneDNN's matmul, float32 accumulation, rounded once, or the
/// widen + sgemm path). k == 0 gives zeros (or leaves c when accumulating).
template <FloatDtype T>
void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const T* a, std::int64_t lda,
          const T* b, std::int64_t ldb, T* c, std::int64_t ldc, bool accumulate = false);

}  // namespace shard::detail
