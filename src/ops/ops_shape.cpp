// Shape and indexing ops on ShardedArrays, each the Tensor op of the same name on every block
// plus the data movement its layout needs:
//   transpose, expand_dims        local (spec entries move with their dims)
//   reshape, squeeze              local, or first a reshard of the dims that cannot stay split
//   slice, concatenate, stack     redistribute (redistribute.hpp): each device receives the
//                                 parts of its new box it does not hold; nothing when none moves
//   take, take_along_axis         local gathers; a split gathered dim adds one psum
//   dot, vdot                     matmul / sum of products

#include <algorithm>
#include <numeric>
#include <optional>

#include "ops/ops_internal.hpp"
#include "shard/ops/shape.hpp"
#include "shard/array/detail/node_meta.hpp"
#include "shard/core/trace.hpp"
#include "array/redistribute.hpp"
#include "shard/error.hpp"
#include "shard/core/detail/int_wrap.hpp"
#include "core/tensor_kernels.hpp"

namespace shard {

namespace {

template <typename T, typename F>
ShardedArray<T> blockwise(const ShardedArray<T>& a, const Shape& out_shape, const NamedSharding& out, F&& f) {
  std::vector<Tensor<T>> blocks;
  for (const auto& s : a.addressable_shards()) blocks.push_back(f(s.data));
  return detail::assemble(out_shape, out, std::move(blocks));
}

/// a's spec with the entries of `dims` set to None (a reshard gathers those dims only).
NamedSharding without_dims(const NamedSharding& s, const std::vector<int>& dims) {
  std::vector<SpecEntry> entries = s.spec().entries();
  for (int d : dims)
    if (d < static_cast<int>(entries.size())) entries[d] = SpecEntry();
  return NamedSharding(s.mesh(), PartitionSpec(std::move(entries)));
}

}  // namespace

namespace detail {

template <Dtype T>
ShardedArray<T> transpose_sharded(const ShardedArray<T>& a, std::vector<int> perm) {
  const int rank = a.ndim();
  if (perm.empty())
    for (int k = rank - 1; k >= 0; --k) perm.push_back(k);
  detail::check_permutation(perm, a.shape());
  Shape out_shape;
  std::vector<SpecEntry> entries;
  for (int p : perm) {
    out_shape.push_back(a.shape()[p]);
    entries.push_back(a.spec()[p]);
  }
  const NamedSharding out(a.mesh(), PartitionSpec(std::move(entries)));
  return blockwise(a, out_shape, out, [&](const Tensor<T>& b) { return transpose_kernel(b, perm); });
}

template <Dtype T>
ShardedArray<T> expand_dims_sharded(const ShardedArray<T>& a, int axis) {
  const int ax = resolve_dim(axis, a.ndim() + 1, "expand_dims");
  Shape out_shape = a.shape();
  out_shape.insert(out_shape.begin() + ax, 1);
  std::vector<SpecEntry> entries;
  for (int d = 0; d < a.ndim(); ++d) entries.push_back(a.spec()[d]);
  entries.insert(entries.begin() + ax, SpecEntry());
  const NamedSharding out(a.mesh(), PartitionSpec(std::move(entries)));
  return blockwise(a, out_shape, out, [&](const Tensor<T>& b) { return Tensor<T>(b).reshaped(expand_dims_shape(b.shape(), ax)); });
}

template <Dtype T>
ShardedArray<T> squeeze_sharded(const ShardedArray<T>& a, const Dims& dims) {
  const std::vector<int> drop = squeezed_dims(a.shape(), dims);
  const ShardedArray<T> g = reshard(a, without_dims(a.sharding(), drop));  // a split size-1 dim: gather it
  Shape out_shape;
  std::vector<SpecEntry> entries;
  for (int d = 0; d < a.ndim(); ++d)
    if (!std::binary_search(drop.begin(), drop.end(), d)) {
      out_shape.push_back(a.shape()[d]);
      entries.push_back(g.spec()[d]);
    }
  const NamedSharding out(a.mesh(), PartitionSpec(std::move(entries)));
  return blockwise(g, out_shape, out, [&](const Tensor<T>& b) { return Tensor<T>(b).reshaped(squeeze_shape(b.shape(), Dims(drop))); });
}

}  // namespace detail

// ---------------------------------------------------------------- reshape

namespace {

/// One group of a reshape: input dims [i0, i1) and output dims [j0, j1) with equal products.
struct ReshapeGroup {
  int i0, i1, j0, j1;
};

std::vector<ReshapeGroup> reshape_groups(const Shape& in, const Shape& out) {
  std::vector<ReshapeGroup> groups;
  const int ni = static_cast<int>(in.size()), no = static_cast<int>(out.size());
  int i = 0, j = 0;
  while (i < ni || j < no) {
    if (i < ni && j < no && in[i] == 1 && out[j] == 1) {  // size 1 on both sides: a dim kept as it is
      groups.push_back({i, i + 1, j, j + 1});
      ++i;
      ++j;
      continue;
    }
    if (i < ni && in[i] == 1 && !(j < no && out[j] == 1)) {  // a lone size-1 input dim
      groups.push_back({i, i + 1, j, j});
      ++i;
      continue;
    }
    if (j < no && out[j] == 1 && !(i < ni && in[i] == 1)) {  // a lone size-1 output dim
      groups.push_back({i, i, j, j + 1});
      ++j;
      continue;
    }
    ReshapeGroup g{i, i, j, j};
    std::int64_t pi = 1, po = 1;
    do {
      if (pi <= po && g.i1 < ni) pi *= in[g.i1++];
      else if (g.j1 < no) po *= out[g.j1++];
      else break;
    } while (pi != po || (g.i1 == g.i0 || g.j1 == g.j0));
    groups.push_back(g);
    i = g.i1;
    j = g.j1;
  }
  return groups;
}

}  // namespace

template <Dtype T>
ShardedArray<T> detail::reshape_sharded(const ShardedArray<T>& a, const Shape& shape) {
  const Shape resolved = resolve_reshape(a.shape(), shape);  // the Tensor rule for -1 (metadata only)
  const auto groups = reshape_groups(a.shape(), resolved);
  std::vector<int> gather;                           // input dims that must be unsplit first
  std::vector<SpecEntry> entries(resolved.size());   // the result's spec
  for (const auto& g : groups) {
    bool only_major = true;
    for (int d = g.i0 + 1; d < g.i1; ++d) only_major = only_major && a.spec()[d].is_none();
    if (g.i1 == g.i0 || a.spec()[g.i0].is_none()) {
      if (!only_major)
        for (int d = g.i0; d < g.i1; ++d) gather.push_back(d);
      continue;
    }
    const int parts = a.sharding().num_parts(g.i0);
    std::int64_t inner_in = 1, inner_out = 1;
    for (int d = g.i0 + 1; d < g.i1; ++d) inner_in *= a.shape()[d];
    for (int d = g.j0 + 1; d < g.j1; ++d) inner_out *= resolved[d];
    const bool stays = only_major && g.j1 > g.j0 && a.shape()[g.i0] % parts == 0 &&
                       (a.shape()[g.i0] / parts * inner_in) % inner_out == 0;
    if (stays) entries[g.j0] = a.spec()[g.i0];
    else
      for (int d = g.i0; d < g.i1; ++d) gather.push_back(d);
  }
  std::optional<ShardedArray<T>> gathered;
  const ShardedArray<T>& g = gather.empty() ? a : gathered.emplace(reshard(a, without_dims(a.sharding(), gather)));
  const NamedSharding out(a.mesh(), PartitionSpec(std::move(entries)));
  std::vector<Tensor<T>> blocks;
  for (const auto& s : g.addressable_shards()) blocks.push_back(s.data.reshaped(out.box(s.device, resolved).extent));
  return detail::assemble(resolved, out, std::move(blocks));
}

// ---------------------------------------------------------------- slicing

namespace {

/// The result-coordinate range of the source elements [lo, lo + n) of a dim sliced by r.
SliceRange image_of(const SliceRange& r, std::int64_t lo, std::int64_t n) {
  SliceRange out;  // start = first result index, count = how many
  if (n <= 0 || r.count == 0) return out;
  const std::int64_t hi = lo + n;  // source [lo, hi)
  std::int64_t j0, j1;             // result [j0, j1)
  if (r.step > 0) {
    j0 = lo <= r.start ? 0 : (lo - r.start + r.step - 1) / r.step;
    j1 = hi <= r.start ? 0 : (hi - r.start + r.step - 1) / r.step;
  } else {
    const std::int64_t k = -r.step;  // index start - j*k in [lo, hi)
    j0 = r.start < hi ? 0 : (r.start - hi) / k + 1;
    j1 = r.start < lo ? 0 : (r.start - lo) / k + 1;
  }
  j0 = std::clamp<std::int64_t>(j0, 0, r.count);
  j1 = std::clamp<std::int64_t>(j1, 0, r.count);
  out.start = j0;
  out.count = std::max<std::int64_t>(0, j1 - j0);
  return out;
}

}  // namespace

template <Dtype T>
ShardedArray<T> detail::slice_sharded(const ShardedArray<T>& a, const std::vector<Index>& index) {
  const IndexPlan p = plan_index(a.shape(), index);
  std::vector<SpecEntry> entries;
  for (int d = 0; d < a.ndim(); ++d)
    if (!p.dropped[d]) entries.push_back(a.spec()[d]);
  const NamedSharding out(a.mesh(), PartitionSpec(std::move(entries)));
  // Each device's piece: the image of its box under the index, in result coordinates.
  std::vector<detail::SourcePiece> pieces;
  for (int dev : a.mesh().device_ids()) {
    const Box b = a.sharding().box(dev, a.shape());
    Box piece;
    bool empty = false;
    for (int d = 0; d < a.ndim(); ++d) {
      const SliceRange img = image_of(p.ranges[d], b.offset[d], b.extent[d]);
      if (img.count == 0) empty = true;
      if (p.dropped[d]) continue;
      piece.offset.push_back(img.start);
      piece.extent.push_back(img.count);
    }
    if (!empty) pieces.push_back({dev, 0, piece});
  }
  // Copy a piece out of a device's block: result index j of dim d is source index start + j*step.
  const detail::FetchPiece<T> fetch = [&](int dev, int, const Box& box, T* o) {
    const auto& s = a.shard_of(dev);
    std::vector<Index> local;
    for (int d = 0, k = 0; d < a.ndim(); ++d) {
      const SliceRange& r = p.ranges[d];
      if (p.dropped[d]) {
        local.emplace_back(r.start - s.box.offset[d]);
        continue;
      }
      const std::int64_t first = r.start + box.offset[k] * r.step - s.box.offset[d];
      const std::int64_t last = first + (box.extent[k] - 1) * r.step;
      local.emplace_back(Slice(first, r.step > 0 ? SliceBound(last + 1) : (last > 0 ? SliceBound(last - 1) : SliceBound()), r.step));
      ++k;
    }
    const Tensor<T> t = slice_kernel(s.data, local);
    std::copy(t.begin(), t.end(), o);
  };
  return detail::redistribute<T>(p.out_shape, out, pieces, fetch, "slice");
}

template <Dtype T>
ShardedArray<T> detail::concatenate_sharded(const std::vector<ShardedArray<T>>& xs, int axis) {
  const int rank = xs[0].ndim();
  const int a = detail::concatenate_axis(axis, rank);
  Shape out_shape = xs[0].shape();
  out_shape[a] = 0;
  const ShardedArray<T>* first_committed = &xs[0];
  for (std::size_t i = 0; i < xs.size(); ++i) {
    detail::check_same_devices(xs[0].mesh(), xs[i].mesh(), "concatenate");
    detail::check_concatenate_operand(xs[0].shape(), xs[i].shape(), i, a);
    out_shape[a] += xs[i].shape()[a];
    if (!first_committed->committed() && xs[i].committed()) first_committed = &xs[i];
  }
  const NamedSharding& out = first_committed->sharding();
  std::vector<detail::SourcePiece> pieces;
  std::vector<std::int64_t> at;  // each operand's offset along the axis
  std::int64_t off = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    at.push_back(off);
    for (int dev : xs[i].mesh().device_ids()) {
      Box b = xs[i].sharding().box(dev, xs[i].shape());
      b.offset[a] += off;
      pieces.push_back({dev, static_cast<int>(i), b});
    }
    off += xs[i].shape()[a];
  }
  const detail::FetchPiece<T> fetch = [&](int dev, int src, const Box& box, T* o) {
    const auto& s = xs[static_cast<std::size_t>(src)].shard_of(dev);
    Shape origin = s.box.offset;
    origin[a] += at[static_cast<std::size_t>(src)];
    copy_box(s.data.data(), s.box.extent, origin, o, box.extent, box.offset, box, sizeof(T));
  };
  return detail::redistribute<T>(out_shape, out, pieces, fetch, "concatenate");
}

