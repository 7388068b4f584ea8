#pragma once
/// \file Gradient reduction overlapped with the backward pass (ops layer: matmul's VJP defers a
/// parameter's gradient here; autodiff.hpp opens the scope and reads the gradients).
///
/// A parameter's gradient that comes out of a product contracting over mesh axes (dW = x^T dy
/// with x split over 'data') is a psum of each device's partial product. In the global view
/// the backward pass does not run that psum where the rule produces it: the product is
/// computed in row chunks of at most GradientReduction::bucket_bytes, the psum of each chunk is
/// started (MPI_Iallreduce) as soon as its rows are written, and the in-flight sums are
/// progressed (MPI_Test) between the gemms of the following chunks and of the rest of the
/// backward pass. The parameter's node keeps a handle; reading the gradient waits for its
/// chunks. The buckets therefore go out in reverse order of the forward pass, as DDP's do.
/// Through group-shared memory (one node) the sums stay blocking: they are memory copies.

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "shard/core/box.hpp"
#include "shard/core/dtype.hpp"

namespace shard {

template <typename T>
class ShardedArray;
template <typename T>
class Tensor;
class NamedSharding;
class SpecEntry;

/// How grad / value_and_grad / vjp reduce the gradients of parameters across devices
/// (process-wide; every rank must use the same values, which the consistency check verifies
/// through the chunks' shapes).
struct GradientReduction {
  /// Start each chunk's psum as soon as its rows are computed and let it run behind the rest
  /// of the backward pass (false: wait for each chunk right after starting it; the same
  /// transfers, unoverlapped).
  bool overlap = true;
  /// The largest chunk of one gradient reduced in one call (DDP's bucket_cap).
  std::int64_t bucket_bytes = std::int64_t{1} << 20;
  /// Send float32 gradients as bfloat16 and accumulate them in float32 (half the bytes; each
  /// sum is rounded to bfloat16's 8 significant bits, the same on every rank).
  bool bfloat16 = false;
};

/// The settings in effect (modifiable: shard::gradient_reduction().overlap = false).
GradientReduction& gradient_reduction();

}  // namespace shard

namespace shard::detail {

/// A reduction in flight that the backward pass progresses between its kernels.
class InFlightReduction {
 public:
  virtual ~InFlightReduction() = default;
  /// Progresses the transfers (MPI_Test), never blocks.
  virtual void progress() = 0;
};

/// While alive, this thread's backward pass may defer the reductions of parameters' gradients
/// (grad / value_and_grad / vjp open one around the pass and the reading of the gradients).
class DeferredReductionScope {
 public:
  DeferredReductionScope();
  ~DeferredReductionScope();
  DeferredReductionScope(const DeferredReductionScope&) = delete;
  DeferredReductionScope& operator=(const DeferredReductionScope&) = delete;
};

/// Progresses every reduction in flight of this thread's scope (no-op outside one).
void progress_reductions();

/// Gradient accumulation over micro-batches (autodiff/accumulate.hpp; PyTorch DDP's no_sync): while
/// a scope is open on this thread, the deferred reductions of parameters' gradients (the two
/// functions below) add this rank's partial blocks into a sum kept across micro-batches, give
/// zeros for every micro-batch but the last, and on the last start the one reduction of the
/// sums, behind its backward pass. Every micro-batch defers the same reductions in the same order
/// (the same program); one that does not raises.
class AccumulationScope {
 public:
  AccumulationScope();
  ~AccumulationScope();
  AccumulationScope(const AccumulationScope&) = delete;
  AccumulationScope& operator=(const AccumulationScope&) = delete;
  /// Micro-batch i of k (0 <= i < k) starts (ValueError when the micro-batch before it deferred
  /// fewer reductions than the first). A scope opened inside another's micro-batch does nothing:
  /// its reductions are the outer one's.
  void begin(int i, int k);
  /// After the last micro-batch: ValueError when it deferred fewer reductions than the first.
  void finish() const;

 private:
  bool outermost_;
};

/// The gradient op(a) @ op(b) (op: transpose when ta / tb) placed as `out`, whose psum over the
/// contracting mesh axes is started now in chunks and completed when the returned function is
/// called. An empty function when the deferred path does not apply (no scope, no contraction
/// over mesh axes, a layout other than `out`, a 2-D block algorithm, group-shared memory, uneven
/// blocks): the caller then runs the product as usual.
template <Dtype T>
std::function<ShardedArray<T>()> matmul_t_deferred(const ShardedArray<T>& a, bool ta, const ShardedArray<T>& b,
                                                   bool tb, const NamedSharding& out);

/// The psum over the mesh axes `axes` of partial gradient blocks (one per local device of
/// `sharding`'s mesh, in its local order, all of one shape: a shard_map argument's cotangent
/// that varies over axes its primal does not), started now in the same buckets as a product's
/// and completed when the returned function is called. The result is sharded as `sharding`.
/// `parameter`: the cotangent is a parameter's gradient, which GradientReduction::bfloat16 may
/// send as bfloat16 (another argument's, an activation's, is summed exactly).
template <Dtype T>
std::function<ShardedArray<T>()> psum_deferred(std::vector<Tensor<T>> blocks, const SpecEntry& axes,
                                               const NamedSharding& sharding, const Shape& shape, bool parameter);

}  // namespace shard::detail
