#pragma once
/// \file jax.pmap on shard_map: a 1-D mesh over the first n devices, the leading dim (or the
/// in_axes dim) mapped, the outputs stacked along a new leading dim.

#include <array>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "shard/spmd/shard_map.hpp"

namespace shard {

/// One entry of pmap's in_axes: the dim to map (an int), or None (the argument is broadcast).
class InAxis {
 public:
  InAxis(int axis) : mapped_(true), axis_(axis) {}  // NOLINT: in_axes = {0, None}
  InAxis(NoneType) {}                               // NOLINT
  bool mapped() const { return mapped_; }
  int axis() const { return axis_; }

 private:
  bool mapped_ = false;
  int axis_ = 0;
};

namespace detail {
/// The 1-D mesh of pmap: the first n devices of make_mesh's order, axis `name`.
Mesh pmap_mesh(int n, const std::string& name);
/// pmap's leading size from the arguments' mapped dims (equal, 1..device count), else ShapeError.
int pmap_size(const std::vector<std::pair<Shape, InAxis>>& args);

template <typename A>
struct PmapArg;
template <Dtype T>
struct PmapArg<Tensor<T>> {
  static Shape shape(const Tensor<T>& x) { return x.shape(); }
  static ShardedArray<T> put(const Tensor<T>& x, const Mesh& mesh, const InAxis& a) {
    if (!a.mapped()) return device_put(x, NamedSharding(mesh, P()));
    return device_put(a.axis() == 0 ? x : moveaxis(x, a.axis(), 0),
                      NamedSharding(mesh, P(mesh.axis_names()[0])));
  }
};
template <Dtype T>
struct PmapArg<ShardedArray<T>> {
  static Shape shape(const ShardedArray<T>& x) { return x.shape(); }
  static ShardedArray<T> put(const ShardedArray<T>& x, const Mesh& mesh, const InAxis& a) {
    if (!a.mapped()) return reshard(x, NamedSharding(mesh, P()));
    return reshard(a.axis() == 0 ? x : moveaxis(x, a.axis(), 0),
                   NamedSharding(mesh, P(mesh.axis_names()[0])));
  }
};

/// A mapped block without its leading dim of size 1 (a view, no copy).
template <Dtype T>
Tensor<T> drop_leading(const Tensor<T>& b) {
  return Tensor<T>::borrow(const_cast<T*>(b.data()), Shape(b.shape().begin() + 1, b.shape().end()));
}
/// A body output with a leading dim of size 1 (pmap stacks the devices' outputs along it).
template <typename R>
auto add_leading(R&& r) {
  using D = std::decay_t<R>;
  if constexpr (Scalar<D>) {
    return Tensor<scalar_dtype_t<D>>(Shape{1}, static_cast<scalar_dtype_t<D>>(r));
  } else if constexpr (detail::is_tensor_v<D>) {
    Shape s = r.shape();
    s.insert(s.begin(), 1);
    return std::move(r).reshaped(std::move(s));
  } else {
    return std::apply([](auto&&... x) { return std::make_tuple(add_leading(std::move(x))...); },
                      std::move(r));
  }
}
}  // namespace detail

/// A function mapped with pmap: call it with the arguments.
template <typename F>
class Pmapped {
 public:
  Pmapped(F f, std::string axis_name, std::vector<InAxis> in_axes)
      : f_(std::move(f)), axis_(std::move(axis_name)), in_axes_(std::move(in_axes)) {}

  /// Collective over all ranks. Arguments are host Tensors (every rank passes the same) or
  /// ShardedArrays; each mapped one must have the same size n (<= the device count) along its
  /// in_axes dim. Returns the outputs stacked along a new leading dim, sharded over the mesh.
  template <typename... Args>
  auto operator()(const Args&... args) const {
    constexpr std::size_t N = sizeof...(Args);
    static_assert(N > 0, "pmap: call the mapped function with at least one argument");
    const std::vector<InAxis> axes = in_axes_.empty() ? std::vector<InAxis>(N, InAxis(0)) : in_axes_;
    if (axes.size() != N)
      raise<ValueError>("pmap: in_axes has ", axes.size(), " entries but the function was called with ", N,
                        " arguments");
    std::vector<std::pair<Shape, InAxis>> shapes;
    std::size_t i = 0;
    ((shapes.emplace_back(detail::PmapArg<Args>::shape(args), axes[i++])), ...);
    const Mesh mesh = detail::pmap_mesh(detail::pmap_size(shapes), axis_);
    return call(mesh, axes, std::index_sequence_for<Args...>{}, args...);
  }

