#pragma once
/// \file What an autodiff node remembers of a ShardedArray primal (core/trace.hpp has the
/// Tensor one): its shape and sharding, the sharding its cotangent takes, as in JAX.

#include <utility>

#include "shard/array/sharded_array.hpp"
#include "shard/core/trace.hpp"

namespace shard::detail {

template <Dtype T>
struct NodeMeta<ShardedArray<T>> {
  explicit NodeMeta(const ShardedArray<T>& x) : shape(x.shape()), sharding(x.sharding()) {}
  NodeMeta(Shape s, NamedSharding sh) : shape(std::move(s)), sharding(std::move(sh)) {}
  Shape shape;
  NamedSharding sharding;
};

}  // namespace shard::detail
