// matmul with sharding rules. Layouts at each step, for A[.., M, K] @ B[K, N]:
//   A[batch.., rows, k] B[k, cols]   after the chosen reshards (k: the contracting axes)
//   C_partial[batch.., rows, cols] = A_block @ B_block           OpenBLAS, per device
//   C[batch.., rows, cols] = psum_k(C_partial)                    only when k names axes

#include "shard/ops/matmul.hpp"

#include <algorithm>
#include <optional>
#include <set>
#include <sstream>

#include "shard/array/driver.hpp"
#include "shard/comm/detail/collective.hpp"
#include "shard/core/trace.hpp"
#include "shard/ops/ops.hpp"
#include "shard/error.hpp"

#include "array/plan_cache.hpp"

namespace shard {

namespace {

std::vector<std::string> without(const std::vector<std::string>& v, const std::set<std::string>& drop) {
  std::vector<std::string> out;
  for (const auto& a : v)
    if (!drop.count(a)) out.push_back(a);
  return out;
}

struct Layout {
  PartitionSpec a, b, out;
  SpecEntry k;
};

/// The layouts that contract over the mesh axes `k` (A's k entry and B's k entry become k;
/// every other entry drops the axes an earlier operand dim already uses).
Layout layout_for(const PartitionSpec& sa, int ra, const PartitionSpec& sb, int rb, const SpecEntry& k) {
  std::set<std::string> used(k.axes().begin(), k.axes().end());
  std::vector<SpecEntry> ea;
  for (int d = 0; d < ra - 1; ++d) {
    auto axes = without(sa[d].axes(), used);
    used.insert(axes.begin(), axes.end());
    ea.emplace_back(axes);
  }
  ea.push_back(k);
  std::vector<SpecEntry> eb;
  if (rb > 2)
    for (int d = 0; d < rb - 2; ++d) eb.push_back(ea[d]);  // batched B follows A's batch dims
  eb.push_back(k);
  const SpecEntry cols(without(sb[rb - 1].axes(), used));
  eb.push_back(cols);
  std::vector<SpecEntry> eo(ea.begin(), ea.end() - 1);
  eo.push_back(cols);
  return Layout{PartitionSpec(ea), PartitionSpec(eb), PartitionSpec(eo), k};
}

void check_shapes(const Shape& a, const Shape& b) {
  const bool ok = a.size() >= 2 && (b.size() == 2 || b.size() == a.size()) && a.back() == b[b.size() - 2] &&
                  (b.size() == 2 || std::equal(a.begin(), a.end() - 2, b.begin()));
  if (!ok)
    raise<ShapeError>("matmul: shapes ", to_string(a), " and ", to_string(b),
                      " do not multiply; need A[.., M, K] and B[K, N] or B[.., K, N] with the same leading dims");
}

}  // namespace

std::string MatmulPlan::to_string() const {
  std::ostringstream os;
  os << a.to_string() << " @ " << b.to_string() << " -> " << out.to_string();
  if (!contract.is_none()) os << ", psum over " << contract.to_string();
  os << "; reshards send " << reshard_bytes << " bytes";
  return os.str();
}

namespace {

/// The plan of plan_matmul, computed (the cache below remembers it): the checks, then the
/// candidate layouts' reshard plans (themselves cached).
MatmulPlan compute_plan_matmul(const Shape& a_shape, const NamedSharding& a, const Shape& b_shape,
                               const NamedSharding& b, std::size_t elem_size) {
  detail::check_same_devices(a.mesh(), b.mesh(), "matmul");
  check_shapes(a_shape, b_shape);
  const int ra = static_cast<int>(a_shape.size()), rb = static_cast<int>(b_shape.size());
  // B's layout spelled on A's mesh (the candidates below name A's mesh axes); a B on another
  // mesh without such a spelling counts as unsplit there, and its reshard costs what it costs.
  const PartitionSpec b_spec = equivalent_sharding(b, b_shape, a.mesh()).value_or(NamedSharding(a.mesh(), P())).spec();
  const SpecEntry ka = a.spec()[ra - 1], kb = b_spec[rb - 2];
  MatmulPlan best;
  std::int64_t best_cost = -1;
  for (const SpecEntry& k : {ka, kb, SpecEntry()}) {
    const Layout l = layout_for(a.spec(), ra, b_spec, rb, k);
    const NamedSharding na(a.mesh(), l.a), nb(a.mesh(), l.b), no(a.mesh(), l.out);
    std::int64_t cost = detail::cached_plan_reshard(a_shape, a, na, elem_size)->total_bytes() +
                        detail::cached_plan_reshard(b_shape, b, nb, elem_size)->total_bytes();
    const std::int64_t reshards = cost;
    if (!k.is_none()) {  // a psum of C's blocks: about twice their bytes per device
      Shape c_shape(a_shape.begin(), a_shape.end() - 1);
      c_shape.push_back(b_shape.back());
      cost += 2 * num_elements(no.shard_shape(c_shape)) * static_cast<std::int64_t>(elem_size) * a.mesh().size();
    }
    if (reshards == 0 && l.a == a.spec() && l.b == b_spec)  // already a supported layout: keep it
      return MatmulPlan{l.a, l.b, l.out, l.k, 0};
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      best = MatmulPlan{l.a, l.b, l.out, l.k, reshards};
    }
  }
  return best;
}

}  // namespace

