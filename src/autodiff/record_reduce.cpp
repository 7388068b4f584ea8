// The recorders of the reductions, scans and products (declared in core/trace.hpp, the rules
// in autodiff/detail/vjp_rules.hpp), for every dtype and both views.

#include "shard/autodiff/detail/vjp_rules.hpp"

namespace shard::detail {

#define SHARD_RECORD_REDUCE(V, T)                                                 \
  template V<T> record_matmul<V<T>>(Tape&, const V<T>&, const V<T>&, const char*, \
                                    const std::function<V<T>()>&);                \
  template V<T> record_vdot<V<T>>(Tape&, const V<T>&, const V<T>&);
#define SHARD_RECORD_REDUCE_BOTH(T) \
  SHARD_RECORD_REDUCE(Tensor, T)    \
  SHARD_RECORD_REDUCE(ShardedArray, T)
SHARD_FOR_EACH_DTYPE(SHARD_RECORD_REDUCE_BOTH)
#undef SHARD_RECORD_REDUCE_BOTH
#undef SHARD_RECORD_REDUCE

}  // namespace shard::detail
