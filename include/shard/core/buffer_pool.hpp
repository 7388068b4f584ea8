#pragma once
/// \file A pool of Tensor buffers that one program reuses from call to call (jit's buffers: no
/// allocation per replay after the first). While a BufferPoolScope names a pool on a thread (the
/// device executor hands the caller's pool to its workers), every Tensor buffer that thread
/// allocates comes from the pool's freed buffers of exactly that size, else from the system and
/// is then the pool's: when its last Tensor dies (during the call or after it, on any thread) it
/// goes back to the pool's free list instead of the system. After a call that had to allocate,
/// the pool keeps as many free buffers of each size as the call had in use at once, so the next
/// call finds them even while the caller still holds the last call's results (the price: one set
/// of results more, as JAX's buffers without donation). Destroying the pool frees its free
/// buffers; the ones still in use go to the system when their Tensors die.
///
/// "In use at once" is counted per lane (the thread that allocated a buffer: the caller is lane
/// 0, the executor's device threads 1, 2, ...) and summed over lanes: each device thread runs the
/// same ops in the same order every call, but how two of them interleave changes from call to
/// call, and the sum of each lane's own peak bounds what any interleaving has in use at once
/// (the whole peak, measured once, did not: a later call's interleaving needed one buffer more
/// and took it from the system).
#include <cstddef>
#include <cstdint>

namespace shard::detail {

class BufferPool {
 public:
  BufferPool();
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  /// Starts a call's accounting (what it has in use at once, per size).
  void begin_call();
  /// Ends it: after a call that allocated from the system, tops the free lists up to what the
  /// call had in use at once (per size).
  void end_call();

  struct State;
  State* state() const { return state_; }

 private:
  State* state_;
};

/// Names `pool` (null: none) as this thread's pool for its lifetime, the thread counted as `lane`
/// (0: the caller; the executor's device threads: their device index); restores the previous ones.
class BufferPoolScope {
 public:
  explicit BufferPoolScope(BufferPool* pool, int lane = 0) noexcept;
  ~BufferPoolScope();
  BufferPoolScope(const BufferPoolScope&) = delete;
  BufferPoolScope& operator=(const BufferPoolScope&) = delete;

 private:
  BufferPool* previous_;
  int previous_lane_;
};

/// This thread's pool (null when none).
BufferPool* active_buffer_pool() noexcept;

}  // namespace shard::detail