template <Dtype T>
ShardedArray<T> detail::stack_sharded(const std::vector<ShardedArray<T>>& xs, int axis) {
  const int a = resolve_dim(axis, xs[0].ndim() + 1, "stack");
  std::vector<ShardedArray<T>> expanded;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    detail::check_stack_operand(xs[0].shape(), xs[i].shape(), i);
    expanded.push_back(expand_dims_sharded(xs[i], a));
  }
  return concatenate_sharded(expanded, a);
}

// ---------------------------------------------------------------- gathers

namespace {

/// The spec of `s` without the mesh axes in `taken`.
PartitionSpec without_axes(const PartitionSpec& s, int rank, const std::vector<std::string>& taken) {
  std::vector<SpecEntry> entries;
  for (int d = 0; d < rank; ++d) {
    std::vector<std::string> keep;
    for (const auto& n : s[d].axes())
      if (std::find(taken.begin(), taken.end(), n) == taken.end()) keep.push_back(n);
    entries.emplace_back(keep);
  }
  return PartitionSpec(std::move(entries));
}

/// take of a block whose `axis` dim holds global rows [lo, lo + n) of `global_n`: rows
/// outside give zeros (the psum over the split axes completes them).
template <typename T, typename I>
Tensor<T> masked_take(const Tensor<T>& x, const Tensor<I>& idx, int axis, std::int64_t lo, std::int64_t global_n) {
  const auto v = detail::three_dims(x.shape(), axis, axis + 1);
  Shape out_shape(x.shape().begin(), x.shape().begin() + axis);
  out_shape.insert(out_shape.end(), idx.shape().begin(), idx.shape().end());
  out_shape.insert(out_shape.end(), x.shape().begin() + axis + 1, x.shape().end());
  Tensor<T> out(out_shape, T(0));
  const std::int64_t m = idx.size();
  for (std::int64_t j = 0; j < m; ++j) {
    const auto i = static_cast<std::int64_t>(idx.flat(j));
    const std::int64_t g = i < 0 ? i + global_n : i;
    if (g < 0 || g >= global_n)
      raise<ShapeError>("take: index ", i, " is out of bounds for dim ", axis, " with size ", global_n);
    const std::int64_t r = g - lo;
    if (r < 0 || r >= v.n || v.inner == 0) continue;
    for (std::int64_t o = 0; o < v.outer; ++o)
      std::copy_n(x.data() + (o * v.n + r) * v.inner, v.inner, out.data() + (o * m + j) * v.inner);
  }
  return out;
}

}  // namespace

