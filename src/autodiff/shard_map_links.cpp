// The links between a shard_map body's device tapes and the tape outside
// (spmd/detail/shard_map_ad.hpp declares them; the autodiff layer defines them, with the nodes):
// each argument block a leaf of its device's tape, each output block's node seeded by the
// outer node of the assembled output.

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "shard/autodiff/autodiff.hpp"
#include "shard/autodiff/detail/ad_node.hpp"
#include "shard/ops/detail/grad_reduce.hpp"
#include "shard/spmd/detail/shard_map_ad.hpp"

namespace shard::detail {

template <Dtype T>
void ShardMapAd::link(const ShardedArray<T>& p, const PartitionSpec& spec) {
  Arg a;
  a.vma = spec_axes_mask(mesh, spec);
  const NodePtr<ShardedArray<T>> pn = outer ? node_of(p, *outer) : nullptr;
  if constexpr (FloatDtype<T>) {
    if (pn) {
      a.tracked = true;
      const std::size_t n = p.addressable_shards().size();
      // Per device: the cotangent block that varies over the argument's axes only, and the
      // parts that vary over more (their sums over those axes run in the global view below).
      using Parts = std::vector<std::pair<std::uint32_t, Tensor<T>>>;
      auto store = std::make_shared<std::vector<std::optional<Tensor<T>>>>(n);
      auto parts = std::make_shared<std::vector<Parts>>(n);
      std::vector<Shard<T>> meta;  // devices and boxes (no data)
      for (const auto& s : p.addressable_shards()) meta.push_back(Shard<T>{s.device, s.box, Tensor<T>()});
      std::vector<Shape> shapes;
      for (const auto& s : p.addressable_shards()) shapes.push_back(s.data.shape());
      a.read = [store, parts, shapes](int li, NodeBase* leaf) {
        auto* node = static_cast<Node<Tensor<T>>*>(leaf);
        (*parts)[li].clear();
        if (node && node->has_cotangent()) {
          auto [own, extra] = node->take_parts();
          (*store)[li] = own ? std::move(*own) : Tensor<T>(shapes[li], T(0));
          (*parts)[li] = std::move(extra);
          node->reset();
        } else {
          (*store)[li] = Tensor<T>(shapes[li], T(0));
        }
      };
      a.push = [store, parts, pn, meta, shapes, shape = p.shape(), sharding = p.sharding(),
                axis_names = mesh.axis_names()]() {
        std::vector<Shard<T>> shards = meta;
        for (std::size_t li = 0; li < shards.size(); ++li) shards[li].data = std::move(*(*store)[li]);
        push(pn, ShardedArray<T>(shape, sharding, std::move(shards)), 0);
        for (auto& b : *store) b.reset();
        // The transpose of the body's implicit pvary: each set of extra axes summed over them
        // with the parameters' bucketed, overlapped reduction (ops/detail/grad_reduce.hpp); the
        // node waits for it when it is read. Every device ran the same body, so the sets match.
        std::vector<std::uint32_t> masks;
        for (const auto& dev : *parts)
          for (const auto& [mask, part] : dev)
            if (std::find(masks.begin(), masks.end(), mask) == masks.end()) masks.push_back(mask);
        std::sort(masks.begin(), masks.end());
        for (const std::uint32_t mask : masks) {
          std::vector<Tensor<T>> blocks;
          for (std::size_t li = 0; li < parts->size(); ++li) {
            auto& dev = (*parts)[li];
            auto it = std::find_if(dev.begin(), dev.end(), [&](const auto& e) { return e.first == mask; });
            blocks.push_back(it != dev.end() ? std::move(it->second) : Tensor<T>(shapes[li], T(0)));
          }
          std::vector<std::string> names;
          for (std::size_t k = 0; k < axis_names.size(); ++k)
            if (mask >> k & 1u) names.push_back(axis_names[k]);
          auto take = psum_deferred(std::move(blocks), SpecEntry(std::move(names)), sharding, shape,
                                    parameter_like(*pn));
          pn->defer([take = std::move(take), want = pn->meta.sharding]() {
            ShardedArray<T> sum = take();
            if (sum.sharding() == want) return sum;
            return reshard(sum, want);
          });
        }
        for (auto& dev : *parts) dev.clear();
      };
    }
  }
  args.push_back(std::move(a));
}

template <Dtype T>
Tensor<T> ShardMapAd::block(const Tensor<T>& data, int li, std::size_t arg) {
  Tensor<T> b = data.alias();
  Tape& t = *tapes[li];
  const Arg& a = args[arg];
  std::shared_ptr<NodeBase> leaf;
  if constexpr (FloatDtype<T>) {
    if (a.tracked) {
      auto node = std::make_shared<Node<Tensor<T>>>("shard_map argument", t, a.vma, NodeMeta<Tensor<T>>(b));
      node->leaf = true;
      leaf = node;
    }
  }
  b.set_ad(a.vma || leaf ? std::make_shared<AdValue>(AdValue{t.id(), a.vma, leaf}) : nullptr);
  leaves[li].push_back(std::move(leaf));
  return b;
}

template <Dtype T>
void ShardMapAd::attach(ShardedArray<T>& y, std::size_t f, const std::shared_ptr<ShardMapAd>& self) {
  if constexpr (FloatDtype<T>) {
    auto node =
        std::make_shared<Node<ShardedArray<T>>>("shard_map output", *outer, 0, NodeMeta<ShardedArray<T>>(y));
    node->rule = [self, f](const ShardedArray<T>& ct, std::uint32_t) {
      for (std::size_t li = 0; li < self->outs.size(); ++li)
        if (const auto& dn = self->outs[li][f])
          static_cast<Node<Tensor<T>>*>(dn.get())->add(ct.addressable_shards()[li].data.alias(),
                                                       self->out_vma[li][f]);
      self->seeded = true;
    };
    outer->append(node);
    y.set_ad(std::make_shared<AdValue>(AdValue{outer->id(), 0, std::move(node)}));
  }
}

template <Dtype T>
ShardedArray<T> JitAdLinks<T>::leaf(const ShardedArray<T>& x, Tape& tape) {
  if constexpr (FloatDtype<T>) {
    return make_leaf(x, tape, "shard_map");
  } else {
    ShardedArray<T> out = x.alias();
    out.set_ad(nullptr);
    return out;
  }
}

template <Dtype T>
void JitAdLinks<T>::seed(const ShardedArray<T>& y, const ShardedArray<T>& ct, const Tape& tape) {
  if (auto n = node_of(y, tape)) n->add(ct.alias(), n->vma);
}

template <Dtype T>
ShardedArray<T> JitAdLinks<T>::cotangent(const ShardedArray<T>& leaf) {
  return leaf_cotangent(leaf, leaf);
}

template <Dtype T>
bool JitAdLinks<T>::tracked(const ShardedArray<T>& x, const Tape& tape) {
  return node_of(x, tape) != nullptr;
}

template <Dtype T>
void JitAdLinks<T>::collect(ShardedArray<T>& y, Tape& tape,
                            std::function<void(const ShardedArray<T>&)> take) {
  if constexpr (FloatDtype<T>) {
    auto node =
        std::make_shared<Node<ShardedArray<T>>>("shard_map output", tape, 0, NodeMeta<ShardedArray<T>>(y));
    node->rule = [take = std::move(take)](const ShardedArray<T>& ct, std::uint32_t) { take(ct); };
    tape.append(node);
    y.set_ad(std::make_shared<AdValue>(AdValue{tape.id(), 0, std::move(node)}));
  }
}

template <Dtype T>
void JitAdLinks<T>::push(const ShardedArray<T>& x, const Tape& tape, const ShardedArray<T>& ct) {
  if (auto n = node_of(x, tape)) n->add(ct.alias(), 0);
}

#define SHARD_INSTANTIATE_LINKS(T)                                                                        \
  template void ShardMapAd::link<T>(const ShardedArray<T>&, const PartitionSpec&);                        \
  template Tensor<T> ShardMapAd::block<T>(const Tensor<T>&, int, std::size_t);                            \
  template void ShardMapAd::attach<T>(ShardedArray<T>&, std::size_t, const std::shared_ptr<ShardMapAd>&); \
  template struct JitAdLinks<T>;
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_LINKS)
#undef SHARD_INSTANTIATE_LINKS

}  // namespace shard::detail
