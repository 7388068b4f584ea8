// Collectives through group-shared memory: a slot per rank of the group in an MPI-3 shared
// window, written, then read by every rank after one barrier (collective_shared.hpp).

#include "comm/collective_shared.hpp"

#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "shard/comm/detail/mesh_comms.hpp"
#include "shard/core/detail/int_wrap.hpp"

namespace shard::detail {

/// Whether a collective goes through group-shared memory when its blocks are large enough
/// (shared_pays: kSharedReduceMin, and kSharedPsumMax for a psum): the group's ranks share a node with one device each
/// (MeshComms::groups_share_node, decided once per axes for the whole mesh) and it is a psum /
/// pmean or a psum_scatter over dim 0 (contiguous chunks); SHARD_SHARED_REDUCE=0 turns it off.
/// (An all_gather through the window copies twice where MPI's single-copy transfer copies once:
/// measured 1.0-1.4x slower, so it stays with MPI.)
bool g_shared_reduce = true;

void set_shared_reduce(bool on) { g_shared_reduce = on; }
bool shared_memory_allowed() { return g_shared_reduce; }

bool use_shared_memory(const Mesh& mesh, const CollectiveSpec& s, bool is_bool) {
  // Called by every rank of the mesh for the same collective (before its groups are walked).
  if (!g_shared_reduce || s.group_size < 2) return false;
  switch (s.kind) {
    case CollectiveKind::kReduce:
      if (is_bool || (s.op != ReduceKind::kSum && s.op != ReduceKind::kMean)) return false;
      break;
    case CollectiveKind::kPsumScatter:
      if (is_bool || s.dim != 0) return false;
      break;
    default: return false;
  }
  return mesh.comms().groups_share_node(s.axes);  // collective over the mesh's ranks the first time
}

namespace {
// Per (MeshComms, axes): the collectives through group-shared memory so far. Keyed by the
// MeshComms' address, so the entries of one are dropped when it dies (forget_shared_calls): a
// later MeshComms at the same address on one rank but not on another must start at 0 on both,
// or the ranks would take the two windows in opposite turns (and free them in mismatched pairs).
std::mutex g_calls_mutex;
std::map<std::pair<const void*, std::vector<int>>, unsigned> g_calls;
}  // namespace

void forget_shared_calls(const void* comms) {
  std::lock_guard lock(g_calls_mutex);
  for (auto it = g_calls.begin(); it != g_calls.end();)
    it = it->first.first == comms ? g_calls.erase(it) : std::next(it);
}

/// The window for the next collective through group-shared memory on s.axes, with slots of at
/// least `bytes`. Two windows alternate, so one barrier per collective makes reuse safe: a rank
/// writes a slot of a window only after passing the barrier of the collective in between, which
/// every rank reaches only after it read its last result out of that window. Windows are sized
/// in powers of two and cached by the mesh.
/// (`advance` false: the window the next one will use, without taking it; collective_staging.)
SharedWindow& next_shared_window(const Mesh& mesh, const CollectiveSpec& s, std::size_t bytes, bool advance) {
  unsigned parity = 0;
  {
    std::lock_guard lock(g_calls_mutex);
    unsigned& c = g_calls[{&mesh.comms(), s.axes}];
    parity = (advance ? c++ : c) & 1u;
  }
  std::size_t cap = kSharedReduceMin;
  while (cap < bytes) cap <<= 1;
  SharedWindow& w = mesh.comms().shared_window(s.axes, parity ? "shard.psum.1" : "shard.psum.0", cap);
  w.axes_text = s.axes_text;
  return w;
}


/// The sum over the group of acc, in place, through a shared window: every rank writes its
/// block into its slot; after a barrier, in a group of two each sums both slots into its own
/// block; in a larger group each sums its 1/n of the elements over the slots into slot 0 and,
/// after another barrier, copies the sum. Slot order either way: the same bits on every rank.
template <typename T>
void shared_reduce(const Mesh& mesh, const CollectiveSpec& s, Tensor<T>& acc, const shard::source_location& where) {
  SharedWindow& w = next_shared_window(mesh, s, acc.bytes());
  const std::int64_t len = acc.size();
  std::memcpy(window_slot<T>(w, w.index), acc.data(), acc.bytes());
  shared_window_barrier(mesh, w, s.name, where);
  if (w.size == 2) {
    const T* __restrict a = window_slot<T>(w, 0);
    const T* __restrict b = window_slot<T>(w, 1);
    T* __restrict o = acc.data();
    for (std::int64_t i = 0; i < len; ++i) o[i] = add_wrap(a[i], b[i]);  // integers wrap
    return;
  }
  const std::int64_t lo = len * w.index / w.size, hi = len * (w.index + 1) / w.size;
  T* __restrict sum = window_slot<T>(w, 0) + lo;
  for (int r = 1; r < w.size; ++r) {
    const T* __restrict other = window_slot<T>(w, r) + lo;
    for (std::int64_t i = 0; i < hi - lo; ++i) sum[i] = add_wrap(sum[i], other[i]);
  }
  shared_window_barrier(mesh, w, s.name, where);
  std::memcpy(acc.data(), w.base, acc.bytes());
}

/// psum_scatter over dim 0 through a shared window: every rank writes its whole block into
/// the slot of its group position; after a barrier each sums its chunk over the slots (in
/// slot order) into `out`.
template <typename T>
void shared_psum_scatter(const Mesh& mesh, const CollectiveSpec& s, int pos, const Tensor<T>& acc, Tensor<T>& out,
                         const shard::source_location& where) {
  SharedWindow& w = next_shared_window(mesh, s, acc.bytes());
  if (acc.data() != window_slot<T>(w, pos))  // else written there already (collective_staging)
    std::memcpy(window_slot<T>(w, pos), acc.data(), acc.bytes());
  shared_window_barrier(mesh, w, s.name, where);
  const std::int64_t ce = acc.size() / s.group_size, off = pos * ce;
  out = Tensor<T>(s.out_shape);
  T* __restrict o = out.data();
  const T* __restrict first = window_slot<T>(w, 0) + off;
  if (w.size == 1) {
    std::memcpy(o, first, static_cast<std::size_t>(ce) * sizeof(T));
    return;
  }
  const T* __restrict second = window_slot<T>(w, 1) + off;
  for (std::int64_t i = 0; i < ce; ++i) o[i] = detail::add_wrap(first[i], second[i]);
  for (int r = 2; r < w.size; ++r) {
    const T* __restrict other = window_slot<T>(w, r) + off;
    for (std::int64_t i = 0; i < ce; ++i) o[i] = detail::add_wrap(o[i], other[i]);
  }
}

#define SHARD_INSTANTIATE_SHARED(T)                                                                               \
  template void shared_reduce<T>(const Mesh&, const CollectiveSpec&, Tensor<T>&, const shard::source_location&);     \
  template void shared_psum_scatter<T>(const Mesh&, const CollectiveSpec&, int, const Tensor<T>&, Tensor<T>&,      \
                                       const shard::source_location&);
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_SHARED)
#undef SHARD_INSTANTIATE_SHARED

}  // namespace shard::detail
