// The collective consistency check (SHARD_CHECK_COLLECTIVES), the collective watchdog
// (SHARD_COLLECTIVE_TIMEOUT) and the barrier of group-shared memory, which runs under both
// like any collective. See shard/comm/detail/collective_guard.hpp.

#include "shard/comm/detail/collective_guard.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <thread>

#include "comm/collective_guard_internal.hpp"
#include "shard/comm/detail/collective.hpp"
#include "shard/comm/detail/mesh_comms.hpp"
#include "shard/comm/group_shared.hpp"
#include "shard/error.hpp"
#include "shard/mpi/agree.hpp"
#include "shard/mpi/communicator.hpp"
#include "shard/runtime/detail/env.hpp"

namespace shard::detail {

int g_collective_guard = 0;

namespace {

double g_timeout = 0;
double g_abort_grace = 5.0;
mpi::Communicator g_watchdog_comm;  // a duplicate of the world for the arrival messages
DeviceGroup g_world;  // a duplicate of the world: the exchanges of meshes spanning every rank, shard_map's
                      // and the program's ends, failure marks (never met by a data transfer)
DeviceGroup g_world_data;  // the Runtime's world (not owned): the comm verbs' whole-world transfers

using Clock = std::chrono::steady_clock;

std::string ranks_text(const std::vector<int>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

}  // namespace

std::string collective_text(const CollectiveSpec& s) {
  if (s.dtype.empty()) return s.name;
  std::string t = s.name + " over " + s.axes_text + " of " + s.dtype + to_string(s.in_shape);
  if (s.kind == CollectiveKind::kAllGather || s.kind == CollectiveKind::kPsumScatter)
    t += cat(" (dim ", s.dim, s.tiled ? ", tiled" : "", ")");
  if (s.kind == CollectiveKind::kAllToAll)
    t += cat(" (split_dim ", s.dim, ", concat_dim ", s.concat_dim, s.tiled ? ", tiled" : "", ")");
  if (s.kind == CollectiveKind::kPpermute) {
    t += " (perm";
    for (const auto& [a, b] : s.perm) t += cat(" ", a, "->", b);
    t += ")";
  }
  return t;
}

namespace {

[[noreturn]] void watchdog_abort(const std::string& msg) {
  std::fprintf(stderr, "%serror: collective watchdog: %s\n", rank_prefix().c_str(), msg.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 3);
  std::_Exit(3);
}

constexpr int kArrivalTag = 1;
constexpr int kFailureTag = 2;

// Failure announcements (main thread only): one message per failure to every other rank,
// [Error kind][1 if the sender is ending the job][text]. What this rank sent, what it received
// (by sender), and whether it left a collective unfinished to raise one (then no collective may
// run again).
struct Announcement {
  int kind = 0;
  bool exiting = false;
  std::string text;
};
bool g_failure_sent = false;
int g_failures_received = 0;
std::map<int, Announcement> g_received;  // by sender, since the last retire_failure_notices
std::vector<char> g_failure_message;     // the text sent (alive until the sends finish)
std::vector<MPI_Request> g_failure_sends;
std::string g_poisoned;              // non-empty: why no more collectives can run in this job
int g_learned_from = -1;             // the rank whose announced failure this rank raised (-1: none)
bool g_learned_by_exchange = false;  // ... met as a failure mark in an exchange (not by polling)
bool g_peer_exiting = false;         // an exchange met a rank's failure mark: that rank takes part in no more
bool g_job_failing = false;          // guarded_main is ending the job with an error
// Whether a polled wait raises another rank's announced failure. Not in the exchanges every
// rank comes to anyway (shard_map's and the program's ends, a failure mark): there the failure
// arrives as the mark, and leaving the exchange half done would poison the job.
bool g_listening = true;
struct NotListening {
  bool before = g_listening;
  NotListening() { g_listening = false; }
  ~NotListening() { g_listening = before; }
  NotListening(const NotListening&) = delete;
  NotListening& operator=(const NotListening&) = delete;
};

const Announcement& receive_announcement(int source, const MPI_Status* probed) {
  MPI_Status st;
  if (probed)
    st = *probed;
  else
    mpi::check(MPI_Probe(source, kFailureTag, g_watchdog_comm.get(), &st), "MPI_Probe");
  int len = 0;
  MPI_Get_count(&st, MPI_CHAR, &len);
  std::vector<char> buf(static_cast<std::size_t>(std::max(len, 2)), 0);
  mpi::check(MPI_Recv(buf.data(), len, MPI_CHAR, st.MPI_SOURCE, kFailureTag, g_watchdog_comm.get(),
                      MPI_STATUS_IGNORE),
             "MPI_Recv");
  ++g_failures_received;
  Announcement a;
  a.kind = buf[0];
  a.exiting = buf[1] != 0;
  a.text.assign(buf.begin() + 2, buf.begin() + std::max(len, 2));
  return g_received[st.MPI_SOURCE] = std::move(a);
}

/// Raises the failure rank `source` announced (receiving it first if needed): the same
/// shard::Error subclass, "rank R failed: <its message>", and what this rank was waiting in.
[[noreturn]] void raise_announced(int source, const std::string& waiting_in,
                                  const MPI_Status* probed = nullptr) {
  auto it = g_received.find(source);
  const Announcement& a = it != g_received.end() ? it->second : receive_announcement(source, probed);
  g_learned_from = source;
  g_learned_by_exchange = probed == nullptr;
  mpi::throw_error_of_kind(a.kind, cat("rank ", source, " failed: ", a.text,
                                       " (this rank learned of it waiting in ", waiting_in, ")"));
}

/// Raises the failure another rank announced (announce_failure), if one has arrived (polled
/// mode: the collective this rank waited in stays posted, so no collective may run again).
void raise_if_failure_announced(const std::string& waiting_in) {
  if (g_watchdog_comm.is_null()) return;
  int flag = 0;
  MPI_Status st;
  mpi::check(MPI_Iprobe(MPI_ANY_SOURCE, kFailureTag, g_watchdog_comm.get(), &flag, &st), "MPI_Iprobe");
  if (!flag) return;
  if (g_poisoned.empty())
    g_poisoned = cat("rank ", st.MPI_SOURCE, " failed while this rank waited in ", waiting_in);
  raise_announced(st.MPI_SOURCE, waiting_in, &st);
}

/// Polls `n` requests until all complete or `timeout` seconds pass (0: no limit); done[i] says
/// which did. Meanwhile a failure announced by another rank is raised here (see above).
bool poll_requests(int n, MPI_Request* r, std::vector<char>& done, double timeout, const CollectiveSpec& s) {
  done.assign(static_cast<std::size_t>(n), 0);
  const auto deadline =
      timeout > 0 ? Clock::now() + std::chrono::duration<double>(timeout) : Clock::time_point::max();
  int left = n;
  for (long spin = 0;; ++spin) {
    for (int i = 0; i < n; ++i) {
      if (done[i]) continue;
      int flag = 0;
      mpi::check(MPI_Test(&r[i], &flag, MPI_STATUS_IGNORE), "MPI_Test");
      if (flag) {
        done[i] = 1;
        --left;
      }
    }
    if (left == 0) return true;
    if (Clock::now() >= deadline) return false;
    if (spin % 64 == 63 && g_listening) raise_if_failure_announced(collective_text(s));
    if (spin < 2000)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace

/// Waits for requests of a collective's MPI call under the watchdog; aborts on timeout.
void watchdog_wait(int n, MPI_Request* r, const CollectiveSpec& s, const DeviceGroup& g,
                   const char* routine) {
  // Not listening for announced failures here: raising would leave the call posted over
  // buffers the caller frees. A failure reaches this rank at the arrival messages before a
  // collective, or as a failure mark in the next exchange.
  const NotListening quiet;
  std::vector<char> done;
  if (poll_requests(n, r, done, g_timeout, s)) return;
  watchdog_abort(cat(collective_text(s), " (", routine, " on ranks ", ranks_text(g.ranks),
                     ") did not complete within ", g_timeout,
                     " s (SHARD_COLLECTIVE_TIMEOUT); every rank of the mesh had arrived at a collective"));
}

namespace {

/// Watchdog: tells every other rank of the mesh that this one arrived (one small message each,
/// on a duplicate of the world made at start-up, so no communicator has to be created first:
/// creating one would wait for the missing rank) and waits for theirs until the deadline.
void await_arrival(const std::vector<int>& ranks, int me, const CollectiveSpec& s, long seq,
                   const std::string& where) {
  if (ranks.size() < 2 || g_watchdog_comm.is_null()) return;
  // On the heap: if a failure announced meanwhile is raised, the messages stay posted and MPI
  // may still write into the buffers: they are leaked then, never freed under MPI.
  struct Arrival {
    std::vector<long> in;
    long out = 0;
    std::vector<MPI_Request> recvs, sends;
  };
  auto a = std::make_unique<Arrival>();
  a->in.assign(ranks.size(), 0);
  a->out = seq;
  std::vector<int> peer;
  for (std::size_t j = 0; j < ranks.size(); ++j) {
    if (ranks[j] == me) continue;
    peer.push_back(ranks[j]);
    a->recvs.emplace_back();
    mpi::check(
        MPI_Irecv(&a->in[j], 1, MPI_LONG, ranks[j], kArrivalTag, g_watchdog_comm.get(), &a->recvs.back()),
        "MPI_Irecv");
    a->sends.emplace_back();
    mpi::check(
        MPI_Isend(&a->out, 1, MPI_LONG, ranks[j], kArrivalTag, g_watchdog_comm.get(), &a->sends.back()),
        "MPI_Isend");
  }
  try {
    std::vector<char> done;
    if (!poll_requests(static_cast<int>(a->recvs.size()), a->recvs.data(), done, g_timeout, s)) {
      std::vector<int> missing;
      for (std::size_t i = 0; i < done.size(); ++i)
        if (!done[i]) missing.push_back(peer[i]);
      watchdog_abort(cat(collective_text(s), " (collective #", seq, " here, at ", where,
                         ") did not complete within ", g_timeout, " s (SHARD_COLLECTIVE_TIMEOUT): rank",
                         missing.size() > 1 ? "s " : " ", ranks_text(missing), " had not arrived; ranks ",
                         ranks_text(ranks), " take part"));
    }
    std::vector<char> sent;
    if (!poll_requests(static_cast<int>(a->sends.size()), a->sends.data(), sent, g_timeout, s))
      watchdog_abort(cat(s.name, " over ", s.axes_text, ": the arrival messages were not delivered within ",
                         g_timeout, " s"));
  } catch (...) {
    (void)a.release();  // MPI still owns the buffers
    throw;
  }
}

/// The arrival messages over the ranks of a mesh (by first device).
void await_arrival(const Mesh& mesh, const CollectiveSpec& s, long seq, const std::string& where) {
  const Topology& topo = mesh.topology();
  std::vector<int> ranks;
  for (int d : mesh.device_ids()) {
    const int r = topo.owner(d);
    if (std::find(ranks.begin(), ranks.end(), r) == ranks.end()) ranks.push_back(r);
  }
  await_arrival(ranks, topo.process_index, s, seq, where);
}

long g_world_transfers = 0;  // transfers checked over the world (numbers them in messages)

// ---- The guarded exchange: one MPI_MAX allreduce of kWords int64 that every check, shard_map's
// end, the program's end and a failing rank's failure mark use on a guard communicator, so
// any of them can meet any other and tell what the other rank is doing.
constexpr int kPayload = 6;
constexpr int kWords = 4 + kPayload;  // fingerprint, ~fingerprint, -(failed rank), exiting rank + 1, payload
constexpr std::int64_t kNone = INT64_MIN;

struct Outcome {
  bool same = true;  // every rank passed the same fingerprint
  int failed = -1;   // the lowest rank that marked a failure (-1: none)
  int exiting = -1;  // a rank ending the job (its failure mark), or -1
  std::int64_t payload[kPayload] = {};
  std::vector<std::string> descriptions;  // by communicator rank, when !same && failed < 0
};

struct Fingerprint {
  std::uint64_t h = 1469598103934665603ULL;
  void add(std::uint64_t v) {
    for (int b = 0; b < 8; ++b) {
      h ^= (v >> (8 * b)) & 0xffu;
      h *= 1099511628211ULL;
    }
  }
  void add(const std::string& t) {
    for (unsigned char c : t) {
      h ^= c;
      h *= 1099511628211ULL;
    }
    add(t.size());
  }
};

/// What a collective's check compares: everything that must match for the call to be the same
/// collective. Not its call site (named in the messages only): ranks may reach the same
/// collective from different lines, as in `rank == 0 ? psum(2 * x) : psum(x)`.
std::uint64_t fingerprint_of(const CollectiveSpec& s) {
  Fingerprint f;
  f.add(static_cast<std::uint64_t>(s.kind));
  f.add(static_cast<std::uint64_t>(s.op));
  f.add(s.name);
  f.add(s.axes_text);
  f.add(s.dtype);
  f.add(static_cast<std::uint64_t>(s.group_size));
  for (const auto d : s.in_shape) f.add(static_cast<std::uint64_t>(d));
  f.add(static_cast<std::uint64_t>(s.in_shape.size()));
  f.add(static_cast<std::uint64_t>(s.dim) << 32 | static_cast<std::uint32_t>(s.concat_dim));
  f.add(s.tiled ? 1 : 0);
  for (const auto& [a, b] : s.perm)
    f.add(static_cast<std::uint64_t>(a) << 32 | static_cast<std::uint32_t>(b));
  return f.h;
}

std::uint64_t fingerprint_of(const std::string& what) {
  Fingerprint f;
  f.add(what);
  return f.h;
}

/// Every rank's description, by communicator rank (after a mismatch: every participant calls it).
std::vector<std::string> gather_descriptions(const DeviceGroup& g, const std::string& mine,
                                             const CollectiveSpec& s) {
  const int n = static_cast<int>(g.ranks.size());
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<std::size_t>(n)), displs(static_cast<std::size_t>(n));
  {
    const BlockingWait wait("MPI_Allgather (the check's descriptions)", s, g.ranks);
    mpi::check(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, g.comm.get()), "MPI_Allgather");
  }
  int total = 0;
  for (int j = 0; j < n; ++j) {
    displs[j] = total;
    total += lens[j];
  }
  std::string all(static_cast<std::size_t>(total), '\0');
  {
    const BlockingWait wait("MPI_Allgatherv (the check's descriptions)", s, g.ranks);
    mpi::check(MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR,
                              g.comm.get()),
               "MPI_Allgatherv");
  }
  std::vector<std::string> out;
  for (int j = 0; j < n; ++j)
    out.push_back(all.substr(static_cast<std::size_t>(displs[j]), static_cast<std::size_t>(lens[j])));
  return out;
}

/// One guarded exchange on `g` (blocking, or polled under SHARD_COLLECTIVE_TIMEOUT). `failed`:
/// the rank whose failure this rank marks (-1: none). On a fingerprint mismatch with no
/// failure, every participant exchanges descriptions (`describe` gives this rank's).
template <typename Describe>
Outcome exchange(const DeviceGroup& g, const CollectiveSpec& s, std::uint64_t fp, int failed, bool exiting,
                 const std::int64_t* payload, Describe&& describe) {
  std::int64_t v[kWords];
  v[0] = static_cast<std::int64_t>(fp);
  v[1] = ~v[0];
  v[2] = failed >= 0 ? -static_cast<std::int64_t>(failed) : kNone;
  v[3] = exiting ? g.comm.rank() + 1 : 0;
  for (int i = 0; i < kPayload; ++i) v[4 + i] = payload ? payload[i] : 0;
  if (collective_watchdog_on()) {
    polled_call(s, g, "MPI_Allreduce (the collective check)", [&](MPI_Request* r) {
      return MPI_Iallreduce(MPI_IN_PLACE, v, kWords, MPI_INT64_T, MPI_MAX, g.comm.get(), r);
    });
  } else {
    const BlockingWait wait("MPI_Allreduce (the collective check)", s, g.ranks);
    mpi::check(MPI_Allreduce(MPI_IN_PLACE, v, kWords, MPI_INT64_T, MPI_MAX, g.comm.get()),
               "MPI_Allreduce (the collective check)");
  }
  Outcome o;
  o.same = v[0] == ~v[1];  // max(h) == min(h)
  o.failed = v[2] == kNone ? -1 : static_cast<int>(-v[2]);
  o.exiting = static_cast<int>(v[3]) - 1;
  if (o.exiting >= 0) g_peer_exiting = true;  // every rank of this exchange saw it
  for (int i = 0; i < kPayload; ++i) o.payload[i] = v[4 + i];
  if (!o.same && o.failed < 0) o.descriptions = gather_descriptions(g, describe(), s);
  return o;
}

/// "rank 0 called X, but rank 1 called Y" from the descriptions of a mismatch.
std::string mismatch_text(const DeviceGroup& g, const std::vector<std::string>& d) {
  const std::size_t n = d.size();
  std::size_t other = 1;
  while (other < n && d[other] == d[0]) ++other;
  if (other == n) other = n - 1;  // a hash collision cannot make equal texts differ; be safe anyway
  return cat(
      "rank ", g.ranks[0], " called ", d[0], ", but rank ", g.ranks[other], " called ", d[other],
      "; every rank must issue the same collectives in the same order (found by SHARD_CHECK_COLLECTIVES)");
}

/// The spec that names a whole-world exchange in messages ("the end of shard_map").
CollectiveSpec world_spec(const char* name) {
  CollectiveSpec s;
  s.name = name;
  s.axes_text = "every rank";
  return s;
}

bool spans_world(const Mesh& mesh) {
  return !g_world.comm.is_null() && mesh.comms().spans_world(static_cast<int>(g_world.ranks.size()));
}

/// The spec this rank's check presents for `s` at a checked collective on `g`: the fault hook
/// (collective_fault.cpp) may run an extra exchange first, or present another collective.
const CollectiveSpec& fault_hook(const DeviceGroup& g, const CollectiveSpec& s, CollectiveSpec& scratch) {
  switch (fault_at_checked_collective(g_world.comm.is_null() ? -1 : g_world.comm.rank())) {
    case FaultAction::kNone:
      return s;
    case FaultAction::kRename:
      scratch = renamed_by_fault(s);
      return scratch;
    case FaultAction::kExtra:
      break;
  }
  const CollectiveSpec extra = world_spec("an extra collective (SHARD_FAULT_COLLECTIVE)");
  const std::string what = extra_collective_text(s);
  const Outcome o = exchange(g, extra, fingerprint_of(what), -1, false, nullptr, [&] { return what; });
  if (o.failed >= 0) raise_announced(o.failed, what);
  if (!o.same) raise<CollectiveMismatchError>("collective mismatch: ", mismatch_text(g, o.descriptions));
  return s;
}

}  // namespace

/// Before a collective: the watchdog's arrival messages and the consistency check. The check
/// runs on the world when the mesh spans every rank (so it meets shard_map's and the program's
/// ends), else on the communicator of all the mesh's ranks (ranks that call collectives over
/// different axes use different group communicators, so only this one can see that they
/// disagree).
void guard_collective(const Mesh& mesh, const CollectiveSpec& s, const std::vector<int>& devices,
                      const shard::source_location& where) {
  if (devices.empty()) return;  // this rank holds no device of the mesh
  raise_if_poisoned();
  MeshComms& comms = mesh.comms();
  const long seq = comms.next_sequence();
  const shard::source_location& site = where;
  const bool world = spans_world(mesh);
  // The arrival messages come before any communicator creation (which waits for every rank
  // inside MPI): under the watchdog always, under the check until the mesh's guard
  // communicator exists, so a rank that failed before its first collective is still heard of.
  if (collective_watchdog_on() || (!world && collective_check_on() && !comms.guard_group_built()))
    await_arrival(mesh, s, seq, call_site_text(site));
  if (!collective_check_on()) return;
  const DeviceGroup& g = world ? g_world : comms.guard_group();
  if (g.comm.is_null() || g.ranks.size() < 2) return;  // the mesh lives on this rank alone
  CollectiveSpec scratch;
  const CollectiveSpec& shown = fault_hook(g, s, scratch);
  const Outcome o = exchange(g, shown, fingerprint_of(shown), -1, false, nullptr, [&] {
    return cat(collective_text(shown), " (collective #", seq, " on mesh ", mesh.to_string(), ") at ",
               call_site_text(site));
  });
  if (o.failed >= 0) raise_announced(o.failed, collective_text(s));
  if (!o.same)
    raise<CollectiveMismatchError>("collective mismatch on mesh ", mesh.to_string(), ": ",
                                   mismatch_text(g, o.descriptions));
}

void check_world_transfer(const CollectiveSpec& s, const shard::source_location& where) {
  raise_if_poisoned();
  if (g_world.comm.is_null() || g_world.ranks.size() < 2) return;
  if (collective_watchdog_on())
    await_arrival(g_world.ranks, g_world.comm.rank(), s, ++g_world_transfers, call_site_text(where));
  if (!collective_check_on()) return;
  CollectiveSpec scratch;
  const CollectiveSpec& shown = fault_hook(g_world, s, scratch);
  const Outcome o = exchange(g_world, shown, fingerprint_of(shown), -1, false, nullptr,
                             [&] { return cat(collective_text(shown), " at ", call_site_text(where)); });
  if (o.failed >= 0) raise_announced(o.failed, collective_text(s));
  if (!o.same)
    raise<CollectiveMismatchError>("collective mismatch: ", mismatch_text(g_world, o.descriptions));
}

const DeviceGroup& world_device_group() {
  if (g_world_data.comm.is_null())
    raise<RuntimeError>("no shard::Runtime exists; create one at the start of main()");
  return g_world_data;
}

Agreement agree_at_end_of_shard_map(std::exception_ptr& err, const std::int64_t (&words)[6],
                                    const std::function<void(const std::exception_ptr&)>& on_failure) {
  static const CollectiveSpec spec = world_spec("the end of shard_map (the agreement after the bodies)");
  static const std::uint64_t fp = fingerprint_of(spec.name);
  const int me = g_world.comm.is_null() ? 0 : g_world.comm.rank();
  // This rank's error came from a rank that is ending the job: it will not come here either.
  if (err && g_learned_from >= 0) {
    auto it = g_received.find(g_learned_from);
    if (it != g_received.end() && it->second.exiting) std::rethrow_exception(err);
  }
  for (;;) {
    Outcome o;
    if (g_world.comm.is_null() || !collective_check_on()) {
      // Without the check: the plain allreduce (the words and the failure only).
      std::int64_t v[7] = {err ? -static_cast<std::int64_t>(g_learned_from >= 0 ? g_learned_from : me)
                               : kNone};
      std::copy(std::begin(words), std::end(words), v + 1);
      if (!g_world.comm.is_null()) {
        const BlockingWait wait("MPI_Allreduce", spec, g_world.ranks);
        mpi::check(MPI_Allreduce(MPI_IN_PLACE, v, 7, MPI_INT64_T, MPI_MAX, g_world.comm.get()),
                   "MPI_Allreduce");
      }
      Agreement a;
      a.failed = v[0] == kNone ? -1 : static_cast<int>(-v[0]);
      std::copy(v + 1, v + 7, a.words);
      return a;
    }
    {
      const NotListening quiet;
      o = exchange(g_world, spec, fp, err ? (g_learned_from >= 0 ? g_learned_from : me) : -1, false, words,
                   [&] { return spec.name; });
    }
    if (o.same) {
      Agreement a;
      a.failed = o.failed;
      std::copy(o.payload, o.payload + kPayload, a.words);
      return a;
    }
    // Some rank is elsewhere.
    if (o.exiting >= 0) {                    // it ends the job: it will not come here
      if (err) std::rethrow_exception(err);  // this rank's own error is the one to print here
      raise_announced(o.exiting, spec.name);
    }
    if (o.failed < 0 && !err) {  // it called a collective this rank's body did not: a mismatch, ours too
      try {
        raise<CollectiveMismatchError>("collective mismatch: ", mismatch_text(g_world, o.descriptions));
      } catch (...) {
        err = std::current_exception();
      }
      on_failure(err);
    }
    // Its collective raised (the failure mark, or the same mismatch) and it comes here: again.
  }
}

bool agree_at_end_of_program() {
  const bool fault_ok = report_fault_outcome(g_world.comm.is_null() ? -1 : g_world.comm.rank());
  if (g_world.comm.is_null() || !collective_check_on() || g_job_failing || !mpi::is_active()) return fault_ok;
  static const CollectiveSpec spec = world_spec("the end of the program (shard::Runtime's destructor)");
  const NotListening quiet;
  const Outcome o =
      exchange(g_world, spec, fingerprint_of(spec.name), -1, false, nullptr, [&] { return spec.name; });
  if (o.same) return fault_ok;
  std::exception_ptr err;
  try {
    if (o.failed >= 0) raise_announced(o.failed, spec.name);
    raise<CollectiveMismatchError>("collective mismatch: ", mismatch_text(g_world, o.descriptions));
  } catch (...) {
    err = std::current_exception();
  }
  std::fprintf(stderr, "%serror: %s\n", rank_prefix().c_str(), error_message(err, "unknown error").c_str());
  std::fflush(stderr);
  mark_failure_for_exit(err);
  if (!wait_for_every_rank_to_fail(abort_grace_seconds())) MPI_Abort(MPI_COMM_WORLD, 1);
  return false;
}

void mark_failure_for_exit(const std::exception_ptr& err) {
  g_job_failing = true;
  announce_failure(err);
  // A failure met as another rank's mark: that mark is taken. One heard by polling (under
  // SHARD_COLLECTIVE_TIMEOUT) still waits for an exchange: join it.
  // A rank whose mark was met takes part in no more exchanges: nobody would meet this one.
  if (g_world.comm.is_null() || !collective_check_on() || (g_learned_from >= 0 && g_learned_by_exchange) ||
      g_peer_exiting)
    return;
  // Not learned from another rank: join the others' next exchange with the failure mark, in
  // the same form as theirs (MPI matches blocking and nonblocking collectives separately). A
  // rank that never comes to one leaves this rank waiting: end the process after the grace.
  static const CollectiveSpec spec = world_spec("a failed rank's mark (ending the job)");
  const ExitUnlessDoneWithin limit(
      abort_grace_seconds(),
      cat("the other ranks did not reach a collective check within ", abort_grace_seconds(),
          " s (SHARD_ABORT_GRACE) after this failure: aborting the job"));
  try {
    const NotListening quiet;
    (void)exchange(g_world, spec, fingerprint_of(spec.name), g_world.comm.rank(), true, nullptr,
                   [&] { return spec.name; });
  } catch (...) {  // another rank's failure heard meanwhile: this rank's own is already printed
  }
}

double collective_timeout() { return g_timeout; }

void announce_failure(const std::exception_ptr& err) {
  // Once per failure, and not for an error that came from another rank's announcement.
  if (!err || g_watchdog_comm.is_null() || g_failure_sent || g_failures_received > 0) return;
  g_failure_sent = true;
  char kind = 0;
  try {
    std::rethrow_exception(err);
  } catch (const std::exception& e) {
    kind = static_cast<char>(mpi::error_kind(e));
  } catch (...) {
  }
  const std::string text = error_message(err, "an exception that is not a std::exception");
  g_failure_message.assign({kind, static_cast<char>(g_job_failing ? 1 : 0)});
  g_failure_message.insert(g_failure_message.end(), text.begin(), text.end());
  const int me = g_watchdog_comm.rank(), n = g_watchdog_comm.size();
  g_failure_sends.assign(static_cast<std::size_t>(std::max(n - 1, 0)), MPI_REQUEST_NULL);
  for (int p = 0, j = 0; p < n; ++p) {
    if (p == me) continue;
    MPI_Isend(g_failure_message.data(), static_cast<int>(g_failure_message.size()), MPI_CHAR, p, kFailureTag,
              g_watchdog_comm.get(), &g_failure_sends[static_cast<std::size_t>(j++)]);
  }
}

void retire_failure_notices(const mpi::Communicator& world) {
  if (g_watchdog_comm.is_null()) return;
  // How many ranks announced, and whether any left a collective unfinished.
  int v[2] = {g_failure_sent ? 1 : 0, g_poisoned.empty() ? 0 : 1};
  int sum[2] = {0, 0};
  mpi::check(MPI_Allreduce(v, sum, 2, MPI_INT, MPI_SUM, world.get()), "MPI_Allreduce");
  // Receive the announcements not yet received (sent eagerly or waiting for this receive).
  for (int left = sum[0] - v[0] - g_failures_received; left > 0; --left)
    (void)receive_announcement(MPI_ANY_SOURCE, nullptr);
  if (!g_failure_sends.empty())
    mpi::check(
        MPI_Waitall(static_cast<int>(g_failure_sends.size()), g_failure_sends.data(), MPI_STATUSES_IGNORE),
        "MPI_Waitall");
  g_failure_sends.clear();
  g_failure_sent = false;
  g_failures_received = 0;
  g_received.clear();
  g_learned_from = -1;
  g_learned_by_exchange = false;
  if (sum[1] > 0 && g_poisoned.empty())
    g_poisoned = "another rank left a collective unfinished after a failure";
}

void raise_if_poisoned() {
  if (!g_poisoned.empty()) [[unlikely]]
    raise<RuntimeError>("an earlier failure left a collective unfinished (", g_poisoned,
                        "); this job cannot run more collectives: let the error end it (guarded_main)");
}

bool wait_for_every_rank_to_fail(double seconds) {
  return !g_watchdog_comm.is_null() && mpi::barrier_within(g_watchdog_comm.get(), seconds);
}

void open_watchdog_comm(const mpi::Communicator& world) {
  if (g_watchdog_comm.is_null()) g_watchdog_comm = world.dup();
  g_world.comm = world.dup();
  g_world_data.comm = mpi::Communicator::attach(world.get());
  g_world.ranks.resize(static_cast<std::size_t>(world.size()));
  for (int r = 0; r < world.size(); ++r) g_world.ranks[static_cast<std::size_t>(r)] = r;
  g_world_data.ranks = g_world.ranks;
}
void close_watchdog_comm() {
  g_watchdog_comm = mpi::Communicator();
  g_world = DeviceGroup();
  g_world_data = DeviceGroup();
}

void set_collective_guard(bool check, double timeout_seconds) {
  g_timeout = timeout_seconds > 0 ? timeout_seconds : 0;
  g_collective_guard = (check ? 1 : 0) | (g_timeout > 0 ? 2 : 0);
}

void configure_collective_guard_from_env(bool& check, double& timeout_seconds) {
  check = env_flag("SHARD_CHECK_COLLECTIVES").value_or(true);
  timeout_seconds = env_seconds("SHARD_COLLECTIVE_TIMEOUT", 1e6).value_or(-1.0);  // -1: the watcher's default
  configure_fault_hook(check);
}

void shared_window_barrier(const Mesh& mesh, const SharedWindow& w, const std::string& name,
                           const shard::source_location& where) {
  const DeviceGroup& g = mesh.comms().groups(w.axes).front();
  if (g.devices.size() == 1) {  // a group of one device: nothing to wait for
    mesh.comms().sync_windows(w.axes);
    return;
  }
  if (collective_guard_on()) [[unlikely]] {
    CollectiveSpec s;
    s.name = "group_shared barrier '" + name + "'";
    s.axes = w.axes;
    s.axes_text = w.axes_text;
    s.group_size = w.size;
    s.in_shape = s.out_shape = Shape{static_cast<std::int64_t>(w.bytes)};
    s.dtype = "bytes";
    std::vector<int> devices{g.devices[static_cast<std::size_t>(w.index)]};
    guard_collective(mesh, s, devices, where);
    mesh.comms().sync_windows(w.axes);
    mpi_call(
        s, g, "MPI_Barrier", [&] { return MPI_Barrier(g.comm.get()); },
        [&](MPI_Request* r) { return MPI_Ibarrier(g.comm.get(), r); });
    mesh.comms().sync_windows(w.axes);
    return;
  }
  mesh.comms().sync_windows(w.axes);
  mpi::check(MPI_Barrier(g.comm.get()), "MPI_Barrier");
  mesh.comms().sync_windows(w.axes);
}

double abort_grace_seconds() { return g_abort_grace; }
void set_abort_grace_seconds(double seconds) { g_abort_grace = seconds; }

std::string call_site_text(const shard::source_location& where) {
  std::string site = user_call_site(where);
  return site.empty() ? std::string("inside Shard (no call from user code in progress)") : site;
}

}  // namespace shard::detail
