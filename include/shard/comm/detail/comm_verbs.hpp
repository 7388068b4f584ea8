#pragma once
/// \file The comm layer's verbs for transfers that are not named-axis collectives: the general
/// reshard, to_host / gather, print, checkpoint metadata, shard_map's shape agreement, Cannon's
/// shifts and SUMMA's panel broadcasts. Each verb owns the count check, the datatype, the
/// routine name for errors, CommStats accounting (by kind), the consistency check and the
/// watchdog (blocking calls under the watcher thread, or polled under SHARD_COLLECTIVE_TIMEOUT),
/// so no other part of the library calls MPI.
///
/// A transfer is checked once where it starts (check_transfer / check_mesh_transfer): every rank
/// of the group compares a fingerprint of its kind, what it moves and its call line, in the
/// same exchange as the collectives' check (collective_guard.hpp), so a reshard on one rank
/// against a psum or a gather on another is a CollectiveMismatchError on every rank.

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <source_location>
#include <string>
#include <vector>

#include "shard/error.hpp"  // shard::source_location
#include "shard/comm/detail/collective.hpp"
#include "shard/comm/detail/mesh_comms.hpp"
#include "shard/sharding/mesh.hpp"

namespace shard::detail {

/// What a transfer is, for the check, messages and CommStats.
struct CommOp {
  std::string kind;  ///< CommStats kind and the first word of messages: "reshard", "gather", "cannon"
  std::string what;  ///< what it moves, e.g. "float64(8, 8) to NamedSharding(...)": fingerprinted
  shard::source_location where = shard::source_location::current();
};

/// The Runtime's world as a group (ranks 0..n-1). Requires a Runtime.
const DeviceGroup& world_group();

/// Checks that every rank of the world issues this transfer now (no-op with the check off).
void check_transfer(const CommOp& t);
/// The same over the ranks of `mesh` (the world's exchange when the mesh spans every rank).
void check_mesh_transfer(const Mesh& mesh, const CommOp& t);

/// MPI's int count (mpi::int_count), or a ValueError naming the transfer.
int transfer_count(std::int64_t n, const CommOp& t);

/// Blocking verbs over every rank of `g`, in communicator ranks. `bytes_sent` is recorded in
/// CommStats under t.kind (the caller knows what left this rank).
template <typename T>
void alltoallv(const DeviceGroup& g, const CommOp& t, const T* send, const std::vector<int>& send_counts,
               const std::vector<int>& send_displs, T* recv, const std::vector<int>& recv_counts,
               const std::vector<int>& recv_displs, std::int64_t bytes_sent);
template <typename T>
void allgatherv(const DeviceGroup& g, const CommOp& t, const T* send, int count, T* recv,
                const std::vector<int>& counts, const std::vector<int>& displs);
template <typename T>
void gatherv(const DeviceGroup& g, const CommOp& t, const T* send, int count, T* recv, const std::vector<int>& counts,
             const std::vector<int>& displs, int root);
template <typename T>
void broadcast(const DeviceGroup& g, const CommOp& t, T* buf, int count, int root);
/// Elementwise max (min) of `n` int64 over the ranks of `g`, in place: the small agreements.
void allreduce_max(const DeviceGroup& g, const CommOp& t, std::int64_t* v, int n);
void allreduce_min(const DeviceGroup& g, const CommOp& t, std::int64_t* v, int n);

/// A transfer in flight (the nonblocking verbs): test() progresses it, wait() completes it
/// (under the watchdog, or the watcher thread); time spent in both goes to CommStats'
/// exposed-wait time of its kind. Movable. Its CommOp and group must outlive it. If an error
/// unwinds past it while requests are pending, its destructor completes them (the buffers are
/// about to go) within SHARD_ABORT_GRACE s, or ends the process.
class PendingTransfer {
 public:
  PendingTransfer() = default;
  PendingTransfer(PendingTransfer&&) noexcept = default;
  PendingTransfer& operator=(PendingTransfer&& other) noexcept;
  PendingTransfer(const PendingTransfer&) = delete;
  PendingTransfer& operator=(const PendingTransfer&) = delete;
  ~PendingTransfer();

  bool empty() const { return requests_.empty(); }
  /// True once every request completed.
  bool test();
  void wait();
  /// Takes over `other`'s requests (completed together).
  void merge(PendingTransfer&& other);

 private:
  template <typename T>
  friend PendingTransfer isend(const DeviceGroup&, const CommOp&, const T*, int, int, int);
  template <typename T>
  friend PendingTransfer irecv(const DeviceGroup&, const CommOp&, T*, int, int, int);
  template <typename T>
  friend PendingTransfer ibroadcast(const DeviceGroup&, const CommOp&, T*, int, int);
  template <typename T>
  friend PendingTransfer iallreduce_sum(const DeviceGroup&, const CommOp&, const std::string&, T*, int);
  template <typename T>
  friend PendingTransfer ialltoallv(const DeviceGroup&, const CommOp&, const std::string&, const T*,
                                    const std::vector<int>&, const std::vector<int>&, T*, const std::vector<int>&,
                                    const std::vector<int>&);
  template <typename T>
  friend PendingTransfer iallgatherv(const DeviceGroup&, const CommOp&, const std::string&, const T*, int, T*,
                                     const std::vector<int>&, const std::vector<int>&);
  PendingTransfer(const DeviceGroup& g, const CommOp& t);

  std::vector<MPI_Request> requests_;
  const CommOp* op_ = nullptr;  // names it in messages and CommStats
  const DeviceGroup* group_ = nullptr;
};

/// Point-to-point within `g` (communicator ranks; tags distinguish messages of one pair).
template <typename T>
PendingTransfer isend(const DeviceGroup& g, const CommOp& t, const T* buf, int count, int to, int tag);
template <typename T>
PendingTransfer irecv(const DeviceGroup& g, const CommOp& t, T* buf, int count, int from, int tag);
/// MPI_Ibcast over `g` from communicator rank `root`.
template <typename T>
PendingTransfer ibroadcast(const DeviceGroup& g, const CommOp& t, T* buf, int count, int root);

/// MPI_Iallreduce (sum, in place) of `count` elements over `g`; recorded in CommStats under
/// t.kind and the mesh axes `axes`.
template <typename T>
PendingTransfer iallreduce_sum(const DeviceGroup& g, const CommOp& t, const std::string& axes, T* buf, int count);
/// MPI_Ialltoallv and MPI_Iallgatherv over `g` (the count vectors must outlive the transfer);
/// the elements leaving this rank are recorded under t.kind and `axes`.
template <typename T>
PendingTransfer ialltoallv(const DeviceGroup& g, const CommOp& t, const std::string& axes, const T* send,
                           const std::vector<int>& send_counts, const std::vector<int>& send_displs, T* recv,
                           const std::vector<int>& recv_counts, const std::vector<int>& recv_displs);
template <typename T>
PendingTransfer iallgatherv(const DeviceGroup& g, const CommOp& t, const std::string& axes, const T* send, int count,
                            T* recv, const std::vector<int>& counts, const std::vector<int>& displs);

}  // namespace shard::detail
