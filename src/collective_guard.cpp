// The collective consistency check (SHARD_CHECK_COLLECTIVES), the collective watchdog
// (SHARD_COLLECTIVE_TIMEOUT) and the barrier of group-shared memory, which runs under both
// like any collective. See shard/detail/collective_guard.hpp.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "shard/detail/collective.hpp"
#include "shard/detail/collective_guard.hpp"
#include "shard/detail/env.hpp"
#include "shard/detail/mesh_comms.hpp"
#include "shard/group_shared.hpp"
#include "shard/error.hpp"
#include "shard/mpi/agree.hpp"
#include "shard/mpi/communicator.hpp"

#include "collective_guard_internal.hpp"

namespace shard::detail {

int g_collective_guard = 0;

namespace {

double g_timeout = 0;
mpi::Communicator g_watchdog_comm;  // a duplicate of the world for the arrival messages
thread_local const std::source_location* t_call_site = nullptr;

using Clock = std::chrono::steady_clock;

std::string ranks_text(const std::vector<int>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

/// The collective as the messages name it: "psum over 'a' of float64(2,3)".
std::string collective_text(const CollectiveSpec& s) {
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

[[noreturn]] void watchdog_abort(const std::string& msg) {
  std::fprintf(stderr, "%serror: collective watchdog: %s\n", rank_prefix().c_str(), msg.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 3);
  std::_Exit(3);
}

constexpr int kArrivalTag = 1;
constexpr int kFailureTag = 2;

// Failure announcements (main thread only): what this rank sent, what it received, and
// whether it left a collective unfinished to raise one (then no collective may run again).
bool g_failure_sent = false;
int g_failures_received = 0;
std::vector<char> g_failure_message;  // the text sent (alive until the sends finish)
std::vector<MPI_Request> g_failure_sends;
std::string g_poisoned;  // non-empty: why no more collectives can run in this job

/// Raises the failure another rank announced (announce_failure), if one has arrived: the same
/// shard::Error subclass, "rank R failed: <its message>", and what this rank was waiting in.
void raise_if_failure_announced(const std::string& waiting_in) {
  if (g_watchdog_comm.is_null()) return;
  int flag = 0;
  MPI_Status st;
  mpi::check(MPI_Iprobe(MPI_ANY_SOURCE, kFailureTag, g_watchdog_comm.get(), &flag, &st), "MPI_Iprobe");
  if (!flag) return;
  int len = 0;
  MPI_Get_count(&st, MPI_CHAR, &len);
  std::vector<char> buf(static_cast<std::size_t>(std::max(len, 1)));
  mpi::check(MPI_Recv(buf.data(), len, MPI_CHAR, st.MPI_SOURCE, kFailureTag, g_watchdog_comm.get(), MPI_STATUS_IGNORE),
             "MPI_Recv");
  ++g_failures_received;
  const int kind = len > 0 ? buf[0] : 0;
  const std::string text(buf.begin() + (len > 0 ? 1 : 0), buf.begin() + std::max(len, 0));
  const std::string msg =
      cat("rank ", st.MPI_SOURCE, " failed: ", text, " (this rank learned of it waiting in ", waiting_in, ")");
  // The collective this rank waited in stays posted: the communicators cannot be used again.
  if (g_poisoned.empty()) g_poisoned = msg;
  mpi::throw_error_of_kind(kind, msg);
}

/// Polls `n` requests until all complete or `timeout` seconds pass (0: no limit); done[i] says
/// which did. Meanwhile a failure announced by another rank is raised here (see above).
bool poll_requests(int n, MPI_Request* r, std::vector<char>& done, double timeout, const CollectiveSpec& s) {
  done.assign(static_cast<std::size_t>(n), 0);
  const auto deadline = timeout > 0 ? Clock::now() + std::chrono::duration<double>(timeout) : Clock::time_point::max();
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
    if (spin % 64 == 63) raise_if_failure_announced(collective_text(s));
    if (spin < 2000) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace

/// Waits for requests of a collective's MPI call under the watchdog; aborts on timeout.
void watchdog_wait(int n, MPI_Request* r, const CollectiveSpec& s, const DeviceGroup& g, const char* routine) {
  std::vector<char> done;
  if (poll_requests(n, r, done, g_timeout, s)) return;
  watchdog_abort(cat(collective_text(s), " (", routine, " on ranks ",
                     ranks_text(g.ranks), ") did not complete within ", g_timeout,
                     " s (SHARD_COLLECTIVE_TIMEOUT); every rank of the mesh had arrived at a collective"));
}

namespace {

/// Watchdog: tells every other rank of the mesh that this one arrived (one small message each,
/// on a duplicate of the world made at start-up, so no communicator has to be created first:
/// creating one would wait for the missing rank) and waits for theirs until the deadline.
void await_arrival(const Mesh& mesh, const CollectiveSpec& s, long seq, const std::string& where) {
  const Topology& topo = mesh.topology();
  std::vector<int> ranks;  // the mesh's ranks, by first device
  for (int d : mesh.device_ids()) {
    const int r = topo.owner(d);
    if (std::find(ranks.begin(), ranks.end(), r) == ranks.end()) ranks.push_back(r);
  }
  if (ranks.size() < 2 || g_watchdog_comm.is_null()) return;
  std::vector<long> token_in(ranks.size(), 0);
  long token_out = seq;
  std::vector<MPI_Request> recvs, sends;
  std::vector<int> peer;
  for (std::size_t j = 0; j < ranks.size(); ++j) {
    if (ranks[j] == topo.process_index) continue;
    peer.push_back(ranks[j]);
    recvs.emplace_back();
    mpi::check(MPI_Irecv(&token_in[j], 1, MPI_LONG, ranks[j], kArrivalTag, g_watchdog_comm.get(), &recvs.back()),
               "MPI_Irecv");
    sends.emplace_back();
    mpi::check(MPI_Isend(&token_out, 1, MPI_LONG, ranks[j], kArrivalTag, g_watchdog_comm.get(), &sends.back()),
               "MPI_Isend");
  }
  std::vector<char> done;
  if (!poll_requests(static_cast<int>(recvs.size()), recvs.data(), done, g_timeout, s)) {
    std::vector<int> missing;
    for (std::size_t i = 0; i < done.size(); ++i)
      if (!done[i]) missing.push_back(peer[i]);
    watchdog_abort(cat(collective_text(s), " (collective #", seq,
                       " on this mesh, at ", where, ") did not complete within ", g_timeout,
                       " s (SHARD_COLLECTIVE_TIMEOUT): rank", missing.size() > 1 ? "s " : " ", ranks_text(missing),
                       " had not arrived; ranks ", ranks_text(ranks), " take part"));
  }
  std::vector<char> sent;
  if (!poll_requests(static_cast<int>(sends.size()), sends.data(), sent, g_timeout, s))
    watchdog_abort(cat(s.name, " over ", s.axes_text, ": the arrival messages were not delivered within ", g_timeout,
                       " s"));
}

std::uint64_t fnv1a(const std::string& text) {
  std::uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

/// Consistency check: one MPI_Allreduce (MAX of h and ~h) tells every rank whether all
/// fingerprints agree; on a mismatch the descriptions are gathered and every rank throws.
void check_fingerprint(const Mesh& mesh, const DeviceGroup& g, const CollectiveSpec& s, long seq,
                       const std::string& where) {
  const std::string desc = cat(collective_text(s), " (collective #", seq, " on this mesh) at ", where);
  const std::uint64_t h = fnv1a(desc);
  std::uint64_t v[2] = {h, ~h};
  // Polled: a rank that failed before this collective never joins; the others hear of it here.
  polled_call(s, g, "MPI_Allreduce (SHARD_CHECK_COLLECTIVES)",
              [&](MPI_Request* r) { return MPI_Iallreduce(MPI_IN_PLACE, v, 2, MPI_UINT64_T, MPI_MAX, g.comm.get(), r); });
  if (v[0] == ~v[1]) return;  // max(h) == min(h): every rank issued this collective
  const int n = static_cast<int>(g.ranks.size());
  int len = static_cast<int>(desc.size());
  std::vector<int> lens(static_cast<std::size_t>(n)), displs(static_cast<std::size_t>(n));
  mpi::check(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, g.comm.get()), "MPI_Allgather");
  int total = 0;
  for (int j = 0; j < n; ++j) {
    displs[j] = total;
    total += lens[j];
  }
  std::string all(static_cast<std::size_t>(total), '\0');
  mpi::check(MPI_Allgatherv(desc.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR,
                            g.comm.get()),
             "MPI_Allgatherv");
  auto desc_of = [&](int j) { return all.substr(static_cast<std::size_t>(displs[j]), static_cast<std::size_t>(lens[j])); };
  int other = 1;
  while (other < n && desc_of(other) == desc_of(0)) ++other;
  if (other == n) other = n - 1;  // a hash collision cannot make equal texts differ; be safe anyway
  raise<CollectiveMismatchError>("collective mismatch on mesh ", mesh.to_string(), ": rank ", g.ranks[0], " called ",
                                 desc_of(0), ", but rank ", g.ranks[other], " called ", desc_of(other),
                                 "; every rank of the mesh must issue the same collectives in the same order "
                                 "(found by SHARD_CHECK_COLLECTIVES)");
}

}  // namespace

/// Before a collective: the watchdog's arrival messages and the consistency check, on the
/// communicator of all the mesh's ranks (ranks that call collectives over different axes use
/// different group communicators, so only this one can see that they disagree).
void guard_collective(const Mesh& mesh, const CollectiveSpec& s, const std::vector<int>& devices,
                      const std::source_location& where) {
  if (devices.empty()) return;  // this rank holds no device of the mesh
  raise_if_poisoned();
  MeshComms& comms = mesh.comms();
  const long seq = comms.next_sequence();
  const std::string site = call_site_text(t_call_site ? *t_call_site : where);
  // The arrival messages come before any communicator creation (which waits for every rank
  // inside MPI): under the watchdog always, under the check until the mesh's guard
  // communicator exists, so a rank that failed before its first collective is still heard of.
  if (collective_watchdog_on() || !comms.guard_group_built()) await_arrival(mesh, s, seq, site);
  if (!collective_check_on()) return;
  const DeviceGroup& g = comms.guard_group();
  if (g.comm.is_null()) return;  // the mesh lives on this rank alone
  check_fingerprint(mesh, g, s, seq, site);
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
  g_failure_message.assign(1, kind);
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
  for (int left = sum[0] - v[0] - g_failures_received; left > 0; --left) {
    MPI_Status st;
    mpi::check(MPI_Probe(MPI_ANY_SOURCE, kFailureTag, g_watchdog_comm.get(), &st), "MPI_Probe");
    int len = 0;
    MPI_Get_count(&st, MPI_CHAR, &len);
    std::vector<char> buf(static_cast<std::size_t>(std::max(len, 1)));
    mpi::check(MPI_Recv(buf.data(), len, MPI_CHAR, st.MPI_SOURCE, kFailureTag, g_watchdog_comm.get(),
                        MPI_STATUS_IGNORE),
               "MPI_Recv");
  }
  if (!g_failure_sends.empty())
    mpi::check(MPI_Waitall(static_cast<int>(g_failure_sends.size()), g_failure_sends.data(), MPI_STATUSES_IGNORE),
               "MPI_Waitall");
  g_failure_sends.clear();
  g_failure_sent = false;
  g_failures_received = 0;
  if (sum[1] > 0 && g_poisoned.empty()) g_poisoned = "another rank left a collective unfinished after a failure";
}

void raise_if_poisoned() {
  if (!g_poisoned.empty()) [[unlikely]]
    raise<RuntimeError>("an earlier failure left a collective unfinished (", g_poisoned,
                        "); this job cannot run more collectives: let the error end it (guarded_main)");
}

bool wait_for_every_rank_to_fail(double seconds, MPI_Comm comm) {
  if (comm == MPI_COMM_NULL && g_watchdog_comm.is_null()) return false;
  MPI_Request all_failed = MPI_REQUEST_NULL;
  if (MPI_Ibarrier(comm == MPI_COMM_NULL ? g_watchdog_comm.get() : comm, &all_failed) != MPI_SUCCESS) return false;
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  int done = 0;
  while (MPI_Test(&all_failed, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return done != 0;
}

void open_watchdog_comm(const mpi::Communicator& world) {
  if (g_watchdog_comm.is_null()) g_watchdog_comm = world.dup();
}
void close_watchdog_comm() { g_watchdog_comm = mpi::Communicator(); }

void set_collective_guard(bool check, double timeout_seconds) {
  g_timeout = timeout_seconds > 0 ? timeout_seconds : 0;
  g_collective_guard = (check ? 1 : 0) | (g_timeout > 0 ? 2 : 0);
}

void configure_collective_guard_from_env(bool& check, double& timeout_seconds) {
#ifdef NDEBUG
  check = env_flag("SHARD_CHECK_COLLECTIVES").value_or(false);
#else
  check = env_flag("SHARD_CHECK_COLLECTIVES").value_or(true);
#endif
  timeout_seconds = env_seconds("SHARD_COLLECTIVE_TIMEOUT", 1e6).value_or(0.0);  // 0: no watchdog
}

void shared_window_barrier(const Mesh& mesh, const SharedWindow& w, const std::string& name,
                           const std::source_location& where) {
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

namespace {
double g_abort_grace = 5.0;
}  // namespace

double abort_grace_seconds() { return g_abort_grace; }
void set_abort_grace_seconds(double seconds) { g_abort_grace = seconds; }

std::string call_site_text(const std::source_location& where) {
  return cat(where.file_name(), ":", where.line(), " (", where.function_name(), ")");
}

CallSiteScope::CallSiteScope(const std::source_location& where) : previous_(t_call_site) { t_call_site = &where; }
CallSiteScope::~CallSiteScope() { t_call_site = previous_; }
const std::source_location* scoped_call_site() { return t_call_site; }

}  // namespace shard::detail
