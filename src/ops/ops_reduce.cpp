// Reductions on ShardedArrays. Each device reduces its block with the Tensor kernel
//   partial[kept dims of its box] = reduce(block, dims)          local (pairwise sums)
// then one collective over the mesh axes that split the reduced dims combines the partials:
//   out[kept dims] = psum / pmax / pmin / product over those axes
// float32 and float64 sums cross devices as float64 partials and are rounded once at the end,
// so the result does not depend on the mesh beyond float64 rounding.

#include <limits>

#include "ops/ops_internal.hpp"
#include "shard/core/trace.hpp"
#include "shard/error.hpp"
#include "core/tensor_kernels.hpp"

namespace shard {

namespace {

const char* kind_name(ReduceKind k) {
  static const char* kNames[] = {"sum", "mean", "max", "min", "prod"};
  return kNames[static_cast<int>(k)];
}

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

template <Dtype T>
ShardedArray<T> reduce(const ShardedArray<T>& a, ReduceKind kind, const Dims& dims_in, bool keepdims) {
  if (auto* tape = detail::recording_tape_for(a)) return detail::record_reduce(*tape, a, kind, dims_in, keepdims);
  const int rank = a.ndim();
  const std::vector<int> dims = dims_in.resolve(rank, kind_name(kind));
  std::int64_t count = 1;
  for (int d : dims) count *= a.shape()[d];
  if (kind == ReduceKind::kMean && !std::is_floating_point_v<T>)
    raise<ValueError>("mean kernel of a ", dtype_name<T>(), " array: the front end shard::mean converts integers "
                      "to floating first");
  if (count == 0 && (kind == ReduceKind::kMax || kind == ReduceKind::kMin))
    raise<ValueError>(kind_name(kind), " over zero elements of a ", dtype_name<T>(), to_string(a.shape()),
                      " array has no identity (numpy raises too)");
  const Shape out_shape = reduced_shape(a.shape(), dims, keepdims);
  const NamedSharding out = reduced_sharding(a.sharding(), rank, dims, keepdims);
  const SpecEntry axes = detail::axes_of_dims(a.sharding(), dims);
  const bool sums = kind == ReduceKind::kSum || kind == ReduceKind::kMean;
  if constexpr (std::is_floating_point_v<T>) {
    if (sums) {
      std::vector<Tensor<double>> partial;
      for (const auto& s : a.addressable_shards()) partial.push_back(detail::sum_in_double(s.data, dims, keepdims));
      ShardedArray<double> total = detail::combine_over(std::move(partial), axes, ReduceKind::kSum, out, out_shape);
      const double scale = kind == ReduceKind::kMean ? 1.0 / static_cast<double>(count) : 1.0;
      std::vector<Tensor<T>> blocks;
      for (const auto& s : total.addressable_shards()) {
        Tensor<T> b(s.data.shape());
        for (std::int64_t i = 0; i < b.size(); ++i) b[i] = static_cast<T>(kind == ReduceKind::kMean ? s.data[i] * scale : s.data[i]);
        blocks.push_back(std::move(b));
      }
      return detail::assemble(out_shape, out, std::move(blocks));
    }
  }
  std::vector<Tensor<T>> partial;
  for (const auto& s : a.addressable_shards()) partial.push_back(detail::reduce_or_identity(s.data, kind, dims, keepdims));
  return detail::combine_over(std::move(partial), axes, reduce_op(kind), out, out_shape);
}

namespace {

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
          if (idx[r] == kNone && s.data[(o * v.n + j) * v.inner + k] == m[r]) idx[r] = s.box.offset[d] + j;
        }
    index.push_back(std::move(idx));
  }
  ShardedArray<std::int64_t> r = detail::combine_over(std::move(index), axes, ReduceKind::kMin, out, out_shape);
  return keepdims ? r : squeeze(r, Dims{d});
}

}  // namespace

template <Dtype T>
ShardedArray<std::int64_t> argmax(const ShardedArray<T>& a, int axis, bool keepdims) {
  if (detail::recording_tape_for(a)) return detail::paused([&] { return arg_reduce(a, axis, keepdims, true); });
  return arg_reduce(a, axis, keepdims, true);
}
template <Dtype T>
ShardedArray<std::int64_t> argmin(const ShardedArray<T>& a, int axis, bool keepdims) {
  if (detail::recording_tape_for(a)) return detail::paused([&] { return arg_reduce(a, axis, keepdims, false); });
  return arg_reduce(a, axis, keepdims, false);
}

// ---------------------------------------------------------------- prefix sums (cumsum)
//
// Along a dim split over mesh axes (n = 7 over 3 devices: blocks of 3, 3, 1), each device
//   totals[lines]   = sum of its block along the dim                        local
//   gathered[q, ..] = every block's totals along the dim's axes             one all_gather
//   start           = sum of gathered[q] over the blocks q before its own   local
//   out block       = running sums of its block starting at start           local
// so only the totals (the block with that dim of size 1) move. Totals are zero-padded to the
// largest block's shape, so the blocks of every group (uneven on other dims too) gather alike.

