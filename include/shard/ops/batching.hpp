#pragma once
/// \file Batching rules (vmap; DESIGN.md "jit and vmap"): how the op driver runs a primitive on
/// batched operands, and the helpers the primitives' rules are written with.
///
/// A primitive's batching rule is its member
///
///   template <typename... A>
///   auto batch(const shard::source_location& where, std::int64_t size, const A&... args) const;
///
/// where each argument is a `BatchArg<X>`: the operand's physical array and its batch dim (-1:
/// the operand is not batched at this level; it is then the operand itself). The rule returns a
/// `BatchOut<Out>`: the physical result and its batch dim. A rule is written with Shard's ops on
/// the physical arrays (a transpose to bring the batch dim first, the primitive itself with its
/// parameters shifted past it), so it runs as one op whatever the batch size (JAX's batching
/// rules in `interpreters/batching.py`), and an outer vmap or tape sees those ops in turn.
///
/// The driver (array/driver.hpp) calls `batch_primitive` when an operand is batched at a level
/// newer than the recording tape's; a primitive without batch() raises, or runs as a loop over
/// the batch when the vmap asked for `loop_fallback` (and says so once on stderr).

#include <array>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <source_location>
#include <type_traits>
#include <utility>
#include <vector>

#include "shard/array/driver.hpp"
#include "shard/core/detail/batch.hpp"
#include "shard/core/shape_ops.hpp"
#include "shard/error.hpp"

