// Cannon's algorithm on a q x q pair of mesh axes (r, c). Device (i, j) holds blocks
// A(i, j), B(i, j) of A[r, c] and B[r, c], zero-padded to ceil(M/q) x ceil(K/q) and
// ceil(K/q) x ceil(N/q).
//   skew:      A(i, j) -> device (i, j - i),  B(i, j) -> device (i - j, j)
//              now device (i, j) holds A(i, i + j) and B(i + j, j)
//   q steps:   C(i, j) += A_cur @ B_cur   (OpenBLAS, in row panels)
//              meanwhile A_cur moves one device left along c, B_cur one device up along r,
//              posted before the product, progressed by test() between panels
// Every transfer is a comm verb on the group communicator of the axis it moves along (A along
// c, B along r), checked once per call (comm_verbs.hpp).
// All indices mod q. Transfers between devices of one rank are memory copies. Batched
// operands A[.., M, K] (batch dims sharded over other mesh axes) carry all of a device's
// batch elements in one message; each step runs one product per batch element.

#include <algorithm>
#include <optional>

#include "shard/comm/detail/comm_verbs.hpp"
#include "shard/core/detail/local_gemm.hpp"
#include "shard/error.hpp"
#include "shard/linalg/linalg.hpp"
#include "shard/sharding/partition_spec.hpp"
#include "shard/array/reshard.hpp"
#include "shard/runtime/runtime.hpp"

