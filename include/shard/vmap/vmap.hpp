#pragma once
/// \file shard::vmap (jax.vmap): a function written for one example, applied to a batch.
///
///   // given: Tensor<float> xs({8, 5}, 1.f), ws({8, 3}, 2.f), params({5}, 0.5f);
///   auto convolve = [](const Tensor<float>& x, const Tensor<float>& w) {   // one example
///     std::vector<Tensor<float>> out;
///     for (std::int64_t i = 1; i + 1 < x.shape()[0]; ++i) out.push_back(dot(x[{Slice(i - 1, i + 2)}], w));
///     return stack(out);
///   };
///   Tensor<float> ys = vmap(convolve)(xs, ws);                 // (8, 5), (8, 3) -> (8, 3)
///   auto loss = [](const Tensor<float>& p, const Tensor<float>& x) { return sum(p * x * x); };
///   Tensor<float> per_example = vmap(grad(loss), {None, 0})(params, xs);   // (8, 5)
///
/// Inside the function each mapped argument is a *batched value*: it reports the shape (and a
/// ShardedArray the sharding) of one example, and every op on it runs once on the whole batch
/// through its primitive's batching rule (ops/batching.hpp), so a vmapped program makes the same
/// kernel calls whatever the batch size. Its elements cannot be read inside (as JAX's tracers
/// cannot be made concrete); the result can.
///
/// Semantics (JAX's): `in_axes` is one entry for every argument or a list with one per
/// argument, each a dim (negative counts from the end) or None (not mapped: the argument is
/// the same for every example); an entry applies to every array of its argument's tree.
/// Every mapped array must have the same size along its axis (ValueError naming them
/// otherwise). `out_axes` likewise for the result (a tuple/pair result may take one entry per
/// element): the batch dim is put there, an output that does not depend on the batch is
/// repeated along it, and None returns an output that does not depend on the batch as it is
/// (ValueError if it does). vmaps nest; vmap(grad(f)) gives per-example gradients and
/// grad(vmap(f)) differentiates the batched function.
///
/// `axis_name` names the batch for the collectives inside: psum / pmean / pmax / pmin,
/// all_gather and axis_index over it reduce, gather or enumerate the examples (as over a mesh
/// axis in shard_map). Inside a shard_map, a vmap's body uses the mesh axes' collectives as
/// well. `spmd_axis_name`: the batch dim of mapped ShardedArrays is split over that mesh axis.

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "shard/array/driver.hpp"
#include "shard/core/detail/batch.hpp"
#include "shard/core/none.hpp"
#include "shard/core/shape_ops.hpp"
#include "shard/core/tree.hpp"
#include "shard/error.hpp"
#include "shard/ops/batching.hpp"
#include "shard/ops/ops.hpp"

namespace shard {

/// One entry of in_axes / out_axes: a dim (negative counts from the end) or None.
class BatchAxis {
 public:
  BatchAxis(int dim) : dim_(dim) {}  // NOLINT: 0 converts, as in JAX
  BatchAxis(NoneType) {}             // NOLINT: None converts
  bool is_none() const { return !dim_; }
  int dim() const { return *dim_; }
  std::string to_string() const { return dim_ ? std::to_string(*dim_) : "None"; }

 private:
  std::optional<int> dim_;
};

/// in_axes / out_axes: one entry for every argument (0, None), or one per argument ({None, 0}).
class VmapAxes {
 public:
  VmapAxes(int dim) : all_(dim) {}          // NOLINT
  VmapAxes(BatchAxis axis) : all_(axis) {}  // NOLINT
  VmapAxes(NoneType) : all_(None) {}        // NOLINT
  VmapAxes(std::initializer_list<BatchAxis> each) : each_(each), per_argument_(true) {}
  explicit VmapAxes(std::vector<BatchAxis> each) : each_(std::move(each)), per_argument_(true) {}
  bool per_argument() const { return per_argument_; }
  std::size_t size() const { return each_.size(); }
  /// The entry of argument i.
  const BatchAxis& operator[](std::size_t i) const { return per_argument_ ? each_[i] : all_; }
  std::string to_string() const;