namespace detail {

std::shared_ptr<const MatmulPlan> cached_plan_matmul(const Shape& a_shape, const NamedSharding& a,
                                                     const Shape& b_shape, const NamedSharding& b,
                                                     std::size_t elem_size) {
  thread_local SignatureKey key;
  key.clear();
  key.add(a_shape);
  key.add(a);
  key.add(b_shape);
  key.add(b);
  key.add(static_cast<std::int64_t>(elem_size));
  return matmul_plan_cache().get(key,
                                 [&] { return compute_plan_matmul(a_shape, a, b_shape, b, elem_size); });
}

}  // namespace detail

MatmulPlan plan_matmul(const Shape& a_shape, const NamedSharding& a, const Shape& b_shape, const NamedSharding& b,
                       std::size_t elem_size) {
  return *detail::cached_plan_matmul(a_shape, a, b_shape, b, elem_size);
}

/// The dim of C a psum_scatter splits to leave C summed over the plan's contracting axes and
/// sharded as `out`, when `out` splits exactly one dim of C further over them (-1 otherwise).
/// Its blocks are all natural.shard_shape(c_shape): only when every dim of C splits evenly (a
/// short last block of an uneven dim would come back padded to the full block).
int scatter_dim(const Mesh& mesh, const MatmulPlan& p, const Shape& c_shape, const NamedSharding* out) {
  if (p.contract.is_none() || !out || !(out->mesh() == mesh)) return -1;
  const NamedSharding natural(mesh, p.out);
  for (int d = 0; d < static_cast<int>(c_shape.size()); ++d)
    if (c_shape[d] % natural.num_parts(d) != 0) return -1;
  for (int d = 0; d < static_cast<int>(c_shape.size()); ++d) {
    std::vector<std::string> want = p.out[d].axes();
    want.insert(want.end(), p.contract.axes().begin(), p.contract.axes().end());
    std::vector<SpecEntry> entries;
    for (int e = 0; e < static_cast<int>(c_shape.size()); ++e) entries.push_back(e == d ? SpecEntry(want) : p.out[e]);
    if (out->spec() == PartitionSpec(entries) && c_shape[d] % out->num_parts(d) == 0) return d;
  }
  return -1;
}

/// The driver's plan (array/driver.hpp) for product plan p with C placed as `out` (nullptr:
/// p.out): the operands' reshards, then the closing psum over the contracting axes, or the
/// psum_scatter straight into `out`. `then` is the sharding C still moves to afterwards (none
/// when the closing collective already leaves it there).
struct ProductPlan {
  detail::OpPlan op;
  const NamedSharding* then = nullptr;
};
ProductPlan product_plan(const Mesh& mesh, const MatmulPlan& p, const Shape& c_shape, const NamedSharding* out,
                         std::optional<PartitionSpec> want_a, std::optional<PartitionSpec> want_b) {
  ProductPlan r{detail::OpPlan{0, p.out, {std::move(want_a), std::move(want_b)}, p.contract, -1}, nullptr};
  if (const int d = scatter_dim(mesh, p, c_shape, out); d >= 0) {
    r.op.out = out->spec();
    r.op.scatter_dim = d;
  } else if (out && !(*out == NamedSharding(mesh, p.out))) {
    r.then = out;
  }
  return r;
}

/// The block kernels of the rules' products (what run_blocks calls on each device).
struct BlockProduct {
  template <typename T>
  Tensor<T> kernel(const Tensor<T>& a, const Tensor<T>& b) const {
    return detail::matmul_kernel(a, b);
  }
};
/// With the transposes in the gemm; `staged`: where the gemm writes for the closing collective.
template <typename T>
struct TransposedBlockProduct {
  bool ta, tb;
  T* staged;
  Tensor<T> kernel(const Tensor<T>& a, const Tensor<T>& b) const { return detail::matmul_t(a, ta, b, tb, staged); }
};