namespace shard::linalg {

namespace {

/// `block` [.., m, k] zero-padded to `shape` (same leading dims; the block sits at the origin).
template <typename T>
Tensor<T> padded(const Tensor<T>& block, const Shape& shape) {
  if (block.shape() == shape) return block;
  Tensor<T> out(shape, T(0));
  const Shape origin(shape.size(), 0);
  copy_box(block.data(), block.shape(), origin, out.data(), shape, origin, Box{origin, block.shape()}, sizeof(T));
  return out;
}

/// `shape` with its last two dims replaced by (rows, cols).
Shape with_matrix(Shape shape, std::int64_t rows, std::int64_t cols) {
  shape[shape.size() - 2] = rows;
  shape[shape.size() - 1] = cols;
  return shape;
}

/// One exchange of blocks between devices along mesh axis `axis` (on that axis's group
/// communicators): local device l sends cur[l] to device to[l] and receives into next[l] from
/// device from[l]; a message's tag is its receiving device's position in the group. Copies
/// between devices of this rank happen now; the transfers are returned to be completed later.
template <typename T>
detail::PendingTransfer start_exchange(const Mesh& mesh, int axis, const std::vector<int>& local,
                                       std::vector<Tensor<T>>& cur, std::vector<Tensor<T>>& next,
                                       const std::vector<int>& to, const std::vector<int>& from,
                                       const detail::CommOp& op) {
  const Topology& topo = mesh.topology();
  const int me = topo.process_index;
  const auto& groups = mesh.comms().groups({axis});
  auto group_of = [&](int device) -> const detail::DeviceGroup& {
    for (const auto& g : groups)
      if (std::find(g.devices.begin(), g.devices.end(), device) != g.devices.end()) return g;
    raise<Error>("cannon: device ", device, " is in no group of this rank");
  };
  auto position = [](const std::vector<int>& v, int x) {
    return static_cast<int>(std::find(v.begin(), v.end(), x) - v.begin());
  };
  detail::PendingTransfer req;
  for (std::size_t l = 0; l < local.size(); ++l) {
    if (topo.owner(from[l]) == me) continue;
    const auto& g = group_of(local[l]);
    req.merge(detail::irecv(g, op, next[l].data(), detail::transfer_count(next[l].size(), op),
                            position(g.ranks, topo.owner(from[l])), position(g.devices, local[l])));
  }
  for (std::size_t l = 0; l < local.size(); ++l) {
    if (topo.owner(to[l]) == me) {
      const int dst = position(local, to[l]);
      std::copy(cur[l].begin(), cur[l].end(), next[dst].begin());
      continue;
    }
    const auto& g = group_of(local[l]);
    req.merge(detail::isend(g, op, cur[l].data(), detail::transfer_count(cur[l].size(), op),
                            position(g.ranks, topo.owner(to[l])), position(g.devices, to[l])));
  }
  return req;
}

}  // namespace

template <typename T>
ShardedArray<T> cannon(const ShardedArray<T>& a, const ShardedArray<T>& b_in, CannonOptions options) {
  detail::check_same_mesh(a.mesh(), b_in.mesh(), "cannon");
  const Mesh& mesh = a.mesh();
  const int ra = a.ndim(), rb = b_in.ndim();
  const bool shapes_ok = ra >= 2 && (rb == 2 || rb == ra) && a.shape()[ra - 1] == b_in.shape()[rb - 2] &&
                         (rb == 2 || std::equal(a.shape().begin(), a.shape().end() - 2, b_in.shape().begin()));
  if (!shapes_ok)
    raise<ShapeError>("cannon: shapes ", to_string(a.shape()), " and ", to_string(b_in.shape()),
                      " do not multiply; need A[.., M, K] and B[K, N] or B[.., K, N] with the same leading dims");
  const auto& er = a.spec()[ra - 2].axes();
  const auto& ec = a.spec()[ra - 1].axes();
  if (er.size() != 1 || ec.size() != 1)
    raise<ShardingError>("cannon: A must be sharded P(.., r, c) over two mesh axes, got ", a.spec().to_string(),
                         "; reshard it first or use Algorithm::kSumma / matmul");
  const int rpos = mesh.axis_position(er[0]), cpos = mesh.axis_position(ec[0]);
  const int q = mesh.shape()[rpos];
  if (mesh.shape()[cpos] != q)
    raise<ShardingError>("cannon: needs a square q x q pair of mesh axes, but '", er[0], "' has size ", q, " and '",
                         ec[0], "' has size ", mesh.shape()[cpos], "; use SUMMA for a non-square grid");
  // C and a batched B keep A's batch entries (over axes other than r and c: every device of
  // one Cannon group holds the same batch box); a 2-D B is P(r, c) and multiplies every batch.
  const PartitionSpec cspec = a.spec();
  const PartitionSpec bspec = rb == 2 ? P(er[0], ec[0]) : cspec;
  const NamedSharding s(mesh, cspec), sb(mesh, bspec);
  std::optional<ShardedArray<T>> moved_b;
  const ShardedArray<T>& b = b_in.spec() == bspec ? b_in : moved_b.emplace(reshard(b_in, sb));
  const std::int64_t M = a.shape()[ra - 2], K = a.shape()[ra - 1], N = b.shape()[rb - 1];
  const std::int64_t mb = (M + q - 1) / q, kb = (K + q - 1) / q, nb = (N + q - 1) / q;

  const std::vector<int> local = mesh.local_device_ids();
  const std::size_t n = local.size();
  std::vector<Tensor<T>> acur, anext, bcur, bnext, c;
  for (std::size_t l = 0; l < n; ++l) {
    const Shape& as = a.addressable_shards()[l].data.shape();
    const Shape& bs = b.addressable_shards()[l].data.shape();
    acur.push_back(padded(a.addressable_shards()[l].data, with_matrix(as, mb, kb)));
    bcur.push_back(padded(b.addressable_shards()[l].data, with_matrix(bs, kb, nb)));
    anext.emplace_back(acur.back().shape());
    bnext.emplace_back(bcur.back().shape());
    c.emplace_back(with_matrix(as, mb, nb), T(0));
  }
  // The device at (i, j) of the same replica as `device` (other mesh axes unchanged).
  auto at = [&](int device, int i, int j) {
    auto co = mesh.coords(device);
    co[rpos] = ((i % q) + q) % q;
    co[cpos] = ((j % q) + q) % q;
    return mesh.device_at(co);
  };
  std::vector<int> ti(n), tj(n);
  for (std::size_t l = 0; l < n; ++l) {
    const auto co = mesh.coords(local[l]);
    ti[l] = co[rpos];
    tj[l] = co[cpos];
  }
  const detail::CommOp op{"cannon", detail::cat(dtype_name<T>(), to_string(a.shape()), " @ ", dtype_name<T>(), to_string(b.shape()),
                                                " on ", s.to_string())};
  detail::check_mesh_transfer(mesh, op);

  // Skew: A(i, j) -> (i, j - i); B(i, j) -> (i - j, j).
  {
    std::vector<int> to_a(n), from_a(n), to_b(n), from_b(n);
    for (std::size_t l = 0; l < n; ++l) {
      const int i = ti[l], j = tj[l];
      to_a[l] = at(local[l], i, j - i);
      from_a[l] = at(local[l], i, j + i);
      to_b[l] = at(local[l], i - j, j);
      from_b[l] = at(local[l], i + j, j);
    }
    auto req = start_exchange(mesh, cpos, local, acur, anext, to_a, from_a, op);  // along c
    req.merge(start_exchange(mesh, rpos, local, bcur, bnext, to_b, from_b, op));  // along r
    req.wait();
    std::swap(acur, anext);
    std::swap(bcur, bnext);
  }
  const int panels = options.panels > 0 ? options.panels
                                        : static_cast<int>(std::clamp<std::int64_t>(mb / 128, 1, 8));
  for (int t = 0; t < q; ++t) {
    detail::PendingTransfer req;
    if (t + 1 < q) {  // post the next shift: A one device left along c, B one device up along r
      std::vector<int> to_a(n), from_a(n), to_b(n), from_b(n);
      for (std::size_t l = 0; l < n; ++l) {
        const int i = ti[l], j = tj[l];
        to_a[l] = at(local[l], i, j - 1);
        from_a[l] = at(local[l], i, j + 1);
        to_b[l] = at(local[l], i - 1, j);
        from_b[l] = at(local[l], i + 1, j);
      }
      req = start_exchange(mesh, cpos, local, acur, anext, to_a, from_a, op);
      req.merge(start_exchange(mesh, rpos, local, bcur, bnext, to_b, from_b, op));
      if (!options.overlap) req.wait();
    }
    // C += A_cur @ B_cur, panel by panel, letting MPI progress the shift in between.
    for (std::size_t l = 0; l < n; ++l) {
      const std::int64_t batches = c[l].size() / std::max<std::int64_t>(mb * nb, 1);
      const bool batched_b = rb > 2;
      for (std::int64_t e = 0; e < batches; ++e)
        for (int p = 0; p < panels; ++p) {
          const std::int64_t r0 = mb * p / panels, r1 = mb * (p + 1) / panels;
          const T* pa = acur[l].data() + (e * mb + r0) * kb;
          const T* pb = bcur[l].data() + (batched_b ? e * kb * nb : 0);
          detail::gemm_acc(r1 - r0, nb, kb, pa, kb, pb, nb, c[l].data() + (e * mb + r0) * nb, nb);
          if (!req.empty()) (void)req.test();
        }
    }
    req.wait();
    if (t + 1 < q) {
      std::swap(acur, anext);
      std::swap(bcur, bnext);
    }
  }
  // Unpad: each device keeps the top-left part that its box of C covers.
  Shape cshape = a.shape();
  cshape[ra - 1] = N;
  std::vector<Shard<T>> shards;
  for (std::size_t l = 0; l < n; ++l) {
    const Box box = s.box(local[l], cshape);
    shards.push_back(Shard<T>{local[l], box, c[l].slice(Box{Shape(box.extent.size(), 0), box.extent})});
  }
  return ShardedArray<T>(cshape, s, std::move(shards));
}

#define SHARD_INSTANTIATE_CANNON(T) \
  template ShardedArray<T> cannon<T>(const ShardedArray<T>&, const ShardedArray<T>&, CannonOptions);
SHARD_FOR_EACH_FLOAT_DTYPE(SHARD_INSTANTIATE_CANNON)
#undef SHARD_INSTANTIATE_CANNON

}  // namespace shard::linalg
