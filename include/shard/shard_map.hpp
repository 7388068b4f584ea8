#pragma once
/// \file Manual SPMD: shard_map and pmap run a body once per logical device with that
/// device's blocks; inside it, named-axis collectives with JAX's semantics (jax.lax.psum,
/// all_gather, psum_scatter, all_to_all, ppermute, axis_index, axis_size).

#include <functional>
#include <memory>
#include <source_location>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "shard/detail/collective.hpp"
#include "shard/group_shared.hpp"
#include "shard/partition_spec.hpp"
#include "shard/sharded_array.hpp"

namespace shard {

/// Mesh axis names for a collective: "a", {"a", "b"} (their product, row-major) or None.
using Axes = SpecEntry;

namespace detail {
class SpmdState;
}

/// What a shard_map body sees: its device, and the collectives over mesh axes. Every
/// collective is collective over the devices that differ from this one only along the named
/// axes; every device of the mesh must issue the same collectives in the same order (SPMD).
/// Inputs are taken by value: pass std::move(x) to let reductions work in place.
/// `where` (defaulted) is the caller's source location: the consistency check
/// (SHARD_CHECK_COLLECTIVES, see detail/collective_guard.hpp) names it when ranks disagree.
class DeviceContext {
 public:
  DeviceContext(std::shared_ptr<detail::SpmdState> state, int local_index);

  int device() const;
  const Mesh& mesh() const;
  /// Row-major index of this device over `axes` (jax.lax.axis_index).
  int axis_index(const Axes& axes) const;
  /// Product of the sizes of `axes` (jax.lax.axis_size).
  int axis_size(const Axes& axes) const;

  template <typename T>
  Tensor<T> psum(Tensor<T> x, const Axes& axes, std::source_location where = std::source_location::current());
  template <typename T>
  Tensor<T> pmean(Tensor<T> x, const Axes& axes, std::source_location where = std::source_location::current());  ///< integer types divide with truncation
  template <typename T>
  Tensor<T> pmax(Tensor<T> x, const Axes& axes, std::source_location where = std::source_location::current());
  template <typename T>
  Tensor<T> pmin(Tensor<T> x, const Axes& axes, std::source_location where = std::source_location::current());

  /// Scalar forms: psum(3.0, "a").
  template <typename T>
    requires std::is_arithmetic_v<T>
  T psum(T x, const Axes& axes, std::source_location where = std::source_location::current()) {
    return psum(Tensor<T>(Shape{}, x), axes, where)[0];
  }
  template <typename T>
    requires std::is_arithmetic_v<T>
  T pmean(T x, const Axes& axes, std::source_location where = std::source_location::current()) {
    return pmean(Tensor<T>(Shape{}, x), axes, where)[0];
  }
  template <typename T>
    requires std::is_arithmetic_v<T>
  T pmax(T x, const Axes& axes, std::source_location where = std::source_location::current()) {
    return pmax(Tensor<T>(Shape{}, x), axes, where)[0];
  }
  template <typename T>
    requires std::is_arithmetic_v<T>
  T pmin(T x, const Axes& axes, std::source_location where = std::source_location::current()) {
    return pmin(Tensor<T>(Shape{}, x), axes, where)[0];
  }

  /// Untiled: stacks the N blocks along a new dim `dim`; tiled: concatenates along `dim`.
  /// all_gather, all_to_all and ppermute only read their input: an lvalue is read where it
  /// lies (not copied first) and stays unchanged; an rvalue's buffer is released afterwards.
  template <typename T>
  Tensor<T> all_gather(Tensor<T>&& x, const Axes& axes, int dim = 0, bool tiled = false,
                       std::source_location where = std::source_location::current());
  template <typename T>
  Tensor<T> all_gather(const Tensor<T>& x, const Axes& axes, int dim = 0, bool tiled = false,
                       std::source_location where = std::source_location::current());
  /// Untiled: x.shape[dim] == N, returns psum(x)[axis_index] along dim (dim removed);
  /// tiled: N divides x.shape[dim], returns this device's chunk of psum(x) (dim kept).
  template <typename T>
  Tensor<T> psum_scatter(Tensor<T> x, const Axes& axes, int dim = 0, bool tiled = false,
                         std::source_location where = std::source_location::current());
  /// Splits split_dim into N chunks, sends chunk j to device j, and concatenates (tiled) or
  /// stacks (untiled, x.shape[split_dim] == N) the received chunks along concat_dim.
  template <typename T>
  Tensor<T> all_to_all(Tensor<T>&& x, const Axes& axes, int split_dim, int concat_dim, bool tiled = false,
                       std::source_location where = std::source_location::current());
  template <typename T>
  Tensor<T> all_to_all(const Tensor<T>& x, const Axes& axes, int split_dim, int concat_dim, bool tiled = false,
                       std::source_location where = std::source_location::current());
  /// Sends x from axis index src to dst for each (src, dst) pair (no repeated src or dst);
  /// a device that is no one's destination gets zeros.
  template <typename T>
  Tensor<T> ppermute(Tensor<T>&& x, const Axes& axes, std::vector<std::pair<int, int>> perm,
                     std::source_location where = std::source_location::current());
  template <typename T>
  Tensor<T> ppermute(const Tensor<T>& x, const Axes& axes, std::vector<std::pair<int, int>> perm,
                     std::source_location where = std::source_location::current());

