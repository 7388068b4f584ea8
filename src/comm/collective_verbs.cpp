// The comm layer's verbs for transfers outside the named-axis collectives (comm_verbs.hpp):
// each checks its counts, runs its MPI call under the watchdog (or the watcher thread) and
// records CommStats. The consistency check runs once per transfer (check_transfer).

#include "shard/comm/detail/comm_verbs.hpp"

#include <cstdint>
#include <utility>

#include "shard/comm/comm_stats.hpp"
#include "shard/comm/detail/collective_guard.hpp"
#include "shard/error.hpp"
#include "shard/mpi/communicator.hpp"

#include "comm/collective_guard_internal.hpp"

namespace shard::detail {

namespace {

/// The spec naming a transfer in the check's and the watchdog's messages.
CollectiveSpec spec_of(const CommOp& t) {
  CollectiveSpec s;
  s.name = t.what.empty() ? t.kind : t.kind + " of " + t.what;
  s.axes_text = "every rank";
  return s;  // no dtype: collective_text gives the name alone
}

/// Runs one blocking MPI call of a verb (polled under SHARD_COLLECTIVE_TIMEOUT).
template <typename Blocking, typename Start>
void run(const DeviceGroup& g, const CommOp& t, const char* routine, Blocking&& blocking, Start&& start) {
  if (!collective_watchdog_on()) [[likely]] {
    const BlockingWait wait(routine, t, g.ranks);
    mpi::check(blocking(), routine);
    return;
  }
  polled_call(spec_of(t), g, routine, start);
}

}  // namespace

const DeviceGroup& world_group() { return world_device_group(); }

void check_transfer(const CommOp& t) {
  raise_if_poisoned();
  if (!collective_guard_on()) return;
  check_world_transfer(spec_of(t), t.where);
}

void check_mesh_transfer(const Mesh& mesh, const CommOp& t) {
  raise_if_poisoned();
  if (!collective_guard_on()) return;
  guard_collective(mesh, spec_of(t), mesh.local_device_ids(), t.where);
}

int transfer_count(std::int64_t n, const CommOp& t) {
  return mpi::int_count(n, "elements in one MPI call", t.kind);
}

template <typename T>
void alltoallv(const DeviceGroup& g, const CommOp& t, const T* send, const std::vector<int>& sc,
               const std::vector<int>& sd, T* recv, const std::vector<int>& rc, const std::vector<int>& rd,
               std::int64_t bytes_sent) {
  const auto n = g.ranks.size();
  if (sc.size() != n || sd.size() != n || rc.size() != n || rd.size() != n)
    raise<ValueError>(t.kind, ": MPI_Alltoallv needs one count and displacement per rank (", n, ")");
  run(
      g, t, "MPI_Alltoallv",
      [&] {
        return MPI_Alltoallv(send, sc.data(), sd.data(), mpi::datatype<T>(), recv, rc.data(), rd.data(),
                             mpi::datatype<T>(), g.comm.get());
      },
      [&](MPI_Request* r) {
        return MPI_Ialltoallv(send, sc.data(), sd.data(), mpi::datatype<T>(), recv, rc.data(), rd.data(),
                              mpi::datatype<T>(), g.comm.get(), r);
      });
  if (bytes_sent > 0) comm_stats().record(t.kind, "", bytes_sent);
}

template <typename T>
void allgatherv(const DeviceGroup& g, const CommOp& t, const T* send, int count, T* recv,
                const std::vector<int>& counts, const std::vector<int>& displs) {
  if (counts.size() != g.ranks.size() || displs.size() != g.ranks.size())
    raise<ValueError>(t.kind, ": MPI_Allgatherv needs one count and displacement per rank (", g.ranks.size(), ")");
  run(
      g, t, "MPI_Allgatherv",
      [&] {
        return MPI_Allgatherv(send, count, mpi::datatype<T>(), recv, counts.data(), displs.data(), mpi::datatype<T>(),
                              g.comm.get());
      },
      [&](MPI_Request* r) {
        return MPI_Iallgatherv(send, count, mpi::datatype<T>(), recv, counts.data(), displs.data(),
                               mpi::datatype<T>(), g.comm.get(), r);
      });
  comm_stats().record(t.kind, "", static_cast<std::int64_t>(count) * static_cast<std::int64_t>(sizeof(T)));
}

template <typename T>
void gatherv(const DeviceGroup& g, const CommOp& t, const T* send, int count, T* recv,
             const std::vector<int>& counts, const std::vector<int>& displs, int root) {
  if (root < 0 || root >= static_cast<int>(g.ranks.size()))
    raise<ValueError>(t.kind, ": root ", root, " is not a rank of the group (", g.ranks.size(), " ranks)");
  const bool is_root = g.comm.rank() == root;
  if (is_root && (counts.size() != g.ranks.size() || displs.size() != g.ranks.size()))
    raise<ValueError>(t.kind, ": MPI_Gatherv needs one count and displacement per rank (", g.ranks.size(), ")");
  run(
      g, t, "MPI_Gatherv",
      [&] {
        return MPI_Gatherv(send, count, mpi::datatype<T>(), recv, is_root ? counts.data() : nullptr,
                           is_root ? displs.data() : nullptr, mpi::datatype<T>(), root, g.comm.get());
      },
      [&](MPI_Request* r) {
        return MPI_Igatherv(send, count, mpi::datatype<T>(), recv, is_root ? counts.data() : nullptr,
                            is_root ? displs.data() : nullptr, mpi::datatype<T>(), root, g.comm.get(), r);
      });
  comm_stats().record(t.kind, "", static_cast<std::int64_t>(count) * static_cast<std::int64_t>(sizeof(T)));
}

template <typename T>
void broadcast(const DeviceGroup& g, const CommOp& t, T* buf, int count, int root) {
  run(
      g, t, "MPI_Bcast", [&] { return MPI_Bcast(buf, count, mpi::datatype<T>(), root, g.comm.get()); },
      [&](MPI_Request* r) { return MPI_Ibcast(buf, count, mpi::datatype<T>(), root, g.comm.get(), r); });
  if (g.comm.rank() == root)
    comm_stats().record(t.kind, "", static_cast<std::int64_t>(count) * static_cast<std::int64_t>(sizeof(T)));
}

namespace {
void allreduce_op(const DeviceGroup& g, const CommOp& t, std::int64_t* v, int n, MPI_Op op) {
  run(
      g, t, "MPI_Allreduce", [&] { return MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_INT64_T, op, g.comm.get()); },
      [&](MPI_Request* r) { return MPI_Iallreduce(MPI_IN_PLACE, v, n, MPI_INT64_T, op, g.comm.get(), r); });
}
}  // namespace

