// The products' primitives (ops/matmul.hpp): matmul (the Tensor kernel is core's; the sharded form chooses
// Cannon or SUMMA for 2-D block layouts, the sharding rules of matmul_rules.cpp for everything else, or
// whatever the caller forces; the VJP), and vdot.

#include <source_location>
#include <type_traits>

#include "shard/array/detail/node_meta.hpp"
#include "shard/core/trace.hpp"
#include "shard/error.hpp"
#include "shard/linalg/linalg.hpp"
#include "shard/ops/detail/grad_reduce.hpp"
#include "shard/ops/elementwise.hpp"
#include "shard/ops/matmul.hpp"
#include "shard/ops/ops.hpp"
#include "shard/array/reshard.hpp"
#include "shard/linalg/scalapack.hpp"

namespace shard {

Algorithm choose_algorithm(const Shape& a_shape, const NamedSharding& a, const Shape& b_shape,
                           const NamedSharding& b) {
  const int ra = static_cast<int>(a_shape.size()), rb = static_cast<int>(b_shape.size());
  if (ra < 2 || (rb != 2 && rb != ra) || !(a.mesh() == b.mesh())) return Algorithm::kRules;
  const SpecEntry& er = a.spec()[ra - 2];
  const SpecEntry& ec = a.spec()[ra - 1];
  if (er.axes().size() != 1 || ec.axes().size() != 1) return Algorithm::kRules;
  // B in the same 2-D layout: P(r, c), or A's whole spec when batched.
  if (rb == 2 ? !(b.spec()[0] == er && b.spec()[1] == ec) : !(b.spec() == a.spec())) return Algorithm::kRules;
  const Mesh& mesh = a.mesh();
  const int p = mesh.shape()[mesh.axis_position(er.axes()[0])];
  const int q = mesh.shape()[mesh.axis_position(ec.axes()[0])];
  if (p * q == 1) return Algorithm::kRules;  // nothing is split: a local product
  if (p == q) return Algorithm::kCannon;
  return ra == 2 ? Algorithm::kSumma : Algorithm::kRules;
}

namespace {
constexpr shard::source_location kLibrary{};  // the public functions below have no caller's line yet
}  // namespace

// ---------------------------------------------------------------- matmul

template <Dtype T>
Tensor<T> matmul(const Tensor<T>& a, const Tensor<T>& b, shard::source_location where) {
  const detail::CallScope scope("matmul", where);
  return detail::bind_at(prim::Matmul{}, where, a, b);
}

template <typename T>
ShardedArray<T> matmul(const ShardedArray<T>& a, const ShardedArray<T>& b, const NamedSharding* out,
                       Algorithm algorithm, shard::source_location where) {
  const detail::CallScope scope("matmul", where);
  if (!(a.mesh() == b.mesh())) {  // B on another mesh over the same devices: spelled on A's if it can be
    detail::check_same_devices(a.mesh(), b.mesh(), "matmul");
    if (auto eq = equivalent_sharding(b.sharding(), b.shape(), a.mesh())) return matmul(a, reshard(b, *eq), out, algorithm);
  }
  return detail::bind_at(prim::Matmul{{}, out ? std::make_shared<const NamedSharding>(*out) : nullptr, algorithm}, where, a, b);
}

template <Dtype T>
ShardedArray<T> prim::Matmul::sharded(const ShardedArray<T>& a, const ShardedArray<T>& b) const {
  if (a.ndim() == 0 || b.ndim() == 0)
    raise<ShapeError>("matmul: operands must have at least one dim, got shapes ", to_string(a.shape()), " and ",
                      to_string(b.shape()), " (use * or dot for scalars)");
  if (a.ndim() == 1 || b.ndim() == 1) {  // numpy: vectors become matrices, the added dims go again
    if (a.ndim() == 1 && b.ndim() == 1) {
      ShardedArray<T> c = vdot(a, b);
      if (out && !(*out == c.sharding())) return reshard(c, *out);
      return c;  // moved (a ternary with c would copy it)
    }
    const ShardedArray<T> c = matmul(a.ndim() == 1 ? expand_dims(a, 0) : a, b.ndim() == 1 ? expand_dims(b, -1) : b,
                                     nullptr, algorithm);
    ShardedArray<T> r = squeeze(c, Dims{a.ndim() == 1 ? c.ndim() - 2 : c.ndim() - 1});
    if (out && !(*out == r.sharding())) return reshard(r, *out);
    return r;
  }
  Algorithm alg = algorithm;
  if (alg == Algorithm::kAuto) {
    alg = choose_algorithm(a.shape(), a.sharding(), b.shape(), b.sharding());
    if constexpr (!is_floating_v<T>) alg = Algorithm::kRules;
  }
  if (alg == Algorithm::kRules) return matmul_by_rules(a, b, out.get());
  if constexpr (is_floating_v<T>) {
    ShardedArray<T> c = alg == Algorithm::kCannon ? linalg::cannon(a, b)
                        : alg == Algorithm::kSumma ? linalg::summa(a, b)
                                                   : linalg::scalapack_matmul(a, b);
    if (out && !(*out == c.sharding())) return reshard(c, *out);
    return c;
  } else {
    raise<ValueError>("matmul: Algorithm '", algorithm_name(alg), "' multiplies float and double only, not ",
                      dtype_name<T>(), "; use Algorithm::kAuto or kRules");
  }
}

template <ArrayLike X>
BatchOut<X> prim::MatmulT::batch(const shard::source_location& where, std::int64_t size, const BatchArg<X>& a,
                                 const BatchArg<X>& b) const {
  auto op = [&](const BatchArg<X>& v, bool t) -> X {
    if (!t) return v.x.alias();
    return v.batched() ? swapaxes(detail::batch_first(v), -1, -2) : swapaxes(v.x, -1, -2);
  };
  const X ax = op(a, ta), bx = op(b, tb);
  return Matmul{}.batch(where, size, BatchArg<X>{ax, ta && a.batched() ? 0 : a.bdim},
                        BatchArg<X>{bx, tb && b.batched() ? 0 : b.bdim});
}

template <Dtype T>
ShardedArray<T> prim::MatmulT::sharded(const ShardedArray<T>& a, const ShardedArray<T>& b) const {
  if constexpr (is_floating_v<T>) {
    return detail::matmul_t(a, ta, b, tb, out.get());
  } else {
    raise<ValueError>("matmul_t: float operands only, not ", dtype_name<T>(), " (use matmul)");
  }
}

namespace {

/// Whether every operand that carries a batch() is only traced by jit (no vmap batch dim).
template <ArrayLike X>
bool only_traced(const X& ct, const std::optional<X>& ak, const std::optional<X>& bk) {
  auto traced = [](const X& x) { return !x.batch() || x.batch()->trace; };
  return traced(ct) && (!ak || traced(*ak)) && (!bk || traced(*bk));
}

/// The cotangents of a and b in numpy's matmul from the result's (1-D operands promoted, batch
/// dims broadcast). `ak` is kept when b needs a cotangent, `bk` when a does.
template <ArrayLike X>
Cotangents<X> matmul_cotangents(const X& ct, const VjpNeed& need, const std::optional<X>& ak,
                                const std::optional<X>& bk, const Shape& as, const Shape& bs) {
  Cotangents<X> r(2);
  const bool a1 = as.size() == 1, b1 = bs.size() == 1;
  X c2 = ct.alias();
  if (a1) c2 = expand_dims(c2, c2.ndim() - (b1 ? 0 : 1));
  if (b1) c2 = expand_dims(c2, -1);
  const bool batched = ct.batch() || (ak && ak->batch()) || (bk && bk->batch());  // vmap: ops that batch
  if (!a1 && !b1 && as.size() == 2 && bs.size() == 2 && !batched) {  // the common case: no transpose copies
    if constexpr (detail::is_sharded_v<X>) {
      // Each product lands where its input's node keeps the cotangent; a parameter's gradient
      // leaves its psum over the contracting axes running behind the backward pass where it can.
      auto product = [&](std::size_t i, const X& l, bool tl, const X& rr, bool tr) {
        const auto* meta = need.input<X>(i);
        const NamedSharding* want = meta ? &meta->sharding : nullptr;
        if (want && need.leaf(i))
          if (auto take = detail::matmul_t_deferred(l, tl, rr, tr, *want)) return r.defer(i, std::move(take));
        r[i].emplace(detail::matmul_t(l, tl, rr, tr, want));
      };
      if (need[0]) product(0, c2, false, *bk, true);
      if (need[1]) product(1, *ak, true, c2, false);
    } else {
      if (need[0]) r[0].emplace(detail::matmul_t(c2, false, *bk, true));
      if (need[1]) r[1].emplace(detail::matmul_t(*ak, true, c2, false));
    }
    return r;
  }
  if constexpr (detail::is_sharded_v<X> && is_floating_v<elem_t<X>>) {
    if (!a1 && !b1 && as.size() == 2 && bs.size() == 2 && only_traced(ct, ak, bk)) {  // under jit
      auto product = [&](std::size_t i, const X& l, bool tl, const X& rr, bool tr) {
        const auto* meta = need.input<X>(i);
        std::shared_ptr<const NamedSharding> want;
        if (meta) want = std::make_shared<const NamedSharding>(meta->sharding);
        r[i].emplace(detail::bind_at(prim::MatmulT{{}, tl, tr, std::move(want)}, shard::source_location{}, l, rr));
      };
      if (need[0]) product(0, c2, false, *bk, true);
      if (need[1]) product(1, *ak, true, c2, false);
      return r;
    }
  }
  if (need[0]) {
    const X b2 = b1 ? expand_dims(*bk, -1) : bk->alias();
    X da = matmul(c2, swapaxes(b2, -1, -2));  // batch + (1, K) when a is a vector
    r[0].emplace(a1 ? reshape(unbroadcast(da, Shape{1, as[0]}), as) : unbroadcast(da, as));
  }
  if (need[1]) {
    const X a2 = a1 ? expand_dims(*ak, 0) : ak->alias();
    X db = matmul(swapaxes(a2, -1, -2), c2);  // batch + (K, 1) when b is a vector
    r[1].emplace(b1 ? reshape(unbroadcast(db, Shape{bs[0], 1}), bs) : unbroadcast(db, bs));
  }
  return r;
}

}  // namespace

template <ArrayLike X>
KernelVjp<X, X> prim::Matmul::vjp(const VjpNeed& need, const X&, const X& a, const X& b) const {
  return [ak = need[1] ? std::optional<X>(detail::keep(a)) : std::nullopt,
          bk = need[0] ? std::optional<X>(detail::keep(b)) : std::nullopt, as = a.shape(),
          bs = b.shape()](const X& ct, const VjpNeed& need) { return matmul_cotangents(ct, need, ak, bk, as, bs); };
}

// ---------------------------------------------------------------- vdot

template <Dtype T>
ShardedArray<T> prim::Vdot::sharded(const ShardedArray<T>& a, const ShardedArray<T>& b) const {
  if (a.size() != b.size())
    raise<ShapeError>("vdot: arrays of shapes ", to_string(a.shape()), " and ", to_string(b.shape()),
                      " have different sizes");
  const ShardedArray<T> prod =
      a.shape() == b.shape() ? binary(a, b, BinaryOp::kMul) : binary(a, reshape(b, a.shape()), BinaryOp::kMul);
  return reduce(prod, ReduceKind::kSum);
}

template <ArrayLike X>
KernelVjp<X, X> prim::Vdot::vjp(const VjpNeed&, const X&, const X& a, const X& b) const {
  return [ak = detail::keep(a), bk = detail::keep(b)](const X& ct, const VjpNeed& need) {
    Cotangents<X> r(2);
    if (need[0]) r[0] = ct * reshape(bk, ak.shape());
    if (need[1]) r[1] = ct * reshape(ak, bk.shape());
    return r;
  };
}

template <Dtype T>
Tensor<T> vdot(const Tensor<T>& a, const Tensor<T>& b) {
  return detail::bind_at(prim::Vdot{}, kLibrary, a, b);
}
template <Dtype T>
ShardedArray<T> vdot(const ShardedArray<T>& a, const ShardedArray<T>& b) {
  return detail::bind_at(prim::Vdot{}, kLibrary, a, b);
}

#define SHARD_INSTANTIATE(T)                                                                            \
  template Tensor<T> matmul<T>(const Tensor<T>&, const Tensor<T>&, shard::source_location);                 \
  template ShardedArray<T> prim::MatmulT::sharded<T>(const ShardedArray<T>&, const ShardedArray<T>&) const; \
  template BatchOut<Tensor<T>> prim::MatmulT::batch<Tensor<T>>(const shard::source_location&, std::int64_t,  \
                                                               const BatchArg<Tensor<T>>&,                  \
                                                               const BatchArg<Tensor<T>>&) const;           \
  template BatchOut<ShardedArray<T>> prim::MatmulT::batch<ShardedArray<T>>(                                \
      const shard::source_location&, std::int64_t, const BatchArg<ShardedArray<T>>&,                       \
      const BatchArg<ShardedArray<T>>&) const;                                                               \
  template ShardedArray<T> matmul<T>(const ShardedArray<T>&, const ShardedArray<T>&, const NamedSharding*, \
                                     Algorithm, shard::source_location);                                    \
  template Tensor<T> vdot<T>(const Tensor<T>&, const Tensor<T>&);                                         \
  template ShardedArray<T> vdot<T>(const ShardedArray<T>&, const ShardedArray<T>&);
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE)
#undef SHARD_INSTANTIATE

}  // namespace shard