 private:
  BatchAxis all_{0};
  std::vector<BatchAxis> each_;
  bool per_argument_ = false;
};

inline std::string VmapAxes::to_string() const {
  if (!per_argument_) return all_.to_string();
  std::string s = "(";
  for (std::size_t i = 0; i < each_.size(); ++i) s += (i ? ", " : "") + each_[i].to_string();
  return s + (each_.size() == 1 ? ",)" : ")");
}

/// vmap's options (jax.vmap's keyword arguments).
struct VmapOptions {
  /// The name collectives use for the batch ("" for none).
  std::string axis_name{};
  /// The batch size when no argument is mapped (-1: from the arguments).
  std::int64_t axis_size = -1;
  /// A mesh axis the batch dim of mapped ShardedArrays is split over ("" for none).
  std::string spmd_axis_name{};
  /// A primitive without a batching rule runs as a loop over the examples (said once on
  /// stderr) instead of raising.
  bool loop_fallback = false;
};

namespace detail {

/// Pops the vmap frame it pushed (also when the function throws).
class BatchFrameScope {
 public:
  explicit BatchFrameScope(BatchFrame frame) { t_batch_frames.push_back(std::move(frame)); }
  ~BatchFrameScope() { t_batch_frames.pop_back(); }
  BatchFrameScope(const BatchFrameScope&) = delete;
  BatchFrameScope& operator=(const BatchFrameScope&) = delete;
};

/// The size of every array of `arg` along `axis` (checked against `size`, set by the first).
template <typename Arg>
void vmap_sizes(const Arg& arg, std::size_t i, const BatchAxis& axis, std::int64_t& size, std::string& first,
                const shard::source_location& where) {
  if (axis.is_none()) return;
  if constexpr (!has_leaves<Arg>) {
    raise<ValueError>(located("vmap", where), ": in_axes for argument ", i, " is ", axis.to_string(),
                      " but the argument holds no array (a ",
                      (std::is_arithmetic_v<Arg> ? "scalar" : "static value"),
                      "); map it with None, or pass an array");
  } else {
    tree_for_each_with_path(
        [&](const TreePath& path, const auto& leaf) {
          const std::string name = "argument " + std::to_string(i) + path.to_string();
          if (leaf.ndim() == 0)
            raise<ValueError>(located("vmap", where), ": in_axes maps ", name, " along dim ", axis.dim(),
                              ", but it is 0-d (a mapped array needs a dim to map over); map it with None");
          const int d = resolve_dim(axis.dim(), leaf.ndim(), "vmap in_axes");
          const std::int64_t n = leaf.shape()[d];
          if (size < 0) {
            size = n;
            first = name + " has size " + std::to_string(n) + " along dim " + std::to_string(d);
          } else if (n != size) {
            raise<ValueError>(located("vmap", where),
                              ": mapped arrays have different sizes along their mapped dims: ", first, ", ",
                              name, " has size ", n, " along dim ", d,
                              " (every mapped dim must have the batch's size)");
          }
        },
        arg);
  }
}

/// `arg` with each array batched at `level` along `axis` (as it is for None).
template <typename Arg>
Arg vmap_wrap(const Arg& arg, const BatchAxis& axis, std::uint64_t level, const std::string& spmd_axis) {
  if constexpr (!has_leaves<Arg>) {
    return arg;
  } else {
    if (axis.is_none())  // the same for every example: aliases, not copies of the arrays
      return tree_map([](const auto& leaf) { return leaf.alias(); }, arg);
    return tree_map(
        [&](const auto& leaf) {
          using X = std::remove_cvref_t<decltype(leaf)>;
          const int d = resolve_dim(axis.dim(), leaf.ndim(), "vmap in_axes");
          X phys = leaf.alias();
          if constexpr (is_sharded_v<X>) {
            if (!spmd_axis.empty()) {
              std::vector<SpecEntry> e = phys.spec().entries();
              if (static_cast<int>(e.size()) <= d) e.resize(static_cast<std::size_t>(d) + 1);
              if (!(e[d] == SpecEntry(spmd_axis))) {
                e[d] = SpecEntry(spmd_axis);
                phys = reshard(phys, NamedSharding(phys.mesh(), PartitionSpec(std::move(e))));
              }
            }
          }
          return make_batched(std::move(phys), d, level);
        },
        arg);
  }
}

/// An output's array: its memory when nothing else shares it, else a copy (inside vmap the rules
/// reshape by views, so an output may share an input's memory: writing the input's elements
/// must not change it).
template <typename X>
X detached(const X& x) {
  if constexpr (is_tensor_v<X>) {
    return x.unique_storage() ? x.alias() : X(x);
  } else {
    if (x.batch()) return x.alias();  // traced by an enclosing jit: its replay makes new arrays
    for (const auto& s : x.addressable_shards())
      if (!s.data.unique_storage() && s.data.size() > 0) return X(x);
    return x.alias();
  }
}

/// One output array at `level` with its batch dim at `axis` (repeated along it when it does not
/// depend on the batch; as it is for None).
template <typename X>
X vmap_unwrap_leaf(const X& out, const BatchAxis& axis, std::uint64_t level, std::int64_t size,
                   const std::string& name, const shard::source_location& where) {
  int bdim = -1;
  const X& phys = physical_at(out, level, bdim);
  if (axis.is_none()) {
    if (bdim >= 0)
      raise<ValueError>(located("vmap", where), ": out_axes is None for ", name,
                        ", but it depends on the batch (it has a batch dim); give it an out axis");
    return detached(phys);
  }
  if (bdim < 0) {
    const int d = resolve_dim(axis.dim(), phys.ndim() + 1, "vmap out_axes");
    std::vector<X> copies;
    copies.reserve(static_cast<std::size_t>(size));
    for (std::int64_t i = 0; i < size; ++i) copies.push_back(phys.alias());
    return stack(copies, d);
  }
  const int d = resolve_dim(axis.dim(), phys.ndim(), "vmap out_axes");
  if (d == bdim) return detached(phys);
  return moveaxis(phys, bdim, d);
}

template <typename Out>
auto vmap_unwrap(const Out& out, const BatchAxis& axis, std::uint64_t level, std::int64_t size,
                 const std::string& name, const shard::source_location& where) {
  if constexpr (!has_leaves<Out>) {
    return out;
  } else {
    return tree_map_with_path(
        [&](const TreePath& path, const auto& leaf) {
          return vmap_unwrap_leaf(leaf, axis, level, size, name + path.to_string(), where);
        },
        out);
  }
}

}  // namespace detail

/// What vmap returns: call it with the batched arguments.
template <typename F>
class Vmapped {
 public:
  Vmapped(F f, VmapAxes in_axes, VmapAxes out_axes, VmapOptions options, shard::source_location where)
      : f_(std::move(f)),
        in_(std::move(in_axes)),
        out_(std::move(out_axes)),
        options_(std::move(options)),
        where_(where) {}

