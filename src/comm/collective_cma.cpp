// all_to_all between ranks of one node by direct reads (collective_cma.hpp). Layout, for the
// tiled all_to_all of one device per rank (position = communicator rank):
//   x[q] (s.in_shape)  chunk p along s.dim is what position p receives from q
//   out  (s.out_shape) chunk q along s.concat_dim is what came from q
// Each rank publishes (pid, address of its x), then copies chunk `me` of every peer's x into
// its chunk q of out with process_vm_readv, one run of the last dim per iovec, strided on both
// sides: no pack, no unpack, one copy (MPI's single-copy path needs contiguous buffers, so the
// MPI route packs the sends of a split along dims > 0 first). A final agreement (min of an ok
// flag) keeps every peer's x alive until everyone has read it. The Runtime probes such a read
// between the ranks of each node at start-up (containers may forbid it) and agrees on the result
// over the world, so every rank takes the same route.

#include "comm/collective_cma.hpp"

#include <sys/uio.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <vector>

#include "shard/comm/comm_stats.hpp"
#include "shard/comm/detail/comm_verbs.hpp"
#include "shard/error.hpp"

#include "comm/collective_shared.hpp"

namespace shard::detail {

namespace {

bool g_cma_allowed = false;  // the Runtime's start-up probe (set_cma_allowed)
std::uint64_t g_probe_word = 0x5368617264434d41ull;  // "ShardCMA"

/// Row-major strides (elements) of `shape`.
Shape strides_of(const Shape& shape) {
  Shape st(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) st[d] = st[d + 1] * shape[d + 1];
  return st;
}

/// Appends one iovec per contiguous run (the last dim) of `box` in an array of `shape` at `base`.
void runs_of(const Box& box, const Shape& shape, std::uintptr_t base, std::size_t elem, std::vector<iovec>& out) {
  const int r = box.rank();
  const Shape st = strides_of(shape);
  const std::size_t run = static_cast<std::size_t>(box.extent[r - 1]) * elem;
  if (box.empty()) return;
  Shape idx(r, 0);
  for (;;) {
    std::int64_t off = 0;
    for (int d = 0; d < r; ++d) off += (box.offset[d] + (d < r - 1 ? idx[d] : 0)) * st[d];
    out.push_back(iovec{reinterpret_cast<void*>(base + static_cast<std::uintptr_t>(off) * elem), run});
    int d = r - 2;
    for (; d >= 0; --d) {
      if (++idx[d] < box.extent[d]) break;
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

}  // namespace

void set_cma_allowed(bool on) { g_cma_allowed = on; }

const std::uint64_t* cma_probe_word() { return &g_probe_word; }

bool cma_probe(std::int64_t pid, std::int64_t address) {
  std::uint64_t got = 0;
  iovec local{&got, sizeof got};
  iovec remote{reinterpret_cast<void*>(static_cast<std::uintptr_t>(address)), sizeof got};
  return process_vm_readv(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0) == static_cast<ssize_t>(sizeof got) &&
         got == g_probe_word;
}

bool cma_possible(const Mesh& mesh, const CollectiveSpec& s) {
  return g_cma_allowed && shared_memory_allowed() && s.kind == CollectiveKind::kAllToAll && s.tiled &&
         !(s.dim == 0 && s.concat_dim == 0) && s.group_size > 1 && mesh.comms().groups_share_node(s.axes);
}

template <typename T>
bool all_to_all_by_cma(const CollectiveSpec& s, const DeviceGroup& g, const Tensor<T>& x, Tensor<T>& out,
                       const std::vector<Box>& in_chunks, const std::vector<Box>& out_chunks) {
  const CommOp op{s.name, "direct reads of " + s.dtype + to_string(s.in_shape) + " over " + s.axes_text};
  const int n = g.comm.size(), me = g.comm.rank();
  // Every rank's (pid, address of x): a small agreement (a max over zeros elsewhere), like the
  // other metadata exchanges not counted as data in CommStats.
  std::vector<std::int64_t> all(2 * static_cast<std::size_t>(n), 0);
  all[2 * me] = static_cast<std::int64_t>(getpid());
  all[2 * me + 1] = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(x.data()));
  allreduce_max(g, op, all.data(), 2 * n);
  std::int64_t ok = 1, moved = 0;
  std::vector<iovec> local, remote;
  for (int q = 0; q < n && ok; ++q) {
    if (q == me) continue;
    local.clear();
    remote.clear();
    runs_of(out_chunks[q], s.out_shape, reinterpret_cast<std::uintptr_t>(out.data()), sizeof(T), local);
    runs_of(in_chunks[me], s.in_shape, static_cast<std::uintptr_t>(all[2 * q + 1]), sizeof(T), remote);
    if (local.size() != remote.size()) {  // the same box shape on both sides: never
      ok = 0;
      break;
    }
    const auto pid = static_cast<pid_t>(all[2 * q]);
    for (std::size_t i = 0; i < local.size() && ok; i += IOV_MAX) {
      const std::size_t k = std::min<std::size_t>(IOV_MAX, local.size() - i);
      std::size_t want = 0;
      for (std::size_t j = 0; j < k; ++j) want += local[i + j].iov_len;
      const ssize_t got = process_vm_readv(pid, local.data() + i, k, remote.data() + i, k, 0);
      if (got != static_cast<ssize_t>(want)) ok = 0;
      else moved += static_cast<std::int64_t>(want);
    }
  }
  allreduce_min(g, op, &ok, 1);  // also: every peer is done reading my x
  if (!ok)  // the start-up probe read between these ranks, so this is not a matter of permissions
    raise<RuntimeError>(s.name, " over ", s.axes_text, ": a direct read of another rank's block on this node failed "
                        "(process_vm_readv); SHARD_SHARED_REDUCE=0 sends everything through MPI");
  comm_stats().record(s.name, s.axes_text, moved);  // what this rank's peers read here moves as much
  return true;
}

#define SHARD_INSTANTIATE_CMA(T)                                                                                \
  template bool all_to_all_by_cma<T>(const CollectiveSpec&, const DeviceGroup&, const Tensor<T>&, Tensor<T>&, \
                                     const std::vector<Box>&, const std::vector<Box>&);
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_CMA)
#undef SHARD_INSTANTIATE_CMA

}  // namespace shard::detail
