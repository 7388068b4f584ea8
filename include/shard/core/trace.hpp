#pragma once
/// \file The hook through which a kernel hands its op to the transformation that records it
/// (DESIGN.md "Layers": declarations only; core never includes autodiff).
///
/// The op driver (array/driver.hpp) records every primitive of the op table through
/// record_vjp below: when a tape records one of the operands it runs the op with recording
/// paused and hands the tape the primitive's VJP (the cotangents of its inputs); the autodiff
/// layer makes the node (src/autodiff/record_vjp.cpp). The fused kernels with a VJP of their own
/// (softmax, standardize, attention) are primitives with forward_vjp (ops/nn.hpp); the
/// collectives and the layout moves between views (to_host, uncommitted) call record_vjp themselves.
///
/// A kernel knows that its op is recorded, not how: the node is the autodiff layer's.

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "shard/core/array_ops.hpp"
#include "shard/core/box.hpp"
#include "shard/core/detail/tape.hpp"
#include "shard/core/index.hpp"

namespace shard::detail {

/// What a node remembers of its primal: the shape (and a ShardedArray's sharding: the
/// cotangent's sharding, as in JAX; that specialization is in array/detail/node_meta.hpp).
template <typename X>
struct NodeMeta;
template <Dtype T>
struct NodeMeta<Tensor<T>> {
  explicit NodeMeta(const Tensor<T>& x) : shape(x.shape()) {}
  explicit NodeMeta(Shape s) : shape(std::move(s)) {}
  Shape shape;
};

/// A node with what it remembers of its primal (autodiff's Node<X> derives from it): a VJP
/// reads its inputs' metadata through VjpNeed::input (where a leaf's cotangent is kept).
template <typename X>
struct MetaNode : NodeBase {
  MetaNode(const char* op_, NodeMeta<X> meta_) : NodeBase(op_), meta(std::move(meta_)) {}
  NodeMeta<X> meta;
};

// ---------------------------------------------------------------- kernels the rules use
// Defined with the kernels (src/core/tensor_*.cpp, src/ops/ops_shape.cpp).

/// op(a) @ op(b) of 2-D operands, op = transpose when ta / tb (tensor_linalg.cpp; `into`: m x n
/// elements the product is written to, the result borrows them).
template <Dtype T>
Tensor<T> matmul_t(const Tensor<T>& a, bool ta, const Tensor<T>& b, bool tb, T* into = nullptr);
/// ct * gelu'(x) in one pass over Tensors of one shape.
template <Dtype T>
Tensor<T> gelu_vjp(const Tensor<T>& x, const Tensor<T>& ct);
/// The cotangent of x from that of slice(x, index): ct placed at the slice, zeros elsewhere.
template <Dtype T>
Tensor<T> slice_transpose(const Tensor<T>& ct, const NodeMeta<Tensor<T>>& x, const std::vector<Index>& index);
template <Dtype T>
ShardedArray<T> slice_transpose(const ShardedArray<T>& ct, const NodeMeta<ShardedArray<T>>& x,
                                const std::vector<Index>& index);
/// The cotangent of x from that of take(x, indices, axis): rows scatter-added.
template <Dtype T, Dtype I>
Tensor<T> take_transpose(const Tensor<T>& ct, const Tensor<I>& indices, const NodeMeta<Tensor<T>>& x,
                         int axis);
template <Dtype T, Dtype I>
ShardedArray<T> take_transpose(const ShardedArray<T>& ct, const ShardedArray<I>& indices,
                               const NodeMeta<ShardedArray<T>>& x, int axis);
template <Dtype T, Dtype I>
Tensor<T> take_along_axis_transpose(const Tensor<T>& ct, const Tensor<I>& indices,
                                    const NodeMeta<Tensor<T>>& x, int axis);
template <Dtype T, Dtype I>
ShardedArray<T> take_along_axis_transpose(const ShardedArray<T>& ct, const ShardedArray<I>& indices,
                                          const NodeMeta<ShardedArray<T>>& x, int axis);

// ---------------------------------------------------------------- kernels with their own VJP

}  // namespace shard::detail

namespace shard {
/// Which inputs of an op need a cotangent (need[i]: input i is differentiable). The mask holds
/// the first 64 inputs; inputs past those of a list op (concatenate) count as needed.
struct VjpNeed {
  std::uint64_t bits = 0;
  std::size_t n = 0;
  /// During the backward pass of a primitive with up to three inputs: the inputs' nodes (null
  /// for a constant); null elsewhere.
  const detail::NodeBase* const* nodes = nullptr;
  bool operator[](std::size_t i) const { return i >= 64 || ((bits >> i) & 1u); }
  std::size_t size() const { return n; }
  /// Input i is a differentiated input (a parameter): its cotangent is a gradient read only when
  /// the pass ends, so the VJP may return it deferred (Cotangents::defer).
  bool leaf(std::size_t i) const { return nodes && i < 3 && nodes[i] && nodes[i]->leaf; }
  /// What input i's node remembers of its primal, the sharding its cotangent is kept in included
  /// (a leaf's may differ from the primal's: grad_sharding); null when not known.
  template <typename X>
  const detail::NodeMeta<X>* input(std::size_t i) const {
    if (!nodes || i >= 3 || !nodes[i]) return nullptr;
    return &static_cast<const detail::MetaNode<X>*>(nodes[i])->meta;
  }
};
}  // namespace shard