  /// Group-shared memory over `axes` (group_shared.hpp): the buffer `name` with `count`
  /// elements per device of the group. Collective over the group on first use (then cached);
  /// ShardingError when group_shared_available(mesh, axes) is false or the body runs on more
  /// than one device of this rank.
  template <typename T>
  GroupShared<T> group_shared(const Axes& axes, std::int64_t count, const std::string& name) {
    return GroupShared<T>(mesh(), &shared_window(axes, static_cast<std::size_t>(count) * sizeof(T), name), name);
  }

 private:
  detail::SharedWindow& shared_window(const Axes& axes, std::size_t bytes, const std::string& name);

  template <typename T>
  Tensor<T> run(detail::CollectiveSpec spec, Tensor<T> x, const std::source_location& where);

  std::shared_ptr<detail::SpmdState> state_;
  int local_;
};

/// The blocks a shard_map body receives, one per argument (const views of the shards).
template <typename T>
class Blocks {
 public:
  explicit Blocks(std::vector<const Tensor<T>*> blocks) : blocks_(std::move(blocks)) {}
  const Tensor<T>& operator[](std::size_t i) const { return *blocks_.at(i); }
  std::size_t size() const { return blocks_.size(); }

 private:
  std::vector<const Tensor<T>*> blocks_;
};

template <typename T>
using ShardMapBody = std::function<std::vector<Tensor<T>>(DeviceContext&, const Blocks<T>&)>;

/// Collective over all ranks: runs `body` once per device of `mesh` with that device's block
/// of every argument (the shard of in_specs[i]; the argument must already have that sharding
/// and its dims must divide evenly), and assembles the returned blocks into arrays with
/// out_specs (the global shape is the block shape times the parts of each dim). With k
/// devices per rank the body runs on k threads (device 0 on the calling thread).
template <typename T>
std::vector<ShardedArray<T>> shard_map(const Mesh& mesh, const std::vector<PartitionSpec>& in_specs,
                                       const std::vector<PartitionSpec>& out_specs, const ShardMapBody<T>& body,
                                       const std::vector<const ShardedArray<T>*>& args);

/// One argument, one result.
template <typename T>
ShardedArray<T> shard_map(const Mesh& mesh, const PartitionSpec& in_spec, const PartitionSpec& out_spec,
                          const std::function<Tensor<T>(DeviceContext&, const Tensor<T>&)>& body,
                          const ShardedArray<T>& x) {
  ShardMapBody<T> wrapped = [&](DeviceContext& ctx, const Blocks<T>& b) {
    std::vector<Tensor<T>> out;
    out.push_back(body(ctx, b[0]));
    return out;
  };
  return std::move(shard_map<T>(mesh, {in_spec}, {out_spec}, wrapped, {&x})[0]);
}

/// jax.pmap: maps the leading dim of `x` (size n <= device count) over a 1-D mesh of the
/// first n devices (make_mesh order) named `axis_name`; the body sees x[i] and its results
/// are stacked along a new leading dim. Collective over all ranks.
template <typename T>
ShardedArray<T> pmap(const std::function<Tensor<T>(DeviceContext&, const Tensor<T>&)>& body,
                     const std::string& axis_name, const Tensor<T>& x);

/// Collective over the mesh: sums an array over mesh axes its spec does not use (partial
/// sums living on the replicas along those axes); the result keeps x's sharding.
template <typename T>
ShardedArray<T> psum(const ShardedArray<T>& x, const Axes& axes, std::source_location where = std::source_location::current());
/// Collective over all ranks: replicates x along mesh axis `axis` (the spec loses that axis):
/// one all_gather over the axis when it is the minor axis of its entry and the dims divide
/// evenly, otherwise the reshard that moves only the missing pieces.
template <typename T>
ShardedArray<T> all_gather(const ShardedArray<T>& x, const std::string& axis, std::source_location where = std::source_location::current());

}  // namespace shard
