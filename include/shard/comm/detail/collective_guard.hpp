#pragma once
/// \file Collective consistency checking and the collective watchdog (comm layer internals).
///
/// Safe by default (no setting needed): a collective issued differently on two ranks never
/// returns wrong data and never waits forever.
///
/// SHARD_CHECK_COLLECTIVES (default 1; 0 turns it off): before each collective, the ranks of
/// the mesh compare a 64-bit fingerprint of it (kind, axes, dtype, shapes, dims, permutation;
/// not the call site, named in messages only) in one small blocking MPI_Allreduce, on a
/// duplicate of the world kept for these exchanges when the mesh spans every rank (else on a
/// communicator of the mesh's ranks). The ends of
/// shard_map and of the program take part in the same exchange, so a rank that skipped a
/// collective, or whose shard_map body returned early, meets the others' collective there. A
/// mismatch raises CollectiveMismatchError on every rank naming each side's collective and
/// call site. About 1 us per collective.
///
/// SHARD_COLLECTIVE_TIMEOUT: unset, a watcher thread ends the job when one blocking MPI call
/// of the comm layer has waited 600 s (collective_watch.cpp; no cost per call but two
/// uncontended mutex operations). Set to seconds > 0, each rank first tells the other ranks of
/// the mesh that it has arrived (a small message to each) and every MPI call of the collective
/// runs in its nonblocking form, polled with MPI_Test until that deadline: a collective that
/// does not complete in time aborts the job naming the ranks that had not arrived. 0: neither.
///
/// A rank that fails (guarded_main, or a shard_map body) announces its error to the others on
/// a duplicate of the world and joins the next exchange with a failure mark, so a rank waiting
/// in a collective's check (or polling under the timeout) raises it: the same shard::Error
/// subclass with "rank R failed: <message> (this rank learned of it waiting in <collective>)".
///
/// Both are decided once when the Runtime starts (every rank takes the most checking any
/// rank asked for) and cost one branch per collective when off.

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <source_location>
#include <string>
#include <thread>
#include <vector>

#include "shard/error.hpp"
#include "shard/mpi/communicator.hpp"

namespace shard {
namespace detail {

/// Bit 1: consistency check on; bit 2: polled watchdog on (SHARD_COLLECTIVE_TIMEOUT set).
/// 0: nothing to do (the fast path).
extern int g_collective_guard;
inline bool collective_guard_on() { return g_collective_guard != 0; }
inline bool collective_check_on() { return (g_collective_guard & 1) != 0; }
inline bool collective_watchdog_on() { return (g_collective_guard & 2) != 0; }

/// Seconds a collective may take under the polled watchdog (0: not polled).
double collective_timeout();
/// Sets both settings on this rank (every rank must set the same; tests and Runtime use it):
/// timeout_seconds > 0 polls every collective with that deadline; otherwise none (the watcher
/// thread is separate: start_collective_watch).
void set_collective_guard(bool check, double timeout_seconds);
/// The watcher's default limit when SHARD_COLLECTIVE_TIMEOUT is unset.
inline constexpr double kDefaultCollectiveTimeout = 600.0;
/// The watchdog's arrival messages and the failure announcements travel on a duplicate of
/// `world` (collective over the world; the Runtime opens it at start and closes it before
/// MPI_Finalize).
void open_watchdog_comm(const mpi::Communicator& world);
void close_watchdog_comm();
/// Reads SHARD_CHECK_COLLECTIVES and SHARD_COLLECTIVE_TIMEOUT (comm's Runtime hooks):
/// timeout_seconds is -1 when SHARD_COLLECTIVE_TIMEOUT is unset (the watcher's default).
void configure_collective_guard_from_env(bool& check, double& timeout_seconds);

/// The watcher thread (collective_watch.cpp): ends the job with a message naming the
/// collective, its routine and its ranks when one blocking MPI call of the comm layer has
/// waited `seconds` (> 0). The Runtime starts it when SHARD_COLLECTIVE_TIMEOUT is unset.
/// The thread never calls MPI: it prints and ends the process (mpirun then ends the job).
void start_collective_watch(double seconds);
void stop_collective_watch();
/// The watcher's limit (0: not running).
double collective_watch_seconds();

/// Armed while a rank that failed waits in MPI for the other ranks (which may wait forever in
/// a collective this rank will not join): unless destroyed within `seconds`, a helper thread
/// prints "[rank r] error: <message>" and ends the process (it never calls MPI); mpirun then
/// ends the whole job with a non-zero code.
class ExitUnlessDoneWithin {
 public:
  ExitUnlessDoneWithin(double seconds, std::string message);
  ~ExitUnlessDoneWithin();
  ExitUnlessDoneWithin(const ExitUnlessDoneWithin&) = delete;
  ExitUnlessDoneWithin& operator=(const ExitUnlessDoneWithin&) = delete;

