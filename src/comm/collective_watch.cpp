// The watcher thread: with no SHARD_COLLECTIVE_TIMEOUT set, it ends the job when one blocking
// MPI call of the comm layer has waited too long (collective_guard.hpp). The main thread
// records each blocking call (BlockingWait: two uncontended mutex operations); the watcher
// wakes up every second (or a quarter of the limit), and when the same call is still waiting
// after the limit it prints "[rank r] error: collective watchdog: ..." and ends the process.
// It never calls MPI (the thread level is MPI_THREAD_FUNNELED and the main thread is inside
// MPI): mpirun sees the non-zero exit and ends the other ranks.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "shard/comm/detail/collective.hpp"
#include "shard/comm/detail/collective_guard.hpp"
#include "shard/comm/detail/comm_verbs.hpp"
#include "shard/error.hpp"

namespace shard::detail {

namespace {

using Clock = std::chrono::steady_clock;

struct Watch {
  std::mutex mutex;
  std::condition_variable wake;
  std::thread thread;
  bool stop = false;
  double seconds = 0;
  // The blocking call in progress (guarded by mutex).
  unsigned long generation = 0;  // one per call
  bool waiting = false;
  const char* routine = nullptr;
  const CollectiveSpec* spec = nullptr;  // one of these two names it
  const CommOp* op = nullptr;
  const std::vector<int>* ranks = nullptr;
};

Watch g_watch;
std::atomic<bool> g_watch_on{false};

std::string ranks_list(const std::vector<int>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

void watch_loop() {
  std::unique_lock lock(g_watch.mutex);
  const auto tick = std::chrono::duration<double>(std::min(1.0, g_watch.seconds / 4));
  unsigned long seen = 0;
  Clock::time_point since{};
  bool tracking = false;
  while (!g_watch.stop) {
    g_watch.wake.wait_for(lock, tick);
    if (g_watch.stop) break;
    if (!g_watch.waiting) {
      tracking = false;
      continue;
    }
    if (!tracking || g_watch.generation != seen) {
      tracking = true;
      seen = g_watch.generation;
      since = Clock::now();
      continue;
    }
    const double waited = std::chrono::duration<double>(Clock::now() - since).count();
    if (waited + std::chrono::duration<double>(tick).count() < g_watch.seconds) continue;
    // The same call has waited at least the limit (measured from the first tick that saw it).
    const std::string what = g_watch.spec ? collective_text(*g_watch.spec)
                             : g_watch.op->what.empty() ? g_watch.op->kind
                                                        : g_watch.op->kind + " of " + g_watch.op->what;
    const std::string msg = cat(
        what, " (", g_watch.routine, " on ranks ", ranks_list(*g_watch.ranks),
        ") has not completed after ", g_watch.seconds,
        " s (SHARD_COLLECTIVE_TIMEOUT unset: the default limit): a rank of these did not reach it (it skipped it, "
        "waits in another collective, or is still computing). Set SHARD_COLLECTIVE_TIMEOUT=<seconds> to change the "
        "limit and have every collective name the ranks that did not arrive (0: no limit)");
    std::fflush(stdout);  // the program's own output so far (the main thread is inside MPI)
    std::fprintf(stderr, "%serror: collective watchdog: %s\n", rank_prefix().c_str(), msg.c_str());
    std::fflush(stderr);
    // Let the other ranks' watchers print their side before mpirun ends them.
    std::this_thread::sleep_for(std::chrono::seconds(2));
    std::_Exit(3);
  }
}

}  // namespace

void start_collective_watch(double seconds) {
  stop_collective_watch();
  if (seconds <= 0) return;
  {
    std::lock_guard lock(g_watch.mutex);
    g_watch.stop = false;
    g_watch.seconds = seconds;
    g_watch.waiting = false;
  }
  g_watch.thread = std::thread(watch_loop);
  g_watch_on.store(true, std::memory_order_release);
}

void stop_collective_watch() {
  if (!g_watch.thread.joinable()) return;
  g_watch_on.store(false, std::memory_order_release);
  {
    std::lock_guard lock(g_watch.mutex);
    g_watch.stop = true;
  }
  g_watch.wake.notify_all();
  g_watch.thread.join();
  g_watch.seconds = 0;
}

double collective_watch_seconds() { return g_watch_on.load(std::memory_order_acquire) ? g_watch.seconds : 0.0; }

namespace {
/// Records the blocking call in progress (named by `spec` or `op`) for the watcher.
void begin_wait(const char* routine, const CollectiveSpec* spec, const CommOp* op, const std::vector<int>& ranks) {
  std::lock_guard lock(g_watch.mutex);
  ++g_watch.generation;
  g_watch.waiting = true;
  g_watch.routine = routine;
  g_watch.spec = spec;
  g_watch.op = op;
  g_watch.ranks = &ranks;
}
}  // namespace

BlockingWait::BlockingWait(const char* routine, const CollectiveSpec& s, const std::vector<int>& ranks)
    : on_(g_watch_on.load(std::memory_order_relaxed)) {
  if (on_) begin_wait(routine, &s, nullptr, ranks);
}

BlockingWait::BlockingWait(const char* routine, const CommOp& op, const std::vector<int>& ranks)
    : on_(g_watch_on.load(std::memory_order_relaxed)) {
  if (on_) begin_wait(routine, nullptr, &op, ranks);
}

BlockingWait::~BlockingWait() {
  if (!on_) return;
  std::lock_guard lock(g_watch.mutex);
  g_watch.waiting = false;
}

struct ExitUnlessDoneWithin::State {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
};

ExitUnlessDoneWithin::ExitUnlessDoneWithin(double seconds, std::string message)
    : state_(std::make_shared<State>()) {
  std::string line = rank_prefix() + "error: " + message + "\n";
  thread_ = std::thread([state = state_, seconds, line = std::move(line)] {
    std::unique_lock lock(state->mutex);
    if (state->cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return state->done; })) return;
    std::fputs(line.c_str(), stderr);
    std::fflush(stderr);
    std::_Exit(1);
  });
}

ExitUnlessDoneWithin::~ExitUnlessDoneWithin() {
  {
    std::lock_guard lock(state_->mutex);
    state_->done = true;
  }
  state_->cv.notify_all();
  thread_.join();
}

}  // namespace shard::detail
