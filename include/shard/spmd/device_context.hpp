#pragma once
/// \file What a shard_map / pmap body sees (spmd/shard_map.hpp runs the bodies): its
/// DeviceContext, and jax.lax's named-axis collectives over mesh axes (psum, pmean, pmax, pmin,
/// all_gather, psum_scatter, all_to_all, ppermute, axis_index, axis_size), as its methods and as
/// free functions; inside vmap the free functions also take the vmap's axis name.

#include <array>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <source_location>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "shard/array/reshard.hpp"
#include "shard/array/sharded_array.hpp"
#include "shard/comm/detail/collective.hpp"
#include "shard/comm/group_shared.hpp"
#include "shard/core/detail/tape.hpp"
#include "shard/core/tensor_ops.hpp"
#include "shard/error.hpp"
#include "shard/ops/ops.hpp"
#include "shard/sharding/partition_spec.hpp"
#include "shard/spmd/detail/shard_map_ad.hpp"
#include "shard/spmd/detail/vmap_collectives.hpp"

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

  /// Position of this device among the rank's devices of the mesh (0..k-1).
  int local_index() const { return local_; }

  template <typename T>
  Tensor<T> psum(Tensor<T> x, const Axes& axes,
                 shard::source_location where = shard::source_location::current());
  /// The mean over the devices; integer and bool inputs give a floating result (float_of_t),
  /// as in JAX: the sum is exact, then divided.
  template <typename T>
  Tensor<float_of_t<T>> pmean(Tensor<T> x, const Axes& axes,
                              shard::source_location where = shard::source_location::current());
  /// pmax / pmin of bool arrays are a logical or / and.
  template <typename T>
  Tensor<T> pmax(Tensor<T> x, const Axes& axes,
                 shard::source_location where = shard::source_location::current());
  template <typename T>
  Tensor<T> pmin(Tensor<T> x, const Axes& axes,
                 shard::source_location where = shard::source_location::current());

  /// Scalar forms: psum(3.0, "a").
  template <Scalar S>
  S psum(S x, const Axes& axes, shard::source_location where = shard::source_location::current()) {
    return static_cast<S>(
        psum(Tensor<scalar_dtype_t<S>>(Shape{}, static_cast<scalar_dtype_t<S>>(x)), axes, where).flat(0));
  }
  template <Scalar S>
  float_of_t<scalar_dtype_t<S>> pmean(S x, const Axes& axes,
                                      shard::source_location where = shard::source_location::current()) {
    return pmean(Tensor<scalar_dtype_t<S>>(Shape{}, static_cast<scalar_dtype_t<S>>(x)), axes, where).flat(0);
  }
  template <Scalar S>
  S pmax(S x, const Axes& axes, shard::source_location where = shard::source_location::current()) {
    return static_cast<S>(
        pmax(Tensor<scalar_dtype_t<S>>(Shape{}, static_cast<scalar_dtype_t<S>>(x)), axes, where).flat(0));
  }
  template <Scalar S>
  S pmin(S x, const Axes& axes, shard::source_location where = shard::source_location::current()) {
    return static_cast<S>(
        pmin(Tensor<scalar_dtype_t<S>>(Shape{}, static_cast<scalar_dtype_t<S>>(x)), axes, where).flat(0));
  }

  /// Untiled: stacks the N blocks along a new dim `dim`; tiled: concatenates along `dim`.
  /// all_gather, all_to_all and ppermute only read their input: an lvalue is read where it
  /// lies (not copied first) and stays unchanged; an rvalue's buffer is released afterwards.
  template <typename T>
  Tensor<T> all_gather(Tensor<T>&& x, const Axes& axes, int dim = 0, bool tiled = false,
                       shard::source_location where = shard::source_location::current());
  template <typename T>
  Tensor<T> all_gather(const Tensor<T>& x, const Axes& axes, int dim = 0, bool tiled = false,
                       shard::source_location where = shard::source_location::current());
  /// jax.lax.all_gather_invariant: the same values as all_gather, but the result is invariant
  /// over `axes` (every device holds the same gathered array), so it may be returned under an
  /// out_spec that omits them; its transpose takes each device's own chunk (no communication).
  template <typename T>
  Tensor<T> all_gather_invariant(const Tensor<T>& x, const Axes& axes, int dim = 0, bool tiled = false,
                                 shard::source_location where = shard::source_location::current());
  /// Untiled: x.shape[dim] == N, returns psum(x)[axis_index] along dim (dim removed);
  /// tiled: N divides x.shape[dim], returns this device's chunk of psum(x) (dim kept).
  template <typename T>
  Tensor<T> psum_scatter(Tensor<T> x, const Axes& axes, int dim = 0, bool tiled = false,
                         shard::source_location where = shard::source_location::current());
  /// Splits split_dim into N chunks, sends chunk j to device j, and concatenates (tiled) or
  /// stacks (untiled, x.shape[split_dim] == N) the received chunks along concat_dim.
  template <typename T>
  Tensor<T> all_to_all(Tensor<T>&& x, const Axes& axes, int split_dim, int concat_dim, bool tiled = false,
                       shard::source_location where = shard::source_location::current());
  template <typename T>
  Tensor<T> all_to_all(const Tensor<T>& x, const Axes& axes, int split_dim, int concat_dim,
                       bool tiled = false, shard::source_location where = shard::source_location::current());
  /// Sends x from axis index src to dst for each (src, dst) pair (no repeated src or dst);
  /// a device that is no one's destination gets zeros.
  template <typename T>
  Tensor<T> ppermute(Tensor<T>&& x, const Axes& axes, std::vector<std::pair<int, int>> perm,
                     shard::source_location where = shard::source_location::current());
  template <typename T>
  Tensor<T> ppermute(const Tensor<T>& x, const Axes& axes, std::vector<std::pair<int, int>> perm,
                     shard::source_location where = shard::source_location::current());

  /// Group-shared memory over `axes` (group_shared.hpp): the buffer `name` with `count`
  /// elements per device of the group. Collective over the group on first use (then cached);
  /// ShardingError when group_shared_available(mesh, axes) is false or the body runs on more
  /// than one device of this rank.
  template <typename T>
  GroupShared<T> group_shared(const Axes& axes, std::int64_t count, const std::string& name) {
    return GroupShared<T>(mesh(), &shared_window(axes, static_cast<std::size_t>(count) * sizeof(T), name),
                          name);
  }

 private:
  detail::SharedWindow& shared_window(const Axes& axes, std::size_t bytes, const std::string& name);

  template <typename T>
  Tensor<T> run(detail::CollectiveSpec spec, Tensor<T> x, const shard::source_location& where);

  std::shared_ptr<detail::SpmdState> state_;
  int local_;
};