 private:
  struct State;
  std::shared_ptr<State> state_;
  std::thread thread_;
};

struct CollectiveSpec;
struct CommOp;
/// While alive, this thread waits in a blocking MPI call of the comm layer: the watcher
/// reports `routine` for `s` (or `op`) on world `ranks` if it lasts too long. They must outlive
/// it. Nothing is formatted unless the watcher fires.
class BlockingWait {
 public:
  BlockingWait(const char* routine, const CollectiveSpec& s, const std::vector<int>& ranks);
  BlockingWait(const char* routine, const CommOp& op, const std::vector<int>& ranks);
  ~BlockingWait();
  BlockingWait(const BlockingWait&) = delete;
  BlockingWait& operator=(const BlockingWait&) = delete;

 private:
  bool on_;
};

/// The collective as messages name it: "psum over 'a' of float64(2,3)" (only the name when
/// the spec has no dtype, e.g. "the end of shard_map").
std::string collective_text(const CollectiveSpec& s);

/// shard_map's agreement after the bodies, collective over the world (every rank calls it,
/// also ranks without a device of the mesh). `words`: this rank's six values, reduced with
/// MPI_MAX. Returns once every rank is at the agreement: the lowest failing rank (-1: none)
/// and the reduced words. Meanwhile a rank that is elsewhere is met here: one that called a
/// collective (it skipped one, or its body returned early) is a mismatch, which becomes this
/// rank's failure (`err`, passed to `on_failure` to announce it) before the agreement repeats;
/// a rank that is ending the job with an error makes this rank raise that error.
struct Agreement {
  int failed = -1;
  std::int64_t words[6] = {};
};
Agreement agree_at_end_of_shard_map(std::exception_ptr& err, const std::int64_t (&words)[6],
                                    const std::function<void(const std::exception_ptr&)>& on_failure);
/// The program's end (Runtime's destructor): collective over the world when the check is on.
/// Returns false (after printing this rank's error line and waiting for the others to fail)
/// when some rank was still in a collective or had failed: the process must then exit 1.
bool agree_at_end_of_program();
/// This rank ends the job with `err` (guarded_main): announces it to the other ranks (as
/// ending the job) and, unless it learned it from another rank, joins their next exchange
/// with a failure mark, so ranks waiting in a collective's check raise it (if none comes
/// within SHARD_ABORT_GRACE, the process ends: see ExitUnlessDoneWithin).
void mark_failure_for_exit(const std::exception_ptr& err);

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
/// After a failure: joins the other failed ranks (mpi::barrier_within on the world's duplicate)
/// and says whether every rank got there within `seconds`.
bool wait_for_every_rank_to_fail(double seconds);

/// Seconds a rank whose shard_map body failed waits for the other ranks to reach the
/// agreement at the end of shard_map before it aborts the job, and a rank whose program failed
/// waits for the others to fail too (SHARD_ABORT_GRACE, default 5; set by the Runtime).
double abort_grace_seconds();
void set_abort_grace_seconds(double seconds);

/// Where a collective was called, for the consistency check's messages: the user's file:line
/// (detail::user_call_site: `where` when it is in user code, else the innermost public call in
/// progress), or "inside Shard" when no user call is in progress. Never a path of Shard's build.
std::string call_site_text(const shard::source_location& where);

}  // namespace detail
}  // namespace shard
