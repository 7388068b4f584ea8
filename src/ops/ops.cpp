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

/// A tracked Tensor lifted to a ShardedArray: its cotangent is the (replicated) array's, which
/// every rank holds.
template <Dtype T, typename Kernel>
ShardedArray<T> record_uncommitted(Tape& tape, const Tensor<T>& x, const Mesh&, Kernel kernel) {
  Tensor<T> operand;  // x's record only: the kernel may move x's storage away
  operand.set_ad(x.ad());
  const Shape shape = x.shape();
  ShardedArray<T> out = paused(kernel);
  for (auto& s : out.addressable_shards()) s.data.set_ad(nullptr);
  KernelVjp<ShardedArray<T>, Tensor<T>> vjp = [shape](const ShardedArray<T>& ct, const VjpNeed&) {
    const auto& shards = ct.addressable_shards();
    return cotangents<Tensor<T>>(shards.empty() ? Tensor<T>(shape, T(0)) : shards.front().data.alias());
  };
  return record_vjp<ShardedArray<T>, Tensor<T>>(tape, "uncommitted", std::move(out), {&operand}, std::move(vjp));
}

template <Dtype T>
ShardedArray<T> uncommitted(const Tensor<T>& x, const Mesh& mesh) {
  if (auto* tape = recording_tape_for(x)) return record_uncommitted(*tape, x, mesh, [&] { return uncommitted(x, mesh); });
  std::vector<Shard<T>> shards;
  for (int d : mesh.local_device_ids())
    shards.push_back(Shard<T>{d, full_box(x.shape()), Tensor<T>::borrow(const_cast<T*>(x.data()), x.shape())});
  return ShardedArray<T>(x.shape(), NamedSharding(mesh, PartitionSpec()), std::move(shards), false);
}

template <Dtype T>
ShardedArray<T> uncommitted(Tensor<T>&& x, const Mesh& mesh) {
  if (auto* tape = recording_tape_for(x))
    return record_uncommitted(*tape, x, mesh, [&] {
      Tensor<T> own = std::move(x);
      own.set_ad(nullptr);
      return uncommitted(std::move(own), mesh);
    });
  std::vector<Shard<T>> shards;
  for (int d : mesh.local_device_ids()) {
    Tensor<T> data = shards.empty() ? std::move(x) : Tensor<T>::borrow(shards.front().data.data(), shards.front().data.shape());
    shards.push_back(Shard<T>{d, full_box(data.shape()), std::move(data)});
  }
  const Shape shape = shards.empty() ? x.shape() : shards.front().data.shape();
  return ShardedArray<T>(shape, NamedSharding(mesh, PartitionSpec()), std::move(shards), false);
}

template <Dtype T>
ShardedArray<T> scalar_on(T v, const Mesh& mesh) {
  std::vector<Shard<T>> shards;
  for (int d : mesh.local_device_ids()) shards.push_back(Shard<T>{d, Box{}, Tensor<T>(Shape{}, v)});
  return ShardedArray<T>(Shape{}, NamedSharding(mesh, PartitionSpec()), std::move(shards), false);
}

}  // namespace detail

#define SHARD_INSTANTIATE_OPS(T)                                                                             \
  template ShardedArray<T> detail::uncommitted<T>(const Tensor<T>&, const Mesh&);                            \
  template ShardedArray<T> detail::uncommitted<T>(Tensor<T>&&, const Mesh&);                                 \
  template ShardedArray<T> detail::scalar_on<T>(T, const Mesh&);
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_OPS)
#undef SHARD_INSTANTIATE_OPS

}  // namespace shard
