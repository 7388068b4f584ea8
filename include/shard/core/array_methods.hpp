#pragma once
/// \file jax.Array's methods, written once for both views: Tensor<T> derives from
/// detail::ArrayMethods<Tensor, T> and ShardedArray<T> from detail::ArrayMethods<ShardedArray, T>.
/// Each method is the free function of the same name on the array (array_ops.hpp's sum, mean,
/// max and min; the view's reshape and transpose), with its semantics, errors and communication.

#include <utility>

#include "shard/core/array_ops.hpp"
#include "shard/core/box.hpp"
#include "shard/core/index.hpp"

namespace shard::detail {

// The view's reshape and transpose, found by argument-dependent lookup where a method is used
// (inside the class the methods of those names would hide them).
template <typename X>
X reshape_of(const X& x, Shape shape) {
  return reshape(x, std::move(shape));
}
template <typename X>
X transpose_of(const X& x) {
  return transpose(x);
}

/// The methods of View<T> (CRTP: View<T> derives from ArrayMethods<View, T>).
template <template <typename> class View, typename T>
class ArrayMethods {
 public:
  /// x.sum(), x.sum(1), x.sum({0, 2}, true): shard::sum(x, dims, keepdims); likewise mean,
  /// max and min.
  View<sum_t<T>> sum(const Dims& dims = {}, bool keepdims = false) const {
    return shard::sum(self(), dims, keepdims);
  }
  View<float_of_t<T>> mean(const Dims& dims = {}, bool keepdims = false) const {
    return shard::mean(self(), dims, keepdims);
  }
  View<T> max(const Dims& dims = {}, bool keepdims = false) const {
    return shard::max(self(), dims, keepdims);
  }
  View<T> min(const Dims& dims = {}, bool keepdims = false) const {
    return shard::min(self(), dims, keepdims);
  }
  /// x.reshape({2, -1}): shard::reshape(x, shape).
  View<T> reshape(Shape shape) const { return reshape_of(self(), std::move(shape)); }
  /// numpy's x.T: shard::transpose(x), the dims reversed.
  View<T> transpose() const { return transpose_of(self()); }

 private:
  const View<T>& self() const { return static_cast<const View<T>&>(*this); }
};

}  // namespace shard::detail