// ---------------------------------------------------------------- collectives as functions

/// The DeviceContext of the shard_map / pmap body running on the calling thread (what the
/// free collectives below use). RuntimeError outside a body: named axes are bound only there,
/// as in JAX.
DeviceContext& device_context();

namespace detail {
/// The DeviceContext of the body running on the calling thread, or null outside a body (jit keys
/// a program traced inside a body by its device: jit/jit.hpp).
DeviceContext* current_device_context() noexcept;
}  // namespace detail

namespace detail {
/// psum / pmax / pmin inside vmap: over the vmap axes among `axes` first (the batch reduced),
/// then `mesh_op` over the mesh axes left, on the physical array of a batched value.
template <Dtype T, typename MeshOp>
Tensor<T> reduce_over_axes(Tensor<T> x, const Axes& axes, ReduceKind kind, const char* name,
                           const shard::source_location& where, const MeshOp& mesh_op) {
  const CallScope scope(name, where);
  const auto split = split_vmap_axes(axes);
  for (const auto* f : split.frames) x = vmap_reduce(x, *f, kind);
  if (split.mesh.is_none() && !split.frames.empty()) return x;
  if (detail::vmap_batched(x))
    return on_batched_physical(x, [&](Tensor<T> p, int) {
      return reduce_over_axes(std::move(p), split.mesh, kind, name, where, mesh_op);
    });
  return mesh_op(std::move(x), split.mesh);
}
}  // namespace detail

