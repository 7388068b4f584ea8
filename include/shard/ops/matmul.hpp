#pragma once
/// \file The matmul primitive (ops layer): its sharding rules, and the choice among linalg's
/// distributed strategies. Computation follows the operands' layouts.
///
/// For C[.., M, N] = A[.., M, K] @ B[K, N] (or batched B[.., K, N] with the same leading dims)
/// with A sharded (batch.., rows, k_a) and B (k_b, cols):
///   - k_a == k_b (both None, or the same mesh axes) and rows, k, cols use distinct axes:
///       each device multiplies its blocks with OpenBLAS; C is (batch.., rows, cols). When the
///       contracting dim is sharded, the partial products are summed with one psum over those
///       axes (or psum_scatter when `out` asks for C split further over them).
///       P('x', None) @ P(None, 'y') -> P('x', 'y') sends nothing.
///   - otherwise the operands are resharded to such a layout: the contracting axes become
///     A's k axes, B's k axes or none, whichever moves the fewest bytes (reshard_plan's bytes,
///     plus about twice C's blocks for the psum when the contracting dim stays sharded).
/// Integer types multiply with a plain loop.
///
/// `matmul` (the entry point users call) first looks for a 2-D block layout: A[.., M, K]
/// sharded P(.., r, c) over two single mesh axes of sizes p x q (p*q > 1) and B sharded like
/// it (P(r, c), or A's spec when batched). It runs Cannon's algorithm when p == q and SUMMA
/// otherwise (2-D operands; batched ones on a non-square grid use the rules); every other
/// layout uses the rules above (`matmul_by_rules`). `Algorithm` forces one (linalg.hpp,
/// scalapack.hpp); a forced algorithm raises a clear error where its layout cannot run.

#include "shard/error.hpp"  // shard::source_location
#include "shard/array/driver.hpp"
#include "shard/array/reshard.hpp"
#include "shard/array/sharded_array.hpp"
#include "shard/core/primitive.hpp"
#include "shard/core/tensor_ops.hpp"
#include "shard/linalg/algorithm.hpp"

namespace shard {

/// The layouts matmul(a, b) runs with (metadata only): the resharded operands' specs, the
/// result spec, the contracting axes, and the bytes the reshards send.
struct MatmulPlan {
  PartitionSpec a, b, out;
  SpecEntry contract;          ///< mesh axes the partial products are summed over (None: no psum)
  std::int64_t reshard_bytes = 0;
  std::string to_string() const;
};

MatmulPlan plan_matmul(const Shape& a_shape, const NamedSharding& a, const Shape& b_shape, const NamedSharding& b,
                       std::size_t elem_size);

/// The algorithm kAuto runs for these operands (metadata only).
Algorithm choose_algorithm(const Shape& a_shape, const NamedSharding& a, const Shape& b_shape,
                           const NamedSharding& b);

/// Collective over all ranks when anything moves. `out`, when given, is the sharding of the
/// result (reached with psum_scatter when the rules only split C further over the contracting
/// axes, otherwise with a reshard of the result).
template <typename T>
ShardedArray<T> matmul(const ShardedArray<T>& a, const ShardedArray<T>& b, const NamedSharding* out = nullptr,
                       Algorithm algorithm = Algorithm::kAuto,
                       shard::source_location where = shard::source_location::current());

template <typename T>
ShardedArray<T> matmul(const ShardedArray<T>& a, const ShardedArray<T>& b, Algorithm algorithm,
                       shard::source_location where = shard::source_location::current()) {
  return matmul(a, b, nullptr, algorithm, where);
}

namespace prim {

/// numpy's matmul (1-D operands promoted, batch dims broadcast). The Tensor kernel is one gemm
/// per product (detail::matmul_kernel); the sharded form chooses the algorithm as above (`out`
/// and `algorithm` are matmul's arguments). VJP: dA = dC @ B^T, dB = A^T @ dC, with the
/// transposes in the gemm for 2-D operands; a sharded parameter's gradient that contracts over
/// mesh axes leaves its psum running behind the rest of the backward pass
/// (ops/detail/grad_reduce.hpp) and lands in the sharding its node keeps (grad_sharding).
struct Matmul : Primitive {
  static constexpr bool kernel_validates = true;
  const NamedSharding* out = nullptr;
  Algorithm algorithm = Algorithm::kAuto;
  const char* name() const { return "matmul"; }
  template <Dtype T>
  Tensor<T> kernel(const Tensor<T>& a, const Tensor<T>& b) const {
    return detail::matmul_kernel(a, b);
  }
  template <Dtype T>
  ShardedArray<T> sharded(const ShardedArray<T>& a, const ShardedArray<T>& b) const;
  template <ArrayLike X>
  KernelVjp<X, X> vjp(const VjpNeed& need, const X& out, const X& a, const X& b) const;
};

/// numpy's vdot: the sum of the products of two arrays' elements (any shapes of one size; a
/// 0-d result). Sharded: the product on the blocks as binary() lines them up, then the sum.
struct Vdot : Primitive {
  static constexpr bool kernel_validates = true;
  const char* name() const { return "vdot"; }
  template <Dtype T>
  Tensor<T> kernel(const Tensor<T>& a, const Tensor<T>& b) const {
    return detail::vdot_kernel(a, b);
  }
  template <Dtype T>
  ShardedArray<T> sharded(const ShardedArray<T>& a, const ShardedArray<T>& b) const;
  template <ArrayLike X>
  KernelVjp<X, X> vjp(const VjpNeed& need, const X& out, const X& a, const X& b) const;
};

}  // namespace prim

/// matmul with the sharding rules only (what Algorithm::kRules runs).
template <typename T>
ShardedArray<T> matmul_by_rules(const ShardedArray<T>& a, const ShardedArray<T>& b,
                                const NamedSharding* out = nullptr);

namespace detail {

/// op(a) @ op(b) for 2-D operands, with the transposes in the gemm (matmul_rules.cpp: the blocks
/// are multiplied where they lie when the rules need no reshard; otherwise the operands are
/// transposed and multiplied by matmul). `out`: the sharding the result should have (as
/// matmul's; a contraction over mesh axes then ends in a psum_scatter where `out` splits C
/// further over them, instead of a psum and a reshard).
template <Dtype T>
ShardedArray<T> matmul_t(const ShardedArray<T>& a, bool ta, const ShardedArray<T>& b, bool tb,
                         const NamedSharding* out = nullptr);

}  // namespace detail

}  // namespace shard