template <Dtype T, Dtype I>
ShardedArray<T> detail::take_sharded(const ShardedArray<T>& x, const ShardedArray<I>& indices, int axis) {
  const int a = resolve_dim(axis, x.ndim(), "take");
  const std::vector<std::string> x_axes = x.spec().axes();
  // Indices keep the axes x does not use, on x's mesh.
  const NamedSharding idx_sharding(x.mesh(), without_axes(equivalent_sharding(indices.sharding(), indices.shape(), x.mesh())
                                                              .value_or(NamedSharding(x.mesh(), PartitionSpec()))
                                                              .spec(),
                                                          indices.ndim(), x_axes));
  std::optional<ShardedArray<I>> keep;
  const ShardedArray<I>& li = detail::lined_up(indices, idx_sharding, keep);
  Shape out_shape(x.shape().begin(), x.shape().begin() + a);
  out_shape.insert(out_shape.end(), indices.shape().begin(), indices.shape().end());
  out_shape.insert(out_shape.end(), x.shape().begin() + a + 1, x.shape().end());
  std::vector<SpecEntry> entries;
  for (int d = 0; d < a; ++d) entries.push_back(x.spec()[d]);
  for (int d = 0; d < indices.ndim(); ++d) entries.push_back(idx_sharding.spec()[d]);
  for (int d = a + 1; d < x.ndim(); ++d) entries.push_back(x.spec()[d]);
  const NamedSharding out(x.mesh(), PartitionSpec(std::move(entries)));
  const SpecEntry split = x.spec()[a];
  std::vector<Tensor<T>> blocks;
  for (std::size_t i = 0; i < x.addressable_shards().size(); ++i) {
    const auto& s = x.addressable_shards()[i];
    const auto& ib = li.addressable_shards()[i].data;
    blocks.push_back(split.is_none() ? take_kernel(s.data, ib, a) : masked_take(s.data, ib, a, s.box.offset[a], x.shape()[a]));
  }
  return detail::combine_over(std::move(blocks), split, ReduceKind::kSum, out, out_shape);
}

