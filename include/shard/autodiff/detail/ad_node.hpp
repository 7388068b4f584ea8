#pragma once
/// \file The nodes of the autodiff tape (internals of autodiff.hpp): what a node remembers of
/// its primal, how cotangent contributions accumulate (psums of the ones that vary over extra
/// mesh axes, waits for deferred gradient sums), and how an op's result becomes a node
/// (finish). The rules themselves are the primitives' vjp() (ops/*.hpp).

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "shard/array/detail/node_meta.hpp"
#include "shard/array/reshard.hpp"
#include "shard/core/detail/tape.hpp"
#include "shard/core/tensor_ops.hpp"
#include "shard/core/trace.hpp"
#include "shard/error.hpp"
#include "shard/ops/ops.hpp"

namespace shard::detail {

// ---------------------------------------------------------------- nodes

/// Zeros shaped (and sharded) like a node's primal.
template <Dtype T>
Tensor<T> zeros_like(const NodeMeta<Tensor<T>>& m) {
  return Tensor<T>(m.shape, T(0));
}
template <Dtype T>
ShardedArray<T> zeros_like(const NodeMeta<ShardedArray<T>>& m) {
  return zeros<T>(m.shape, m.sharding);
}

/// A psum over the mesh axes `axes` (bit mask over tape.axis_names()) through a device tape's
/// context (shard_map.cpp).
template <Dtype T>
Tensor<T> tape_psum(Tape& tape, Tensor<T> x, std::uint32_t axes);

/// acc += v (same shape; in place when acc's storage is its own).
template <Dtype T>
void add_in_place(Tensor<T>& acc, const Tensor<T>& v) {
  if (acc.unique_storage()) binary_inplace(acc, v, BinaryOp::kAdd);
  else acc = binary(acc, v, BinaryOp::kAdd);
}
template <Dtype T>
void add_in_place(ShardedArray<T>& acc, const ShardedArray<T>& v) {
  if (acc.batch() || v.batch()) {  // batched values (vmap(grad)) have no shards of their own
    acc = binary(acc, v, BinaryOp::kAdd);
    return;
  }
  auto& a = acc.addressable_shards();
  const auto& b = v.addressable_shards();
  for (std::size_t i = 0; i < a.size(); ++i) add_in_place(a[i].data, b[i].data);
}
template <typename X>
void accumulate(std::optional<X>& acc, X&& v) {
  if (!acc) acc.emplace(std::move(v));
  else add_in_place(*acc, v);
}

/// A node whose primal is an array of type X.
template <typename X>
struct Node final : MetaNode<X> {
  /// Pushes the input cotangents of the op, given the output's (`vma`: the output's axes).
  using Rule = std::function<void(const X& ct, std::uint32_t vma)>;
  using MetaNode<X>::op;
  using MetaNode<X>::meta;
  using MetaNode<X>::leaf;

  Node(const char* op_, Tape& tape_, std::uint32_t vma_, NodeMeta<X> meta_)
      : MetaNode<X>(op_, std::move(meta_)), tape(&tape_), vma(vma_) {}

  bool has_cotangent() const override { return ct.has_value() || !pending.empty() || !deferred.empty(); }

  /// Adds a contribution that varies over the axes `ct_vma`; one that varies over axes the
  /// primal does not is summed over them when the node runs (the transpose of pvary).
  void add(X&& v, std::uint32_t ct_vma) {
    if (v.shape() != meta.shape)
      raise<Error>("autodiff: a cotangent of shape ", to_string(v.shape()), " reached '", op, "' whose value has shape ",
                   to_string(meta.shape), " (an internal error of a derivative rule)");
    if constexpr (is_sharded_v<X>) {
      if (!(v.sharding() == meta.sharding)) v = reshard(v, meta.sharding);
    }
    v.set_ad(nullptr);
    const std::uint32_t excess = ct_vma & ~vma;
    if (!excess) {
      accumulate(ct, std::move(v));
      return;
    }
    for (auto& [mask, part] : pending)
      if (mask == excess) {
        add_in_place(part, v);
        return;
      }
    pending.emplace_back(excess, std::move(v));
  }

  /// A contribution whose reduction is in flight (a leaf's, grad_reduce.hpp): `take` waits
  /// for it and returns it, sharded as the primal.
  void defer(std::function<X()> take) { deferred.push_back(std::move(take)); }

  /// The whole cotangent: pending contributions psummed over their extra axes and added, and
  /// the deferred ones waited for.
  X& total() {
    if constexpr (is_tensor_v<X>) {
      for (auto& [mask, part] : pending) accumulate(ct, tape_psum(*tape, std::move(part), mask));
    }
    pending.clear();
    for (auto& take : deferred) accumulate(ct, take());
    deferred.clear();
    return *ct;
  }

