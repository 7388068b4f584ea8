// The reduce and scan family (ops/reduce.hpp): reductions and prefix sums, each primitive's
// partial and final steps and VJP beside its rule, and the public functions of both views.

#include "shard/ops/reduce.hpp"

#include <map>
#include <mutex>
#include <tuple>

#include "core/tensor_kernels.hpp"
#include "shard/comm/detail/collective.hpp"
#include "shard/error.hpp"
#include "shard/ops/elementwise.hpp"
#include "shard/ops/ops.hpp"

namespace shard {

namespace detail {

const FactorRule& reduce_rule(int rank, const std::vector<int>& dims, bool keepdims) {
  static std::mutex mutex;
  static std::map<std::tuple<int, std::vector<int>, bool>, std::unique_ptr<FactorRule>> rules;
  std::lock_guard lock(mutex);
  auto& r = rules[{rank, dims, keepdims}];
  if (!r) {
    std::string in, out;
    for (int d = 0; d < rank; ++d) {
      const char c = static_cast<char>(d < 26 ? 'a' + d : 'A' + (d - 26));
      in += c;
      const bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
      if (!reduced)
        out += c;
      else if (keepdims)
        out += '1';
    }
    r = std::make_unique<FactorRule>(in + "->" + out);
  }
  return *r;
}

}  // namespace detail

namespace prim {

template <Dtype T>
Tensor<typename Reduce<T>::Partial> Reduce<T>::partial(const Tensor<T>& block) const {
  if constexpr (is_floating_v<T>) {
    if (kind == ReduceKind::kSum || kind == ReduceKind::kMean)
      return detail::sum_in_double(block, dims, keepdims);
    return astype<double>(detail::reduce_or_identity(block, kind, dims, keepdims));
  } else {
    return detail::reduce_or_identity(block, kind, dims, keepdims);
  }
}

template <Dtype T>
Tensor<T> Reduce<T>::finalize(const Tensor<Partial>& combined) const {
  if constexpr (std::is_same_v<Partial, T>) {
    if (kind != ReduceKind::kMean) return combined.alias();
  }
  const double scale = kind == ReduceKind::kMean ? 1.0 / static_cast<double>(count) : 1.0;
  Tensor<T> b(combined.shape());
  for (std::int64_t i = 0; i < b.size(); ++i)
    b.flat(i) = static_cast<T>(kind == ReduceKind::kMean ? combined.flat(i) * scale : combined.flat(i));
  return b;
}

template <Dtype T>
template <ArrayLike X>
KernelVjp<X, X> Reduce<T>::vjp(const VjpNeed&, const X& out, const X& x) const {
  using detail::keep;
  const Shape kshape = detail::keepdims_shape(x.shape(), dims);
  detail::NodeMeta<X> xm(x);
  auto kept = [kshape, keepdims = keepdims](const X& ct) {
    return keepdims ? ct.alias() : reshape(ct, kshape);
  };
  switch (kind) {
    case ReduceKind::kSum:
      return [xm, kept](const X& ct, const VjpNeed&) {
        return cotangents<X>(detail::broadcast_like(kept(ct), xm));
      };
    case ReduceKind::kMean:
      return [xm, kept, count = count](const X& ct, const VjpNeed&) {
        return cotangents<X>(detail::broadcast_like(kept(ct) / static_cast<T>(count), xm));
      };
    case ReduceKind::kMax:
    case ReduceKind::kMin:
      return [kept, dims = dims, xk = keep(x), ok = keep(out)](const X& ct, const VjpNeed&) {
        const X hit = astype<T>(equal(xk, kept(ok)));
        const X ties = reduce(hit, ReduceKind::kSum, Dims(dims), true);
        return cotangents<X>(hit * (kept(ct) / ties));
      };
    case ReduceKind::kProd:
      return [kept, dims = dims, xk = keep(x), ok = keep(out)](const X& ct, const VjpNeed&) {
        // d prod / dx_i = prod of the others: out / x_i where x_i != 0; where x_i is the only
        // zero of its group, the product of the group's non-zeros; 0 with two zeros or more.
        const auto zero = equal(xk, T(0));
        const X nz = where(zero, T(1), xk);
        const X prod_nz = reduce(nz, ReduceKind::kProd, Dims(dims), true);
        const X zeros_in = reduce(astype<T>(zero), ReduceKind::kSum, Dims(dims), true);
        const X others = where(zero, where(equal(zeros_in, T(1)), prod_nz, T(0)), kept(ok) / nz);
        return cotangents<X>(others * kept(ct));
      };
  }
  return nullptr;
}

}  // namespace prim

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
ShardedArray<T> prim::PrefixSum<T>::sharded(const ShardedArray<T>& a) const {
  if constexpr (std::is_same_v<T, bool>)
    raise<ValueError>(
        "prefix_sum kernel of a bool array: the front end shard::cumsum converts bool to int32 first");
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
      copy_box(own.data(), own.shape(), origin, padded.data(), tshape, origin, Box{origin, own.shape()},
               sizeof(A));
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
    using W = std::conditional_t<is_floating_v<T>, double, std::uint64_t>;
    std::vector<W> before(static_cast<std::size_t>(m), W(0));
    const A* g = gathered[k].data();
    for (int q = reverse ? p + 1 : 0; q < (reverse ? spec.group_size : p); ++q)
      for (std::int64_t i = 0; i < m; ++i)
        before[static_cast<std::size_t>(i)] += static_cast<W>(g[q * m + i]);
    Tensor<A> padded(tshape);
    for (std::int64_t i = 0; i < m; ++i) padded.flat(i) = static_cast<A>(before[static_cast<std::size_t>(i)]);
    Shape own = s.data.shape();
    own[d] = 1;
    Tensor<A> start(own);
    if (start.size() > 0)
      copy_box(padded.data(), tshape, origin, start.data(), own, origin, Box{origin, own}, sizeof(A));
    out.push_back(Shard<T>{s.device, s.box, detail::prefix_sum_from(s.data, d, reverse, &start)});
  }
  return ShardedArray<T>(a.shape(), a.sharding(), std::move(out));
}