void allreduce_max(const DeviceGroup& g, const CommOp& t, std::int64_t* v, int n) { allreduce_op(g, t, v, n, MPI_MAX); }
void allreduce_min(const DeviceGroup& g, const CommOp& t, std::int64_t* v, int n) { allreduce_op(g, t, v, n, MPI_MIN); }

// ---- Nonblocking verbs.

PendingTransfer::PendingTransfer(const DeviceGroup& g, const CommOp& t) : op_(&t), group_(&g) {}

namespace {
/// Completes requests MPI still owns (their buffers are about to go): after an error this rank
/// may be the only one left, so it waits at most SHARD_ABORT_GRACE s, then ends the process.
void drain(std::vector<MPI_Request>& requests, const CommOp* op) {
  if (requests.empty()) return;
  const ExitUnlessDoneWithin limit(
      abort_grace_seconds(),
      cat("a transfer of ", op ? op->kind : std::string("the comm layer"), " left in flight (after an error) did not ",
          "complete within ", abort_grace_seconds(), " s (SHARD_ABORT_GRACE): aborting the job"));
  MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
  requests.clear();
}
}  // namespace

PendingTransfer& PendingTransfer::operator=(PendingTransfer&& other) noexcept {
  if (this != &other) {
    drain(requests_, op_);  // complete what this one still holds (MPI owns its buffers)
    requests_ = std::move(other.requests_);
    op_ = other.op_;
    group_ = other.group_;
    other.requests_.clear();
  }
  return *this;
}

