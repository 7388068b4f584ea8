#pragma once
/// \file The named-axis collectives inside vmap (internals of the free collectives of
/// spmd/shard_map.hpp; DESIGN.md "jit and vmap"). An axis name that names an active vmap
/// (VmapOptions::axis_name) is the batch: psum / pmean / pmax / pmin over it reduce the batch
/// dim (the result no longer depends on the example, as in JAX), all_gather stacks or joins the
/// examples, axis_index is each example's position. The other names are mesh axes of the
/// enclosing shard_map body; a collective over them on a batched value runs on the physical
/// array (the batch dim moved first, the collective's dims shifted past it).

#include <cstdint>
#include <string>
#include <vector>

#include "shard/array/driver.hpp"
#include "shard/core/detail/batch.hpp"
#include "shard/core/shape_ops.hpp"
#include "shard/core/tensor_ops.hpp"
#include "shard/sharding/partition_spec.hpp"

namespace shard::detail {

/// The vmap frames `axes` names (innermost first as listed) and the remaining mesh axes.
struct VmapAxesSplit {
  std::vector<const BatchFrame*> frames;
  SpecEntry mesh;
};
inline VmapAxesSplit split_vmap_axes(const SpecEntry& axes) {
  VmapAxesSplit s;
  std::vector<std::string> rest;
  for (const auto& a : axes.axes()) {
    if (const BatchFrame* f = batch_frame_named(a))
      s.frames.push_back(f);
    else
      rest.push_back(a);
  }
  s.mesh = SpecEntry(std::move(rest));
  return s;
}

/// x reduced over the batch of `frame` (psum: kSum, pmax, pmin; pmean: kMean on floating x):
/// an unbatched x is the same for every example (psum multiplies it by the batch size).
template <Dtype T, typename F>
auto on_batched_physical(const Tensor<T>& x, F&& f);

template <Dtype T>
Tensor<T> vmap_reduce(const Tensor<T>& x, const BatchFrame& frame, ReduceKind kind) {
  if (x.batch() && x.batch()->level > frame.level)  // batched by an inner vmap: its examples first
    return on_batched_physical(x, [&](Tensor<T> p, int) { return vmap_reduce(p, frame, kind); });
  int bdim = -1;
  const Tensor<T>& phys = physical_at(x, frame.level, bdim);
  if (bdim < 0) {
    if (kind == ReduceKind::kSum) {
      if constexpr (std::is_same_v<T, bool>)
        return x.alias();  // a logical or of equal values
      else
        return binary(x, static_cast<T>(frame.size), BinaryOp::kMul);
    }
    return x.alias();
  }
  return reduce(phys, kind, Dims(bdim), false);
}

/// all_gather over the batch of `frame`: untiled stacks the examples along a new dim `dim`,
/// tiled joins them along `dim`.
template <Dtype T>
Tensor<T> vmap_all_gather(const Tensor<T>& x, const BatchFrame& frame, int dim, bool tiled) {
  if (x.batch() && x.batch()->level > frame.level) {  // batched by an inner vmap: dims past its batch
    const int r = x.ndim();
    const int d = resolve_dim(dim, tiled ? r : r + 1, "all_gather");
    return on_batched_physical(x, [&](Tensor<T> p, int) { return vmap_all_gather(p, frame, d + 1, tiled); });
  }
  int bdim = -1;
  const Tensor<T>& phys = physical_at(x, frame.level, bdim);
  const int rank = x.ndim();
  if (tiled && rank == 0)
    raise<ShapeError>("all_gather: tiled needs an operand of rank >= 1; got a 0-d array");
  const int d = resolve_dim(dim, tiled ? rank : rank + 1, "all_gather");
  Tensor<T> stacked;
  if (bdim < 0) {
    std::vector<Tensor<T>> copies;
    for (std::int64_t i = 0; i < frame.size; ++i) copies.push_back(x.alias());
    stacked = stack(copies, 0);
  } else {
    stacked = bdim == 0 ? phys.alias() : moveaxis(phys, bdim, 0);
  }
  if (!tiled) return d == 0 ? stacked : moveaxis(stacked, 0, d);
  // tiled: the batch next to `dim`, then the two merged.
  Tensor<T> moved = d == 0 ? std::move(stacked) : moveaxis(stacked, 0, d);
  Shape s = moved.shape();
  s[d] *= s[d + 1];
  s.erase(s.begin() + d + 1);
  return reshape(moved, s);
}

/// The index of each example along the batch of `frame` (int32, batched at its level).
inline Tensor<std::int32_t> vmap_axis_index(const BatchFrame& frame) {
  return make_batched(arange<std::int32_t>(static_cast<std::int32_t>(frame.size)), 0, frame.level);
}

/// A mesh collective `f(physical, example_rank)` on a batched x: x's physical array with its
/// batch dim first; the result is batched the same way (batch dim 0).
template <Dtype T, typename F>
auto on_batched_physical(const Tensor<T>& x, F&& f) {
  const std::uint64_t level = x.batch()->level;
  int bdim = -1;
  const Tensor<T>& phys = physical_at(x, level, bdim);
  Tensor<T> front = bdim == 0 ? phys.alias() : moveaxis(phys, bdim, 0);
  return make_batched(f(std::move(front), x.ndim()), 0, level);
}

}  // namespace shard::detail
