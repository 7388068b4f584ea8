#pragma once
/// \file Printing arrays as numpy prints them (`print(x)`): numpy's str() format with its
/// default options (precision 8, shortest round-trip digits, decimal points aligned, lines
/// of at most 75 characters, arrays of more than 1000 elements summarised to their first and
/// last 3 items per dim with "..."). 0-d arrays print like numpy scalars ("1.0", "7", "True").

#include <iosfwd>
#include <source_location>
#include <string>

#include "shard/error.hpp"  // shard::source_location
#include "shard/array/sharded_array.hpp"
#include "shard/core/tensor.hpp"

namespace shard {

/// Print options (numpy's np.set_printoptions subset). to_string and print raise ValueError naming
/// a field out of range: precision 0-100, threshold >= 0, edgeitems >= 0, linewidth >= 1.
struct PrintOptions {
  int precision = 8;        ///< at most this many digits after the decimal point
  std::int64_t threshold = 1000;  ///< summarise arrays with more elements
  int edgeitems = 3;        ///< items kept at each end of a summarised dim
  int linewidth = 75;       ///< characters per line
};

/// Local: numpy's str() of the tensor.
template <Dtype T>
std::string to_string(const Tensor<T>& x, const PrintOptions& options = {});

/// Collective over all ranks: numpy's str() of the global array, built on rank 0 from only
/// the elements it shows (a summarised array sends at most (2 * edgeitems)^ndim elements);
/// the other ranks get an empty string.
template <Dtype T>
std::string to_string(const ShardedArray<T>& x, const PrintOptions& options = {});

/// Local: writes to_string(x).
template <Dtype T>
std::ostream& operator<<(std::ostream& os, const Tensor<T>& x) {
  return os << to_string(x);
}
/// Collective over all ranks (call it on every rank): rank 0 writes to_string(x), the
/// others write nothing.
template <Dtype T>
std::ostream& operator<<(std::ostream& os, const ShardedArray<T>& x) {
  return os << to_string(x);
}

/// Like Python's print(x) in the seeds: writes to_string(x) and a newline to stdout on rank 0
/// (collective over all ranks for a ShardedArray; call it on every rank).
template <Dtype T>
void print(const ShardedArray<T>& x, const PrintOptions& options = {},
           shard::source_location where = shard::source_location::current());
template <Dtype T>
void print(const Tensor<T>& x, const PrintOptions& options = {});

}  // namespace shard
