#include "shard/core/blas.hpp"

#include <cblas.h>

#include <cstdlib>

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

}  // namespace shard