namespace shard {

namespace detail {

/// The physical array with its batch dim first (an alias when it is first already); an
/// unbatched operand as it is.
template <typename X>
X batch_first(const BatchArg<X>& a) {
  if (a.bdim <= 0) return a.x.alias();
  return moveaxis(a.x, a.bdim, 0);
}

/// x reshaped for a batching rule: on a Tensor no autodiff tape records, a view of x's memory
/// (an in-place op on either copies first, as for every alias), so the moves a rule makes around
/// a primitive copy nothing; otherwise the reshape op.
template <typename X>
X reshaped_view(const X& x, Shape shape, const shard::source_location& where = {}) {
  if constexpr (is_tensor_v<X>) {
    if (!x.batch() && !traced(x) && x.owns_memory() && num_elements(shape) == x.size()) {
      X v = x.alias();
      v.set_ad(nullptr);
      return std::move(v).reshaped(std::move(shape));
    }
  }
  return reshape(x, std::move(shape), where);
}

/// The batch dim first and the example's dims padded with leading size-1 dims to `rank`
/// (numpy's broadcasting then lines the examples up with unbatched operands of rank `rank`).
template <typename X>
X batch_first_rank(const BatchArg<X>& a, int rank) {
  X f = batch_first(a);
  if (!a.batched() || a.rank() >= rank) return f;
  Shape s = f.shape();
  s.insert(s.begin() + 1, static_cast<std::size_t>(rank - a.rank()), 1);
  return reshaped_view(f, s);
}

/// The operand with a batch dim first in any case: an unbatched one repeated `size` times
/// (stack of aliases: one op).
template <typename X>
X batch_first_or_broadcast(const BatchArg<X>& a, std::int64_t size) {
  if (a.batched()) return batch_first(a);
  if constexpr (is_tensor_v<X>) {  // one broadcast kernel
    Shape one = a.x.shape(), to = a.x.shape();
    one.insert(one.begin(), 1);
    to.insert(to.begin(), size);
    return broadcast_to(reshaped_view(a.x, one), to);
  }
  std::vector<X> copies;
  copies.reserve(static_cast<std::size_t>(size));
  for (std::int64_t i = 0; i < size; ++i) copies.push_back(a.x.alias());
  return stack(copies, 0);
}

/// x broadcast (numpy) to `shape`: broadcast_to on a Tensor; on a ShardedArray the sum with
/// replicated zeros of that shape (the sharded view has no broadcast_to).
template <typename X>
X broadcast_like_shape(const X& x, const Shape& shape) {
  if constexpr (is_tensor_v<X>) {
    return broadcast_to(x, shape);
  } else {
    using T = elem_t<X>;
    return binary(x, zeros<T>(shape, NamedSharding(x.mesh(), PartitionSpec())), BinaryOp::kAdd);
  }
}

/// The largest example rank among the operands.
template <typename... A>
int max_example_rank(const A&... a) {
  int r = 0;
  ((r = std::max(r, a.rank())), ...);
  return r;
}

/// The rule of every elementwise primitive (numpy broadcasting): the batched operands get
/// their batch dim first and their examples padded to the largest example rank; the unbatched
/// ones broadcast against the examples as they are. The result's batch dim is 0.
template <typename P, typename... A>
auto batch_elementwise(const P& p, const shard::source_location& where, const A&... a) {
  const int rank = max_example_rank(a...);
  auto out = bind_at(p, where, batch_first_rank(a, rank)...);
  return BatchOut<decltype(out)>{std::move(out), 0};
}

/// `dim` of an example of rank `rank` resolved (negative counts from the end), + 1: the same
/// dim of the physical array whose batch dim is first.
inline int past_batch(int dim, int rank, const char* what) { return resolve_dim(dim, rank, what) + 1; }

/// Example i of a batch arg (the operand itself when it is not batched).
template <typename X>
X example_of(const BatchArg<X>& a, std::int64_t i) {
  if (!a.batched()) return a.x.alias();
  std::vector<Index> index(static_cast<std::size_t>(a.bdim), Slice());
  index.push_back(i);
  return slice(a.x, index);
}

/// The loop fallback: the primitive on each example, the results stacked (batch dim 0).
template <typename P, typename... A>
auto batch_by_loop(const P& p, const shard::source_location& where, std::int64_t size, const A&... a) {
  note_loop_fallback(p.name(), size);
  using Out = decltype(bind_at(p, where, example_of(a, 0)...));
  std::vector<Out> outs;
  outs.reserve(static_cast<std::size_t>(size));
  for (std::int64_t i = 0; i < size; ++i) outs.push_back(bind_at(p, where, example_of(a, i)...));
  return BatchOut<Out>{stack(outs, 0), 0};
}

/// numpy's arange(size) as an array of X's view (on X's mesh, replicated).
template <Dtype I, typename X>
auto batch_iota(const X& like, std::int64_t size) {
  if constexpr (is_tensor_v<X>)
    return arange<I>(static_cast<I>(size));
  else
    return arange<I>(size, NamedSharding(like.mesh(), PartitionSpec()));
}

/// `sharding` with an unsplit dim in front (the batch dim of a physical array).
inline NamedSharding with_batch_entry(const NamedSharding& sharding) {
  std::vector<SpecEntry> e = sharding.spec().entries();
  e.insert(e.begin(), SpecEntry());
  return NamedSharding(sharding.mesh(), PartitionSpec(std::move(e)));
}

/// take of examples whose tables are merged into one (size * n rows along dim 0): each
/// example's indices (batch first) normalized and offset by its rows' start. An index out of
/// range becomes size * n, out of range of the merged table too (the kernel names it).
template <typename I>
I merged_take_indices(const I& i0, std::int64_t n, std::int64_t size) {
  using IT = elem_t<I>;
  const I norm = shard::where(less(i0, IT(0)), i0 + IT(n), i0);
  const auto bad = logical_or(less(norm, IT(0)), greater_equal(norm, IT(n)));
  Shape off_shape(static_cast<std::size_t>(i0.ndim()), 1);
  off_shape[0] = size;
  const I off = reshape(batch_iota<IT>(i0, size) * IT(n), off_shape);
  return shard::where(bad, IT(size * n), norm + off);
}

/// The permutation from take's merged result (N, indices..., before..., after...) to the
/// example layout (N, before..., indices..., after...).
inline std::vector<int> merged_take_perm(int before, int indices, int rank) {
  std::vector<int> perm{0};
  for (int k = 0; k < before; ++k) perm.push_back(1 + indices + k);
  for (int k = 0; k < indices; ++k) perm.push_back(1 + k);
  for (int k = 1 + indices + before; k < rank; ++k) perm.push_back(k);
  return perm;
}

/// take / take_along_axis on batched operands (prim::Take's rule).
template <typename P, typename X, typename I>
BatchOut<X> take_batch(const P& p, const shard::source_location& where, std::int64_t size,
                       const BatchArg<X>& x, const BatchArg<I>& idx) {
  const int rank = x.rank();
  if (p.along) {
    const int ax = past_batch(p.axis, rank, p.name());
    return {
        take_along_axis(batch_first_or_broadcast(x, size), batch_first_or_broadcast(idx, size), ax, where),
        0};
  }
  const int a = resolve_dim(p.axis, rank, p.name());
  if (!idx.batched()) return {take(batch_first(x), idx.x, a + 1, where), 0};
  if (!x.batched()) return {take(x.x, batch_first(idx), a, where), a};  // the batch dim lands at `axis`
  // Both batched: the tables merged into one of size * n rows along `axis`, each example's
  // indices offset by its rows' start.
  const std::int64_t n = x.shape()[static_cast<std::size_t>(a)];
  X x1 = moveaxis(batch_first(x), a + 1, 1);  // (N, n, before..., after...)
  Shape merged = x1.shape();
  merged.erase(merged.begin());
  merged[0] = size * n;
  X r = take(reshape(x1, merged), merged_take_indices(batch_first(idx), n, size), 0, where);
  if (a == 0) return {std::move(r), 0};
  return {transpose(r, merged_take_perm(a, idx.rank(), r.ndim()), where), 0};
}

/// The transpose of take / take_along_axis on batched operands (prim::TakeTranspose's rule):
/// the forward rule's layout, transposed.
template <typename P, typename X, typename I>
BatchOut<X> take_transpose_batch(const P& p, const shard::source_location& where, std::int64_t size,
                                 const BatchArg<X>& ct, const BatchArg<I>& idx) {
  const int rank = static_cast<int>(p.shape.size());
  Shape shape = p.shape;
  shape.insert(shape.begin(), size);
  std::shared_ptr<const NamedSharding> shp;
  if constexpr (is_sharded_v<X>) shp = std::make_shared<const NamedSharding>(with_batch_entry(*p.sharding));
  const int a = resolve_dim(p.axis, rank, p.name());
  if (p.along || !idx.batched()) {
    const I i = p.along ? batch_first_or_broadcast(idx, size) : idx.x.alias();
    return {bind_at(P{{}, shape, shp, a + 1, p.along}, where, batch_first_or_broadcast(ct, size), i), 0};
  }
  // Batched indices: the forward's merged table of size * n rows, transposed.
  const std::int64_t n = p.shape[static_cast<std::size_t>(a)];
  X c = batch_first_or_broadcast(ct, size);  // (N, before..., indices..., after...)
  if (a > 0) {
    const std::vector<int> fwd = merged_take_perm(a, idx.rank(), c.ndim());
    std::vector<int> inv(fwd.size());
    for (std::size_t k = 0; k < fwd.size(); ++k) inv[static_cast<std::size_t>(fwd[k])] = static_cast<int>(k);
    c = transpose(c, inv, where);  // (N, indices..., before..., after...)
  }
  Shape merged(p.shape.begin(), p.shape.end());  // (n, before..., after...) with n first
  merged.erase(merged.begin() + a);
  merged.insert(merged.begin(), size * n);
  std::shared_ptr<const NamedSharding> msh;
  if constexpr (is_sharded_v<X>)
    msh = std::make_shared<const NamedSharding>(p.sharding->mesh(), PartitionSpec());
  X rows = bind_at(P{{}, merged, msh, 0, false}, where, c, merged_take_indices(batch_first(idx), n, size));
  Shape split = merged;
  split[0] = n;
  split.insert(split.begin(), size);
  X r = reshape(rows, split, where);  // (N, n, before..., after...)
  if (a == 0) return {std::move(r), 0};
  return {moveaxis(r, 1, a + 1), 0};
}

template <typename P, ArrayLike... X>
auto batch_forward_vjp(const P& p, const VjpNeed& need, std::uint64_t level, const X&... xs)
    -> decltype(p.forward_vjp(need, xs...)) {
  const BatchFrame* frame = batch_frame(level);
  if (!frame) raise_escaped_batch(p.name());
  const std::int64_t size = frame->size;
  const int rank = max_example_rank(batch_arg(xs, level)...);
  const auto batched = p.batched(rank);
  // The physical operands may be batched by an outer vmap in turn (vmap(vmap(grad(f)))): batch again.
  auto forward = [&](const auto&... phys) { return forward_vjp_at(batched, need, phys...); };
  auto [out, vjp] = forward(batch_first_or_broadcast(batch_arg(xs, level), size)...);
  using Out = decltype(out);
  KernelVjp<Out, Out> wrapped = [vjp = std::move(vjp), level, size](const Out& ct, const VjpNeed& n) {
    Cotangents<Out> c = vjp(batch_first_or_broadcast(batch_arg(ct, level), size), n);
    for (std::size_t i = 0; i < c.size(); ++i)
      if (c[i]) {
        Out v = make_batched(std::move(*c[i]), 0, level);
        c[i] = std::move(v);
      }
    return c;
  };
  return std::pair<Out, KernelVjp<Out, Out>>{make_batched(std::move(out), 0, level), std::move(wrapped)};
}

/// The rule of a primitive whose kernel takes any number of leading dims once its parameters
/// name dims past the batch dim (softmax's axis): every operand with the batch dim first (the
/// unbatched ones repeated), the primitive `batched(rank)` on them.
template <typename P, typename... A>
auto batch_shifted(const P& p, const shard::source_location& where, std::int64_t size, const A&... a) {
  const int rank = max_example_rank(a...);
  auto out = bind_at(p.batched(rank), where, batch_first_or_broadcast(a, size)...);
  return BatchOut<decltype(out)>{std::move(out), 0};
}

/// A list primitive (concatenate, stack) on operands some of which are batched: every operand
/// gets the batch dim first (the unbatched ones repeated), and batch_list(where, xs) runs it.
template <typename P, ArrayLike X>
X batch_list_primitive(const P& p, const shard::source_location& where, std::uint64_t level,
                       const std::vector<X>& xs) {
  const BatchFrame* frame = batch_frame(level);
  if (!frame) raise_escaped_batch(p.name());
  std::vector<X> front;
  front.reserve(xs.size());
  int rank = 0;
  for (const auto& x : xs) {
    int bdim = -1;
    const X& phys = physical_at(x, level, bdim);
    const BatchArg<X> a{phys, bdim};
    rank = a.rank();
    front.push_back(batch_first_or_broadcast(a, frame->size));
  }
  return make_batched(p.batch_list(where, rank, front), 0, level);
}

}  // namespace detail

}  // namespace shard
