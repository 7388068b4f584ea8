// Cannon's algorithm on a q x q pair of mesh axes (r, c). Device (i, j) holds blocks
// A(i, j), B(i, j) of A[r, c] and B[r, c], zero-padded to ceil(M/q) x ceil(K/q) and
// ceil(K/q) x ceil(N/q).
//   skew:      A(i, j) -> device (i, j - i),  B(i, j) -> device (i - j, j)
//              now device (i, j) holds A(i, i + j) and B(i + j, j)
//   q steps:   C(i, j) += A_cur @ B_cur   (OpenBLAS, in row panels)
//              meanwhile A_cur moves one device left along c, B_cur one device up along r,
//              posted before the product, progressed by MPI_Testall between panels
// All indices mod q. Transfers between devices of one rank are memory copies. Batched
// operands A[.., M, K] (batch dims sharded over other mesh axes) carry all of a device's
// batch elements in one message; each step runs one product per batch element.

#include <algorithm>
#include <optional>

#include "shard/comm_stats.hpp"
#include "shard/detail/local_gemm.hpp"
#include "shard/error.hpp"
#include "shard/linalg.hpp"
#include "shard/partition_spec.hpp"
#include "shard/reshard.hpp"
#include "shard/runtime.hpp"

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

/// One exchange of blocks between devices: local device l sends cur[l] to device to[l] and
/// receives into next[l] from device from[l]. Copies between devices of this rank happen now;
/// the MPI requests are returned to be completed later.
template <typename T>
std::vector<MPI_Request> start_exchange(const Topology& topo, const std::vector<int>& local, std::vector<Tensor<T>>& cur,
                                        std::vector<Tensor<T>>& next, const std::vector<int>& to,
                                        const std::vector<int>& from, int tag_base, MPI_Comm comm) {
  const int k = topo.devices_per_rank;
  const int me = topo.process_index;
  std::vector<MPI_Request> req;
  std::int64_t sent = 0;
  auto local_index = [&](int device) {
    return static_cast<int>(std::find(local.begin(), local.end(), device) - local.begin());
  };
  for (std::size_t l = 0; l < local.size(); ++l) {
    if (topo.owner(from[l]) == me) continue;
    req.emplace_back();
    mpi::check(MPI_Irecv(next[l].data(), static_cast<int>(next[l].size()), mpi::datatype<T>(), topo.owner(from[l]),
                         tag_base + local[l] % k, comm, &req.back()),
               "MPI_Irecv");
  }
  for (std::size_t l = 0; l < local.size(); ++l) {
    if (topo.owner(to[l]) == me) {
      const int dst = local_index(to[l]);
      std::copy(cur[l].begin(), cur[l].end(), next[dst].begin());
      continue;
    }
    req.emplace_back();
    mpi::check(MPI_Isend(cur[l].data(), static_cast<int>(cur[l].size()), mpi::datatype<T>(), topo.owner(to[l]),
                         tag_base + to[l] % k, comm, &req.back()),
               "MPI_Isend");
    sent += static_cast<std::int64_t>(cur[l].bytes());
  }
  if (sent > 0) comm_stats().record("cannon", "", sent);
  return req;
}

void wait_all(std::vector<MPI_Request>& req) {
  if (req.empty()) return;
  const double t0 = MPI_Wtime();
  mpi::check(MPI_Waitall(static_cast<int>(req.size()), req.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
  comm_stats().record_wait("cannon", MPI_Wtime() - t0);
  req.clear();
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

  const Topology& topo = mesh.topology();
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
  const MPI_Comm comm = Runtime::current().world().get();
  const int kdev = topo.devices_per_rank;

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
    auto req = start_exchange(topo, local, acur, anext, to_a, from_a, 0, comm);
    auto rb = start_exchange(topo, local, bcur, bnext, to_b, from_b, kdev, comm);
    req.insert(req.end(), rb.begin(), rb.end());
    wait_all(req);
    std::swap(acur, anext);
    std::swap(bcur, bnext);
  }
  const int panels = options.panels > 0 ? options.panels
                                        : static_cast<int>(std::clamp<std::int64_t>(mb / 128, 1, 8));
  for (int t = 0; t < q; ++t) {
    std::vector<MPI_Request> req;
    if (t + 1 < q) {  // post the next shift: A one device left along c, B one device up along r
      std::vector<int> to_a(n), from_a(n), to_b(n), from_b(n);
      for (std::size_t l = 0; l < n; ++l) {
        const int i = ti[l], j = tj[l];
        to_a[l] = at(local[l], i, j - 1);
        from_a[l] = at(local[l], i, j + 1);
        to_b[l] = at(local[l], i - 1, j);
        from_b[l] = at(local[l], i + 1, j);
      }
      const int tag = 2 * (t + 1) * kdev;
      req = start_exchange(topo, local, acur, anext, to_a, from_a, tag, comm);
      auto rb = start_exchange(topo, local, bcur, bnext, to_b, from_b, tag + kdev, comm);
      req.insert(req.end(), rb.begin(), rb.end());
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
          if (!req.empty()) {
            int done = 0;
            const double t0 = MPI_Wtime();
            mpi::check(MPI_Testall(static_cast<int>(req.size()), req.data(), &done, MPI_STATUSES_IGNORE),
                       "MPI_Testall");
            comm_stats().record_wait("cannon", MPI_Wtime() - t0);
          }
        }
    }
    wait_all(req);
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

template ShardedArray<float> cannon<float>(const ShardedArray<float>&, const ShardedArray<float>&, CannonOptions);
template ShardedArray<double> cannon<double>(const ShardedArray<double>&, const ShardedArray<double>&, CannonOptions);

}  // namespace shard::linalg