  /// The cotangent in parts, unsummed (a shard_map argument's block, whose sums over the axes
  /// the argument is invariant over run in the global view, bucketed like every parameter's
  /// gradient: ShardMapAd): the part that varies over the primal's axes only, and one part per
  /// set of extra axes, in increasing order of the axes' mask. Leaves the node empty.
  std::pair<std::optional<X>, std::vector<std::pair<std::uint32_t, X>>> take_parts() {
    for (auto& take : deferred) accumulate(ct, take());
    deferred.clear();
    std::vector<std::pair<std::uint32_t, X>> parts = std::move(pending);
    pending.clear();
    std::sort(parts.begin(), parts.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::optional<X> own = std::move(ct);
    ct.reset();
    return {std::move(own), std::move(parts)};
  }

  void backward(bool keep) override {
    if (!has_cotangent()) {
      if (!keep) drop_rule();
      return;
    }
    if constexpr (is_tensor_v<X>) {
      // The transpose of pvary commutes with a local linear op (a transpose, a reshape): the
      // contributions that vary over more axes than this value pass through unsummed, so an
      // invariant parameter used in several places (a tied embedding and its transpose) is
      // psummed once, at its own node, over the sum of its uses.
      if (linear_local && has_rule() && !pending.empty()) {
        for (auto& [mask, part] : pending) apply(part, vma | mask);
        pending.clear();
        if (!ct && deferred.empty()) {
          if (!keep) drop_rule();
          return;
        }
      }
    }
    const X& c = total();
    apply(c, vma);
    if (!keep) {
      drop_rule();  // frees the residuals
      if (!leaf) ct.reset();
    }
  }

  bool has_rule() const { return rule || vjp; }
  /// Runs the rule (or the primitive's VJP, pushing its cotangents to the input nodes).
  void apply(const X& c, std::uint32_t v) {
    if (rule) {
      rule(c, v);
    } else if (vjp) {
      const std::array<const NodeBase*, 3> nodes{vjp_inputs[0].get(), vjp_inputs[1].get(), vjp_inputs[2].get()};
      VjpNeed need = vjp_need;
      need.nodes = nodes.data();
      Cotangents<X> cts = vjp(c, need);
      for (std::size_t i = 0; i < vjp_need.size() && i < cts.size(); ++i)
        if (vjp_inputs[i] && cts[i]) vjp_inputs[i]->add(std::move(*cts[i]), v | ct_extra);
      for (auto& [i, take] : cts.deferred())
        if (i < vjp_inputs.size() && vjp_inputs[i]) vjp_inputs[i]->defer(std::move(take));
    }
  }
  void drop_rule() {
    rule = nullptr;
    vjp = nullptr;
    vjp_inputs = {};
  }
  void reset() override {
    ct.reset();
    pending.clear();
    deferred.clear();
  }

  Tape* tape;
  std::uint32_t vma;
  Rule rule;
  /// A primitive's VJP with up to three inputs of this node's type (record_vjp): the cotangents
  /// it returns go to vjp_inputs (no rule closure around it).
  KernelVjp<X, X> vjp;
  std::array<std::shared_ptr<Node>, 3> vjp_inputs;
  VjpNeed vjp_need;
  std::uint32_t ct_extra = 0;
  bool linear_local = false;  ///< a linear op without communication (see backward)
  std::optional<X> ct;
  std::vector<std::pair<std::uint32_t, X>> pending;
  std::vector<std::function<X()>> deferred;
};

template <typename X>
using NodePtr = std::shared_ptr<Node<X>>;

/// A parameter's node, or a reshard of one (a layout of it, as FSDP's all_gather of a parameter
/// split over 'data' for a shard_map): its cotangent reaches the parameter through linear maps
/// that do not depend on the data, so gradient accumulation may sum it across micro-batches
/// before reducing it (ops/detail/grad_reduce.hpp).
template <typename X>
bool parameter_like(const Node<X>& n) {
  if (n.leaf) return true;
  if (std::string_view(n.op) != "reshard" || !n.vjp_inputs[0] || n.vjp_inputs[1]) return false;
  return parameter_like(*n.vjp_inputs[0]);
}

/// x's node on `tape` (null for a constant).
template <typename X>
NodePtr<X> node_of(const X& x, const Tape& tape) {
  const AdValue* a = ad_on(x, &tape);
  return a && a->node ? std::static_pointer_cast<Node<X>>(a->node) : nullptr;
}

/// Pushes a cotangent contribution to an input's node (nothing for a constant).
template <typename X>
void push(const NodePtr<X>& n, X v, std::uint32_t vma) {
  if (n) n->add(std::move(v), vma);
}

/// Marks `out` as the result of op on the inputs: a node (when an input is differentiable
/// and out is floating) whose rule `make_rule(input nodes...)` returns; otherwise only the
/// union of the inputs' vma.
/// `out` is taken by reference and moved only after make_rule ran (rules keep aliases of it).
template <typename Out, typename MakeRule, typename... In>
  requires(!std::is_reference_v<Out>)
Out finish(Tape& tape, const char* op, Out&& out, MakeRule&& make_rule, const In&... in) {
  const std::uint32_t vma = (vma_of(in, tape) | ... | 0u);
  if constexpr (FloatDtype<elem_t<Out>>) {
    if ((node_of(in, tape) || ...)) {
      auto node = std::make_shared<Node<Out>>(op, tape, vma, NodeMeta<Out>(out));
      node->rule = make_rule(node_of(in, tape)...);
      tape.append(node);
      out.set_ad(std::make_shared<AdValue>(AdValue{tape.id(), vma, std::move(node)}));
      return std::move(out);
    }
  }
  out.set_ad(vma ? std::make_shared<AdValue>(AdValue{tape.id(), vma, nullptr}) : nullptr);
  return std::move(out);
}

/// Marks out's node (if any) as a linear op without communication: its backward passes
/// varying cotangents through instead of psumming them (Node::backward).
template <typename Out>
Out linear_local(Out out) {
  if (const auto& a = out.ad(); a && a->node) static_cast<Node<Out>*>(a->node.get())->linear_local = true;
  return out;
}

}  // namespace shard::detail