 private:
  template <std::size_t... I, typename... Args>
  auto call(const Mesh& mesh, const std::vector<InAxis>& axes, std::index_sequence<I...>,
            const Args&... args) const {
    const std::array<SpecTree, sizeof...(Args)> in_specs{
        SpecTree(axes[I].mapped() ? PartitionSpec(SpecEntry(axis_)) : PartitionSpec())...};
    const std::array<bool, sizeof...(Args)> mapped{axes[I].mapped()...};
    const auto body = [this, mapped](DeviceContext& ctx, const auto&... blocks) {
      return invoke(ctx, mapped, std::index_sequence_for<decltype(blocks)...>{}, blocks...);
    };
    return run(mesh, in_specs, body, detail::PmapArg<Args>::put(args, mesh, axes[I])...);
  }

  template <Dtype T>
  static Tensor<T> view(const Tensor<T>& b, bool mapped) {
    if (b.ad())
      return mapped ? reshape(b, Shape(b.shape().begin() + 1, b.shape().end())) : b.alias();  // recorded
    return mapped ? detail::drop_leading(b) : Tensor<T>::borrow(const_cast<T*>(b.data()), b.shape());
  }

  template <std::size_t N, std::size_t... I, typename... B>
  auto invoke(DeviceContext& ctx, const std::array<bool, N>& mapped, std::index_sequence<I...>,
              const B&... blocks) const {
    auto views = std::make_tuple(view(blocks, mapped[I])...);
    return std::apply(
        [&](auto&... v) {
          if constexpr (std::is_invocable_v<const F&, DeviceContext&, decltype(v)...>)
            return detail::add_leading(f_(ctx, v...));
          else
            return detail::add_leading(f_(v...));
        },
        views);
  }

  template <std::size_t N, typename B, typename... A>
  auto run(const Mesh& mesh, const std::array<SpecTree, N>& in_specs, B body, const A&... prepared) const {
    using Outs = decltype(body(std::declval<DeviceContext&>(), prepared.addressable_shards()[0].data...));
    constexpr std::size_t M = std::tuple_size_v<typename detail::as_tuple<Outs>::type>;
    const SpecTree stacked{PartitionSpec(SpecEntry(axis_))};
    auto outs = [&]<std::size_t... J>(std::index_sequence<J...>) {
      return std::array<SpecTree, M>{((void)J, stacked)...};
    }
    (std::make_index_sequence<M>{});
    // Every output is stacked along the mapped axis (out_spec P(axis)): the vma check cannot
    // fail, so the body runs without its per-op cost (a differentiated pmap still tracks vma).
    return ShardMapped<N, M, B>(mesh, in_specs, outs, std::move(body),
                                ShardMapOptions{.check_vma = false})(prepared...);
  }

  F f_;
  std::string axis_;
  std::vector<InAxis> in_axes_;
};

/// jax.pmap: `pmap(f, "p")(x, y)` maps the leading dim (or the in_axes dim; None broadcasts
/// the argument) of each argument over a 1-D mesh named `axis_name` of the first n devices
/// (make_mesh order), n being that dim's size; f gets the slices x[i] (and the whole broadcast
/// arguments), optionally after a DeviceContext&, and its outputs are stacked along a new
/// leading dim. Collective over all ranks.
template <typename F>
Pmapped<F> pmap(F f, std::string axis_name = "pmap", std::vector<InAxis> in_axes = {}) {
  return Pmapped<F>(std::move(f), std::move(axis_name), std::move(in_axes));
}

}  // namespace shard
