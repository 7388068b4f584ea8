// The recorders of the shape and indexing ops (declared in core/trace.hpp, the rules in
// autodiff/detail/vjp_rules.hpp), for every dtype and both views.

#include "shard/autodiff/detail/vjp_rules.hpp"

namespace shard::detail {

#define SHARD_RECORD_SHAPE(V, T)                                                                          \
  template V<T> record_reshape_like<V<T>>(Tape&, const V<T>&, const char*, const std::function<V<T>()>&); \
  template V<T> record_transpose<V<T>>(Tape&, const V<T>&, std::vector<int>);                             \
  template V<T> record_slice<V<T>>(Tape&, const V<T>&, const std::vector<Index>&);                        \
  template V<T> record_concatenate<V<T>>(Tape&, const std::vector<V<T>>&, int);
#define SHARD_RECORD_SHAPE_BOTH(T) \
  SHARD_RECORD_SHAPE(Tensor, T)    \
  SHARD_RECORD_SHAPE(ShardedArray, T)
SHARD_FOR_EACH_DTYPE(SHARD_RECORD_SHAPE_BOTH)
#undef SHARD_RECORD_SHAPE_BOTH
#undef SHARD_RECORD_SHAPE

// Tensor only: the sharded stack is expand_dims and concatenate (ops_shape.cpp); broadcast_to is a
// Tensor op.
#define SHARD_RECORD_TENSOR_SHAPE(T)                                                        \
  template Tensor<T> record_broadcast_to<Tensor<T>>(Tape&, const Tensor<T>&, const Shape&); \
  template Tensor<T> record_stack<Tensor<T>>(Tape&, const std::vector<Tensor<T>>&, int);
SHARD_FOR_EACH_DTYPE(SHARD_RECORD_TENSOR_SHAPE)
#undef SHARD_RECORD_TENSOR_SHAPE

#define SHARD_RECORD_TAKE(T, I)                                                                         \
  template Tensor<T> record_take<Tensor<T>, Tensor<I>>(Tape&, const Tensor<T>&, const Tensor<I>&, int,  \
                                                       bool);                                           \
  template ShardedArray<T> record_take<ShardedArray<T>, ShardedArray<I>>(Tape&, const ShardedArray<T>&, \
                                                                         const ShardedArray<I>&, int, bool);
SHARD_FOR_EACH_DTYPE_PAIR(ALL, INT, SHARD_RECORD_TAKE)
#undef SHARD_RECORD_TAKE

}  // namespace shard::detail
