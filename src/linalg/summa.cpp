// SUMMA on a p x q pair of mesh axes (r, c). Layouts: A[r, c], B[r, c], C[r, c].
//   for each K panel [k0, k0 + w) (inside one block column of A and one block row of B):
//     A_panel(i)  = A(i, jc)[:, k0 - jc*kbA : +w]   broadcast along mesh row i from column jc
//     B_panel(j)  = B(ir, j)[k0 - ir*kbB : +w, :]   broadcast along mesh column j from row ir
//     C(i, j)    += A_panel(i) @ B_panel(j)        OpenBLAS
// The broadcasts of panel t+1 (MPI_Ibcast) are posted before the update of panel t.

#include <algorithm>
#include <map>
#include <optional>

#include "shard/comm/detail/comm_verbs.hpp"
#include "shard/core/detail/local_gemm.hpp"
#include "shard/comm/detail/mesh_comms.hpp"
#include "shard/error.hpp"
#include "shard/linalg/linalg.hpp"
#include "shard/array/reshard.hpp"

namespace shard::linalg {

namespace {

/// One panel's broadcasts: a buffer per device group (a mesh row for A, a column for B).
template <typename T>
struct Panel {
  std::map<int, Tensor<T>> a, b;  // group id -> panel
  detail::PendingTransfer req;
};

}  // namespace

template <typename T>
ShardedArray<T> summa(const ShardedArray<T>& a, const ShardedArray<T>& b_in, SummaOptions options) {
  detail::check_same_mesh(a.mesh(), b_in.mesh(), "summa");
  const Mesh& mesh = a.mesh();
  if (a.ndim() != 2 || b_in.ndim() != 2 || a.shape()[1] != b_in.shape()[0])
    raise<ShapeError>("summa: shapes ", to_string(a.shape()), " and ", to_string(b_in.shape()),
                      " do not multiply as matrices");
  const auto& er = a.spec()[0].axes();
  const auto& ec = a.spec()[1].axes();
  if (er.size() != 1 || ec.size() != 1)
    raise<ShardingError>("summa: A must be sharded P(r, c) over two mesh axes, got ", a.spec().to_string(),
                         "; reshard it first or use matmul");
  const int rpos = mesh.axis_position(er[0]), cpos = mesh.axis_position(ec[0]);
  const int p = mesh.shape()[rpos], q = mesh.shape()[cpos];
  const NamedSharding s(mesh, P(er[0], ec[0]));
  std::optional<ShardedArray<T>> moved_b;
  const ShardedArray<T>& b = b_in.spec() == s.spec() ? b_in : moved_b.emplace(reshard(b_in, s));
  const std::int64_t M = a.shape()[0], K = a.shape()[1], N = b.shape()[1];
  const std::int64_t kba = (K + q - 1) / q, kbb = (K + p - 1) / p;
  const std::int64_t width = options.panel > 0 ? options.panel : 256;
  const Topology& topo = mesh.topology();
  const int me = topo.process_index;
  const detail::CommOp op{"summa", detail::cat(dtype_name<T>(), to_string(a.shape()), " @ ", dtype_name<T>(), to_string(b.shape()), " on ",
                                               s.to_string(), ", panel ", width)};
  detail::check_mesh_transfer(mesh, op);

  const auto& rows = mesh.comms().groups({cpos});  // devices along c: one mesh row each
  const auto& cols = mesh.comms().groups({rpos});  // devices along r: one mesh column each
  const std::vector<int> local = mesh.local_device_ids();
  std::vector<Tensor<T>> c;
  for (int d : local) c.emplace_back(s.box(d, {M, N}).extent, T(0));

  // The K panels: [k0, k0 + w) inside one block column of A and one block row of B.
  std::vector<std::pair<std::int64_t, std::int64_t>> panels;
  for (std::int64_t k0 = 0; k0 < K;) {
    const std::int64_t w = std::min({width, kba - k0 % kba, kbb - k0 % kbb, K - k0});
    panels.emplace_back(k0, w);
    k0 += w;
  }
  auto post = [&](std::int64_t k0, std::int64_t w) {
    Panel<T> pan;
    // Posts the broadcast of `buf` from device `root` over group g (nothing for a one-rank group).
    auto broadcast = [&](const detail::DeviceGroup& g, int root, Tensor<T>& buf, Panel<T>& into) {
      if (g.comm.is_null()) return;
      const int owner = topo.owner(root);
      const int root_rank = static_cast<int>(std::find(g.ranks.begin(), g.ranks.end(), owner) - g.ranks.begin());
      into.req.merge(detail::ibroadcast(g, op, buf.data(), detail::transfer_count(buf.size(), op), root_rank));
    };
    const int jc = static_cast<int>(k0 / kba), ir = static_cast<int>(k0 / kbb);
    for (const auto& g : rows) {  // A panel of this mesh row, from the device in column jc
      const int root = g.devices[jc];
      const std::int64_t rows_here = s.box(root, {M, N}).extent[0];
      Tensor<T> buf({rows_here, w});
      if (topo.owner(root) == me) {
        const auto& blk = a.shard_of(root).data;
        const std::int64_t off = k0 - static_cast<std::int64_t>(jc) * kba;
        for (std::int64_t r = 0; r < rows_here; ++r)
          std::copy(blk.data() + r * blk.shape()[1] + off, blk.data() + r * blk.shape()[1] + off + w,
                    buf.data() + r * w);
      }
      broadcast(g, root, buf, pan);
      pan.a.emplace(g.id, std::move(buf));
    }
    for (const auto& g : cols) {  // B panel of this mesh column, from the device in row ir
      const int root = g.devices[ir];
      const std::int64_t cols_here = s.box(root, {M, N}).extent[1];
      Tensor<T> buf({w, cols_here});
      if (topo.owner(root) == me) {
        const auto& blk = b.shard_of(root).data;
        const std::int64_t off = k0 - static_cast<std::int64_t>(ir) * kbb;
        std::copy(blk.data() + off * cols_here, blk.data() + (off + w) * cols_here, buf.data());
      }
      broadcast(g, root, buf, pan);
      pan.b.emplace(g.id, std::move(buf));
    }
    return pan;
  };
  // The group a local device belongs to, in `groups`.
  auto group_of = [&](const std::vector<detail::DeviceGroup>& groups, int device) {
    for (const auto& g : groups)
      if (std::find(g.devices.begin(), g.devices.end(), device) != g.devices.end()) return g.id;
    raise<Error>("summa: device ", device, " is in no group");
  };

  if (!panels.empty()) {
    Panel<T> cur = post(panels[0].first, panels[0].second);
    for (std::size_t t = 0; t < panels.size(); ++t) {
      cur.req.wait();
      Panel<T> next;
      if (t + 1 < panels.size()) next = post(panels[t + 1].first, panels[t + 1].second);
      if (!options.overlap) next.req.wait();
      const std::int64_t w = panels[t].second;
      for (std::size_t l = 0; l < local.size(); ++l) {
        const Tensor<T>& ap = cur.a.at(group_of(rows, local[l]));
        const Tensor<T>& bp = cur.b.at(group_of(cols, local[l]));
        const std::int64_t m = c[l].shape()[0], n = c[l].shape()[1];
        // Row pieces of ~128 rows with a test() after each: Open MPI moves the next panel's
        // bytes only inside MPI calls (over TCP, a socket buffer's worth per call).
        const std::int64_t pieces = std::clamp<std::int64_t>(m / 64, 1, 32);
        for (std::int64_t p = 0; p < pieces; ++p) {
          const std::int64_t r0 = m * p / pieces, r1 = m * (p + 1) / pieces;
          detail::gemm_acc(r1 - r0, n, w, ap.data() + r0 * w, w, bp.data(), n, c[l].data() + r0 * n, n);
          if (!next.req.empty()) (void)next.req.test();
        }
      }
      cur = std::move(next);
    }
  }
  std::vector<Shard<T>> shards;
  for (std::size_t l = 0; l < local.size(); ++l)
    shards.push_back(Shard<T>{local[l], s.box(local[l], {M, N}), std::move(c[l])});
  return ShardedArray<T>(Shape{M, N}, s, std::move(shards));
}

#define SHARD_INSTANTIATE_SUMMA(T) \
  template ShardedArray<T> summa<T>(const ShardedArray<T>&, const ShardedArray<T>&, SummaOptions);
SHARD_FOR_EACH_FLOAT_DTYPE(SHARD_INSTANTIATE_SUMMA)
#undef SHARD_INSTANTIATE_SUMMA

}  // namespace shard::linalg
