// The recorder of the products not yet on the op driver (matmul, dot; declared in
// core/trace.hpp, the rule in autodiff/detail/vjp_rules.hpp), for every dtype and both views.

#include "shard/autodiff/detail/vjp_rules.hpp"

namespace shard::detail {

#define SHARD_RECORD_MATMUL(V, T)                                                 \
  template V<T> record_matmul<V<T>>(Tape&, const V<T>&, const V<T>&, const char*, \
                                    const std::function<V<T>()>&);
#define SHARD_RECORD_MATMUL_BOTH(T) \
  SHARD_RECORD_MATMUL(Tensor, T)    \
  SHARD_RECORD_MATMUL(ShardedArray, T)
SHARD_FOR_EACH_DTYPE(SHARD_RECORD_MATMUL_BOTH)
#undef SHARD_RECORD_MATMUL_BOTH
#undef SHARD_RECORD_MATMUL

}  // namespace shard::detail
