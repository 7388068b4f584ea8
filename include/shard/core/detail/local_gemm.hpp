#pragma once
/// \file The local block product every distributed matmul uses (linalg internals): the public
/// shard::gemm_acc (blas.hpp).

#include "shard/core/blas.hpp"

namespace shard::detail {

using shard::gemm_acc;

}  // namespace shard::detail