  template <typename... Args>
  auto operator()(const Args&... args) const {
    const detail::CallScope scope("vmap", where_);
    if (in_.per_argument() && in_.size() != sizeof...(Args))
      raise<ValueError>(located("vmap", where_), ": in_axes ", in_.to_string(), " has ", in_.size(),
                        " entries but the function is called with ", sizeof...(Args),
                        " arguments (one entry per argument, or a single entry for all)");
    std::int64_t size = -1;
    std::string first;
    {
      std::size_t i = 0;
      (
          [&] {
            detail::vmap_sizes(args, i, in_[i], size, first, where_);
            ++i;
          }(),
          ...);
    }
    if (size < 0) {
      if (options_.axis_size < 0)
        raise<ValueError>(located("vmap", where_),
                          ": no argument is mapped (in_axes all None) and no axis_size is given; pass "
                          "VmapOptions{.axis_size = n}");
      size = options_.axis_size;
    } else if (options_.axis_size >= 0 && options_.axis_size != size) {
      raise<ValueError>(located("vmap", where_), ": axis_size is ", options_.axis_size, " but ", first);
    }
    const std::uint64_t level = detail::next_transform_id();
    using Out = std::invoke_result_t<const F&, const Args&...>;
    std::optional<Out> out;
    {
      const detail::BatchFrameScope frame(
          detail::BatchFrame{level, size, options_.axis_name, options_.loop_fallback});
      auto wrapped = [&]<std::size_t... I>(std::index_sequence<I...>) {
        return std::tuple<Args...>{detail::vmap_wrap(args, in_[I], level, options_.spmd_axis_name)...};
      }
      (std::index_sequence_for<Args...>{});
      out.emplace(std::apply(f_, wrapped));
    }
    return unwrap(*out, level, size);
  }

 private:
  template <typename Out>
  auto unwrap(const Out& out, std::uint64_t level, std::int64_t size) const {
    if constexpr (detail::is_tuple_like<Out>::value) {
      constexpr std::size_t n = std::tuple_size_v<Out>;
      if (out_.per_argument() && out_.size() != n)
        raise<ValueError>(located("vmap", where_), ": out_axes ", out_.to_string(), " has ", out_.size(),
                          " entries but the function returns ", n, " values");
      return [&]<std::size_t... I>(std::index_sequence<I...>) {
        return Out{detail::vmap_unwrap(std::get<I>(out), out_[I], level, size, "output " + std::to_string(I),
                                       where_)...};
      }
      (std::make_index_sequence<n>{});
    } else {
      if (out_.per_argument() && out_.size() != 1)
        raise<ValueError>(located("vmap", where_), ": out_axes ", out_.to_string(), " has ", out_.size(),
                          " entries but the function returns one value");
      return detail::vmap_unwrap(out, out_[0], level, size, "the output", where_);
    }
  }

  F f_;
  VmapAxes in_;
  VmapAxes out_;
  VmapOptions options_;
  shard::source_location where_;
};

/// jax.vmap(f, in_axes, out_axes, axis_name=..., axis_size=..., spmd_axis_name=...).
template <typename F>
Vmapped<F> vmap(F f, VmapAxes in_axes = 0, VmapAxes out_axes = 0, VmapOptions options = {},
                shard::source_location where = shard::source_location::current()) {
  return Vmapped<F>(std::move(f), std::move(in_axes), std::move(out_axes), std::move(options), where);
}

}  // namespace shard