template <Dtype T, Dtype I>
ShardedArray<T> detail::take_along_axis_sharded(const ShardedArray<T>& x, const ShardedArray<I>& indices, int axis) {
  if (indices.ndim() != x.ndim())
    raise<ShapeError>("take_along_axis: indices of shape ", to_string(indices.shape()), " and an array of shape ",
                      to_string(x.shape()), " need the same number of dims");
  const int a = resolve_dim(axis, x.ndim(), "take_along_axis");
  const Shape out_shape = detail::take_along_axis_shape(x.shape(), indices.shape(), a);
  // The result: x's spec on the other dims (None where x is broadcast) and None along the axis.
  std::vector<SpecEntry> entries;
  for (int d = 0; d < x.ndim(); ++d) entries.push_back(d == a || x.shape()[d] != out_shape[d] ? SpecEntry() : x.spec()[d]);
  const NamedSharding out(x.mesh(), PartitionSpec(entries));
  const NamedSharding want_idx = detail::matching_sharding(out, out_shape, indices.shape());
  std::vector<SpecEntry> x_entries = entries;
  x_entries[a] = x.spec()[a];
  const NamedSharding want_x = detail::matching_sharding(NamedSharding(x.mesh(), PartitionSpec(x_entries)), out_shape, x.shape());
  std::vector<SpecEntry> xe = want_x.spec().entries();
  xe.resize(static_cast<std::size_t>(x.ndim()));
  xe[a] = x.spec()[a];
  std::optional<ShardedArray<T>> keep_x;
  std::optional<ShardedArray<I>> keep_i;
  const ShardedArray<T>& lx = detail::lined_up(x, NamedSharding(x.mesh(), PartitionSpec(xe)), keep_x);
  const ShardedArray<I>& li = detail::lined_up(indices, want_idx, keep_i);
  const SpecEntry split = x.spec()[a];
  std::vector<Tensor<T>> blocks;
  for (std::size_t i = 0; i < lx.addressable_shards().size(); ++i) {
    const auto& s = lx.addressable_shards()[i];
    const auto& ib = li.addressable_shards()[i].data;
    if (split.is_none()) {
      blocks.push_back(take_along_axis_kernel(s.data, ib, a));
      continue;
    }
    // Masked: indices shifted into this block; those outside pick nothing (zero).
    const std::int64_t lo = s.box.offset[a], n = s.data.shape()[a], global_n = x.shape()[a];
    Tensor<I> local(ib.shape());
    Tensor<bool> inside(ib.shape());
    for (std::int64_t k = 0; k < ib.size(); ++k) {
      const auto v = static_cast<std::int64_t>(ib.flat(k));
      const std::int64_t g = v < 0 ? v + global_n : v;
      if (g < 0 || g >= global_n)
        raise<ShapeError>("take_along_axis: index ", v, " is out of bounds for dim ", a, " with size ", global_n);
      inside.flat(k) = g >= lo && g < lo + n;
      local.flat(k) = static_cast<I>(inside.flat(k) ? g - lo : 0);
    }
    if (n == 0) {  // an empty block along the axis picks nothing
      Shape own = s.data.shape();
      own[a] = 1;
      Shape bs = broadcast_shapes(own, ib.shape());
      bs[a] = ib.shape()[a];
      blocks.emplace_back(bs, T(0));
      continue;
    }
    Tensor<T> picked = take_along_axis_kernel(s.data, local, a);
    blocks.push_back(where(broadcast_to(inside, picked.shape()), picked, Tensor<T>(Shape{}, T(0))));
  }
  return detail::combine_over(std::move(blocks), split, ReduceKind::kSum, out, out_shape);
}

