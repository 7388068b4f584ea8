#pragma once
/// \file The op set on ShardedArray: the same numpy / jax.numpy operations as on Tensor
/// (array_ops.hpp is the shared front end: operators, promotion, reductions; nn.hpp the
/// composites: softmax, gelu, layer_norm, losses), run where the
/// shards are ("computation follows data"). Each kernel below runs the Tensor kernel of the
/// same name on every local block and adds only the communication its sharding rule needs.
///
/// Sharding rules (documents of record):
///   - Elementwise ops over several operands: the result takes the sharding of the first
///     committed operand whose shape is the result's shape (else of the first operand with
///     that shape; else the first operand's entries on its non-broadcast dims). The other
///     operands are resharded, if needed, to the matching layout: the result's spec on their
///     non-broadcast dims, None on broadcast (size-1 or missing) dims. So `batch + bias` with
///     batch P('data', 'model') slices a replicated bias to P('model') locally.
///   - Operands on different meshes over the same *set* of devices combine: the others are
///     moved onto the result's mesh, without communication when their layout has an
///     equivalent there (reshard_plan shows the plan), by the minimal-bytes plan otherwise.
///     Different device sets raise MeshMismatchError naming both sets.
///   - A Tensor operand is JAX's uncommitted array: replicated, every rank holds it, it never
///     moves and never decides the result's sharding.
///   - Reductions: local reduction of each block, then one collective (psum, pmax, pmin, or a
///     product) over the mesh axes that split the reduced dims; the result's spec drops the
///     reduced dims (None with keepdims). float32 sums cross devices in float64.
///   - Prefix sums (cumsum): the operand's sharding; a split axis costs one all_gather of
///     the blocks' totals (the block shape with that dim 1) over its mesh axes.

#include <cstdint>
#include <source_location>
#include <vector>

#include "shard/error.hpp"  // shard::source_location
#include "shard/core/array_ops.hpp"
#include "shard/array/reshard.hpp"
#include "shard/array/sharded_array.hpp"
#include "shard/core/shape_ops.hpp"
#include "shard/core/tensor_ops.hpp"
#include "shard/ops/nn.hpp"

