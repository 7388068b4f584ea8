// matmul's choice of algorithm (the primitive of the ops layer): Cannon or SUMMA for 2-D block layouts, the
// sharding rules (matmul.cpp) for everything else, or whatever the caller forces.

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

#define SHARD_INSTANTIATE(T)                                                                            \
  template ShardedArray<T> matmul<T>(const ShardedArray<T>&, const ShardedArray<T>&, const NamedSharding*, \
                                     Algorithm);
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE)
#undef SHARD_INSTANTIATE

}  // namespace shard