// ---------------------------------------------------------------- products

template <Dtype T>
ShardedArray<T> dot(const ShardedArray<T>& a, const ShardedArray<T>& b) {
  if (a.ndim() == 0 || b.ndim() == 0) return binary(a, b, BinaryOp::kMul);
  if (b.ndim() > 2)
    raise<ShapeError>("dot of sharded arrays with a ", b.ndim(), "-D right operand: use matmul (batched) instead");
  return matmul(a, b);
}

// ---------------------------------------------------------------- transposes (autodiff)

namespace detail {

template <Dtype T>
ShardedArray<T> slice_transpose(const ShardedArray<T>& ct, const NodeMeta<ShardedArray<T>>& x,
                                const std::vector<Index>& index) {
  const IndexPlan p = plan_index(x.shape, index);
  const int rank = static_cast<int>(x.shape.size());
  for (int d = 0; d < rank; ++d)
    if (!p.dropped[d] && p.ranges[d].step != 1 && p.ranges[d].count > 1)
      raise_not_differentiable("slice", "a strided slice (step " + std::to_string(p.ranges[d].step) +
                                            ") of a sharded array; slice with step 1, or use take");
  // Each device's block of ct, placed at its position in x; zeros elsewhere.
  std::vector<SourcePiece> pieces;
  for (int dev : ct.mesh().device_ids()) {
    const Box cb = ct.sharding().box(dev, ct.shape());
    Box xb;
    bool empty = false;
    for (int d = 0, k = 0; d < rank; ++d) {
      if (p.dropped[d]) {
        xb.offset.push_back(p.ranges[d].start);
        xb.extent.push_back(1);
        continue;
      }
      xb.offset.push_back(p.ranges[d].start + cb.offset[k]);
      xb.extent.push_back(cb.extent[k]);
      empty = empty || cb.extent[k] == 0;
      ++k;
    }
    if (!empty) pieces.push_back({dev, 0, xb});
  }
  const FetchPiece<T> fetch = [&](int dev, int, const Box& box, T* o) {
    const auto& s = ct.shard_of(dev);
    Box rel;
    for (int d = 0, k = 0; d < rank; ++d) {
      if (p.dropped[d]) continue;
      rel.offset.push_back(box.offset[d] - p.ranges[d].start - s.box.offset[k]);
      rel.extent.push_back(box.extent[d]);
      ++k;
    }
    const Tensor<T> t = s.data.slice(rel);
    std::copy(t.begin(), t.end(), o);
  };
  return redistribute<T>(x.shape, x.sharding, pieces, fetch, "slice transpose", true);
}

template <Dtype T, Dtype I>
ShardedArray<T> take_transpose(const ShardedArray<T>& ct, const ShardedArray<I>& indices,
                               const NodeMeta<ShardedArray<T>>& x, int axis) {
  const Mesh& mesh = x.sharding.mesh();
  const int a = resolve_dim(axis, static_cast<int>(x.shape.size()), "take");
  // The indices lined up as the forward pass had them (take above).
  const NamedSharding idx_sharding(mesh, without_axes(equivalent_sharding(indices.sharding(), indices.shape(), mesh)
                                                          .value_or(NamedSharding(mesh, PartitionSpec()))
                                                          .spec(),
                                                      indices.ndim(), x.sharding.spec().axes()));
  std::optional<ShardedArray<I>> keep;
  const ShardedArray<I>& li = lined_up(indices, idx_sharding, keep);
  // Each device scatters its rows of ct into its box of x; the devices that differ along the
  // indices' axes hold parts of the sum (one psum over those axes).
  std::vector<Tensor<T>> blocks;
  const auto local = mesh.local_device_ids();
  for (std::size_t i = 0; i < local.size(); ++i) {
    const Box b = x.sharding.box(local[i], x.shape);
    Tensor<T> out(b.extent, T(0));
    const Tensor<T>& c = ct.addressable_shards()[i].data;
    const Tensor<I>& ib = li.addressable_shards()[i].data;
    const auto v = three_dims(b.extent, a, a + 1);
    const std::int64_t m = ib.size(), n_global = x.shape[a];
    for (std::int64_t j = 0; j < m; ++j) {
      const auto g0 = static_cast<std::int64_t>(ib.flat(j));
      const std::int64_t r = (g0 < 0 ? g0 + n_global : g0) - b.offset[a];
      if (r < 0 || r >= v.n || v.inner == 0) continue;
      for (std::int64_t o = 0; o < v.outer; ++o) {
        T* dst = out.data() + (o * v.n + r) * v.inner;
        const T* src = c.data() + (o * m + j) * v.inner;
        for (std::int64_t k = 0; k < v.inner; ++k) dst[k] = detail::add_wrap(dst[k], src[k]);
      }
    }
    blocks.push_back(std::move(out));
  }
  const std::vector<std::string> idx_axes = idx_sharding.spec().axes();
  return combine_over(std::move(blocks), idx_axes.empty() ? SpecEntry() : SpecEntry(idx_axes), ReduceKind::kSum,
                      x.sharding, x.shape);
}

template <Dtype T, Dtype I>
ShardedArray<T> take_along_axis_transpose(const ShardedArray<T>& ct, const ShardedArray<I>& indices,
                                          const NodeMeta<ShardedArray<T>>& x, int axis) {
  const Mesh& mesh = x.sharding.mesh();
  const int rank = static_cast<int>(x.shape.size());
  const int a = resolve_dim(axis, rank, "take_along_axis");
  // The layouts of the forward pass (take_along_axis above).
  const Shape& out_shape = ct.shape();
  const NamedSharding want_idx = matching_sharding(ct.sharding(), out_shape, indices.shape());
  std::vector<SpecEntry> x_entries = ct.sharding().spec().entries();
  x_entries.resize(static_cast<std::size_t>(rank));
  x_entries[a] = x.sharding.spec()[a];
  const NamedSharding want_x = matching_sharding(NamedSharding(mesh, PartitionSpec(x_entries)), out_shape, x.shape);
  std::vector<SpecEntry> xe = want_x.spec().entries();
  xe.resize(static_cast<std::size_t>(rank));
  xe[a] = x.sharding.spec()[a];
  const NamedSharding lx(mesh, PartitionSpec(xe));
  std::optional<ShardedArray<I>> keep_i;
  const ShardedArray<I>& li = lined_up(indices, want_idx, keep_i);
  std::vector<Tensor<T>> blocks;
  const auto local = mesh.local_device_ids();
  for (std::size_t i = 0; i < local.size(); ++i) {
    const Box b = lx.box(local[i], x.shape);
    const Tensor<T>& c = ct.addressable_shards()[i].data;
    const Tensor<I>& ib = li.addressable_shards()[i].data;
    const std::int64_t lo = b.offset[a], n = b.extent[a], global_n = x.shape[a];
    Tensor<I> local_idx(ib.shape());
    Tensor<bool> inside(ib.shape());
    for (std::int64_t k = 0; k < ib.size(); ++k) {
      const auto v = static_cast<std::int64_t>(ib.flat(k));
      const std::int64_t g = v < 0 ? v + global_n : v;
      inside.flat(k) = g >= lo && g < lo + n;
      local_idx.flat(k) = static_cast<I>(inside.flat(k) ? g - lo : 0);
    }
    if (n == 0) {
      blocks.emplace_back(b.extent, T(0));
      continue;
    }
    const Tensor<T> masked = where(inside, c, Tensor<T>(Shape{}, T(0)));
    blocks.push_back(take_along_axis_transpose(masked, local_idx, NodeMeta<Tensor<T>>(b.extent), a));
  }
  return assemble(x.shape, lx, std::move(blocks));
}

}  // namespace detail