namespace shard {
/// The cotangents a VJP returns: entry i for input i, empty where the input gets none (a
/// constant, or a zero). Up to three inline, so a primitive's backward step allocates nothing here.
template <typename X>
class Cotangents {
 public:
  Cotangents() = default;
  explicit Cotangents(std::size_t n) : n_(n) {
    if (n > inline_.size()) more_.resize(n);
  }
  std::size_t size() const { return n_; }
  /// Input i's cotangent is in flight (a leaf's, VjpNeed::leaf): `take` waits for it and returns it.
  void defer(std::size_t i, std::function<X()> take) { deferred_.emplace_back(i, std::move(take)); }
  std::vector<std::pair<std::size_t, std::function<X()>>>& deferred() { return deferred_; }
  std::optional<X>& operator[](std::size_t i) { return n_ <= inline_.size() ? inline_[i] : more_[i]; }
  const std::optional<X>& operator[](std::size_t i) const {
    return n_ <= inline_.size() ? inline_[i] : more_[i];
  }

 private:
  std::array<std::optional<X>, 3> inline_;
  std::vector<std::optional<X>> more_;
  std::vector<std::pair<std::size_t, std::function<X()>>> deferred_;
  std::size_t n_ = 0;
};

/// The cotangents of inputs 0, 1, ... (moved in).
template <typename X, typename... More>
Cotangents<X> cotangents(std::type_identity_t<X>&& first, More&&... more) {
  Cotangents<X> r(1 + sizeof...(More));
  r[0].emplace(std::move(first));
  std::size_t i = 1;
  ((r[i++].emplace(std::forward<More>(more))), ...);
  return r;
}
}  // namespace shard

namespace shard::detail {

/// The cotangents of an op's inputs from its output's: entry i for input i (left empty when
/// need[i] is false: that input is a constant).
template <typename Out, typename In>
using KernelVjp = std::function<Cotangents<In>(const Out& ct, const VjpNeed& need)>;

/// Records `out = op(inputs...)` with the VJP `vjp` (floating arrays; defined by autodiff): the
/// result varies over the axes `vma`, the inputs' cotangents over those plus `ct_extra`.
template <typename Out, typename In>
Out record_vjp_node(Tape& tape, const char* op, Out&& out, std::span<const In* const> inputs,
                    KernelVjp<Out, In> vjp, std::uint32_t vma, std::uint32_t ct_extra, bool linear_local);

/// The vma of the inputs on `tape` (bit mask over the body's mesh axes).
template <typename In>
std::uint32_t vma_of_all(const Tape& tape, std::span<const In* const> inputs) {
  std::uint32_t vma = 0;
  for (const In* x : inputs) vma |= vma_of(*x, tape);
  return vma;
}

/// True when one of the inputs is differentiable on `tape` (a node, not only a vma).
template <typename In>
bool any_differentiable(const Tape& tape, std::span<const In* const> inputs) {
  for (const In* x : inputs)
    if (differentiable_on(*x, tape)) return true;
  return false;
}

template <typename In>
std::uint32_t vma_of_all(const Tape& tape, const std::vector<const In*>& inputs) {
  return vma_of_all(tape, std::span<const In* const>(inputs));
}
template <typename In>
bool any_differentiable(const Tape& tape, const std::vector<const In*>& inputs) {
  return any_differentiable(tape, std::span<const In* const>(inputs));
}

/// Records an op whose kernel computes its own VJP: a node when an input is differentiable
/// and the result floating, else the result carries the vma only. Build `vjp` (which keeps
/// aliases of the output it needs, keep(out)) before calling: `out` is moved here. The result
/// varies over the inputs' axes, or over `out_vma` when given (a collective's rule: psum's result
/// varies over fewer axes, all_gather's over more); the inputs' cotangents vary over the
/// result's axes plus `ct_extra` (psum's transpose is pvary). `linear_local`: a linear op without
/// communication, whose node passes varying cotangents through (their psum waits for the primal). The inputs
/// must still carry their records: a kernel that moves an operand away passes a Tensor that holds only the
/// operand's ad().
template <typename Out, typename In>
Out record_vjp(Tape& tape, const char* op, Out&& out, std::span<const In* const> inputs,
               KernelVjp<Out, In> vjp, std::optional<std::uint32_t> out_vma = std::nullopt,
               std::uint32_t ct_extra = 0, bool linear_local = false) {
  const std::uint32_t vma = out_vma ? *out_vma : vma_of_all(tape, inputs);
  if constexpr (FloatDtype<elem_t<Out>> && FloatDtype<elem_t<In>>) {
    if (any_differentiable(tape, inputs))
      return record_vjp_node(tape, op, std::move(out), inputs, std::move(vjp), vma, ct_extra, linear_local);
  }
  out.set_ad(vma ? std::make_shared<AdValue>(AdValue{tape.id(), vma, nullptr}) : nullptr);
  return std::move(out);
}

/// The same with the inputs in a vector.
template <typename Out, typename In>
Out record_vjp(Tape& tape, const char* op, Out&& out, const std::vector<const In*>& inputs,
               KernelVjp<Out, In> vjp, std::optional<std::uint32_t> out_vma = std::nullopt,
               std::uint32_t ct_extra = 0, bool linear_local = false) {
  return record_vjp<Out, In>(tape, op, std::move(out), std::span<const In* const>(inputs), std::move(vjp),
                             out_vma, ct_extra, linear_local);
}

}  // namespace shard::detail