namespace {

/// The index of `device`'s block along a dim split over `axes` (row-major over the axes, in
/// the spec's order: NamedSharding's block order and the group position of a collective).
int block_position(const Mesh& mesh, const SpecEntry& axes, int device) {
  const auto c = mesh.coords(device);
  int p = 0;
  for (const auto& name : axes.axes()) {
    const int a = mesh.axis_position(name);
    p = p * mesh.shape()[a] + c[a];
  }
  return p;
}

}  // namespace

template <Dtype T>
ShardedArray<T> prefix_sum(const ShardedArray<T>& a, int axis, bool reverse) {
  if (auto* tape = detail::recording_tape_for(a)) return detail::record_prefix_sum(*tape, a, axis, reverse);
  if constexpr (std::is_same_v<T, bool>)
    raise<ValueError>("prefix_sum kernel of a bool array: the front end shard::cumsum converts bool to int32 first");
  using A = detail::scan_acc_t<T>;
  const int d = resolve_dim(axis, a.ndim(), "cumsum");
  const SpecEntry& axes = a.sharding().spec()[d];
  const auto& shards = a.addressable_shards();
  Shape tshape = a.sharding().shard_shape(a.shape());
  tshape[d] = 1;
  std::vector<Shard<T>> out;
  if (axes.is_none() || num_elements(tshape) == 0 || a.mesh().axes_size(a.mesh().mask_of(axes.axes())) == 1) {
    for (const auto& s : shards)
      out.push_back(Shard<T>{s.device, s.box, detail::prefix_sum_from(s.data, d, reverse, nullptr)});
    return ShardedArray<T>(a.shape(), a.sharding(), std::move(out));
  }
  const Shape origin(tshape.size(), 0);
  std::vector<Tensor<A>> totals;
  std::vector<const Tensor<A>*> ins;
  std::vector<int> devices;
  for (const auto& s : shards) {
    const Tensor<A> own = detail::line_totals(s.data, d);
    Tensor<A> padded(tshape, A(0));
    if (own.size() > 0)
      copy_box(own.data(), own.shape(), origin, padded.data(), tshape, origin, Box{origin, own.shape()}, sizeof(A));
    totals.push_back(std::move(padded));
    devices.push_back(s.device);
  }
  for (const auto& t : totals) ins.push_back(&t);
  detail::CollectiveSpec spec = detail::all_gather_spec(a.mesh(), axes, tshape, 0, false);
  spec.dtype = dtype_name<A>();
  std::vector<Tensor<A>> gathered;
  detail::execute_gather_like<A>(a.mesh(), spec, devices, ins, gathered);
  const std::int64_t m = num_elements(tshape);
  for (std::size_t k = 0; k < shards.size(); ++k) {
    const auto& s = shards[k];
    const int p = block_position(a.mesh(), axes, s.device);
    // The blocks before this one (after it, reverse), added in wrapping arithmetic for integers.
    using W = std::conditional_t<std::is_floating_point_v<T>, double, std::uint64_t>;
    std::vector<W> before(static_cast<std::size_t>(m), W(0));
    const A* g = gathered[k].data();
    for (int q = reverse ? p + 1 : 0; q < (reverse ? spec.group_size : p); ++q)
      for (std::int64_t i = 0; i < m; ++i) before[static_cast<std::size_t>(i)] += static_cast<W>(g[q * m + i]);
    Tensor<A> padded(tshape);
    for (std::int64_t i = 0; i < m; ++i) padded[i] = static_cast<A>(before[static_cast<std::size_t>(i)]);
    Shape own = s.data.shape();
    own[d] = 1;
    Tensor<A> start(own);
    if (start.size() > 0)
      copy_box(padded.data(), tshape, origin, start.data(), own, origin, Box{origin, own}, sizeof(A));
    out.push_back(Shard<T>{s.device, s.box, detail::prefix_sum_from(s.data, d, reverse, &start)});
  }
  return ShardedArray<T>(a.shape(), a.sharding(), std::move(out));
}

#define SHARD_INSTANTIATE_REDUCE(T)                                                                  \
  template ShardedArray<T> reduce<T>(const ShardedArray<T>&, ReduceKind, const Dims&, bool);         \
  template ShardedArray<T> prefix_sum<T>(const ShardedArray<T>&, int, bool);                         \
  template ShardedArray<std::int64_t> argmax<T>(const ShardedArray<T>&, int, bool);                  \
  template ShardedArray<std::int64_t> argmin<T>(const ShardedArray<T>&, int, bool);
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_REDUCE)
#undef SHARD_INSTANTIATE_REDUCE

}  // namespace shard