#define SHARD_INSTANTIATE_SHAPE_OPS(T)                                                                  \
  template ShardedArray<T> detail::transpose_sharded<T>(const ShardedArray<T>&, std::vector<int>);      \
  template ShardedArray<T> detail::reshape_sharded<T>(const ShardedArray<T>&, const Shape&);            \
  template ShardedArray<T> detail::expand_dims_sharded<T>(const ShardedArray<T>&, int);                 \
  template ShardedArray<T> detail::squeeze_sharded<T>(const ShardedArray<T>&, const Dims&);             \
  template ShardedArray<T> detail::slice_sharded<T>(const ShardedArray<T>&, const std::vector<Index>&); \
  template ShardedArray<T> detail::concatenate_sharded<T>(const std::vector<ShardedArray<T>>&, int);    \
  template ShardedArray<T> detail::stack_sharded<T>(const std::vector<ShardedArray<T>>&, int);
// (array, index) type pairs: every dtype with int32 and int64 indices.
#define SHARD_INSTANTIATE_TAKE(T, I)                                                                      \
  template ShardedArray<T> detail::take_sharded<T, I>(const ShardedArray<T>&, const ShardedArray<I>&, int); \
  template ShardedArray<T> detail::take_along_axis_sharded<T, I>(const ShardedArray<T>&, const ShardedArray<I>&, int);