namespace {

constexpr shard::source_location kLibrary{};

/// The primitive of reduce(x, kind, dims, keepdims), with the checks every view makes.
template <Dtype T>
prim::Reduce<T> reduce_prim(const Shape& shape, ReduceKind kind, const Dims& dims_in, bool keepdims,
                            bool sharded) {
  const int rank = static_cast<int>(shape.size());
  std::vector<int> dims = dims_in.resolve(rank, detail::reduce_op_name(kind));
  std::int64_t count = 1;
  for (int d : dims) count *= shape[d];
  if (kind == ReduceKind::kMean && !is_floating_v<T>)
    raise<ValueError>("mean kernel of a ", dtype_name<T>(), sharded ? " array" : " tensor",
                      ": the front end shard::mean converts integers to floating first");
  if (count == 0 && (kind == ReduceKind::kMax || kind == ReduceKind::kMin))
    raise<ValueError>(detail::reduce_op_name(kind), " over zero elements of a ", dtype_name<T>(),
                      to_string(shape), " array has no identity (numpy raises too)");
  const FactorRule* rule = sharded ? &detail::reduce_rule(rank, dims, keepdims) : nullptr;
  return prim::Reduce<T>{{}, kind, std::move(dims), keepdims, count, rule};
}

}  // namespace

template <Dtype T>
Tensor<T> reduce(const Tensor<T>& x, ReduceKind kind, const Dims& dims, bool keepdims) {
  return detail::bind_at(reduce_prim<T>(x.shape(), kind, dims, keepdims, false), kLibrary, x);
}
template <Dtype T>
ShardedArray<T> reduce(const ShardedArray<T>& x, ReduceKind kind, const Dims& dims, bool keepdims) {
  return detail::bind_at(reduce_prim<T>(x.shape(), kind, dims, keepdims, true), kLibrary, x);
}
template <Dtype T>
Tensor<T> prefix_sum(const Tensor<T>& x, int axis, bool reverse) {
  return detail::bind_at(prim::PrefixSum<T>{{}, axis, reverse}, kLibrary, x);
}
template <Dtype T>
ShardedArray<T> prefix_sum(const ShardedArray<T>& x, int axis, bool reverse) {
  return detail::bind_at(prim::PrefixSum<T>{{}, axis, reverse}, kLibrary, x);
}

#define SHARD_INSTANTIATE_REDUCE(V, T)                                 \
  template V<T> reduce<T>(const V<T>&, ReduceKind, const Dims&, bool); \
  template V<T> prefix_sum<T>(const V<T>&, int, bool);
#define SHARD_INSTANTIATE_REDUCE_BOTH(T) \
  SHARD_INSTANTIATE_REDUCE(Tensor, T)    \
  SHARD_INSTANTIATE_REDUCE(ShardedArray, T)
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_REDUCE_BOTH)
#undef SHARD_INSTANTIATE_REDUCE_BOTH
#undef SHARD_INSTANTIATE_REDUCE

}  // namespace shard
