// Nonblocking collectives (collective.hpp): the gathers jit schedules (start_all_gather, through MPI
// or group-shared memory, below). Sums of row ranges (start_psum_rows): the backward pass's
// gradient buckets (grad_reduce.cpp). For each group over the sum's axes that holds a device of
// this rank: the local members' rows are added in memory, then one MPI_Iallreduce on the
// group's communicator (or, in bfloat16, an Ialltoallv of each rank's share, a float32 sum and
// an Iallgatherv of the rounded sums); completion copies the sum to the other local members.

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "comm/collective_guard_internal.hpp"
#include "comm/collective_members.hpp"
#include "comm/collective_shared.hpp"
#include "shard/comm/comm_stats.hpp"
#include "shard/comm/detail/collective.hpp"
#include "shard/comm/detail/collective_guard.hpp"
#include "shard/comm/detail/comm_verbs.hpp"
#include "shard/comm/detail/mesh_comms.hpp"
#include "shard/core/time_split.hpp"
#include "shard/core/timeline.hpp"
#include "shard/error.hpp"

namespace shard::detail {

// ---- start_psum_rows: the nonblocking psum of a row range (the backward pass's gradient buckets).
struct PendingCollective::State {
  Mesh mesh;  // keeps the groups' communicators alive
  CommOp op;  // names the transfers (outlives them: declared first)
  std::string wait_label;  // the timeline's name of wait()
  /// One group's sum: a transfer in flight and what runs when it completes (which may start the
  /// next phase). `next` (and the buffers it holds) is declared first: it outlives the transfer.
  /// A step that posts a transfer (`next_posts`) runs only from wait() or post_next_phase(),
  /// which the caller reaches at the same point of its program on every rank: MPI needs every
  /// rank to start the collectives of a communicator in the same order, and test() runs when
  /// transfers happen to complete, which differs between ranks.
  struct Part {
    std::function<void(Part&)> next;
    bool next_posts = false;
    PendingTransfer transfer;
  };
  std::vector<Part> parts;
};

PendingCollective::PendingCollective() = default;
PendingCollective::PendingCollective(PendingCollective&&) noexcept = default;
PendingCollective& PendingCollective::operator=(PendingCollective&&) noexcept = default;
PendingCollective::~PendingCollective() = default;

bool PendingCollective::done() const { return !state_ || state_->parts.empty(); }

namespace {
/// Runs the part's next steps once its transfer completed; true when nothing is left. Without
/// `block`, stops before a step that would post a transfer.
bool advance(PendingCollective::State::Part& p, bool block) {
  for (;;) {
    if (block) p.transfer.wait();
    else if (!p.transfer.test()) return false;
    if (!p.next) return true;
    if (!block && p.next_posts) return false;
    auto next = std::move(p.next);
    p.next = nullptr;
    p.next_posts = false;
    next(p);
  }
}
}  // namespace

bool PendingCollective::test() {
  if (done()) return true;
  bool all = true;
  for (auto& p : state_->parts) all = advance(p, false) && all;
  if (all) state_->parts.clear();
  return all;
}

void PendingCollective::post_next_phase() {
  if (done()) return;
  for (auto& p : state_->parts) {
    if (!p.next || !p.next_posts) continue;
    p.transfer.wait();
    auto next = std::move(p.next);
    p.next = nullptr;
    p.next_posts = false;
    next(p);
  }
}

void PendingCollective::wait() {
  if (done()) return;
  const ScopedTime timed(TimeKind::kCommunication);
  const TimelineScope traced("wait", state_->wait_label.c_str());
  for (auto& p : state_->parts) advance(p, true);
  state_->parts.clear();
}

namespace {

/// The state of a collective about to start: the consistency check of `checked` (what every rank
/// must start alike) runs now; `what` names its transfers, `wait_label` its wait on the timeline.
std::unique_ptr<PendingCollective::State> started(const Mesh& mesh, const CollectiveSpec& checked,
                                                  const std::vector<int>& devices, std::string what,
                                                  std::string wait_label,
                                                  const shard::source_location& where) {
  if (collective_guard_on()) [[unlikely]]
    guard_collective(mesh, checked, devices, where);
  return std::make_unique<PendingCollective::State>(PendingCollective::State{
      mesh, CommOp{checked.name, std::move(what), where}, std::move(wait_label), {}});
}

/// float32 -> bfloat16, rounded to nearest even (NaN stays NaN).
std::uint16_t to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
float from_bf16(std::uint16_t h) {
  const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// The bfloat16 sum of `count` floats at acc over g, accumulated in float32: each rank receives
/// every rank's bfloat16 copy of its 1/P of the elements (Ialltoallv), sums them in float32,
/// rounds the sum to bfloat16 and the ranks gather the sums (Iallgatherv): half the bytes of a
/// float32 allreduce. Every rank ends with the same values.
void start_bf16_sum(PendingCollective::State& st, PendingCollective::State::Part& part, const DeviceGroup& g,
                    const std::string& axes, float* acc, std::int64_t count, std::function<void()> finish) {
  struct Buffers {
    std::vector<std::uint16_t> send, recv, gathered, mine;
    std::vector<int> counts, displs, recv_counts, recv_displs;
  };
  auto b = std::make_shared<Buffers>();
  const int p = g.comm.size(), me = g.comm.rank();
  for (int r = 0; r < p; ++r) {  // rank r sums elements [displs[r], displs[r] + counts[r])
    const std::int64_t lo = count * r / p, hi = count * (r + 1) / p;
    b->displs.push_back(static_cast<int>(lo));
    b->counts.push_back(static_cast<int>(hi - lo));
  }
  const int mine = b->counts[me];
  for (int r = 0; r < p; ++r) {
    b->recv_counts.push_back(mine);
    b->recv_displs.push_back(r * mine);
  }
  b->send.resize(static_cast<std::size_t>(count));
  for (std::int64_t e = 0; e < count; ++e) b->send[e] = to_bf16(acc[e]);
  b->recv.resize(static_cast<std::size_t>(mine) * p);
  part.transfer = ialltoallv(g, st.op, axes, b->send.data(), b->counts, b->displs, b->recv.data(), b->recv_counts,
                             b->recv_displs);
  part.next_posts = true;
  part.next = [b, &g, &st, axes, acc, count, p, mine, finish](PendingCollective::State::Part& q) {
    b->mine.resize(static_cast<std::size_t>(mine));
    for (int e = 0; e < mine; ++e) {
      float s = 0;
      for (int r = 0; r < p; ++r) s += from_bf16(b->recv[static_cast<std::size_t>(r) * mine + e]);
      b->mine[e] = to_bf16(s);
    }
    b->gathered.resize(static_cast<std::size_t>(count));
    q.transfer = iallgatherv(g, st.op, axes, b->mine.data(), mine, b->gathered.data(), b->counts, b->displs);
    q.next = [b, acc, count, finish](PendingCollective::State::Part&) {
      for (std::int64_t e = 0; e < count; ++e) acc[e] = from_bf16(b->gathered[e]);
      if (finish) finish();
    };
  };
}

}  // namespace

template <typename T>
PendingCollective start_psum_rows(const Mesh& mesh, const CollectiveSpec& s, const std::vector<int>& devices,
                                  std::vector<Tensor<T>>& blocks, std::int64_t r0, std::int64_t r1, bool bf16,
                                  const shard::source_location& where) {
  if constexpr (!std::is_same_v<T, float> && !std::is_same_v<T, double>) {
    raise<ValueError>("start_psum_rows: float32 and float64 only");
  } else {
    if (s.kind != CollectiveKind::kReduce || s.op != ReduceKind::kSum || s.in_shape.size() != 2 ||
        s.in_shape[0] != r1 - r0)
      raise<ValueError>("start_psum_rows: the spec must be a psum of the ", r1 - r0, " rows");
    bf16 = bf16 && std::is_same_v<T, float>;
    CollectiveSpec checked = s;  // ranks that sum in bfloat16 must all do
    if (bf16) checked.dtype = "bfloat16-compressed " + s.dtype;
    const auto traced = TimelineScope::named("start", [&] { return "start " + s.name + " " + s.axes_text; });
    PendingCollective out;
    out.state_ =
        started(mesh, checked, devices, checked.dtype + to_string(s.in_shape) + " over " + s.axes_text,
                "wait psum (gradient bucket)", where);
    auto& st = *out.state_;
    const std::int64_t n = s.in_shape[1], count = (r1 - r0) * n;
    const bool shared_ok = use_shared_memory(mesh, s, false);
    auto rows = [&](int local) { return blocks[local].data() + r0 * n; };
    for (const auto& g : st.mesh.comms().groups(s.axes)) {
      const auto m = members_of(g, devices);
      if (m.empty() || count == 0) continue;
      T* acc = rows(m[0].local);
      for (std::size_t i = 1; i < m.size(); ++i) {
        const T* x = rows(m[i].local);
        for (std::int64_t e = 0; e < count; ++e) acc[e] += x[e];
      }
      std::vector<T*> others;
      for (std::size_t i = 1; i < m.size(); ++i) others.push_back(rows(m[i].local));
      std::function<void()> finish;
      if (!others.empty())
        finish = [acc, others, count] {
          for (T* o : others) std::memcpy(o, acc, static_cast<std::size_t>(count) * sizeof(T));
        };
      const bool local = g.comm.is_null();
      if (local || (shared_ok && shared_pays(s.kind, static_cast<std::size_t>(count) * sizeof(T)))) {
        if (!local) {  // one node: a blocking sum through group-shared memory (memory copies)
          Tensor<T> view = Tensor<T>::borrow(acc, Shape{r1 - r0, n});
          shared_reduce(mesh, s, view, where);
          comm_stats().record(s.name, s.axes_text, count * static_cast<std::int64_t>(sizeof(T)));
        } else {
          comm_stats().record_in_process(s.name, s.axes_text,
                                         static_cast<std::int64_t>(m.size()) * count * static_cast<std::int64_t>(sizeof(T)));
        }
        if (finish) finish();
        continue;
      }
      auto& part = st.parts.emplace_back();
      if constexpr (std::is_same_v<T, float>) {
        if (bf16) {
          start_bf16_sum(st, part, g, s.axes_text, acc, count, std::move(finish));
          continue;
        }
      }
      if (finish) part.next = [finish](PendingCollective::State::Part&) { finish(); };
      part.transfer = iallreduce_sum(g, st.op, s.axes_text, acc, count_of(count, s));
    }
    return out;
  }
}

// ---- the scheduled all_gather through group-shared memory (one node, one device per rank): a
// rank writes its block into its slot when the gather starts and reads the others' slots when it
// is waited for, so a rank that waits finds its peers' blocks there as soon as each peer has
// *started* (one layer earlier under jit's scheduler), without the peer taking part again, as an
// MPI transfer between ranks of a node needs (its bytes move inside the peer's MPI calls).
namespace {

/// Data windows in turn per (axes, slot size): a rank writes window c % kGatherRing for its c-th
/// gather only after every member read that window's previous gather (c - kGatherRing), which
/// the control window's `read` counters tell; `written` tells that a member's block of gather c
/// is there; `calls` is the member's own count of shared gathers on these windows (kept in the window, which
/// lives as long as the mesh's communicators and starts zeroed: shared_window).
constexpr int kGatherRing = 4;
struct GatherControl {  // one member's slot of the control window (its own two cache lines)
  std::uint64_t written[kGatherRing];
  std::uint64_t read[kGatherRing];
  std::uint64_t calls;
};
static_assert(sizeof(GatherControl) <= 128);
static_assert(std::atomic_ref<std::uint64_t>::is_always_lock_free);  // shared between processes

GatherControl& control_of(const SharedWindow& w, int member) {
  return *window_slot<GatherControl>(w, member);
}

std::uint64_t load(std::uint64_t& v) {
  return std::atomic_ref<std::uint64_t>(v).load(std::memory_order_acquire);
}
void store(std::uint64_t& v, std::uint64_t x) {
  std::atomic_ref<std::uint64_t>(v).store(x, std::memory_order_release);
}

/// Spins (yielding) until ready(); the watcher thread ends the job if it waits too long, as for
/// a blocking MPI call.
template <typename Ready>
void spin_until(const CollectiveSpec& s, const DeviceGroup& g, Ready&& ready) {
  if (ready()) return;
  const BlockingWait wait("group-shared memory (the other ranks' blocks)", s, g.ranks);
  while (!ready()) std::this_thread::yield();
}

}  // namespace

namespace {

/// One group's gather through group-shared memory: this member's block goes into its slot now
/// (and into its own chunk of `out`); the part's step, run by wait(), reads the other slots.
/// False (nothing done) when this rank's gather kGatherRing ago on the same windows is still in
/// flight (the caller goes through MPI instead): every rank replays the same starts and waits, so
/// every rank decides alike.
template <typename T>
bool start_shared_gather(PendingCollective::State& st, const CollectiveSpec& s, const DeviceGroup& g, int pos,
                         Tensor<T>& block, Tensor<T>& out, const Shape& eshape) {
  const auto bytes = static_cast<std::size_t>(num_elements(s.in_shape)) * sizeof(T);
  std::size_t cap = kSharedReduceMin;
  while (cap < bytes) cap <<= 1;
  SharedWindow& control =
      st.mesh.comms().shared_window(s.axes, "shard.gather.control." + std::to_string(cap), 128);
  GatherControl& own = control_of(control, control.index);
  const std::uint64_t call = own.calls + 1;
  const int k = static_cast<int>(call % kGatherRing);
  if (load(own.read[k]) + kGatherRing < call) return false;  // kGatherRing of this rank's unread already
  SharedWindow& data = st.mesh.comms().shared_window(s.axes, "shard.gather." + std::to_string(k), cap);
  own.calls = call;  // (after the window exists: creating it may raise)
  data.axes_text = control.axes_text = s.axes_text;
  const int me = data.index, n = data.size;
  // The window's previous gather (call - kGatherRing) read by every member before it is written.
  spin_until(s, g, [&] {
    for (int r = 0; r < n; ++r)
      if (load(control_of(control, r).read[k]) + kGatherRing < call) return false;
    return true;
  });
  std::memcpy(window_slot<T>(data, me), block.data(), bytes);
  store(control_of(control, me).written[k], call);
  copy_in(block.data(), eshape, chunk_box(s.out_shape, s.dim, eshape[s.dim], pos), out);
  comm_stats().record(s.name, s.axes_text, static_cast<std::int64_t>(bytes));
  auto& part = st.parts.emplace_back();
  part.next_posts = true;  // it may wait for the other ranks: wait() runs it, test() does not
  const std::vector<std::vector<int>> positions = positions_by_rank(g, st.mesh.topology());
  T* dst = out.data();
  const Shape out_shape = out.shape();
  // Marks this member's read of the window when the wait ran, or when the gather is dropped
  // unwaited (an error unwinding): the others may then reuse the window, and later gathers on it
  // do not wait for a read that never comes.
  // (Made in place: a temporary's destructor would mark the read at the start.)
  struct ReadMark {
    ReadMark(std::uint64_t* r, std::uint64_t c) : read(r), call(c) {}
    ReadMark(const ReadMark&) = delete;
    ReadMark& operator=(const ReadMark&) = delete;
    ~ReadMark() { store(*read, call); }
    std::uint64_t* read;
    std::uint64_t call;
  };
  auto mark = std::make_shared<ReadMark>(&control_of(control, me).read[k], call);
  part.next = [&data, &control, s, g_ranks = g.ranks, positions, dst, out_shape, eshape, me, n, k, call,
               mark](PendingCollective::State::Part&) mutable {
    Tensor<T> view = Tensor<T>::borrow(dst, out_shape);
    for (int r = 0; r < n; ++r) {
      if (r == me) continue;
      if (load(control_of(control, r).written[k]) != call) {
        const BlockingWait wait("group-shared memory (the other ranks' blocks)", s, g_ranks);
        while (load(control_of(control, r).written[k]) != call) std::this_thread::yield();
      }
      copy_in(window_slot<T>(data, r), eshape,
              chunk_box(s.out_shape, s.dim, eshape[s.dim], positions[static_cast<std::size_t>(r)][0]), view);
    }
    mark.reset();  // read: store(read[k], call)
  };
  return true;
}

}  // namespace

// ---- start_all_gather: jit's scheduled reshards (an all_gather started early, waited late).
template <typename T>
PendingCollective start_all_gather(const Mesh& mesh, const CollectiveSpec& s, const std::vector<int>& devices,
                                   std::vector<Tensor<T>> ins, std::shared_ptr<std::vector<Tensor<T>>> outs,
                                   const shard::source_location& where) {
  if (s.kind != CollectiveKind::kAllGather)
    raise<ValueError>("start_all_gather: ", s.name, " is not an all_gather");
  const ScopedTime timed(TimeKind::kCommunication);  // packing, and a gather within the rank
  const auto traced = TimelineScope::named("start", [&] { return "start " + s.name + " " + s.axes_text; });
  PendingCollective out;
  out.state_ = started(mesh, s, devices, s.dtype + to_string(s.in_shape) + " all_gather over " + s.axes_text,
                       "wait " + s.name + " " + s.axes_text, where);
  auto& st = *out.state_;
  outs->assign(ins.size(), Tensor<T>());
  Shape eshape = s.in_shape;  // one block in output coordinates
  if (!s.tiled) eshape.insert(eshape.begin() + s.dim, 1);
  const std::int64_t be = num_elements(s.in_shape);
  const auto block_bytes = static_cast<std::size_t>(be) * sizeof(T);
  // Decided before the groups are walked: groups_share_node is collective over the mesh's ranks
  // the first time.
  const bool shared = shared_memory_allowed() && !collective_watchdog_on() &&
                      block_bytes >= kSharedReduceMin && st.mesh.comms().groups_share_node(s.axes);
  for (const auto& g : st.mesh.comms().groups(s.axes)) {
    const auto m = members_of(g, devices);
    if (m.empty()) continue;
    for (const auto& mm : m) (*outs)[mm.local] = Tensor<T>(s.out_shape);
    if (shared && !g.comm.is_null() && g.ranks.size() == g.devices.size() &&
        start_shared_gather<T>(st, s, g, m[0].pos, ins[m[0].local], (*outs)[m[0].local], eshape))
      continue;
    if (g.comm.is_null() || be == 0) {  // within this rank: in memory now
      for (const auto& to : m)
        for (const auto& from : m)
          copy_in(ins[from.local].data(), eshape, chunk_box(s.out_shape, s.dim, eshape[s.dim], from.pos),
                  (*outs)[to.local]);
      if (g.comm.is_null())
        comm_stats().record_in_process(s.name, s.axes_text,
                                       static_cast<std::int64_t>(m.size() * block_bytes));
      continue;
    }
    struct Buffers {
      std::vector<Tensor<T>> ins;  // the blocks being sent (kept alive while they are)
      Tensor<T> send, recv;
      std::vector<int> counts, displs;
      std::vector<std::vector<int>> pos;
    };
    auto b = std::make_shared<Buffers>();
    b->pos = positions_by_rank(g, mesh.topology());
    // One device per rank gathered along dim 0: each rank's chunk lands at its group position
    // in the result itself (no staging buffer, nothing to place afterwards).
    const bool direct = g.ranks.size() == g.devices.size() && s.dim == 0 && s.tiled;
    std::int64_t total = 0;
    for (const auto& ps : b->pos) {
      b->counts.push_back(count_of(static_cast<std::int64_t>(ps.size()) * be, s));
      b->displs.push_back(count_of(direct ? ps[0] * be : total, s));
      total += static_cast<std::int64_t>(ps.size()) * be;
    }
    const T* send = nullptr;
    if (m.size() == 1) {  // one member here: its block goes out as it is
      b->ins.push_back(std::move(ins[m[0].local]));
      send = b->ins[0].data();
    } else {
      b->send = Tensor<T>({static_cast<std::int64_t>(m.size()) * be});
      for (std::size_t i = 0; i < m.size(); ++i)
        std::memcpy(b->send.data() + static_cast<std::int64_t>(i) * be, ins[m[i].local].data(), block_bytes);
      send = b->send.data();
    }
    T* recv = direct ? (*outs)[m[0].local].data() : (b->recv = Tensor<T>({total})).data();
    auto& part = st.parts.emplace_back();
    part.transfer =
        iallgatherv(g, st.op, s.axes_text, send, count_of(static_cast<std::int64_t>(m.size()) * be, s), recv,
                    b->counts, b->displs);
    part.next = [b, m, outs, eshape, s, direct](PendingCollective::State::Part&) {
      if (direct) {  // the result arrived in place; only the buffers are let go
        b->ins.clear();
        return;
      }
      for (const auto& to : m)
        for (std::size_t r = 0; r < b->pos.size(); ++r)
          for (std::size_t j = 0; j < b->pos[r].size(); ++j)
            copy_in(b->recv.data() + b->displs[r] + static_cast<std::int64_t>(j) * num_elements(s.in_shape),
                    eshape, chunk_box(s.out_shape, s.dim, eshape[s.dim], b->pos[r][j]), (*outs)[to.local]);
    };
  }
  return out;
}

#define SHARD_INSTANTIATE_ASYNC(T)                                                                           \
  template PendingCollective start_psum_rows<T>(const Mesh&, const CollectiveSpec&, const std::vector<int>&, \
                                                std::vector<Tensor<T>>&, std::int64_t, std::int64_t, bool,   \
                                                const shard::source_location&);
SHARD_FOR_EACH_FLOAT_DTYPE(SHARD_INSTANTIATE_ASYNC)
#undef SHARD_INSTANTIATE_ASYNC
#define SHARD_INSTANTIATE_GATHER(T)                                                        \
  template PendingCollective start_all_gather<T>(                                          \
      const Mesh&, const CollectiveSpec&, const std::vector<int>&, std::vector<Tensor<T>>, \
      std::shared_ptr<std::vector<Tensor<T>>>, const shard::source_location&);
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_GATHER)
#undef SHARD_INSTANTIATE_GATHER

}  // namespace shard::detail