template <typename T, typename K>
ShardedArray<T> run_product(const K& kernel, const ProductPlan& plan, const Shape& c_shape, const ShardedArray<T>& a,
                            const ShardedArray<T>& b) {
  ShardedArray<T> c = detail::run_blocks<K, T>(kernel, plan.op, c_shape, std::index_sequence<0, 1>{}, a, b);
  if (plan.then) return reshard(c, *plan.then);
  return c;  // moved: `plan.then ? reshard(c, ...) : c` would copy every product
}

template <typename T>
ShardedArray<T> matmul_by_rules(const ShardedArray<T>& a, const ShardedArray<T>& b, const NamedSharding* out) {
  const auto plan = detail::cached_plan_matmul(a.shape(), a.sharding(), b.shape(), b.sharding(), sizeof(T));
  const MatmulPlan& p = *plan;
  const Mesh& mesh = a.mesh();
  Shape c_shape(a.shape().begin(), a.shape().end() - 1);
  c_shape.push_back(b.shape().back());
  // The operands where the plan needs them (no copy when already there).
  std::optional<PartitionSpec> want_a, want_b;
  if (!(p.a == a.spec())) want_a = p.a;
  if (!(b.mesh() == mesh) || !(p.b == b.spec())) want_b = p.b;
  return run_product(BlockProduct{}, product_plan(mesh, p, c_shape, out, want_a, want_b), c_shape, a, b);
}


namespace detail {

/// The spec of a 2-D array's transpose.
NamedSharding transposed(const NamedSharding& s) {
  std::vector<SpecEntry> e = s.spec().entries();
  e.resize(2);
  return NamedSharding(s.mesh(), PartitionSpec(std::vector<SpecEntry>{e[1], e[0]}));
}

template <Dtype T>
ShardedArray<T> matmul_t(const ShardedArray<T>& a, bool ta, const ShardedArray<T>& b, bool tb, const NamedSharding* out) {
  auto fallback = [&] { return matmul(ta ? transpose(a) : a, tb ? transpose(b) : b, out); };
  if (a.ndim() != 2 || b.ndim() != 2 || !(a.mesh() == b.mesh())) return fallback();
  const NamedSharding sa = ta ? transposed(a.sharding()) : a.sharding();
  const NamedSharding sb = tb ? transposed(b.sharding()) : b.sharding();
  const Shape as = ta ? Shape{a.shape()[1], a.shape()[0]} : a.shape();
  const Shape bs = tb ? Shape{b.shape()[1], b.shape()[0]} : b.shape();
  if (as[1] != bs[0]) return fallback();  // the shape error of matmul
  // Only when the rules multiply the operands where they lie (and matmul would not pick a 2-D
  // block algorithm): each device multiplies its blocks with the transposes in the gemm.
  if (choose_algorithm(as, sa, bs, sb) != Algorithm::kRules) return fallback();
  const auto plan = cached_plan_matmul(as, sa, bs, sb, sizeof(T));
  const MatmulPlan& p = *plan;
  if (!(p.a == sa.spec()) || !(p.b == sb.spec())) return fallback();
  const Shape c_shape{as[0], bs[1]};
  const ProductPlan pp = product_plan(a.mesh(), p, c_shape, out, std::nullopt, std::nullopt);
  // A psum_scatter through group-shared memory reads the product from where the gemm wrote it.
  T* staged = nullptr;
  if (pp.op.scatter_dim >= 0) {
    CollectiveSpec spec = closing_spec(p.contract, ReduceKind::kSum, *out, c_shape, pp.op.scatter_dim);
    spec.dtype = dtype_name<T>();
    std::vector<int> devices;
    for (const auto& s : a.addressable_shards()) devices.push_back(s.device);
    staged = collective_staging<T>(a.mesh(), spec, devices);
  }
  return run_product(TransposedBlockProduct<T>{ta, tb, staged}, pp, c_shape, a, b);
}
#define SHARD_INSTANTIATE_MATMUL_T(T)                                                              \
  template ShardedArray<T> matmul_t<T>(const ShardedArray<T>&, bool, const ShardedArray<T>&, bool, \
                                       const NamedSharding*);
SHARD_FOR_EACH_FLOAT_DTYPE(SHARD_INSTANTIATE_MATMUL_T)
#undef SHARD_INSTANTIATE_MATMUL_T

}  // namespace detail

#define SHARD_INSTANTIATE(T) \
  template ShardedArray<T> matmul_by_rules<T>(const ShardedArray<T>&, const ShardedArray<T>&, const NamedSharding*);
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE)
#undef SHARD_INSTANTIATE

}  // namespace shard