/// jax.lax's collectives as free functions of the enclosing body's context, so a body reads
/// like JAX: `return x / psum(x, "p");`. Same semantics as the DeviceContext methods. Inside
/// vmap an axis name may also name the vmap's batch (VmapOptions::axis_name): the collective
/// then reduces, gathers or enumerates the examples (spmd/detail/vmap_collectives.hpp), and
/// over mesh axes a batched value's examples are all sent at once.
template <Dtype T>
Tensor<T> psum(Tensor<T> x, const Axes& axes,
               shard::source_location where = shard::source_location::current()) {
  if (detail::t_batch_frames.empty()) return device_context().psum(std::move(x), axes, where);
  return detail::reduce_over_axes(
      std::move(x), axes, ReduceKind::kSum, "psum", where,
      [&](Tensor<T> v, const Axes& mesh) { return device_context().psum(std::move(v), mesh, where); });
}
template <Dtype T>
Tensor<float_of_t<T>> pmean(Tensor<T> x, const Axes& axes,
                            shard::source_location where = shard::source_location::current()) {
  if (detail::t_batch_frames.empty()) return device_context().pmean(std::move(x), axes, where);
  const detail::CallScope scope("pmean", where);
  const auto split = detail::split_vmap_axes(axes);
  using F = float_of_t<T>;
  if (split.frames.empty()) {
    if (detail::vmap_batched(x))
      return detail::on_batched_physical(x,
                                         [&](Tensor<T> p, int) { return pmean(std::move(p), axes, where); });
    return device_context().pmean(std::move(x), axes, where);
  }
  Tensor<F> m = astype<F>(x);
  for (const auto* f : split.frames) m = detail::vmap_reduce(m, *f, ReduceKind::kMean);
  if (split.mesh.is_none()) return m;
  return pmean(std::move(m), split.mesh, where);
}
template <Dtype T>
Tensor<T> pmax(Tensor<T> x, const Axes& axes,
               shard::source_location where = shard::source_location::current()) {
  if (detail::t_batch_frames.empty()) return device_context().pmax(std::move(x), axes, where);
  return detail::reduce_over_axes(
      std::move(x), axes, ReduceKind::kMax, "pmax", where,
      [&](Tensor<T> v, const Axes& mesh) { return device_context().pmax(std::move(v), mesh, where); });
}
template <Dtype T>
Tensor<T> pmin(Tensor<T> x, const Axes& axes,
               shard::source_location where = shard::source_location::current()) {
  if (detail::t_batch_frames.empty()) return device_context().pmin(std::move(x), axes, where);
  return detail::reduce_over_axes(
      std::move(x), axes, ReduceKind::kMin, "pmin", where,
      [&](Tensor<T> v, const Axes& mesh) { return device_context().pmin(std::move(v), mesh, where); });
}
template <Scalar S>
S psum(S x, const Axes& axes, shard::source_location where = shard::source_location::current()) {
  return device_context().psum(x, axes, where);
}
template <Scalar S>
float_of_t<scalar_dtype_t<S>> pmean(S x, const Axes& axes,
                                    shard::source_location where = shard::source_location::current()) {
  return device_context().pmean(x, axes, where);
}
template <Dtype T>
Tensor<T> all_gather(const Tensor<T>& x, const Axes& axes, int dim = 0, bool tiled = false,
                     shard::source_location where = shard::source_location::current()) {
  if (detail::t_batch_frames.empty()) return device_context().all_gather(x, axes, dim, tiled, where);
  const detail::CallScope scope("all_gather", where);
  const auto split = detail::split_vmap_axes(axes);
  if (!split.frames.empty()) {
    if (split.frames.size() > 1 || !split.mesh.is_none())
      raise<ValueError>("all_gather: over the vmap axis '", split.frames.front()->axis_name,
                        "' the axes must be that one name alone; gather over the others in a second call");
    return detail::vmap_all_gather(x, *split.frames.front(), dim, tiled);
  }
  if (detail::vmap_batched(x)) {
    const int r = x.ndim();
    const int d = resolve_dim(dim, tiled ? r : r + 1, "all_gather");
    return detail::on_batched_physical(
        x, [&](Tensor<T> p, int) { return all_gather(p, axes, d + 1, tiled, where); });
  }
  return device_context().all_gather(x, axes, dim, tiled, where);
}
template <Dtype T>
Tensor<T> all_gather_invariant(const Tensor<T>& x, const Axes& axes, int dim = 0, bool tiled = false,
                               shard::source_location where = shard::source_location::current()) {
  return device_context().all_gather_invariant(x, axes, dim, tiled, where);
}
template <Dtype T>
Tensor<T> psum_scatter(Tensor<T> x, const Axes& axes, int dim = 0, bool tiled = false,
                       shard::source_location where = shard::source_location::current()) {
  if (detail::vmap_batched(x)) {
    const int d = resolve_dim(dim, x.ndim(), "psum_scatter");
    return detail::on_batched_physical(
        x, [&](Tensor<T> p, int) { return psum_scatter(std::move(p), axes, d + 1, tiled, where); });
  }
  return device_context().psum_scatter(std::move(x), axes, dim, tiled, where);
}
template <Dtype T>
Tensor<T> all_to_all(const Tensor<T>& x, const Axes& axes, int split_dim, int concat_dim, bool tiled = false,
                     shard::source_location where = shard::source_location::current()) {
  if (detail::vmap_batched(x)) {
    const int s = resolve_dim(split_dim, x.ndim(), "all_to_all"),
              c = resolve_dim(concat_dim, x.ndim(), "all_to_all");
    return detail::on_batched_physical(
        x, [&](Tensor<T> p, int) { return all_to_all(p, axes, s + 1, c + 1, tiled, where); });
  }
  return device_context().all_to_all(x, axes, split_dim, concat_dim, tiled, where);
}
template <Dtype T>
Tensor<T> ppermute(const Tensor<T>& x, const Axes& axes, std::vector<std::pair<int, int>> perm,
                   shard::source_location where = shard::source_location::current()) {
  if (detail::vmap_batched(x))
    return detail::on_batched_physical(x, [&](Tensor<T> p, int) { return ppermute(p, axes, perm, where); });
  return device_context().ppermute(x, axes, std::move(perm), where);
}
/// jax.lax.axis_index of the enclosing body: an int over mesh axes; over a vmap's axis it is an
/// array (each example's index, int32), as in JAX: `Tensor<std::int32_t> i = axis_index("i")`.
class AxisIndex {
 public:
  explicit AxisIndex(int value) : value_(value) {}
  explicit AxisIndex(Tensor<std::int32_t> batched) : batched_(std::move(batched)), is_array_(true) {}
  /// The index over mesh axes. ValueError when it names a vmap axis (the index is then an array).
  operator int() const {  // NOLINT: int i = axis_index("x")
    if (is_array_)
      raise<ValueError>(
          "axis_index: over a vmap axis the index differs from example to example, so it is an "
          "array, not an int: write Tensor<std::int32_t> i = axis_index(...)");
    return value_;
  }
  template <Dtype T>
  operator Tensor<T>() const {  // NOLINT: Tensor<std::int32_t> i = axis_index("i")
    if (is_array_) return astype<T>(batched_);
    return Tensor<T>(Shape{}, static_cast<T>(value_));
  }

