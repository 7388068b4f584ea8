// The node of a kernel that computes its own VJP (core/trace.hpp record_vjp: softmax,
// standardize, attention, to_host, reshard, uncommitted): the rule asks the kernel's VJP for the
// inputs' cotangents and pushes them to the inputs' nodes.

#include "shard/autodiff/detail/vjp_rules.hpp"

namespace shard::detail {

template <typename Out, typename In>
Out record_vjp_node(Tape& tape, const char* op, Out out, const std::vector<const In*>& inputs,
                    KernelVjp<Out, In> vjp, std::uint32_t vma, std::uint32_t ct_extra, bool linear_local) {
  std::vector<NodePtr<In>> nodes;
  std::vector<bool> need;
  for (const In* x : inputs) {
    nodes.push_back(node_of(*x, tape));
    need.push_back(nodes.back() != nullptr);
  }
  auto node = std::make_shared<Node<Out>>(op, tape, vma, NodeMeta<Out>(out));
  node->linear_local = linear_local;
  node->rule = [nodes = std::move(nodes), need = std::move(need), vjp = std::move(vjp), ct_extra](
                   const Out& ct, std::uint32_t v) {
    std::vector<std::optional<In>> cts = vjp(ct, need);
    for (std::size_t i = 0; i < nodes.size() && i < cts.size(); ++i)
      if (nodes[i] && cts[i]) push(nodes[i], std::move(*cts[i]), v | ct_extra);
  };
  tape.append(node);
  out.set_ad(std::make_shared<AdValue>(AdValue{tape.id(), vma, std::move(node)}));
  return out;
}

#define SHARD_RECORD_VJP(T)                                                                                 \
  template Tensor<T> record_vjp_node<Tensor<T>, Tensor<T>>(                                                 \
      Tape&, const char*, Tensor<T>, const std::vector<const Tensor<T>*>&, KernelVjp<Tensor<T>, Tensor<T>>, \
      std::uint32_t, std::uint32_t, bool);                                                                  \
  template ShardedArray<T> record_vjp_node<ShardedArray<T>, ShardedArray<T>>(                               \
      Tape&, const char*, ShardedArray<T>, const std::vector<const ShardedArray<T>*>&,                      \
      KernelVjp<ShardedArray<T>, ShardedArray<T>>, std::uint32_t, std::uint32_t, bool);                     \
  template Tensor<T> record_vjp_node<Tensor<T>, ShardedArray<T>>(                                           \
      Tape&, const char*, Tensor<T>, const std::vector<const ShardedArray<T>*>&,                            \
      KernelVjp<Tensor<T>, ShardedArray<T>>, std::uint32_t, std::uint32_t, bool);                           \
  template ShardedArray<T> record_vjp_node<ShardedArray<T>, Tensor<T>>(                                     \
      Tape&, const char*, ShardedArray<T>, const std::vector<const Tensor<T>*>&,                            \
      KernelVjp<ShardedArray<T>, Tensor<T>>, std::uint32_t, std::uint32_t, bool);
SHARD_FOR_EACH_FLOAT_DTYPE(SHARD_RECORD_VJP)
#undef SHARD_RECORD_VJP

}  // namespace shard::detail
