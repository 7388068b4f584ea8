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

#include <type_traits>

#include "shard/array/driver.hpp"
#include "shard/array/reshard.hpp"
#include "shard/array/sharded_array.hpp"
#include "shard/core/primitive.hpp"
#include "shard/core/tensor_ops.hpp"
#include "shard/error.hpp"  // shard::source_location
#include "shard/linalg/algorithm.hpp"
#include "shard/ops/batching.hpp"

namespace shard {

/// The layouts matmul(a, b) runs with (metadata only): the resharded operands' specs, the
/// result spec, the contracting axes, and the bytes the reshards send.
struct MatmulPlan {
  PartitionSpec a, b, out;
  SpecEntry contract;  ///< mesh axes the partial products are summed over (None: no psum)
  std::int64_t reshard_bytes = 0;
  std::string to_string() const;
};

MatmulPlan plan_matmul(const Shape& a_shape, const NamedSharding& a, const Shape& b_shape,
                       const NamedSharding& b, std::size_t elem_size);

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
  std::shared_ptr<const NamedSharding> out;  ///< shared, not pointed to: jit keeps the primitive
  Algorithm algorithm = Algorithm::kAuto;
  const char* name() const { return "matmul"; }
  /// Every parameter (jit's common subexpressions): none with an explicit `out` (not merged).
  std::string cse_key() const { return out ? std::string() : std::to_string(static_cast<int>(algorithm)); }
  /// The factor rule jit's propagation lays the product out by (array/detail/trace_primitive.hpp):
  /// "...ik,...kj->...ij" for matrices and batches of them; none for vectors, an explicit `out` or a
  /// forced algorithm (the layout is then the user's).
  template <Dtype T>
  const FactorRule* layout_rule(const ShardedArray<T>& a, const ShardedArray<T>& b) const {
    if (out || algorithm != Algorithm::kAuto || a.ndim() < 2 || b.ndim() < 2) return nullptr;
    static const FactorRule rule("...ik,...kj->...ij");
    return &rule;
  }
  template <Dtype T>
  Tensor<T> kernel(const Tensor<T>& a, const Tensor<T>& b) const {
    return detail::matmul_kernel(a, b);
  }
  template <Dtype T>
  ShardedArray<T> sharded(const ShardedArray<T>& a, const ShardedArray<T>& b) const;
  template <ArrayLike X>
  KernelVjp<X, X> vjp(const VjpNeed& need, const X& out, const X& a, const X& b) const;
  /// Batching: the batch dim becomes a leading batch dim of the product. An unbatched right
  /// operand stays as it is (A[.., M, K] @ B[K, N]); an unbatched left one is moved right by
  /// transposing (a @ b_n = (b_n^T @ a^T)^T); otherwise both operands are brought to the same
  /// leading dims (the batch first, the examples' leading dims broadcast). A batched vector is a
  /// one-row (one-column) matrix whose dim is dropped after.
  template <ArrayLike X>
  BatchOut<X> batch(const shard::source_location& where, std::int64_t size, const BatchArg<X>& a,
                    const BatchArg<X>& b) const {
    const Matmul plain{{}, nullptr, algorithm};
    if (!b.batched() && b.rank() <= 2)  // (N, k) @ (k, n) is every example's (k) @ (k, n): one gemm
      return {detail::bind_at(plain, where, detail::batch_first(a), b.x), 0};
    if (!a.batched() && a.rank() <= 2) {
      X B = detail::batch_first(b);
      if (b.rank() == 1) B = expand_dims(B, 2, where);  // (N, k, 1)
      X bt = swapaxes(B, -1, -2);                       // (N, ..., n, k)
      X at = a.rank() == 1 ? reshape(a.x, Shape{a.x.shape()[0], 1}, where) : swapaxes(a.x, -1, -2);
      X out = swapaxes(detail::bind_at(plain, where, bt, at), -1, -2);  // (N, ..., m, n)
      if (a.rank() == 1) out = squeeze(out, Dims(-2), where);
      if (b.rank() == 1) out = squeeze(out, Dims(-1), where);
      return {std::move(out), 0};
    }
    // Both with leading dims: (N, *lead, m, k) @ (N, *lead, k, n).
    Shape ea = a.shape(), eb = b.shape();
    const bool va = ea.size() == 1, vb = eb.size() == 1;
    if (va) ea.insert(ea.begin(), 1);
    if (vb) eb.push_back(1);
    const Shape lead = broadcast_shapes(Shape(ea.begin(), ea.end() - 2), Shape(eb.begin(), eb.end() - 2));
    auto full = [&](const BatchArg<X>& v, const Shape& e) {
      Shape target{size};
      target.insert(target.end(), lead.begin(), lead.end());
      target.insert(target.end(), e.end() - 2, e.end());
      Shape padded(target.size() - e.size(), 1);
      if (v.batched()) padded[0] = size;
      padded.insert(padded.end(), e.begin(), e.end());
      X x = detail::reshaped_view(detail::batch_first(v), padded, where);
      return x.shape() == target ? x : detail::broadcast_like_shape(x, target);
    };
    // A contracting dim of 1 (per-example outer products: the weight gradients of vmap(grad))
    // is one broadcast multiply, not a small gemm per example.
    X out = ea.back() == 1 && !std::is_same_v<elem_t<X>, bool>
                ? binary(full(a, ea), full(b, eb), BinaryOp::kMul)
                : detail::bind_at(plain, where, full(a, ea), full(b, eb));
    if (vb) out = squeeze(out, Dims(-1), where);
    if (va) out = squeeze(out, Dims(vb ? -1 : -2), where);
    return {std::move(out), 0};
  }
};

