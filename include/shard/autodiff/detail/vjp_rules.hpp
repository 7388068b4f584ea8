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

// ---------------------------------------------------------------- helpers

// ---------------------------------------------------------------- elementwise

template <Dtype U, ArrayLike X>
auto record_astype_impl(Tape& tape, const X& x) {
  using T = elem_t<X>;
  auto out = paused([&] { return astype<U>(x); });
  using Out = decltype(out);
  if constexpr (FloatDtype<T> && FloatDtype<U>) {
    auto make = [&](auto xn) -> typename Node<Out>::Rule {
      return [xn](const Out& ct, std::uint32_t v) { push(xn, astype<T>(ct), v); };
    };
    return finish(tape, "astype", std::move(out), make, x);
  } else {
    return finish_constant(tape, std::move(out), x);
  }
}

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

template <ArrayLike X>
X record_vdot(Tape& tape, const X& a, const X& b) {
  X out = paused([&] { return vdot(a, b); });
  if constexpr (!FloatDtype<elem_t<X>>) {
    return finish_constant(tape, std::move(out), a, b);
  } else {
    auto make = [&](auto an, auto bn) -> typename Node<X>::Rule {
      return [an, bn, ak = keep(a), bk = keep(b)](const X& ct, std::uint32_t v) {
        if (an) push(an, ct * reshape(bk, ak.shape()), v);
        if (bn) push(bn, ct * reshape(ak, bk.shape()), v);
      };
    };
    return finish(tape, "vdot", std::move(out), make, a, b);
  }
}

// ---------------------------------------------------------------- shape ops

/// reshape, expand_dims, squeeze: the cotangent reshaped back.
template <ArrayLike X>
X record_reshape_like(Tape& tape, const X& x, const char* op, const std::function<X()>& kernel) {
  X out = paused(kernel);
  if constexpr (!FloatDtype<elem_t<X>>) {
    return finish_constant(tape, std::move(out), x);
  } else {
    auto make = [&](auto xn) -> typename Node<X>::Rule {
      return [xn, s = x.shape()](const X& ct, std::uint32_t v) {
        if constexpr (is_tensor_v<X>) {
          if (!recording_tape_for(ct) && ct.owns_memory()) {  // the cotangent's memory, reshaped
            X view = ct.alias();
            push(xn, std::move(view).reshaped(s), v);
            return;
          }
        }
        push(xn, reshape(ct, s), v);
      };
    };
    return linear_local(finish(tape, op, std::move(out), make, x));
  }
}

template <ArrayLike X>
X record_transpose(Tape& tape, const X& x, std::vector<int> perm) {
  X out = paused([&] { return transpose(x, perm); });
  if constexpr (!FloatDtype<elem_t<X>>) {
    return finish_constant(tape, std::move(out), x);
  } else {
    auto make = [&](auto xn) -> typename Node<X>::Rule {
      std::vector<int> inv;
      if (!perm.empty()) {
        inv.resize(perm.size());
        for (std::size_t k = 0; k < perm.size(); ++k) inv[static_cast<std::size_t>(perm[k])] = static_cast<int>(k);
      }
      return [xn, inv](const X& ct, std::uint32_t v) { push(xn, transpose(ct, inv), v); };
    };
    return linear_local(finish(tape, "transpose", std::move(out), make, x));
  }
}

template <ArrayLike X>
X record_broadcast_to(Tape& tape, const X& x, const Shape& shape) {
  X out = paused([&] { return broadcast_to(x, shape); });
  if constexpr (!FloatDtype<elem_t<X>>) {
    return finish_constant(tape, std::move(out), x);
  } else {
    auto make = [&](auto xn) -> typename Node<X>::Rule {
      return [xn, s = x.shape()](const X& ct, std::uint32_t v) { push(xn, unbroadcast(ct, s), v); };
    };
    return finish(tape, "broadcast_to", std::move(out), make, x);
  }
}

