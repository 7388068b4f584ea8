// ShardedArray's member functions that are ops (x[i], x[{...}]: ops.hpp defines them with slice),
// instantiated here for every dtype: the array layer's explicit instantiation of the class
// (sharded_array.cpp) cannot see them. (x.sum(), x.reshape(s), ... are detail::ArrayMethods',
// inline templates of core/array_methods.hpp, instantiated where they are called.)

#include "shard/ops/ops.hpp"

namespace shard {

#define SHARD_INSTANTIATE_MEMBERS(T)                                        \
  template ShardedArray<T> ShardedArray<T>::operator[](std::int64_t) const; \
  template ShardedArray<T> ShardedArray<T>::operator[](std::initializer_list<Index>) const;
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_MEMBERS)
#undef SHARD_INSTANTIATE_MEMBERS

}  // namespace shard