/// op(a) @ op(b) of 2-D operands, op a transpose where `ta` / `tb`, with the transposes in the gemm
/// (detail::matmul_t): what matmul's VJP binds on operands that jit traces, so the jitted backward
/// pass multiplies with the transposes in the gemm as eager's does instead of copying each one
/// (train_mlp --jit spent 4.4 ms of a 22 ms step in those copies). Sharded: float dtypes, `out`
/// as matmul's. No VJP: it is bound only inside a backward pass, which no tape records
/// (higher-order derivatives are refused). Batching: the examples' transposes made, then
/// matmul's rule.
struct MatmulT : Primitive {
  static constexpr bool kernel_validates = true;  // detail::matmul_t checks the shapes
  bool ta = false, tb = false;
  std::shared_ptr<const NamedSharding> out;  ///< where the product should land (matmul_t's `out`)
  const char* name() const { return "matmul_t"; }
  /// jit's common subexpressions (trace_primitive.hpp): the transposes and where the product lands
  /// (a backward pass always says: the cotangent's layout).
  std::string cse_key() const {
    std::string key{ta ? 't' : 'n', tb ? 't' : 'n'};
    if (out) key += " " + out->to_string() + out->mesh().devices_string();
    return key;
  }
  template <Dtype T>
  Tensor<T> kernel(const Tensor<T>& a, const Tensor<T>& b) const {
    return detail::matmul_t(a, ta, b, tb);
  }
  template <Dtype T>
  ShardedArray<T> sharded(const ShardedArray<T>& a, const ShardedArray<T>& b) const;
  template <ArrayLike X>
  BatchOut<X> batch(const shard::source_location& where, std::int64_t size, const BatchArg<X>& a,
                    const BatchArg<X>& b) const;  // matmul.cpp
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
  /// Batching: each example flattened, the products summed along the flattened dim.
  template <ArrayLike X>
  BatchOut<X> batch(const shard::source_location& where, std::int64_t size, const BatchArg<X>& a,
                    const BatchArg<X>& b) const {
    auto flat = [&](const BatchArg<X>& v) {
      return v.batched() ? reshape(detail::batch_first(v), Shape{size, -1}, where)
                         : reshape(v.x, Shape{-1}, where);
    };
    return {reduce(binary(flat(a), flat(b), BinaryOp::kMul), ReduceKind::kSum, Dims(-1), false), 0};
  }
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
