#pragma once
/// \file Device-group collectives (comm layer internals): a validated description of one
/// collective, and its execution for all of this rank's devices at once.

#include <cstdint>
#include <memory>
#include <source_location>
#include <string>
#include <utility>
#include <vector>

#include "shard/error.hpp"  // shard::source_location
#include "shard/core/array_ops.hpp"
#include "shard/core/box.hpp"
#include "shard/sharding/mesh.hpp"
#include "shard/sharding/partition_spec.hpp"
#include "shard/core/tensor.hpp"

namespace shard::detail {

enum class CollectiveKind { kReduce, kAllGather, kPsumScatter, kAllToAll, kPpermute };

/// One collective as every device of the mesh issues it. Built from metadata only, so every
/// rank builds the same spec and raises the same error before any communication.
struct CollectiveSpec {
  CollectiveKind kind = CollectiveKind::kReduce;
  ReduceKind op = ReduceKind::kSum;
  std::string name;                     ///< "psum", "all_gather", ... (CommStats kind)
  std::vector<int> axes;                ///< mesh axis positions, major to minor
  std::string axes_text;                ///< "'a'" or "('a','b')"
  int group_size = 1;                   ///< product of the axes' sizes (N)
  int dim = 0;                          ///< gather/scatter dim, or all_to_all split dim
  int concat_dim = 0;                   ///< all_to_all concat dim
  bool tiled = false;
  std::vector<std::pair<int, int>> perm;  ///< ppermute (src, dst) axis positions
  Shape in_shape;
  Shape out_shape;
  std::string dtype;

