#pragma once
/// \file The vector-Jacobian products of the op set (internals of autodiff.hpp), written once
/// for both views with the ops themselves: a rule for a ShardedArray op is the same ops on
/// sharded arrays, so the backward pass communicates exactly where the sharding rules say
/// (x P('data', None) @ W gives dW = x^T @ dy, one psum over 'data'). Each record_* function
/// runs the kernel with recording paused and appends a node to the tape; the kernels call them
/// from their first line when an operand is tracked (tape.hpp).

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <numbers>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "shard/autodiff/detail/ad_node.hpp"
#include "shard/autodiff/detail/grad_reduce.hpp"
#include "shard/core/detail/tape.hpp"
#include "shard/core/trace.hpp"
#include "shard/error.hpp"
#include "shard/ops/elementwise.hpp"
#include "shard/ops/reduce.hpp"
#include "shard/ops/ops.hpp"
#include "shard/array/reshard.hpp"
#include "shard/core/tensor_ops.hpp"

namespace shard::detail {

// ---------------------------------------------------------------- products

/// op(a) @ op(b) for 2-D operands, with the transposes in the gemm (tensor_linalg.cpp, matmul.cpp:
/// the sharded form multiplies the blocks where they lie when the rules need no reshard, and
/// otherwise transposes and calls matmul). `out`: the sharding the result should have (as
/// matmul's; a contraction over mesh axes then ends in a psum_scatter where `out` splits C
/// further over them, instead of a psum and a reshard). `into`: m x n elements the Tensor
/// form writes its product to (the result borrows them).
template <Dtype T>
ShardedArray<T> matmul_t(const ShardedArray<T>& a, bool ta, const ShardedArray<T>& b, bool tb,
                         const NamedSharding* out = nullptr);

/// The cotangents of a and b in numpy's matmul (1-D operands promoted, batch dims broadcast).
/// Only the operand the other's cotangent needs is kept (ak when bn, bk when an).
template <ArrayLike X>
void matmul_transpose(const X& ct, const NodePtr<X>& an, const NodePtr<X>& bn, const std::optional<X>& ak,
                      const std::optional<X>& bk, const Shape& as, const Shape& bs, std::uint32_t v) {
  const bool a1 = as.size() == 1, b1 = bs.size() == 1;
  X c2 = ct.alias();
  if (a1) c2 = expand_dims(c2, c2.ndim() - (b1 ? 0 : 1));
  if (b1) c2 = expand_dims(c2, -1);
  if (!a1 && !b1 && as.size() == 2 && bs.size() == 2) {  // the common case: no transpose copies
    if constexpr (is_sharded_v<X>) {  // each product lands where its node keeps its cotangent
      // A parameter's gradient: its psum over the contracting axes runs behind the rest of the
      // backward pass where it can (grad_reduce.hpp).
      auto product = [&](const NodePtr<X>& n, const X& l, bool tl, const X& r, bool tr) {
        if (n->leaf)
          if (auto take = matmul_t_deferred(l, tl, r, tr, n->meta.sharding)) return n->defer(std::move(take));
        push(n, matmul_t(l, tl, r, tr, &n->meta.sharding), v);
      };
      if (an) product(an, c2, false, *bk, true);
      if (bn) product(bn, *ak, true, c2, false);
    } else {
      if (an) push(an, matmul_t(c2, false, *bk, true), v);
      if (bn) push(bn, matmul_t(*ak, true, c2, false), v);
    }
    return;
  }
  if (an) {
    const X b2 = b1 ? expand_dims(*bk, -1) : bk->alias();
    X da = matmul(c2, swapaxes(b2, -1, -2));
    if (a1) push(an, reshape(da, as), v);
    else push(an, unbroadcast(da, as), v);
  }
  if (bn) {
    const X a2 = a1 ? expand_dims(*ak, 0) : ak->alias();
    X db = matmul(swapaxes(a2, -1, -2), c2);
    if (b1) push(bn, reshape(db, bs), v);
    else push(bn, unbroadcast(db, bs), v);
  }
}

/// matmul and dot (dot of a 0-d operand is a product; otherwise it is matmul for b of up to 2 dims).
template <ArrayLike X>
X record_matmul(Tape& tape, const X& a, const X& b, const char* op, const std::function<X()>& kernel) {
  X out = paused(kernel);
  if constexpr (!FloatDtype<elem_t<X>>) {
    return finish_constant(tape, std::move(out), a, b);
  } else {
    auto make = [&](auto an, auto bn) -> typename Node<X>::Rule {
      if (a.ndim() == 0 || b.ndim() == 0)
        return [an, bn, as = a.shape(), bs = b.shape(), ak = keep(a), bk = keep(b)](const X& ct, std::uint32_t v) {
          if (an) push(an, unbroadcast(ct * bk, as), v);
          if (bn) push(bn, unbroadcast(ct * ak, bs), v);
        };
      return [an, bn, ak = bn ? std::optional<X>(keep(a)) : std::nullopt,
              bk = an ? std::optional<X>(keep(b)) : std::nullopt, as = a.shape(), bs = b.shape()](const X& ct,
                                                                                                   std::uint32_t v) {
        matmul_transpose(ct, an, bn, ak, bk, as, bs, v);
      };
    };
    return finish(tape, op, std::move(out), make, a, b);
  }
}

}  // namespace shard::detail
