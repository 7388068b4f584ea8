// The sharding helpers the hand-planned ShardedArray ops share (matching_sharding,
// axes_of_dims) and the bridges from a Tensor to a ShardedArray (uncommitted arrays, scalars).
// The elementwise ops are primitives of the op table (ops/elementwise.hpp).

#include <algorithm>
#include <optional>

#include "ops/ops_internal.hpp"
#include "shard/core/trace.hpp"
#include "shard/error.hpp"

namespace shard {

namespace detail {

NamedSharding matching_sharding(const NamedSharding& out, const Shape& out_shape, const Shape& shape) {
  const std::size_t lead = out_shape.size() - shape.size();
  if (lead == 0 && shape == out_shape) return out;
  std::vector<SpecEntry> entries;
  for (std::size_t k = 0; k < shape.size(); ++k) {
    const bool broadcast = shape[k] != out_shape[k + lead];
    entries.push_back(broadcast ? SpecEntry() : out.spec()[static_cast<int>(k + lead)]);
  }
  return NamedSharding(out.mesh(), PartitionSpec(std::move(entries)));
}

SpecEntry axes_of_dims(const NamedSharding& s, const std::vector<int>& dims) {
  std::vector<std::string> names;
  for (const auto& n : s.mesh().axis_names())
    for (int d : dims)
      for (const auto& a : s.spec()[d].axes())
        if (a == n) names.push_back(n);
  return SpecEntry(names);
}

namespace {

/// A replicated uncommitted array on `mesh` whose devices' shards all view `first`'s memory.
template <Dtype T>
ShardedArray<T> replicated_view(Tensor<T> first, const Mesh& mesh) {
  std::vector<Shard<T>> shards;
  for (int d : mesh.local_device_ids()) {
    Tensor<T> data = shards.empty()
                         ? std::move(first)
                         : Tensor<T>::borrow(shards.front().data.data(), shards.front().data.shape());
    shards.push_back(Shard<T>{d, full_box(data.shape()), std::move(data)});
  }
  const Shape shape = shards.empty() ? first.shape() : shards.front().data.shape();
  return ShardedArray<T>(shape, NamedSharding(mesh, PartitionSpec()), std::move(shards), false);
}

/// A Tensor lifted to a replicated uncommitted array: a primitive that moves its operand across
/// the views. Its cotangent is the array's, which every rank holds. `own`: the result keeps x's
/// memory alive (x is a temporary), else it views it.
struct Uncommitted : Primitive {
  Mesh mesh;  ///< by value: jit keeps the primitive past its operands' lifetime
  bool own;
  const char* name() const { return "uncommitted"; }
  template <Dtype T>
  ShardedArray<T> across(const Tensor<T>& x) const {
    Tensor<T> first = own ? x.alias() : Tensor<T>::borrow(const_cast<T*>(x.data()), x.shape());
    first.set_ad(nullptr);
    return replicated_view(std::move(first), mesh);
  }
  template <Dtype T>
  KernelVjp<ShardedArray<T>, Tensor<T>> vjp(const VjpNeed&, const ShardedArray<T>&,
                                            const Tensor<T>& x) const {
    return [shape = x.shape()](const ShardedArray<T>& ct, const VjpNeed&) {
      const auto& shards = ct.addressable_shards();
      return cotangents<Tensor<T>>(shards.empty() ? Tensor<T>(shape, T(0)) : shards.front().data.alias());
    };
  }
  /// Batching: the physical tensor lifted (its memory shared), the batch dim where it was.
  template <Dtype T>
  BatchOut<ShardedArray<T>> batch(const shard::source_location& where, std::int64_t,
                                  const BatchArg<Tensor<T>>& a) const {
    return {bind_at(Uncommitted{{}, mesh, true}, where, a.x), a.bdim};
  }
};

}  // namespace

template <Dtype T>
ShardedArray<T> uncommitted(const Tensor<T>& x, const Mesh& mesh) {
  return bind(Uncommitted{{}, mesh, false}, x);
}

template <Dtype T>
ShardedArray<T> uncommitted(Tensor<T>&& x, const Mesh& mesh) {
  if (traced(x)) return bind(Uncommitted{{}, mesh, true}, x);  // the record needs x: share its memory
  return replicated_view(std::move(x), mesh);
}

template <Dtype T>
ShardedArray<T> scalar_on(T v, const Mesh& mesh) {
  std::vector<Shard<T>> shards;
  for (int d : mesh.local_device_ids()) shards.push_back(Shard<T>{d, Box{}, Tensor<T>(Shape{}, v)});
  return ShardedArray<T>(Shape{}, NamedSharding(mesh, PartitionSpec()), std::move(shards), false);
}

}  // namespace detail

#define SHARD_INSTANTIATE_OPS(T)                                                  \
  template ShardedArray<T> detail::uncommitted<T>(const Tensor<T>&, const Mesh&); \
  template ShardedArray<T> detail::uncommitted<T>(Tensor<T>&&, const Mesh&);      \
  template ShardedArray<T> detail::scalar_on<T>(T, const Mesh&);
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_OPS)
#undef SHARD_INSTANTIATE_OPS

}  // namespace shard
