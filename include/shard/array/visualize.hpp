#pragma once
/// \file Layout pictures like jax.debug.visualize_array_sharding.

#include <iostream>
#include <string>

#include "shard/sharding/named_sharding.hpp"
#include "shard/array/sharded_array.hpp"

namespace shard {

/// The picture of how `sharding` lays out an array of `shape` (metadata only): a
/// box-drawn grid for 0-, 1- and 2-D arrays with the device ids in each cell (replicas
/// listed together, "CPU 0,2,4,6"), and a per-dim summary plus the box of every device for
/// N-D arrays. `dtype` goes in the title line when given.
std::string format_sharding(const Shape& shape, const NamedSharding& sharding, const std::string& dtype = "");

/// Prints format_sharding of the array to `os` on rank 0 only (no communication).
template <typename T>
void visualize(const ShardedArray<T>& array, std::ostream& os = std::cout) {
  if (array.mesh().topology().process_index == 0) os << format_sharding(array.shape(), array.sharding(), array.dtype());
}

}  // namespace shard