  bool operator==(const CollectiveSpec&) const = default;
};

/// Resolves axis names against the mesh: unknown or repeated names throw ShardingError.
void resolve_axes(const Mesh& mesh, const SpecEntry& axes, CollectiveSpec& spec);

CollectiveSpec reduce_spec(const Mesh& mesh, ReduceKind op, const SpecEntry& axes, const Shape& shape);
CollectiveSpec all_gather_spec(const Mesh& mesh, const SpecEntry& axes, const Shape& shape, int dim, bool tiled);
CollectiveSpec psum_scatter_spec(const Mesh& mesh, const SpecEntry& axes, const Shape& shape, int dim, bool tiled);
CollectiveSpec all_to_all_spec(const Mesh& mesh, const SpecEntry& axes, const Shape& shape, int split_dim,
                               int concat_dim, bool tiled);
CollectiveSpec ppermute_spec(const Mesh& mesh, const SpecEntry& axes, const Shape& shape,
                             std::vector<std::pair<int, int>> perm);

/// Runs `spec` for this rank's devices `devices` (mesh order) with inputs `ins` (consumed:
/// reductions work in place) into `outs`. For each device group over spec.axes that holds
/// one of these devices, in group-id order (the same on every rank): contributions of local
/// devices are combined in memory, one MPI call runs on the group's communicator, and the
/// results are copied to each local device. `where` is the call site the consistency check
/// (SHARD_CHECK_COLLECTIVES) reports; see collective_guard.hpp.
template <typename T>
void execute_collective(const Mesh& mesh, const CollectiveSpec& spec, const std::vector<int>& devices,
                        std::vector<Tensor<T>>& ins, std::vector<Tensor<T>>& outs,
                        const shard::source_location& where = shard::source_location::current());

/// The same for all_gather and all_to_all, which only read their inputs: the blocks are
/// used in place (no copy of the caller's shards).
template <typename T>
void execute_gather_like(const Mesh& mesh, const CollectiveSpec& spec, const std::vector<int>& devices,
                         const std::vector<const Tensor<T>*>& ins, std::vector<Tensor<T>>& outs,
                         const shard::source_location& where = shard::source_location::current());

/// A tiled all_gather over dim 0 in place: each block (spec.out_shape) holds its device's
/// chunk (spec.in_shape) at the device's group position along dim 0, and receives the other
/// members' chunks around it (one device per rank: MPI_Allgather with MPI_IN_PLACE, so only
/// the other chunks move).
template <typename T>
void execute_all_gather_in_place(const Mesh& mesh, const CollectiveSpec& spec, const std::vector<int>& devices,
                                 const std::vector<Tensor<T>*>& blocks,
                                 const shard::source_location& where = shard::source_location::current());

/// Where this rank may write its block (spec.in_shape) of the collective `spec` for its one
/// device `devices` before calling execute_collective(spec) with that block, so that the
/// transfer copies nothing in: the slot in the group-shared window the collective will use
/// (a psum_scatter through group-shared memory), or nullptr. Collective over the mesh's ranks
/// the first time for spec.axes (all call it alike). No other collective over spec.axes may
/// run in between; the block is then a Tensor::borrow of the slot.
template <typename T>
T* collective_staging(const Mesh& mesh, const CollectiveSpec& spec, const std::vector<int>& devices);

class PendingTransfer;
class PendingCollective;

/// Starts the sum over spec.axes (spec: a psum of shape {r1 - r0, n}) of rows [r0, r1) of each
/// local device's 2-D block (`blocks`, by index into `devices`), in place; the other rows are
/// not touched. The consistency check runs now (the transfers are fingerprinted like psum);
/// the sum goes out as one MPI_Iallreduce per group, or, with `bf16` (float32 only), as
/// bfloat16 with float32 accumulation (an Ialltoallv of each rank's share, a float32 sum,
/// an Iallgatherv of the rounded sums: half the bytes; every rank gets the same values).
/// Through group-shared memory (one node) or within a rank it completes before returning.
template <typename T>
PendingCollective start_psum_rows(const Mesh& mesh, const CollectiveSpec& spec,
                                  const std::vector<int>& devices, std::vector<Tensor<T>>& blocks,
                                  std::int64_t r0, std::int64_t r1, bool bf16 = false,
                                  const shard::source_location& where = shard::source_location::current());

/// Starts the all_gather `spec` (kAllGather) of each local device's block `ins` (by index into
/// `devices`, kept alive by the transfer) into `outs` (resized to one block of spec.out_shape per
/// device, filled when the collective completes). The consistency check runs now. A group within
/// this rank is gathered in memory before returning; a group of ranks on one node with one
/// device each and blocks of kSharedReduceMin bytes or more goes through group-shared memory
/// (this rank's block is copied into its slot now, possibly after waiting for the members to have
/// read that window's use four shared gathers earlier; wait() copies the others' slots, which
/// needs no further step of theirs; with four of this rank's shared gathers unread already, it
/// goes through MPI instead); any other group posts one MPI_Iallgatherv. jit's scheduler starts
/// a reshard's all_gather with it where the operand is ready and waits where the result is first
/// used.
template <typename T>
PendingCollective start_all_gather(const Mesh& mesh, const CollectiveSpec& spec,
                                   const std::vector<int>& devices, std::vector<Tensor<T>> ins,
                                   std::shared_ptr<std::vector<Tensor<T>>> outs,
                                   const shard::source_location& where = shard::source_location::current());

/// A collective started by start_psum_rows or start_all_gather: wait() completes the transfers and
/// hands the result to every local member of each group.
/// Movable; the blocks it was started on must outlive it. Destroyed while in flight (an error
/// unwinding), it completes the MPI transfers within SHARD_ABORT_GRACE (PendingTransfer) and marks
/// a group-shared gather read without reading it.
class PendingCollective {
 public:
  PendingCollective();
  PendingCollective(PendingCollective&&) noexcept;
  PendingCollective& operator=(PendingCollective&&) noexcept;
  ~PendingCollective();
  /// Progresses the transfers in flight; true once everything completed. Never starts a
  /// transfer (a bfloat16 sum's second phase waits for post_next_phase() or wait()).
  bool test();
  /// Completes everything, starting later phases as their inputs arrive.
  void wait();
  /// Waits for the transfers whose completion starts another one and starts it (the bfloat16
  /// sum's gather; a group-shared gather's read, which may wait for the other ranks). Call it at
  /// the same point of the program on every rank.
  void post_next_phase();
  bool done() const;

 private:
  template <typename T>
  friend PendingCollective start_psum_rows(const Mesh&, const CollectiveSpec&, const std::vector<int>&,
                                           std::vector<Tensor<T>>&, std::int64_t, std::int64_t, bool,
                                           const shard::source_location&);
  template <typename T>
  friend PendingCollective start_all_gather(const Mesh&, const CollectiveSpec&, const std::vector<int>&,
                                            std::vector<Tensor<T>>, std::shared_ptr<std::vector<Tensor<T>>>,
                                            const shard::source_location&);

 public:
  struct State;  // collective_async.cpp

 private:
  std::unique_ptr<State> state_;
};

}  // namespace shard::detail
