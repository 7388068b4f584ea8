// Execution of device-group collectives. For each group over the collective's axes that
// holds a device of this rank (group-id order, the same on every rank, so no deadlock):
//   1. contributions of this rank's devices in the group are combined in memory;
//   2. one MPI call runs on the group's cached rank-level communicator;
//   3. results are copied to each local device of the group.
// With one device per rank and the natural rank order, buffers go to MPI as they are
// (MPI_IN_PLACE for reductions; gathers and scatters along dim 0 need no packing).

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>

#include "shard/core/time_split.hpp"
#include "shard/core/detail/int_wrap.hpp"
#include "shard/core/timeline.hpp"
#include "shard/comm/comm_stats.hpp"
#include "shard/comm/detail/collective.hpp"
#include "shard/comm/detail/collective_guard.hpp"
#include "shard/comm/detail/mesh_comms.hpp"
#include "shard/error.hpp"
#include "shard/comm/group_shared.hpp"
#include "shard/mpi/communicator.hpp"

#include "comm/collective_cma.hpp"
#include "comm/collective_guard_internal.hpp"
#include "comm/collective_members.hpp"
#include "comm/collective_shared.hpp"

namespace shard::detail {

namespace {

int comm_rank_of(const DeviceGroup& g, int world_rank) {
  for (std::size_t r = 0; r < g.ranks.size(); ++r)
    if (g.ranks[r] == world_rank) return static_cast<int>(r);
  return -1;
}

/// MPI_MAX / MPI_MIN of floating values through nan (numpy's and JAX's max: a nan anywhere makes
/// the result nan; MPI's own ops compare, and a comparison with nan drops it).
template <typename F, bool kMax>
void nan_extreme(void* in, void* inout, int* len, MPI_Datatype*) {
  const F* a = static_cast<const F*>(in);
  F* b = static_cast<F*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = kMax ? max_nan(b[i], a[i]) : min_nan(b[i], a[i]);
}
template <typename F, bool kMax>
MPI_Op nan_extreme_op() {
  static const MPI_Op op = [] {
    MPI_Op o = MPI_OP_NULL;
    MPI_Op_create(&nan_extreme<F, kMax>, 1, &o);
    return o;
  }();
  return op;
}

template <typename T>
MPI_Op mpi_op(ReduceKind op) {
  constexpr bool kBool = std::is_same_v<T, bool>;  // MPI's logical ops: max is or, min is and
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    if (op == ReduceKind::kMax) return nan_extreme_op<T, true>();
    if (op == ReduceKind::kMin) return nan_extreme_op<T, false>();
  }
  switch (op) {
    case ReduceKind::kMax: return kBool ? MPI_LOR : MPI_MAX;
    case ReduceKind::kMin: return kBool ? MPI_LAND : MPI_MIN;
    case ReduceKind::kProd: return MPI_PROD;
    default: return MPI_SUM;
  }
}

template <typename T>
void combine(Tensor<T>& acc, const Tensor<T>& x, ReduceKind op) {
  T* a = acc.data();
  const T* b = x.data();
  const std::int64_t n = acc.size();
  switch (op) {
    case ReduceKind::kMax:  // a nan on either side stays
      for (std::int64_t i = 0; i < n; ++i) a[i] = max_nan(a[i], b[i]);
      break;
    case ReduceKind::kMin:
      for (std::int64_t i = 0; i < n; ++i) a[i] = min_nan(a[i], b[i]);
      break;
    case ReduceKind::kProd:
      if constexpr (!std::is_same_v<T, bool>)
        for (std::int64_t i = 0; i < n; ++i) a[i] = mul_wrap(a[i], b[i]);  // integers wrap
      break;
    default:
      if constexpr (!std::is_same_v<T, bool>)
        for (std::int64_t i = 0; i < n; ++i) a[i] = add_wrap(a[i], b[i]);
  }
}

/// Sums of bool have no MPI operation (and no meaning in JAX): a metadata error, raised the
/// same on every rank before any communication.
template <typename T>
void check_dtype(const CollectiveSpec& s) {
  if constexpr (std::is_same_v<T, bool>) {
    const bool sums = s.kind == CollectiveKind::kPsumScatter ||
                      (s.kind == CollectiveKind::kReduce && s.op != ReduceKind::kMax && s.op != ReduceKind::kMin);
    if (sums)
      raise<ValueError>(s.name, " over ", s.axes_text, " of a bool array: sums of bool are not defined; convert "
                        "with astype<std::int32_t>(x) first (pmax is a logical or, pmin a logical and)");
  }
}

/// Every local member gets the result: copies for all but the first, which takes it.
template <typename T>
void hand_out(Tensor<T>& result, const std::vector<Member>& m, std::vector<Tensor<T>>& outs) {
  for (std::size_t i = 1; i < m.size(); ++i) outs[m[i].local] = result;
  outs[m[0].local] = std::move(result);
}

template <typename T>
void copy_out(const Tensor<T>& x, const Box& b, T* dst) {
  copy_box(x.data(), x.shape(), Shape(x.shape().size(), 0), dst, b.extent, b.offset, b, sizeof(T));
}

/// CommStats of a collective whose whole group is on this rank (no MPI): one call, and the
/// bytes of the members' input blocks, which move in memory.
template <typename T>
void record_in_process(const CollectiveSpec& s, std::size_t members) {
  comm_stats().record_in_process(
      s.name, s.axes_text, static_cast<std::int64_t>(members) * num_elements(s.in_shape) * static_cast<std::int64_t>(sizeof(T)));
}

// ---- psum / pmean / pmax / pmin: Allreduce in place on the locally combined block.
template <typename T>
void run_reduce(const Mesh& mesh, const CollectiveSpec& s, const DeviceGroup& g, const std::vector<Member>& m,
                std::vector<Tensor<T>>& ins, std::vector<Tensor<T>>& outs, bool shared_ok,
                const shard::source_location& where) {
  Tensor<T> acc = std::move(ins[m[0].local]);
  for (std::size_t i = 1; i < m.size(); ++i) combine(acc, ins[m[i].local], s.op);
  if (!g.comm.is_null() && shared_ok && shared_pays(s.kind, acc.bytes())) {
    acc.detach_if_aliased();
    shared_reduce(mesh, s, acc, where);
    comm_stats().record(s.name, s.axes_text, static_cast<std::int64_t>(acc.bytes()));
  } else if (!g.comm.is_null()) {
    const int c = count_of(acc.size(), s);
    mpi_call(
        s, g, "MPI_Allreduce",
        [&] { return MPI_Allreduce(MPI_IN_PLACE, acc.data(), c, mpi::datatype<T>(), mpi_op<T>(s.op), g.comm.get()); },
        [&](MPI_Request* r) {
          return MPI_Iallreduce(MPI_IN_PLACE, acc.data(), c, mpi::datatype<T>(), mpi_op<T>(s.op), g.comm.get(), r);
        });
    comm_stats().record(s.name, s.axes_text, static_cast<std::int64_t>(acc.bytes()));
  }
  if (s.op == ReduceKind::kMean)
    if constexpr (!std::is_same_v<T, bool>)
      for (auto& v : acc) v = static_cast<T>(v / static_cast<T>(s.group_size));
  hand_out(acc, m, outs);
}

// ---- all_gather: Allgather(v) of the local blocks, placed by group position.
/// Read-only access to the local inputs, by index into devices.
template <typename T>
using Inputs = std::function<const Tensor<T>&(int)>;

template <typename T>
void run_all_gather(const CollectiveSpec& s, const DeviceGroup& g, const std::vector<Member>& m,
                    const Topology& topo, const Inputs<T>& in, std::vector<Tensor<T>>& outs) {
  Shape eshape = s.in_shape;  // one block in output coordinates
  if (!s.tiled) eshape.insert(eshape.begin() + s.dim, 1);
  const std::int64_t be = num_elements(s.in_shape);
  auto place = [&](const T* src, int p, Tensor<T>& out) {
    copy_in(src, eshape, chunk_box(s.out_shape, s.dim, eshape[s.dim], p), out);
  };
  Tensor<T> result(s.out_shape);
  const bool one_per_rank = g.ranks.size() == g.devices.size();
  if (g.comm.is_null()) {
    for (const auto& mm : m) place(in(mm.local).data(), mm.pos, result);
  } else if (one_per_rank && s.dim == 0) {
    const int c = count_of(be, s);
    const T* src = in(m[0].local).data();
    mpi_call(
        s, g, "MPI_Allgather",
        [&] { return MPI_Allgather(src, c, mpi::datatype<T>(), result.data(), c, mpi::datatype<T>(), g.comm.get()); },
        [&](MPI_Request* r) {
          return MPI_Iallgather(src, c, mpi::datatype<T>(), result.data(), c, mpi::datatype<T>(), g.comm.get(), r);
        });
    comm_stats().record(s.name, s.axes_text, be * static_cast<std::int64_t>(sizeof(T)));
  } else {
    const auto pos = positions_by_rank(g, topo);
    std::vector<int> counts, displs;
    std::int64_t total = 0;
    for (const auto& ps : pos) {
      counts.push_back(count_of(static_cast<std::int64_t>(ps.size()) * be, s));
      displs.push_back(count_of(total, s));
      total += static_cast<std::int64_t>(ps.size()) * be;
    }
    Tensor<T> send({static_cast<std::int64_t>(m.size()) * be});
    for (std::size_t i = 0; i < m.size(); ++i)
      if (be > 0)  // empty blocks have null data: memcpy(null, null, 0) is undefined
        std::memcpy(send.data() + i * be, in(m[i].local).data(), static_cast<std::size_t>(be) * sizeof(T));
    Tensor<T> recv({total});
    const int sc = count_of(send.size(), s);
    mpi_call(
        s, g, "MPI_Allgatherv",
        [&] {
          return MPI_Allgatherv(send.data(), sc, mpi::datatype<T>(), recv.data(), counts.data(), displs.data(),
                                mpi::datatype<T>(), g.comm.get());
        },
        [&](MPI_Request* r) {
          return MPI_Iallgatherv(send.data(), sc, mpi::datatype<T>(), recv.data(), counts.data(), displs.data(),
                                 mpi::datatype<T>(), g.comm.get(), r);
        });
    comm_stats().record(s.name, s.axes_text, static_cast<std::int64_t>(send.bytes()));
    for (std::size_t r = 0; r < pos.size(); ++r)
      for (std::size_t j = 0; j < pos[r].size(); ++j) place(recv.data() + displs[r] + j * be, pos[r][j], result);
  }
  hand_out(result, m, outs);
}

// ---- psum_scatter: local sum, then Reduce_scatter(_block) of the chunks by position.
template <typename T>
void run_psum_scatter(const Mesh& mesh, const CollectiveSpec& s, const DeviceGroup& g, const std::vector<Member>& m,
                      std::vector<Tensor<T>>& ins, std::vector<Tensor<T>>& outs, bool shared_ok,
                      const shard::source_location& where) {
  const Topology& topo = mesh.topology();
  Tensor<T> acc = std::move(ins[m[0].local]);
  for (std::size_t i = 1; i < m.size(); ++i) combine(acc, ins[m[i].local], ReduceKind::kSum);
  const std::int64_t extent = s.tiled ? s.in_shape[s.dim] / s.group_size : 1;
  const std::int64_t ce = num_elements(s.in_shape) / s.group_size;
  const bool one_per_rank = g.ranks.size() == g.devices.size();
  if (g.comm.is_null()) {
    for (const auto& mm : m) {
      outs[mm.local] = Tensor<T>(s.out_shape);
      copy_out(acc, chunk_box(s.in_shape, s.dim, extent, mm.pos), outs[mm.local].data());
    }
    return;
  }
  if (one_per_rank && shared_ok && shared_pays(s.kind, acc.bytes())) {
    shared_psum_scatter(mesh, s, m[0].pos, acc, outs[m[0].local], where);
    comm_stats().record(s.name, s.axes_text, static_cast<std::int64_t>(acc.bytes()));
    return;
  }
  if (one_per_rank && s.dim == 0) {
    outs[m[0].local] = Tensor<T>(s.out_shape);
    const int c = count_of(ce, s);
    T* dst = outs[m[0].local].data();
    mpi_call(
        s, g, "MPI_Reduce_scatter_block",
        [&] { return MPI_Reduce_scatter_block(acc.data(), dst, c, mpi::datatype<T>(), MPI_SUM, g.comm.get()); },
        [&](MPI_Request* r) {
          return MPI_Ireduce_scatter_block(acc.data(), dst, c, mpi::datatype<T>(), MPI_SUM, g.comm.get(), r);
        });
    comm_stats().record(s.name, s.axes_text, static_cast<std::int64_t>(acc.bytes()));
    return;
  }
  const auto pos = positions_by_rank(g, topo);
  Tensor<T> send({acc.size()});
  std::vector<int> counts;
  std::int64_t off = 0;
  for (const auto& ps : pos) {
    counts.push_back(count_of(static_cast<std::int64_t>(ps.size()) * ce, s));
    for (int p : ps) {
      copy_out(acc, chunk_box(s.in_shape, s.dim, extent, p), send.data() + off);
      off += ce;
    }
  }
  Tensor<T> recv({static_cast<std::int64_t>(m.size()) * ce});
  mpi_call(
      s, g, "MPI_Reduce_scatter",
      [&] { return MPI_Reduce_scatter(send.data(), recv.data(), counts.data(), mpi::datatype<T>(), MPI_SUM, g.comm.get()); },
      [&](MPI_Request* r) {
        return MPI_Ireduce_scatter(send.data(), recv.data(), counts.data(), mpi::datatype<T>(), MPI_SUM, g.comm.get(),
                                   r);
      });
  comm_stats().record(s.name, s.axes_text, static_cast<std::int64_t>(send.bytes()));
  for (std::size_t j = 0; j < m.size(); ++j) {  // my positions arrive in ascending order
    outs[m[j].local] = Tensor<T>(s.out_shape);
    if (ce > 0)  // empty chunks have null data
      std::memcpy(outs[m[j].local].data(), recv.data() + j * ce, static_cast<std::size_t>(ce) * sizeof(T));
  }
}

// ---- all_to_all: chunk p of every block goes to position p; Alltoall(v).
template <typename T>
void run_all_to_all(const CollectiveSpec& s, const DeviceGroup& g, const std::vector<Member>& m,
                    const Topology& topo, const Inputs<T>& in, std::vector<Tensor<T>>& outs, bool cma) {
  const std::int64_t extent = s.tiled ? s.in_shape[s.dim] / s.group_size : 1;
  Shape cshape = s.in_shape;  // a chunk as sent
  cshape[s.dim] = extent;
  Shape eshape = cshape;  // the same chunk in output coordinates
  if (!s.tiled) {
    eshape.erase(eshape.begin() + s.dim);
    eshape.insert(eshape.begin() + s.concat_dim, 1);
  }
  const std::int64_t ce = num_elements(cshape);
  auto place = [&](const T* src, int q, Tensor<T>& out) {
    copy_in(src, eshape, chunk_box(s.out_shape, s.concat_dim, eshape[s.concat_dim], q), out);
  };
  for (const auto& mm : m) outs[mm.local] = Tensor<T>(s.out_shape);
  const bool one_per_rank = g.ranks.size() == g.devices.size();
  if (g.comm.is_null()) {
    Tensor<T> tmp({ce});
    for (const auto& dst : m)
      for (const auto& src : m) {
        copy_out(in(src.local), chunk_box(s.in_shape, s.dim, extent, dst.pos), tmp.data());
        place(tmp.data(), src.pos, outs[dst.local]);
      }
    return;
  }
  if (one_per_rank && s.tiled && !(s.dim == 0 && s.concat_dim == 0)) {
    // One device per rank: the own chunk is copied straight into place; only chunks for other
    // ranks are packed (none when splitting dim 0) and received chunks land in the output
    // directly when they are contiguous there (concatenating along dim 0).
    const int me = m[0].pos;
    const Tensor<T>& x = in(m[0].local);
    Tensor<T>& out = outs[m[0].local];
    const Box mine_in = chunk_box(s.in_shape, s.dim, extent, me);
    const Box mine_out = chunk_box(s.out_shape, s.concat_dim, eshape[s.concat_dim], me);
    Shape src_origin(s.out_shape.size());
    for (std::size_t d = 0; d < src_origin.size(); ++d) src_origin[d] = mine_out.offset[d] - mine_in.offset[d];
    copy_box(x.data(), s.in_shape, src_origin, out.data(), s.out_shape, Shape(s.out_shape.size(), 0), mine_out,
             sizeof(T));
    const int n = s.group_size;
    if (cma && ce * static_cast<std::int64_t>(sizeof(T)) >= static_cast<std::int64_t>(kSharedReduceMin)) {
      // One node: read the peers' chunks where they lie (no pack; collective_cma.cpp).
      std::vector<Box> in_chunks, out_chunks;
      for (int p = 0; p < n; ++p) {
        in_chunks.push_back(chunk_box(s.in_shape, s.dim, extent, p));
        out_chunks.push_back(chunk_box(s.out_shape, s.concat_dim, eshape[s.concat_dim], p));
      }
      if (all_to_all_by_cma(s, g, x, out, in_chunks, out_chunks)) return;
    }
    std::vector<int> sc(n), sd(n), rc(n), rd(n);
    Tensor<T> send(s.dim == 0 ? Shape{0} : Shape{(n - 1) * ce});
    Tensor<T> recv(s.concat_dim == 0 ? Shape{0} : Shape{(n - 1) * ce});
    std::int64_t packed = 0;
    for (int p = 0; p < n; ++p) {
      const bool self = p == me;
      sc[p] = rc[p] = self ? 0 : count_of(ce, s);
      if (s.dim == 0) {
        sd[p] = count_of(p * ce, s);
      } else {
        sd[p] = count_of(packed, s);
        if (!self) copy_out(x, chunk_box(s.in_shape, s.dim, extent, p), send.data() + packed);
      }
      rd[p] = count_of(s.concat_dim == 0 ? p * ce : packed, s);
      if (!self) packed += ce;
    }
    const T* sbuf = s.dim == 0 ? x.data() : send.data();
    T* rbuf = s.concat_dim == 0 ? out.data() : recv.data();
    mpi_call(
        s, g, "MPI_Alltoallv",
        [&] {
          return MPI_Alltoallv(sbuf, sc.data(), sd.data(), mpi::datatype<T>(), rbuf, rc.data(), rd.data(),
                               mpi::datatype<T>(), g.comm.get());
        },
        [&](MPI_Request* r) {
          return MPI_Ialltoallv(sbuf, sc.data(), sd.data(), mpi::datatype<T>(), rbuf, rc.data(), rd.data(),
                                mpi::datatype<T>(), g.comm.get(), r);
        });
    comm_stats().record(s.name, s.axes_text, (n - 1) * ce * static_cast<std::int64_t>(sizeof(T)));
    if (s.concat_dim != 0)
      for (int q = 0; q < n; ++q)
        if (q != me) place(recv.data() + rd[q], q, out);
    return;
  }
  if (one_per_rank && s.dim == 0 && s.concat_dim == 0) {
    const int c = count_of(ce, s);
    const T* sbuf = in(m[0].local).data();
    T* rbuf = outs[m[0].local].data();
    mpi_call(
        s, g, "MPI_Alltoall",
        [&] { return MPI_Alltoall(sbuf, c, mpi::datatype<T>(), rbuf, c, mpi::datatype<T>(), g.comm.get()); },
        [&](MPI_Request* r) {
          return MPI_Ialltoall(sbuf, c, mpi::datatype<T>(), rbuf, c, mpi::datatype<T>(), g.comm.get(), r);
        });
    comm_stats().record(s.name, s.axes_text, (s.group_size - 1) * ce * static_cast<std::int64_t>(sizeof(T)));
    return;
  }
  // Send to rank r: for each of my members (by position), the chunks for r's positions.
  const auto pos = positions_by_rank(g, topo);
  const int me = comm_rank_of(g, topo.process_index);
  const auto nm = static_cast<std::int64_t>(m.size());
  std::vector<int> scounts, sdispls, rcounts, rdispls;
  std::int64_t stotal = 0, rtotal = 0;
  for (const auto& ps : pos) {
    const std::int64_t n = nm * static_cast<std::int64_t>(ps.size()) * ce;
    scounts.push_back(count_of(n, s));
    sdispls.push_back(count_of(stotal, s));
    rcounts.push_back(count_of(n, s));
    rdispls.push_back(count_of(rtotal, s));
    stotal += n;
    rtotal += n;
  }
  Tensor<T> send({stotal});
  std::int64_t off = 0;
  for (const auto& ps : pos)
    for (const auto& src : m)
      for (int p : ps) {
        copy_out(in(src.local), chunk_box(s.in_shape, s.dim, extent, p), send.data() + off);
        off += ce;
      }
  Tensor<T> recv({rtotal});
  mpi_call(
      s, g, "MPI_Alltoallv",
      [&] {
        return MPI_Alltoallv(send.data(), scounts.data(), sdispls.data(), mpi::datatype<T>(), recv.data(),
                             rcounts.data(), rdispls.data(), mpi::datatype<T>(), g.comm.get());
      },
      [&](MPI_Request* r) {
        return MPI_Ialltoallv(send.data(), scounts.data(), sdispls.data(), mpi::datatype<T>(), recv.data(),
                              rcounts.data(), rdispls.data(), mpi::datatype<T>(), g.comm.get(), r);
      });
  comm_stats().record(s.name, s.axes_text, (stotal - scounts[me]) * static_cast<std::int64_t>(sizeof(T)));
  // From rank r: for each of r's positions q, the chunks for my members (by position).
  for (std::size_t r = 0; r < pos.size(); ++r) {
    std::int64_t o = rdispls[r];
    for (int q : pos[r])
      for (const auto& dst : m) {
        place(recv.data() + o, q, outs[dst.local]);
        o += ce;
      }
  }
}

// ---- ppermute: point-to-point along the group, zeros where no one sends.
template <typename T>
void run_ppermute(const CollectiveSpec& s, const DeviceGroup& g, const std::vector<Member>& m,
                  const Topology& topo, std::vector<Tensor<T>>& ins, std::vector<Tensor<T>>& outs) {
  const int n = s.group_size;
  std::vector<int> src_of(n, -1), dst_of(n, -1);
  for (const auto& [src, dst] : s.perm) {
    src_of[dst] = src;
    dst_of[src] = dst;
  }
  auto local_of = [&](int pos) {
    for (const auto& mm : m)
      if (mm.pos == pos) return mm.local;
    return -1;
  };
  std::vector<MPI_Request> requests;
  std::int64_t sent = 0;
  const int count = count_of(num_elements(s.in_shape), s);
  if (m.size() == 1 && src_of[m[0].pos] >= 0 && dst_of[m[0].pos] >= 0 && local_of(src_of[m[0].pos]) < 0 &&
      local_of(dst_of[m[0].pos]) < 0) {
    // One device here that both sends and receives remotely (a shift with one device per
    // rank): one MPI_Sendrecv, measured ~3x faster than Isend/Irecv/Waitall at 64 KiB-1 MiB.
    const Member& mm = m[0];
    const int dst = dst_of[mm.pos];
    const int src = src_of[mm.pos];
    outs[mm.local] = Tensor<T>(s.in_shape);
    const int to = comm_rank_of(g, topo.owner(g.devices[dst]));
    const int from = comm_rank_of(g, topo.owner(g.devices[src]));
    if (!collective_watchdog_on()) [[likely]] {
      const BlockingWait wait("MPI_Sendrecv", s, g.ranks);
      mpi::check(MPI_Sendrecv(ins[mm.local].data(), count, mpi::datatype<T>(), to, dst, outs[mm.local].data(), count,
                              mpi::datatype<T>(), from, mm.pos, g.comm.get(), MPI_STATUS_IGNORE),
                 "MPI_Sendrecv");
    } else {
      MPI_Request r[2];
      mpi::check(MPI_Irecv(outs[mm.local].data(), count, mpi::datatype<T>(), from, mm.pos, g.comm.get(), &r[0]),
                 "MPI_Irecv");
      mpi::check(MPI_Isend(ins[mm.local].data(), count, mpi::datatype<T>(), to, dst, g.comm.get(), &r[1]), "MPI_Isend");
      watchdog_wait(2, r, s, g, "MPI_Isend/MPI_Irecv");
    }
    comm_stats().record(s.name, s.axes_text, static_cast<std::int64_t>(ins[mm.local].bytes()));
    return;
  }
  for (const auto& mm : m) {  // receives first
    const int src = src_of[mm.pos];
    if (src < 0) {
      outs[mm.local] = Tensor<T>(s.in_shape, T(0));
    } else if (local_of(src) < 0) {
      outs[mm.local] = Tensor<T>(s.in_shape);
      requests.emplace_back();
      mpi::check(MPI_Irecv(outs[mm.local].data(), count, mpi::datatype<T>(),
                           comm_rank_of(g, topo.owner(g.devices[src])), mm.pos, g.comm.get(), &requests.back()),
                 "MPI_Irecv");
    }
  }
  for (const auto& mm : m) {  // then sends, and local moves (each source has one destination)
    const int dst = dst_of[mm.pos];
    if (dst < 0) continue;
    const int l = local_of(dst);
    if (l >= 0) {
      if (ins[mm.local].owns_memory()) outs[l] = std::move(ins[mm.local]);
      else outs[l] = Tensor<T>(ins[mm.local]);  // an lvalue input (a borrow) stays the caller's
    } else {
      requests.emplace_back();
      mpi::check(MPI_Isend(ins[mm.local].data(), count, mpi::datatype<T>(),
                           comm_rank_of(g, topo.owner(g.devices[dst])), dst, g.comm.get(), &requests.back()),
                 "MPI_Isend");
      sent += static_cast<std::int64_t>(ins[mm.local].bytes());
    }
  }
  if (!requests.empty()) {
    if (!collective_watchdog_on()) [[likely]] {
      const BlockingWait wait("MPI_Waitall", s, g.ranks);
      mpi::check(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
    } else {
      watchdog_wait(static_cast<int>(requests.size()), requests.data(), s, g, "MPI_Isend/MPI_Irecv");
    }
    if (sent > 0) comm_stats().record(s.name, s.axes_text, sent);
  }
}

}  // namespace

/// The timeline's details of a collective: its block's bytes, shape and dtype.
template <typename T>
std::string collective_args(const CollectiveSpec& s) {
  return "\"bytes_per_device\": " + std::to_string(num_elements(s.in_shape) * static_cast<std::int64_t>(sizeof(T))) +
         ", \"shape\": \"" + to_string(s.in_shape) + "\", \"dtype\": \"" + s.dtype + "\"";
}

template <typename T>
void execute_collective(const Mesh& mesh, const CollectiveSpec& s, const std::vector<int>& devices,
                        std::vector<Tensor<T>>& ins, std::vector<Tensor<T>>& outs, const shard::source_location& where) {
  const ScopedTime timed(TimeKind::kCommunication);
  auto traced = TimelineScope::named("collective", [&] { return s.name + " " + s.axes_text; });
  if (traced.active()) traced.set_args(collective_args<T>(s));
  if constexpr (std::is_same_v<T, bfloat16>) {
    if (s.kind == CollectiveKind::kReduce || s.kind == CollectiveKind::kPsumScatter) {
      // Reductions of bfloat16 accumulate in float32 and round once: the blocks are widened,
      // reduced as float32 (the same paths, group-shared memory or MPI) and narrowed.
      std::vector<Tensor<float>> wide(ins.size()), wide_out;
      for (std::size_t i = 0; i < ins.size(); ++i) {
        wide[i] = Tensor<float>(ins[i].shape());
        widen_bf16(ins[i].data(), wide[i].data(), ins[i].size());
        ins[i] = Tensor<T>();
      }
      CollectiveSpec ws = s;
      ws.dtype = "float32 (accumulating " + s.dtype + ")";
      execute_collective<float>(mesh, ws, devices, wide, wide_out, where);
      outs.resize(ins.size());
      for (std::size_t i = 0; i < wide_out.size(); ++i) {
        outs[i] = Tensor<T>(wide_out[i].shape());
        narrow_to_bf16(wide_out[i].data(), outs[i].data(), wide_out[i].size());
      }
      return;
    }
  }
  check_dtype<T>(s);
  if (collective_guard_on()) [[unlikely]]
    guard_collective(mesh, s, devices, where);
  outs.resize(ins.size());
  const Topology& topo = mesh.topology();
  const Inputs<T> in = [&](int l) -> const Tensor<T>& { return ins[l]; };
  const bool shared_ok = use_shared_memory(mesh, s, std::is_same_v<T, bool>);
  const bool cma = cma_possible(mesh, s);
  for (const auto& g : mesh.comms().groups(s.axes)) {
    const auto m = members_of(g, devices);
    if (m.empty()) continue;
    switch (s.kind) {
      case CollectiveKind::kReduce: run_reduce(mesh, s, g, m, ins, outs, shared_ok, where); break;
      case CollectiveKind::kAllGather: run_all_gather(s, g, m, topo, in, outs); break;
      case CollectiveKind::kPsumScatter: run_psum_scatter(mesh, s, g, m, ins, outs, shared_ok, where); break;
      case CollectiveKind::kAllToAll: run_all_to_all(s, g, m, topo, in, outs, cma); break;
      case CollectiveKind::kPpermute: run_ppermute(s, g, m, topo, ins, outs); break;
    }
    if (g.comm.is_null()) record_in_process<T>(s, m.size());
  }
}

template <typename T>
void execute_gather_like(const Mesh& mesh, const CollectiveSpec& s, const std::vector<int>& devices,
                         const std::vector<const Tensor<T>*>& ins, std::vector<Tensor<T>>& outs,
                         const shard::source_location& where) {
  if (s.kind != CollectiveKind::kAllGather && s.kind != CollectiveKind::kAllToAll)
    raise<ValueError>("execute_gather_like: ", s.name, " consumes its inputs; use execute_collective");
  const ScopedTime timed(TimeKind::kCommunication);
  auto traced = TimelineScope::named("collective", [&] { return s.name + " " + s.axes_text; });
  if (traced.active()) traced.set_args(collective_args<T>(s));
  if (collective_guard_on()) [[unlikely]]
    guard_collective(mesh, s, devices, where);
  outs.resize(ins.size());
  const Inputs<T> in = [&](int l) -> const Tensor<T>& { return *ins[l]; };
  const bool cma = cma_possible(mesh, s);
  for (const auto& g : mesh.comms().groups(s.axes)) {
    const auto m = members_of(g, devices);
    if (m.empty()) continue;
    if (s.kind == CollectiveKind::kAllGather) run_all_gather(s, g, m, mesh.topology(), in, outs);
    else run_all_to_all(s, g, m, mesh.topology(), in, outs, cma);
    if (g.comm.is_null()) record_in_process<T>(s, m.size());
  }
}

template <typename T>
void execute_all_gather_in_place(const Mesh& mesh, const CollectiveSpec& s, const std::vector<int>& devices,
                                 const std::vector<Tensor<T>*>& blocks, const shard::source_location& where) {
  if (s.kind != CollectiveKind::kAllGather || !s.tiled || s.dim != 0)
    raise<ValueError>("execute_all_gather_in_place: ", s.name, " must be a tiled all_gather over dim 0");
  const ScopedTime timed(TimeKind::kCommunication);
  auto traced = TimelineScope::named("collective", [&] { return s.name + " " + s.axes_text; });
  if (traced.active()) traced.set_args(collective_args<T>(s));
  check_dtype<T>(s);
  if (collective_guard_on()) [[unlikely]]
    guard_collective(mesh, s, devices, where);
  const std::int64_t be = num_elements(s.in_shape);
  const auto chunk_bytes = static_cast<std::size_t>(be) * sizeof(T);
  for (std::size_t i = 0; i < blocks.size(); ++i)
    if (blocks[i]->shape() != s.out_shape)
      raise<ShapeError>(s.name, ": block of device ", devices[i], " has shape ", to_string(blocks[i]->shape()),
                        ", expected ", to_string(s.out_shape));
  for (const auto& g : mesh.comms().groups(s.axes)) {
    const auto m = members_of(g, devices);
    if (m.empty() || be == 0) continue;
    if (g.comm.is_null()) {  // the whole group is local: each member's chunk to the others
      for (const auto& from : m)
        for (const auto& to : m)
          if (from.local != to.local)
            std::memcpy(blocks[to.local]->data() + from.pos * be, blocks[from.local]->data() + from.pos * be,
                        chunk_bytes);
      record_in_process<T>(s, m.size());
      continue;
    }
    if (g.ranks.size() == g.devices.size()) {  // one device per rank: the MPI call fills the block
      const int c = count_of(be, s);
      T* buf = blocks[m[0].local]->data();
      mpi_call(
          s, g, "MPI_Allgather",
          [&] { return MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, c, mpi::datatype<T>(), g.comm.get()); },
          [&](MPI_Request* r) {
            return MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, c, mpi::datatype<T>(), g.comm.get(), r);
          });
      comm_stats().record(s.name, s.axes_text, static_cast<std::int64_t>(chunk_bytes));
      continue;
    }
    // Several devices per rank: the general all_gather of each member's chunk, copied back.
    std::vector<Tensor<T>> chunks(blocks.size());
    for (const auto& mm : m) chunks[mm.local] = Tensor<T>::borrow(blocks[mm.local]->data() + mm.pos * be, s.in_shape);
    const Inputs<T> in = [&](int l) -> const Tensor<T>& { return chunks[l]; };
    std::vector<Tensor<T>> outs(blocks.size());
    run_all_gather(s, g, m, mesh.topology(), in, outs);
    for (const auto& mm : m) std::memcpy(blocks[mm.local]->data(), outs[mm.local].data(), blocks[mm.local]->bytes());
  }
}

