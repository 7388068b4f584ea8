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
#include "shard/detail/mesh_comms.hpp"
#include "shard/group_shared.hpp"
#include "shard/error.hpp"
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

/// Polls `n` requests until all complete or `timeout` seconds pass; done[i] says which did.
bool poll_requests(int n, MPI_Request* r, std::vector<char>& done, double timeout) {
  done.assign(static_cast<std::size_t>(n), 0);
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout);
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
    if (spin < 2000) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace

/// Waits for requests of a collective's MPI call under the watchdog; aborts on timeout.
void watchdog_wait(int n, MPI_Request* r, const CollectiveSpec& s, const DeviceGroup& g, const char* routine) {
  std::vector<char> done;
  if (poll_requests(n, r, done, g_timeout)) return;
  watchdog_abort(cat(collective_text(s), " (", routine, " on ranks ",
                     ranks_text(g.ranks), ") did not complete within ", g_timeout,
                     " s (SHARD_COLLECTIVE_TIMEOUT); every rank of the mesh had arrived at a collective"));
}

namespace {

constexpr int kArrivalTag = 1;

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
  if (!poll_requests(static_cast<int>(recvs.size()), recvs.data(), done, g_timeout)) {
    std::vector<int> missing;
    for (std::size_t i = 0; i < done.size(); ++i)
      if (!done[i]) missing.push_back(peer[i]);
    watchdog_abort(cat(collective_text(s), " (collective #", seq,
                       " on this mesh, at ", where, ") did not complete within ", g_timeout,
                       " s (SHARD_COLLECTIVE_TIMEOUT): rank", missing.size() > 1 ? "s " : " ", ranks_text(missing),
                       " had not arrived; ranks ", ranks_text(ranks), " take part"));
  }
  std::vector<char> sent;
  if (!poll_requests(static_cast<int>(sends.size()), sends.data(), sent, g_timeout))
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
  mpi_call(s, g, "MPI_Allreduce (SHARD_CHECK_COLLECTIVES)",
           [&] { return MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_UINT64_T, MPI_MAX, g.comm.get()); },
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
  MeshComms& comms = mesh.comms();
  const long seq = comms.next_sequence();
  const std::string site = call_site_text(t_call_site ? *t_call_site : where);
  if (collective_watchdog_on()) await_arrival(mesh, s, seq, site);  // before any communicator creation
  if (!collective_check_on()) return;
  const DeviceGroup& g = comms.guard_group();
  if (g.comm.is_null()) return;  // the mesh lives on this rank alone
  check_fingerprint(mesh, g, s, seq, site);
}


double collective_timeout() { return g_timeout; }

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
  check = false;
#else
  check = true;
#endif
  if (const char* e = std::getenv("SHARD_CHECK_COLLECTIVES"); e && *e) {
    const std::string v = e;
    if (v == "1" || v == "on" || v == "true") check = true;
    else if (v == "0" || v == "off" || v == "false") check = false;
    else raise<RuntimeError>("SHARD_CHECK_COLLECTIVES must be 0 or 1, got '", v, "'");
  }
  timeout_seconds = 0;
  if (const char* e = std::getenv("SHARD_COLLECTIVE_TIMEOUT"); e && *e) {
    char* end = nullptr;
    const double t = std::strtod(e, &end);
    if (end == e || *end != '\0' || !(t >= 0) || t > 1e6)
      raise<RuntimeError>("SHARD_COLLECTIVE_TIMEOUT must be a number of seconds (0 turns the watchdog off), got '",
                          e, "'");
    timeout_seconds = t;
  }
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

double abort_grace_seconds() {
  if (const char* e = std::getenv("SHARD_ABORT_GRACE"); e && *e) {
    char* end = nullptr;
    const double t = std::strtod(e, &end);
    if (end != e && *end == '\0' && t >= 0) return t;
  }
  return 5.0;
}

std::string call_site_text(const std::source_location& where) {
  return cat(where.file_name(), ":", where.line(), " (", where.function_name(), ")");
}

CallSiteScope::CallSiteScope(const std::source_location& where) : previous_(t_call_site) { t_call_site = &where; }
CallSiteScope::~CallSiteScope() { t_call_site = previous_; }
const std::source_location* scoped_call_site() { return t_call_site; }

}  // namespace shard::detail
