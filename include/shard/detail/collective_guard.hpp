#pragma once
/// \file Collective consistency checking and the collective watchdog (comm layer internals).
///
/// SHARD_CHECK_COLLECTIVES=1 (the default in builds without NDEBUG): before each collective,
/// the ranks of the mesh compare a fingerprint of it (kind, axes, dtype, shape, a per-mesh
/// sequence number, call site) with one small MPI_Allreduce on the mesh's communicator; a
/// mismatch raises CollectiveMismatchError on every rank naming both call sites, instead of
/// a hang or a wrong result.
///
/// SHARD_COLLECTIVE_TIMEOUT=seconds: each rank first tells the other ranks of the mesh that it
/// has arrived (a small message to each), and every MPI call of the collective runs in its
/// nonblocking form, polled with MPI_Test until that deadline; a collective that does not
/// complete in time aborts the job with a message naming the collective, its axes and the
/// ranks that had not arrived.
///
/// Under either, a rank that fails (guarded_main, or a shard_map body) announces its error to
/// the others on a duplicate of the world, and a rank waiting in a collective raises it: the
/// same shard::Error subclass with "rank R failed: <message> (this rank learned of it waiting
/// in <collective>)", so the error and its sizes reach every rank, not only the failing one.
///
/// Both are decided once when the Runtime starts (every rank takes the most checking any
/// rank asked for) and cost one branch per collective when off.

#include <exception>
#include <source_location>
#include <string>

#include "shard/error.hpp"
#include "shard/mpi/communicator.hpp"

namespace shard {

/// Ranks issued different collectives (found by SHARD_CHECK_COLLECTIVES); raised on every rank.
class CollectiveMismatchError : public ValueError {
  using ValueError::ValueError;
};

namespace detail {

/// Bit 1: consistency check on; bit 2: watchdog on. 0: nothing to do (the fast path).
extern int g_collective_guard;
inline bool collective_guard_on() { return g_collective_guard != 0; }
inline bool collective_check_on() { return (g_collective_guard & 1) != 0; }
inline bool collective_watchdog_on() { return (g_collective_guard & 2) != 0; }

/// Seconds a collective may take under the watchdog (0: no watchdog).
double collective_timeout();
/// Sets both settings on this rank (every rank must set the same; tests and Runtime use it).
void set_collective_guard(bool check, double timeout_seconds);
/// The watchdog's arrival messages and the failure announcements travel on a duplicate of
/// `world` (collective over the world; the Runtime opens it at start and closes it before
/// MPI_Finalize).
void open_watchdog_comm(const mpi::Communicator& world);
void close_watchdog_comm();
/// Reads SHARD_CHECK_COLLECTIVES and SHARD_COLLECTIVE_TIMEOUT (called by the Runtime).
void configure_collective_guard_from_env(bool& check, double& timeout_seconds);

/// Tells every other rank of the world about this rank's failure (once per failure; no-op if
/// the failure came from another rank's announcement). Nonblocking; main thread only.
void announce_failure(const std::exception_ptr& err);
/// Collective over `world`, after every rank agreed on a failure (shard_map's end): receives
/// the announcements not yet received, so none is mistaken later for a new failure. If some
/// rank left a collective unfinished to raise an announced error, every later guarded
/// collective raises RuntimeError instead of mixing with it (see raise_if_poisoned).
void retire_failure_notices(const mpi::Communicator& world);
/// RuntimeError if an earlier failure left a collective unfinished.
void raise_if_poisoned();
/// After a failure: joins the other failed ranks (a nonblocking barrier on `comm`, by default
/// the world's duplicate) and says whether every rank got there within `seconds`.
bool wait_for_every_rank_to_fail(double seconds, MPI_Comm comm = MPI_COMM_NULL);

/// Seconds a rank whose shard_map body failed waits for the other ranks to reach the
/// agreement at the end of shard_map before it aborts the job, and a rank whose program failed
/// waits for the others to fail too (SHARD_ABORT_GRACE, default 5; set by the Runtime).
double abort_grace_seconds();
void set_abort_grace_seconds(double seconds);

/// "file:line (function)" of a call site.
std::string call_site_text(const std::source_location& where);

/// While alive, collectives issued by this thread report `where` as their call site (for
/// array-level collectives that run through other library code).
class CallSiteScope {
 public:
  explicit CallSiteScope(const std::source_location& where);
  ~CallSiteScope();
  CallSiteScope(const CallSiteScope&) = delete;
  CallSiteScope& operator=(const CallSiteScope&) = delete;

 private:
  const std::source_location* previous_;
};
/// The call site set by the innermost CallSiteScope of this thread, or null.
const std::source_location* scoped_call_site();

}  // namespace detail
}  // namespace shard