template <typename T>
T* collective_staging(const Mesh& mesh, const CollectiveSpec& s, const std::vector<int>& devices) {
  if (s.kind != CollectiveKind::kPsumScatter || devices.size() != 1) return nullptr;
  if constexpr (std::is_same_v<T, bfloat16>) return nullptr;  // reduced in float32 (execute_collective)
  const auto bytes = static_cast<std::size_t>(num_elements(s.in_shape)) * sizeof(T);
  if (!shared_pays(s.kind, bytes) || !use_shared_memory(mesh, s, std::is_same_v<T, bool>)) return nullptr;
  for (const auto& g : mesh.comms().groups(s.axes)) {
    const auto m = members_of(g, devices);
    if (m.empty()) continue;
    if (g.comm.is_null() || g.ranks.size() != g.devices.size()) return nullptr;
    return window_slot<T>(next_shared_window(mesh, s, bytes, /*advance=*/false), m[0].pos);
  }
  return nullptr;
}

#define SHARD_INSTANTIATE_EXEC(T)                                                                          \
  template void execute_gather_like<T>(const Mesh&, const CollectiveSpec&, const std::vector<int>&,                \
                                       const std::vector<const Tensor<T>*>&, std::vector<Tensor<T>>&,            \
                                       const shard::source_location&);                                             \
  template void execute_collective<T>(const Mesh&, const CollectiveSpec&, const std::vector<int>&,                 \
                                      std::vector<Tensor<T>>&, std::vector<Tensor<T>>&, const shard::source_location&); \
  template void execute_all_gather_in_place<T>(const Mesh&, const CollectiveSpec&, const std::vector<int>&,        \
                                               const std::vector<Tensor<T>*>&, const shard::source_location&);       \
  template T* collective_staging<T>(const Mesh&, const CollectiveSpec&, const std::vector<int>&);
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_EXEC)
#undef SHARD_INSTANTIATE_EXEC

}  // namespace shard::detail
