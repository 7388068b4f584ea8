#pragma once
/// \file What the BLAS under Shard is: benchmarks print it next to every timing.

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

}  // namespace shard
