#pragma once
/// \file Shape ops written once for both views: each is composed of the primitives of its
/// operand's view (transpose, expand_dims, astype, ...: tensor_ops.hpp for `Tensor`, ops.hpp for
/// `ShardedArray`), found by argument-dependent lookup, so it has the same semantics, errors and
/// communication (its primitives') in both.
///
/// The ops are templates over View<T> (Tensor<T> or ShardedArray<T>, the ArrayLike concept)
/// rather than over ArrayLike X, so that a call naming the dtype, `moveaxis<float>(x, 0, -1)`,
/// compiles as it did when each view declared its own.

#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "shard/core/array_ops.hpp"
#include "shard/core/index.hpp"

namespace shard {

/// numpy's arange(stop) as a Tensor (defined in tensor_ops.hpp): one_hot's classes.
template <Dtype T>
Tensor<T> arange(T stop);

/// numpy's swapaxes: dims a and b exchanged (negative dims count from the end). A transpose:
/// on a ShardedArray the spec entries move with their dims and no data moves.
template <Dtype T, template <typename> class View>
View<T> swapaxes(const View<T>& x, int a, int b) requires ArrayLike<View<T>> {
  std::vector<int> perm(static_cast<std::size_t>(x.ndim()));
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[resolve_dim(a, x.ndim(), "swapaxes")], perm[resolve_dim(b, x.ndim(), "swapaxes")]);
  return transpose(x, perm);
}

/// numpy's moveaxis: dim `source` moved to position `destination`, the others keeping their
/// order. A transpose, as swapaxes.
template <Dtype T, template <typename> class View>
View<T> moveaxis(const View<T>& x, int source, int destination) requires ArrayLike<View<T>> {
  const int s = resolve_dim(source, x.ndim(), "moveaxis"), d = resolve_dim(destination, x.ndim(), "moveaxis");
  std::vector<int> perm;
  for (int k = 0; k < x.ndim(); ++k)
    if (k != s) perm.push_back(k);
  perm.insert(perm.begin() + d, s);
  return transpose(x, perm);
}

/// jax.nn.one_hot: labels.shape + (n,) of dtype U, 1 where the last index equals the label
/// (a label outside [0, n) gives a row of zeros). On ShardedArrays the result is sharded like
/// the labels (None on the new dim).
template <Dtype U = float, Dtype I, template <typename> class View>
View<U> one_hot(const View<I>& labels, std::int64_t n) requires ArrayLike<View<I>> {
  return astype<U>(equal(expand_dims(labels, -1), arange<I>(static_cast<I>(n))));
}

}  // namespace shard
