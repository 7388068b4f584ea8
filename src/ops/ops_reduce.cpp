// argmax and argmin on ShardedArrays (the reductions and prefix sums are primitives of the op
// table, ops/reduce.hpp): the extreme value of each line over all devices, then the smallest
// global index where a line reaches it, two collectives.

#include <cmath>
#include <limits>

#include "ops/ops_internal.hpp"
#include "shard/ops/reduce.hpp"
#include "shard/core/trace.hpp"
#include "shard/error.hpp"
#include "core/tensor_kernels.hpp"

namespace shard {

namespace {

/// The sharding of a reduction's result: the kept dims' entries (None for reduced dims kept
/// with keepdims).
NamedSharding reduced_sharding(const NamedSharding& s, int rank, const std::vector<int>& dims, bool keepdims) {
  std::vector<SpecEntry> entries;
  for (int d = 0; d < rank; ++d) {
    const bool r = std::find(dims.begin(), dims.end(), d) != dims.end();
    if (!r) entries.push_back(s.spec()[d]);
    else if (keepdims) entries.emplace_back();
  }
  return NamedSharding(s.mesh(), PartitionSpec(std::move(entries)));
}

Shape reduced_shape(const Shape& shape, const std::vector<int>& dims, bool keepdims) {
  Shape out;
  for (int d = 0; d < static_cast<int>(shape.size()); ++d) {
    const bool r = std::find(dims.begin(), dims.end(), d) != dims.end();
    if (!r) out.push_back(shape[d]);
    else if (keepdims) out.push_back(1);
  }
  return out;
}

/// The reduction across devices that combines per-device partial results of `k`: a mean's
/// partial sums are summed (the division by the count follows), the others combine as themselves.
ReduceKind reduce_op(ReduceKind k) { return k == ReduceKind::kMean ? ReduceKind::kSum : k; }

}  // namespace

namespace {

/// x is the line's extreme m (a nan extreme is reached by the first nan: numpy's argmax).
template <typename T>
bool reaches(T x, T m) {
  if constexpr (is_floating_v<T>) {
    using std::isnan;
    if (isnan(m)) return isnan(x);
  }
  return x == m;
}

template <typename T>
ShardedArray<std::int64_t> arg_reduce(const ShardedArray<T>& a, int axis, bool keepdims, bool want_max) {
  const char* what = want_max ? "argmax" : "argmin";
  const int rank = a.ndim();
  const int d = resolve_dim(axis, rank, what);
  if (a.shape()[d] == 0)
    raise<ValueError>(what, " of a ", to_string(a.shape()), " array along dim ", d, ", which is empty");
  const std::vector<int> dims{d};
  const Shape out_shape = reduced_shape(a.shape(), dims, true);
  const NamedSharding out = reduced_sharding(a.sharding(), rank, dims, true);
  const SpecEntry axes = detail::axes_of_dims(a.sharding(), dims);
  // 1. The extreme value of each line along d, over all devices.
  std::vector<Tensor<T>> partial;
  const ReduceKind kind = want_max ? ReduceKind::kMax : ReduceKind::kMin;
  for (const auto& s : a.addressable_shards()) partial.push_back(detail::reduce_or_identity(s.data, kind, dims, true));
  const ShardedArray<T> best = detail::combine_over(std::move(partial), axes, reduce_op(kind), out, out_shape);
  // 2. The smallest global index along d where a line reaches it.
  constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::max();
  std::vector<Tensor<std::int64_t>> index;
  for (std::size_t i = 0; i < a.addressable_shards().size(); ++i) {
    const auto& s = a.addressable_shards()[i];
    const Tensor<T>& m = best.addressable_shards()[i].data;
    Tensor<std::int64_t> idx(m.shape(), kNone);
    const auto v = detail::three_dims(s.data.shape(), d, d + 1);
    for (std::int64_t o = 0; o < v.outer; ++o)
      for (std::int64_t j = 0; j < v.n; ++j)
        for (std::int64_t k = 0; k < v.inner; ++k) {
          const std::int64_t r = o * v.inner + k;
          if (idx.flat(r) == kNone && reaches(s.data.flat((o * v.n + j) * v.inner + k), m.flat(r)))
            idx.flat(r) = s.box.offset[d] + j;
        }
    index.push_back(std::move(idx));
  }
  ShardedArray<std::int64_t> r = detail::combine_over(std::move(index), axes, ReduceKind::kMin, out, out_shape);
  return keepdims ? r : squeeze(r, Dims{d});
}

}  // namespace

template <Dtype T>
ShardedArray<std::int64_t> prim::ArgReduce<T>::sharded(const ShardedArray<T>& a) const {
  return arg_reduce(a, axis, keepdims, want_max);
}

namespace {
constexpr shard::source_location kLibrary{};
}  // namespace

template <Dtype T>
Tensor<std::int64_t> argmax(const Tensor<T>& x, int axis, bool keepdims) {
  return detail::bind_at(prim::ArgReduce<T>{{}, axis, keepdims, true}, kLibrary, x);
}
template <Dtype T>
Tensor<std::int64_t> argmin(const Tensor<T>& x, int axis, bool keepdims) {
  return detail::bind_at(prim::ArgReduce<T>{{}, axis, keepdims, false}, kLibrary, x);
}
template <Dtype T>
Tensor<std::int64_t> argmax(const Tensor<T>& x) {
  return argmax(reshape(x, Shape{-1}), 0);
}
template <Dtype T>
Tensor<std::int64_t> argmin(const Tensor<T>& x) {
  return argmin(reshape(x, Shape{-1}), 0);
}
template <Dtype T>
ShardedArray<std::int64_t> argmax(const ShardedArray<T>& a, int axis, bool keepdims) {
  return detail::bind_at(prim::ArgReduce<T>{{}, axis, keepdims, true}, kLibrary, a);
}
template <Dtype T>
ShardedArray<std::int64_t> argmin(const ShardedArray<T>& a, int axis, bool keepdims) {
  return detail::bind_at(prim::ArgReduce<T>{{}, axis, keepdims, false}, kLibrary, a);
}

#define SHARD_INSTANTIATE_REDUCE(T)                                                                  \
  template ShardedArray<std::int64_t> argmax<T>(const ShardedArray<T>&, int, bool); \
  template ShardedArray<std::int64_t> argmin<T>(const ShardedArray<T>&, int, bool); \
  template Tensor<std::int64_t> argmax<T>(const Tensor<T>&, int, bool);             \
  template Tensor<std::int64_t> argmin<T>(const Tensor<T>&, int, bool);             \
  template Tensor<std::int64_t> argmax<T>(const Tensor<T>&);                        \
  template Tensor<std::int64_t> argmin<T>(const Tensor<T>&);
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_REDUCE)
#undef SHARD_INSTANTIATE_REDUCE

}  // namespace shard