SHARD_FOR_EACH_DTYPE_PAIR(ALL, INT, SHARD_INSTANTIATE_TAKE)
#undef SHARD_INSTANTIATE_TAKE
#define SHARD_INSTANTIATE_TRANSPOSES(T)                \
  template ShardedArray<T> detail::slice_transpose<T>( \
      const ShardedArray<T>&, const detail::NodeMeta<ShardedArray<T>>&, const std::vector<Index>&);
SHARD_FOR_EACH_FLOAT_DTYPE(SHARD_INSTANTIATE_TRANSPOSES)
#undef SHARD_INSTANTIATE_TRANSPOSES
#define SHARD_INSTANTIATE_TAKE_TRANSPOSES(T, I)                                                         \
  template ShardedArray<T> detail::take_transpose<T, I>(const ShardedArray<T>&, const ShardedArray<I>&, \
                                                        const detail::NodeMeta<ShardedArray<T>>&, int); \
  template ShardedArray<T> detail::take_along_axis_transpose<T, I>(                                     \
      const ShardedArray<T>&, const ShardedArray<I>&, const detail::NodeMeta<ShardedArray<T>>&, int);
SHARD_FOR_EACH_DTYPE_PAIR(FLOAT, INT, SHARD_INSTANTIATE_TAKE_TRANSPOSES)
#undef SHARD_INSTANTIATE_TAKE_TRANSPOSES
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_SHAPE_OPS)
#undef SHARD_INSTANTIATE_SHAPE_OPS
#define SHARD_INSTANTIATE_PRODUCTS(T)                                             \
  template ShardedArray<T> dot<T>(const ShardedArray<T>&, const ShardedArray<T>&);
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_PRODUCTS)
#undef SHARD_INSTANTIATE_PRODUCTS

}  // namespace shard