template <ArrayLike X>
X record_slice(Tape& tape, const X& x, const std::vector<Index>& index) {
  X out = paused([&] { return slice(x, index); });
  if constexpr (!FloatDtype<elem_t<X>>) {
    return finish_constant(tape, std::move(out), x);
  } else {
    auto make = [&](auto xn) -> typename Node<X>::Rule {
      return [xn, xm = NodeMeta<X>(x), index](const X& ct, std::uint32_t v) { push(xn, slice_transpose(ct, xm, index), v); };
    };
    return finish(tape, "slice", std::move(out), make, x);
  }
}

/// A node over a list of inputs (concatenate, stack): `piece(ct, i)` is input i's cotangent.
template <ArrayLike X, typename Piece>
X finish_list(Tape& tape, const char* op, X out, const std::vector<X>& xs, Piece piece) {
  std::uint32_t vma = 0;
  std::vector<NodePtr<X>> nodes;
  bool any = false;
  for (const auto& x : xs) {
    vma |= vma_of(x, tape);
    nodes.push_back(node_of(x, tape));
    any = any || nodes.back();
  }
  if constexpr (FloatDtype<elem_t<X>>) {
    if (any) {
      auto node = std::make_shared<Node<X>>(op, tape, vma, NodeMeta<X>(out));
      node->rule = [nodes, piece](const X& ct, std::uint32_t v) {
        for (std::size_t i = 0; i < nodes.size(); ++i)
          if (nodes[i]) push(nodes[i], piece(ct, i), v);
      };
      tape.append(node);
      out.set_ad(std::make_shared<AdValue>(AdValue{tape.id(), vma, std::move(node)}));
      return out;
    }
  }
  out.set_ad(vma ? std::make_shared<AdValue>(AdValue{tape.id(), vma, nullptr}) : nullptr);
  return out;
}

template <ArrayLike X>
X record_concatenate(Tape& tape, const std::vector<X>& xs, int axis) {
  X out = paused([&] { return concatenate(xs, axis); });
  const int a = resolve_dim(axis, xs.at(0).ndim(), "concatenate");
  std::vector<std::int64_t> offsets{0};
  for (const auto& x : xs) offsets.push_back(offsets.back() + x.shape()[a]);
  return finish_list(tape, "concatenate", std::move(out), xs, [a, offsets](const X& ct, std::size_t i) {
    std::vector<Index> index(static_cast<std::size_t>(a), Index(Slice()));
    index.emplace_back(Slice(offsets[i], offsets[i + 1]));
    return slice(ct, index);
  });
}

template <ArrayLike X>
X record_stack(Tape& tape, const std::vector<X>& xs, int axis) {
  X out = paused([&] { return stack(xs, axis); });
  const int a = resolve_dim(axis, xs.at(0).ndim() + 1, "stack");
  return finish_list(tape, "stack", std::move(out), xs, [a](const X& ct, std::size_t i) {
    std::vector<Index> index(static_cast<std::size_t>(a), Index(Slice()));
    index.emplace_back(static_cast<std::int64_t>(i));
    return slice(ct, index);
  });
}

template <ArrayLike X, ArrayLike I>
X record_take(Tape& tape, const X& x, const I& indices, int axis, bool along) {
  X out = paused([&] { return along ? take_along_axis(x, indices, axis) : take(x, indices, axis); });
  if constexpr (!FloatDtype<elem_t<X>>) {
    return finish_constant(tape, std::move(out), x, indices);
  } else {
    auto make = [&](auto xn, auto) -> typename Node<X>::Rule {
      return [xn, xm = NodeMeta<X>(x), ik = keep(indices), axis, along](const X& ct, std::uint32_t v) {
        push(xn, along ? take_along_axis_transpose(ct, ik, xm, axis) : take_transpose(ct, ik, xm, axis), v);
      };
    };
    return finish(tape, along ? "take_along_axis" : "take", std::move(out), make, x, indices);
  }
}

}  // namespace shard::detail
