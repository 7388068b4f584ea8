// matmul's choice of algorithm (the primitive of the ops layer): Cannon or SUMMA for 2-D block layouts, the
// sharding rules (matmul.cpp) for everything else, or whatever the caller forces.

#include <source_location>
#include <type_traits>

#include "shard/core/trace.hpp"
#include "shard/error.hpp"
#include "shard/linalg/linalg.hpp"
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

template <typename T>
ShardedArray<T> matmul(const ShardedArray<T>& a, const ShardedArray<T>& b, const NamedSharding* out,
                       Algorithm algorithm) {
  if (a.ndim() == 0 || b.ndim() == 0)
    raise<ShapeError>("matmul: operands must have at least one dim, got shapes ", to_string(a.shape()), " and ",
                      to_string(b.shape()), " (use * or dot for scalars)");
  if (a.ndim() == 1 || b.ndim() == 1) {  // numpy: vectors become matrices, the added dims go again
    if (a.ndim() == 1 && b.ndim() == 1) {
      ShardedArray<T> c = vdot(a, b);
      return out && !(*out == c.sharding()) ? reshard(c, *out) : c;
    }
    const ShardedArray<T> c = matmul(a.ndim() == 1 ? expand_dims(a, 0) : a, b.ndim() == 1 ? expand_dims(b, -1) : b,
                                     nullptr, algorithm);
    ShardedArray<T> r = squeeze(c, Dims{a.ndim() == 1 ? c.ndim() - 2 : c.ndim() - 1});
    return out && !(*out == r.sharding()) ? reshard(r, *out) : r;
  }
  if (!(a.mesh() == b.mesh())) {  // B on another mesh over the same devices: spelled on A's if it can be
    detail::check_same_devices(a.mesh(), b.mesh(), "matmul");
    if (auto eq = equivalent_sharding(b.sharding(), b.shape(), a.mesh())) return matmul(a, reshard(b, *eq), out, algorithm);
  }
  if (auto* tape = detail::recording_tape_for(a, b))
    return detail::record_matmul<ShardedArray<T>>(*tape, a, b, "matmul", [&] { return matmul(a, b, out, algorithm); });
  if (algorithm == Algorithm::kAuto) {
    algorithm = choose_algorithm(a.shape(), a.sharding(), b.shape(), b.sharding());
    if constexpr (!std::is_floating_point_v<T>) algorithm = Algorithm::kRules;
  }
  if (algorithm == Algorithm::kRules) return matmul_by_rules(a, b, out);
  if constexpr (std::is_floating_point_v<T>) {
    ShardedArray<T> c = algorithm == Algorithm::kCannon ? linalg::cannon(a, b)
                        : algorithm == Algorithm::kSumma ? linalg::summa(a, b)
                                                         : linalg::scalapack_matmul(a, b);
    return out && !(*out == c.sharding()) ? reshard(c, *out) : c;
  } else {
    raise<ValueError>("matmul: Algorithm '", algorithm_name(algorithm), "' multiplies float and double only, not ",
                      dtype_name<T>(), "; use Algorithm::kAuto or kRules");
  }
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

namespace {
constexpr std::source_location kLibrary{};  // the public functions below have no caller's line yet
}  // namespace

template <Dtype T>
Tensor<T> vdot(const Tensor<T>& a, const Tensor<T>& b) {
  return detail::bind_at(prim::Vdot{}, kLibrary, a, b);
}
template <Dtype T>
ShardedArray<T> vdot(const ShardedArray<T>& a, const ShardedArray<T>& b) {
  return detail::bind_at(prim::Vdot{}, kLibrary, a, b);
}

#define SHARD_INSTANTIATE(T)                                                                            \
  template ShardedArray<T> matmul<T>(const ShardedArray<T>&, const ShardedArray<T>&, const NamedSharding*, \
                                     Algorithm);                                                          \
  template Tensor<T> vdot<T>(const Tensor<T>&, const Tensor<T>&);                                         \
  template ShardedArray<T> vdot<T>(const ShardedArray<T>&, const ShardedArray<T>&);
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE)
#undef SHARD_INSTANTIATE

}  // namespace shard