PendingTransfer::~PendingTransfer() {
  // Buffers must outlive their requests: never leave one posted. Reached with requests only
  // when an error unwinds past the transfer (wait() and test() clear them).
  drain(requests_, op_);
}

void PendingTransfer::merge(PendingTransfer&& other) {
  if (other.requests_.empty()) return;
  if (!op_) {
    op_ = other.op_;
    group_ = other.group_;
  }
  requests_.insert(requests_.end(), other.requests_.begin(), other.requests_.end());
  other.requests_.clear();
}

bool PendingTransfer::test() {
  if (requests_.empty()) return true;
  int done = 0;
  const double t0 = MPI_Wtime();
  mpi::check(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done, MPI_STATUSES_IGNORE),
             "MPI_Testall");
  comm_stats().record_wait(op_->kind, MPI_Wtime() - t0);
  if (done) requests_.clear();
  return done != 0;
}

void PendingTransfer::wait() {
  if (requests_.empty()) return;
  const double t0 = MPI_Wtime();
  if (collective_watchdog_on()) {
    const CollectiveSpec s = spec_of(*op_);
    watchdog_wait(static_cast<int>(requests_.size()), requests_.data(), s, *group_, "MPI_Waitall");
  } else {
    const BlockingWait wait("MPI_Waitall", *op_, group_->ranks);
    mpi::check(MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE),
               "MPI_Waitall");
  }
  comm_stats().record_wait(op_->kind, MPI_Wtime() - t0);
  requests_.clear();
}

template <typename T>
PendingTransfer isend(const DeviceGroup& g, const CommOp& t, const T* buf, int count, int to, int tag) {
  PendingTransfer p(g, t);
  p.requests_.emplace_back();
  mpi::check(MPI_Isend(buf, count, mpi::datatype<T>(), to, tag, g.comm.get(), &p.requests_.back()), "MPI_Isend");
  comm_stats().record(t.kind, "", static_cast<std::int64_t>(count) * static_cast<std::int64_t>(sizeof(T)));
  return p;
}

template <typename T>
PendingTransfer irecv(const DeviceGroup& g, const CommOp& t, T* buf, int count, int from, int tag) {
  PendingTransfer p(g, t);
  p.requests_.emplace_back();
  mpi::check(MPI_Irecv(buf, count, mpi::datatype<T>(), from, tag, g.comm.get(), &p.requests_.back()), "MPI_Irecv");
  return p;
}

template <typename T>
PendingTransfer ibroadcast(const DeviceGroup& g, const CommOp& t, T* buf, int count, int root) {
  PendingTransfer p(g, t);
  p.requests_.emplace_back();
  mpi::check(MPI_Ibcast(buf, count, mpi::datatype<T>(), root, g.comm.get(), &p.requests_.back()), "MPI_Ibcast");
  if (g.comm.rank() == root)
    comm_stats().record(t.kind, "", static_cast<std::int64_t>(count) * static_cast<std::int64_t>(sizeof(T)));
  return p;
}

