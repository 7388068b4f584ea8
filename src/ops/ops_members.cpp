// ShardedArray's member functions that are ops (x.sum(), x.reshape(s), x[i], ...: ops.hpp defines
// them with the ops), instantiated here for every dtype: the array layer's explicit
// instantiation of the class (sharded_array.cpp) cannot see them.

#include "shard/ops/ops.hpp"

namespace shard {

#define SHARD_INSTANTIATE_MEMBERS(T)                                                   \
  template ShardedArray<sum_t<T>> ShardedArray<T>::sum(const Dims&, bool) const;       \
  template ShardedArray<float_of_t<T>> ShardedArray<T>::mean(const Dims&, bool) const; \
  template ShardedArray<T> ShardedArray<T>::max(const Dims&, bool) const;              \
  template ShardedArray<T> ShardedArray<T>::min(const Dims&, bool) const;              \
  template ShardedArray<T> ShardedArray<T>::reshape(Shape) const;                      \
  template ShardedArray<T> ShardedArray<T>::transpose() const;                         \
  template ShardedArray<T> ShardedArray<T>::operator[](std::int64_t) const;            \
  template ShardedArray<T> ShardedArray<T>::operator[](std::initializer_list<Index>) const;
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_MEMBERS)
#undef SHARD_INSTANTIATE_MEMBERS

}  // namespace shard
