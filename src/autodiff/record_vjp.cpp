// The node of a primitive (core/trace.hpp record_vjp: every op of the op table, and the layout
// moves between views to_host and uncommitted): the node asks the primitive's VJP for the inputs'
// cotangents and pushes them to the inputs' nodes (or hands them a deferred one, a leaf's).

#include <array>
#include <span>

#include "shard/autodiff/detail/ad_node.hpp"

namespace shard::detail {

namespace {

/// The input nodes of a recorded op: up to three inline (every primitive of the op table), more
/// in a vector. No allocation for the common case.
template <typename In>
struct InputNodes {
  std::array<NodePtr<In>, 3> inline_nodes;
  std::vector<NodePtr<In>> more;
  std::size_t n = 0;
  const NodePtr<In>& operator[](std::size_t i) const { return n <= 3 ? inline_nodes[i] : more[i]; }
};

}  // namespace

template <typename Out, typename In>
Out record_vjp_node(Tape& tape, const char* op, Out&& out, std::span<const In* const> inputs,
                    KernelVjp<Out, In> vjp, std::uint32_t vma, std::uint32_t ct_extra, bool linear_local) {
  if constexpr (std::is_same_v<Out, In>) {
    if (inputs.size() <= 3) {  // every primitive of the op table: the node holds the VJP itself
      auto node = std::make_shared<Node<Out>>(op, tape, vma, NodeMeta<Out>(out));
      node->linear_local = linear_local;
      node->vjp_need = VjpNeed{0, inputs.size()};
      for (std::size_t i = 0; i < inputs.size(); ++i) {
        node->vjp_inputs[i] = node_of(*inputs[i], tape);
        if (node->vjp_inputs[i]) node->vjp_need.bits |= std::uint64_t{1} << i;
      }
      node->vjp = std::move(vjp);
      node->ct_extra = ct_extra;
      tape.append(node);
      out.set_ad(std::make_shared<AdValue>(AdValue{tape.id(), vma, std::move(node)}));
      return std::move(out);
    }
  }
  InputNodes<In> nodes;
  nodes.n = inputs.size();
  VjpNeed need{0, inputs.size()};
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    NodePtr<In> node = node_of(*inputs[i], tape);
    if (node && i < 64) need.bits |= std::uint64_t{1} << i;
    if (nodes.n <= 3)
      nodes.inline_nodes[i] = std::move(node);
    else
      nodes.more.push_back(std::move(node));
  }
  auto node = std::make_shared<Node<Out>>(op, tape, vma, NodeMeta<Out>(out));
  node->linear_local = linear_local;
  node->rule = [nodes = std::move(nodes), need, vjp = std::move(vjp), ct_extra](const Out& ct,
                                                                                std::uint32_t v) {
    Cotangents<In> cts = vjp(ct, need);
    for (std::size_t i = 0; i < nodes.n && i < cts.size(); ++i)
      if (nodes[i] && cts[i]) nodes[i]->add(std::move(*cts[i]), v | ct_extra);
    for (auto& [i, take] : cts.deferred())
      if (i < nodes.n && nodes[i]) nodes[i]->defer(std::move(take));
  };
  tape.append(node);
  out.set_ad(std::make_shared<AdValue>(AdValue{tape.id(), vma, std::move(node)}));
  return std::move(out);
}

// (Out, In) of one view for every pair of floating dtypes (astype converts between them), and
// of both views for one dtype (to_host, uncommitted, shard_map's links).
#define SHARD_RECORD_VJP_PAIR(U, T)                                                                        \
  template Tensor<U> record_vjp_node<Tensor<U>, Tensor<T>>(                                                \
      Tape&, const char*, Tensor<U>&&, std::span<const Tensor<T>* const>, KernelVjp<Tensor<U>, Tensor<T>>, \
      std::uint32_t, std::uint32_t, bool);                                                                 \
  template ShardedArray<U> record_vjp_node<ShardedArray<U>, ShardedArray<T>>(                              \
      Tape&, const char*, ShardedArray<U>&&, std::span<const ShardedArray<T>* const>,                      \
      KernelVjp<ShardedArray<U>, ShardedArray<T>>, std::uint32_t, std::uint32_t, bool);
SHARD_FOR_EACH_DTYPE_PAIR(FLOAT, FLOAT, SHARD_RECORD_VJP_PAIR)
#undef SHARD_RECORD_VJP_PAIR
#define SHARD_RECORD_VJP_VIEWS(T)                                                 \
  template Tensor<T> record_vjp_node<Tensor<T>, ShardedArray<T>>(                 \
      Tape&, const char*, Tensor<T>&&, std::span<const ShardedArray<T>* const>,   \
      KernelVjp<Tensor<T>, ShardedArray<T>>, std::uint32_t, std::uint32_t, bool); \
  template ShardedArray<T> record_vjp_node<ShardedArray<T>, Tensor<T>>(           \
      Tape&, const char*, ShardedArray<T>&&, std::span<const Tensor<T>* const>,   \
      KernelVjp<ShardedArray<T>, Tensor<T>>, std::uint32_t, std::uint32_t, bool);
SHARD_FOR_EACH_FLOAT_DTYPE(SHARD_RECORD_VJP_VIEWS)
#undef SHARD_RECORD_VJP_VIEWS

}  // namespace shard::detail