 private:
  int value_ = 0;
  Tensor<std::int32_t> batched_;
  bool is_array_ = false;
};
inline AxisIndex axis_index(const Axes& axes) {
  if (detail::t_batch_frames.empty()) return AxisIndex(device_context().axis_index(axes));
  const auto split = detail::split_vmap_axes(axes);
  if (split.frames.empty()) return AxisIndex(device_context().axis_index(axes));
  // Row-major over the named axes, in their order.
  Tensor<std::int32_t> index(Shape{}, 0);
  for (const auto& a : axes.axes()) {
    if (const detail::BatchFrame* f = detail::batch_frame_named(a))
      index = binary(binary(index, static_cast<std::int32_t>(f->size), BinaryOp::kMul),
                     detail::vmap_axis_index(*f), BinaryOp::kAdd);
    else
      index = binary(binary(index, static_cast<std::int32_t>(device_context().axis_size(a)), BinaryOp::kMul),
                     static_cast<std::int32_t>(device_context().axis_index(a)), BinaryOp::kAdd);
  }
  return AxisIndex(std::move(index));
}
/// jax.lax.axis_size: a vmap axis's batch size, or the mesh axes' product.
inline int axis_size(const Axes& axes) {
  if (detail::t_batch_frames.empty()) return device_context().axis_size(axes);
  int n = 1;
  for (const auto& a : axes.axes()) {
    if (const detail::BatchFrame* f = detail::batch_frame_named(a))
      n *= static_cast<int>(f->size);
    else
      n *= device_context().axis_size(a);
  }
  return n;
}

}  // namespace shard
