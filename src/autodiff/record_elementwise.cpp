// The recorders of the elementwise ops (declared in core/trace.hpp, the rules in
// autodiff/detail/vjp_rules.hpp), for every dtype and both views.

#include "shard/autodiff/detail/vjp_rules.hpp"

namespace shard::detail {

#define SHARD_RECORD_ELEMENTWISE(V, T)                                                        \
  template V<T> record_binary<V<T>>(Tape&, const V<T>&, const V<T>&, BinaryOp);               \
  template V<T> record_binary_scalar<V<T>>(Tape&, const V<T>&, T, BinaryOp, bool);            \
  template V<T> record_unary<V<T>>(Tape&, const V<T>&, UnaryOp);                              \
  template V<T> record_where<V<T>, V<bool>>(Tape&, const V<bool>&, const V<T>&, const V<T>&); \
  template V<bool> record_compare<V<T>>(Tape&, const V<T>&, const V<T>&, CompareOp);          \
  template V<bool> record_compare_scalar<V<T>>(Tape&, const V<T>&, T, CompareOp, bool);
#define SHARD_RECORD_ELEMENTWISE_BOTH(T) \
  SHARD_RECORD_ELEMENTWISE(Tensor, T)    \
  SHARD_RECORD_ELEMENTWISE(ShardedArray, T)
SHARD_FOR_EACH_DTYPE(SHARD_RECORD_ELEMENTWISE_BOTH)
#undef SHARD_RECORD_ELEMENTWISE_BOTH
#undef SHARD_RECORD_ELEMENTWISE

#define SHARD_RECORD_AXPY(T)                                                              \
  template ShardedArray<T> record_axpy<ShardedArray<T>>(Tape&, T, const ShardedArray<T>&, \
                                                        const ShardedArray<T>&);
SHARD_FOR_EACH_NUMERIC_DTYPE(SHARD_RECORD_AXPY)
#undef SHARD_RECORD_AXPY

}  // namespace shard::detail