namespace shard {

namespace detail {
/// A Tensor every rank holds, as a replicated uncommitted array on `mesh` whose shards view
/// the tensor's memory (no copy, no communication): valid while the tensor lives.
template <Dtype T>
ShardedArray<T> uncommitted(const Tensor<T>& x, const Mesh& mesh);
/// The same owning the tensor (one copy per rank, shared by its devices' shards).
template <Dtype T>
ShardedArray<T> uncommitted(Tensor<T>&& x, const Mesh& mesh);
/// A 0-d replicated array holding v on `mesh` (uncommitted).
template <Dtype T>
ShardedArray<T> scalar_on(T v, const Mesh& mesh);
}  // namespace detail

// ---------------------------------------------------------------- elementwise kernels

/// Collective over all ranks when an operand must move, local otherwise.
template <Dtype T>
ShardedArray<T> binary(const ShardedArray<T>& a, const ShardedArray<T>& b, BinaryOp op);
/// Local: `a op s` (`s op a` when scalar_first).
template <Dtype T>
ShardedArray<T> binary(const ShardedArray<T>& a, T s, BinaryOp op, bool scalar_first = false);
template <Dtype T>
ShardedArray<bool> compare(const ShardedArray<T>& a, const ShardedArray<T>& b, CompareOp op);
template <Dtype T>
ShardedArray<bool> compare(const ShardedArray<T>& a, T s, CompareOp op, bool scalar_first = false);
/// Local.
template <Dtype T>
ShardedArray<T> unary(const ShardedArray<T>& a, UnaryOp op);
template <Dtype T>
ShardedArray<T> where(const ShardedArray<bool>& cond, const ShardedArray<T>& a, const ShardedArray<T>& b);
/// alpha*x + y in one pass over memory, broadcast and sharded like binary(); local unless it must reshard.
template <Dtype T>
ShardedArray<T> axpy(T alpha, const ShardedArray<T>& x, const ShardedArray<T>& y);

/// Local: converts every element (a primitive of the elementwise family, ops/elementwise.hpp).
template <Dtype U, Dtype T>
ShardedArray<U> astype(const ShardedArray<T>& a);

/// Local: fn applied to every element (any callable T -> T).
template <Dtype T, typename F>
ShardedArray<T> map(const ShardedArray<T>& a, F&& fn) {
  if (detail::traced(a))
    detail::raise_not_differentiable("map", "an arbitrary element function has no derivative rule; write it with the "
                                            "op set (exp, where, ...)");
  std::vector<Shard<T>> shards;
  for (const auto& s : a.addressable_shards()) {
    Tensor<T> out(s.data.shape());
    const T* in = s.data.data();
    T* o = out.data();
    for (std::int64_t i = 0; i < out.size(); ++i) o[i] = fn(in[i]);
    shards.push_back(Shard<T>{s.device, s.box, std::move(out)});
  }
  return ShardedArray<T>(a.shape(), a.sharding(), std::move(shards));
}

// ---------------------------------------------------------------- reductions

/// Collective over the mesh axes that split the reduced dims (none: local).
template <Dtype T>
ShardedArray<T> reduce(const ShardedArray<T>& a, ReduceKind kind, const Dims& dims = {}, bool keepdims = false);
/// Inclusive prefix sums along `axis` (from the end when reverse), sharded like `a`: each
/// device scans its block starting from the sum of the blocks before it along `axis`, which
/// it gets from one all_gather of the blocks' line totals over the mesh axes splitting
/// `axis` (only the totals move, never the blocks; local when `axis` is not split).
template <Dtype T>
ShardedArray<T> prefix_sum(const ShardedArray<T>& a, int axis, bool reverse = false);
/// The global index of the first maximum (minimum) along `axis` (numpy's argmax): two
/// collectives (the extreme value, then the smallest index reaching it) over the axes that
/// split `axis`.
template <Dtype T>
ShardedArray<std::int64_t> argmax(const ShardedArray<T>& a, int axis, bool keepdims = false);
template <Dtype T>
ShardedArray<std::int64_t> argmin(const ShardedArray<T>& a, int axis, bool keepdims = false);

/// Over the flattened array (axis=None): a 0-d index (the array is reshaped to 1-D first).
template <Dtype T>
ShardedArray<std::int64_t> argmax(const ShardedArray<T>& a);
template <Dtype T>
ShardedArray<std::int64_t> argmin(const ShardedArray<T>& a);

// ---------------------------------------------------------------- shape and indexing
// (swapaxes, moveaxis and one_hot, composed of these, are written once for both views in
// shape_ops.hpp.)

/// Local: permutes the dims (reverses them when perm is empty); spec entries move with their
/// dims, so no data moves between devices.
template <Dtype T>
ShardedArray<T> transpose(const ShardedArray<T>& a, std::vector<int> perm = {}, shard::source_location where = shard::source_location::current());
/// The same elements in another shape (one dim may be -1). Local when each group of merged
/// or split dims is sharded only on its major dim and the shards stay whole rows of the
/// result (the major result dim of the group takes the axes); otherwise that group's dims are
/// first gathered over their axes (only those dims: never the whole array unless the whole
/// array is one group) and the group comes out replicated.
template <Dtype T>
ShardedArray<T> reshape(const ShardedArray<T>& a, Shape shape, shard::source_location where = shard::source_location::current());
/// Local: a new dim of size 1 (spec None there).
template <Dtype T>
ShardedArray<T> expand_dims(const ShardedArray<T>& a, int axis, shard::source_location where = shard::source_location::current());
/// Drops size-1 dims (all of them for Dims()); a sharded size-1 dim is gathered first.
template <Dtype T>
ShardedArray<T> squeeze(const ShardedArray<T>& a, const Dims& dims = {}, shard::source_location where = shard::source_location::current());
/// numpy's basic indexing: x[i] drops a dim, slices keep it. The result keeps the spec of the
/// kept dims (an indexed dim's axes become replication); the devices that need elements they
/// do not hold receive exactly those (one exchange of box intersections, none when the
/// sliced dims are not sharded). Collective over all ranks when anything moves.
template <Dtype T>
ShardedArray<T> slice(const ShardedArray<T>& a, const std::vector<Index>& index, shard::source_location where = shard::source_location::current());
/// Joins along an existing `axis`; the result takes the first array's sharding, and each
/// device receives the parts of its box it does not hold.
template <Dtype T>
ShardedArray<T> concatenate(const std::vector<ShardedArray<T>>& xs, int axis = 0, shard::source_location where = shard::source_location::current());
/// Joins along a new `axis` (spec None there).
template <Dtype T>
ShardedArray<T> stack(const std::vector<ShardedArray<T>>& xs, int axis = 0, shard::source_location where = shard::source_location::current());
/// numpy's take along `axis` (embedding lookup, label gather): the result is sharded as
/// x.spec[:axis] + indices' spec + x.spec[axis+1:] (indices lose axes x's other dims use).
/// When x's `axis` dim is sharded (a vocabulary-parallel table), each device takes the rows
/// it holds (zeros elsewhere) and one psum over those axes completes the rows.
template <Dtype T, Dtype I>
ShardedArray<T> take(const ShardedArray<T>& x, const ShardedArray<I>& indices, int axis = 0, shard::source_location where = shard::source_location::current());
/// numpy's take_along_axis (indices of x's rank, lined up with x on the other dims). A sharded
/// `axis` dim is handled like take's: masked local picks, one psum over its axes.
template <Dtype T, Dtype I>
ShardedArray<T> take_along_axis(const ShardedArray<T>& x, const ShardedArray<I>& indices, int axis, shard::source_location where = shard::source_location::current());

// ---------------------------------------------------------------- products

/// numpy's dot on sharded arrays: a 0-d operand multiplies; otherwise matmul (b 1-D or 2-D).
template <Dtype T>
ShardedArray<T> dot(const ShardedArray<T>& a, const ShardedArray<T>& b);
/// sum(a * b) over the flattened arrays (equal sizes), accumulated pairwise in float64.
template <Dtype T>
ShardedArray<T> vdot(const ShardedArray<T>& a, const ShardedArray<T>& b);

// ---------------------------------------------------------------- creation (keep shardings)

/// Local (no communication): an array of ones.
template <Dtype T>
ShardedArray<T> ones(const Shape& shape, const NamedSharding& sharding) {
  return full<T>(shape, T(1), sharding);
}
template <Dtype T>
ShardedArray<T> zeros_like(const ShardedArray<T>& x) {
  return zeros<T>(x.shape(), x.sharding());
}
template <Dtype T>
ShardedArray<T> ones_like(const ShardedArray<T>& x) {
  return full<T>(x.shape(), T(1), x.sharding());
}
template <Dtype T>
ShardedArray<T> full_like(const ShardedArray<T>& x, T value) {
  return full<T>(x.shape(), value, x.sharding());
}
/// Local: numpy's arange(n) sharded as given (1-D).
template <Dtype T>
ShardedArray<T> arange(std::int64_t n, const NamedSharding& sharding) {
  return arange<T>(Shape{n}, sharding);
}

template <Dtype T>
ShardedArray<std::int64_t> argmax(const ShardedArray<T>& a) {
  return argmax(reshape(a, Shape{-1}), 0);
}
template <Dtype T>
ShardedArray<std::int64_t> argmin(const ShardedArray<T>& a) {
  return argmin(reshape(a, Shape{-1}), 0);
}

template <typename T>
ShardedArray<T> ShardedArray<T>::operator[](std::int64_t i) const {
  return slice(*this, std::vector<Index>{Index(i)});
}
template <typename T>
ShardedArray<T> ShardedArray<T>::operator[](std::initializer_list<Index> index) const {
  return slice(*this, std::vector<Index>(index));
}

}  // namespace shard

#include "shard/ops/matmul.hpp"  // the sharded matmul kernel the front end's matmul() calls