template <typename T>
PendingTransfer iallreduce_sum(const DeviceGroup& g, const CommOp& t, const std::string& axes, T* buf, int count) {
  PendingTransfer p(g, t);
  p.requests_.emplace_back();
  mpi::check(MPI_Iallreduce(MPI_IN_PLACE, buf, count, mpi::datatype<T>(), MPI_SUM, g.comm.get(), &p.requests_.back()),
             "MPI_Iallreduce");
  comm_stats().record(t.kind, axes, static_cast<std::int64_t>(count) * static_cast<std::int64_t>(sizeof(T)));
  return p;
}
template <typename T>
PendingTransfer ialltoallv(const DeviceGroup& g, const CommOp& t, const std::string& axes, const T* send,
                           const std::vector<int>& send_counts, const std::vector<int>& send_displs, T* recv,
                           const std::vector<int>& recv_counts, const std::vector<int>& recv_displs) {
  PendingTransfer p(g, t);
  p.requests_.emplace_back();
  mpi::check(MPI_Ialltoallv(send, send_counts.data(), send_displs.data(), mpi::datatype<T>(), recv, recv_counts.data(),
                            recv_displs.data(), mpi::datatype<T>(), g.comm.get(), &p.requests_.back()),
             "MPI_Ialltoallv");
  std::int64_t out = 0;
  for (std::size_t r = 0; r < send_counts.size(); ++r)
    if (static_cast<int>(r) != g.comm.rank()) out += send_counts[r];
  comm_stats().record(t.kind, axes, out * static_cast<std::int64_t>(sizeof(T)));
  return p;
}

template <typename T>
PendingTransfer iallgatherv(const DeviceGroup& g, const CommOp& t, const std::string& axes, const T* send, int count,
                            T* recv, const std::vector<int>& counts, const std::vector<int>& displs) {
  PendingTransfer p(g, t);
  p.requests_.emplace_back();
  mpi::check(MPI_Iallgatherv(send, count, mpi::datatype<T>(), recv, counts.data(), displs.data(), mpi::datatype<T>(),
                             g.comm.get(), &p.requests_.back()),
             "MPI_Iallgatherv");
  comm_stats().record(t.kind, axes, static_cast<std::int64_t>(count) * static_cast<std::int64_t>(sizeof(T)));
  return p;
}
template PendingTransfer ialltoallv<std::uint16_t>(const DeviceGroup&, const CommOp&, const std::string&,
                                                   const std::uint16_t*, const std::vector<int>&,
                                                   const std::vector<int>&, std::uint16_t*, const std::vector<int>&,
                                                   const std::vector<int>&);
template PendingTransfer iallgatherv<std::uint16_t>(const DeviceGroup&, const CommOp&, const std::string&,
                                                    const std::uint16_t*, int, std::uint16_t*,
                                                    const std::vector<int>&, const std::vector<int>&);
#define SHARD_INSTANTIATE_IALLREDUCE(T) \
  template PendingTransfer iallreduce_sum<T>(const DeviceGroup&, const CommOp&, const std::string&, T*, int);
SHARD_FOR_EACH_FLOAT_DTYPE(SHARD_INSTANTIATE_IALLREDUCE)
#undef SHARD_INSTANTIATE_IALLREDUCE

#define SHARD_INSTANTIATE_VERBS(T)                                                                           \
  template void alltoallv<T>(const DeviceGroup&, const CommOp&, const T*, const std::vector<int>&,           \
                             const std::vector<int>&, T*, const std::vector<int>&, const std::vector<int>&,  \
                             std::int64_t);                                                                  \
  template void allgatherv<T>(const DeviceGroup&, const CommOp&, const T*, int, T*, const std::vector<int>&, \
                              const std::vector<int>&);                                                      \
  template void gatherv<T>(const DeviceGroup&, const CommOp&, const T*, int, T*, const std::vector<int>&,    \
                           const std::vector<int>&, int);                                                    \
  template void broadcast<T>(const DeviceGroup&, const CommOp&, T*, int, int);                               \
  template PendingTransfer isend<T>(const DeviceGroup&, const CommOp&, const T*, int, int, int);             \
  template PendingTransfer irecv<T>(const DeviceGroup&, const CommOp&, T*, int, int, int);                   \
  template PendingTransfer ibroadcast<T>(const DeviceGroup&, const CommOp&, T*, int, int);                   \
  template PendingTransfer iallgatherv<T>(const DeviceGroup&, const CommOp&, const std::string&, const T*,   \
                                          int, T*, const std::vector<int>&, const std::vector<int>&);
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_VERBS)
SHARD_INSTANTIATE_VERBS(char)  // text, not a dtype (the checkpoint manifest's broadcast)
#undef SHARD_INSTANTIATE_VERBS

}  // namespace shard::detail
