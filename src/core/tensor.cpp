#include "shard/core/tensor.hpp"

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iterator>
#include <limits>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "shard/core/buffer_pool.hpp"
#include "shard/core/memory.hpp"
#include "shard/core/tensor_ops.hpp"  // Tensor::operator[](index list), instantiated below
#include "shard/error.hpp"

namespace shard {

namespace {
std::atomic<std::int64_t> g_live{0};
std::atomic<std::int64_t> g_peak{0};
bool g_keep_freed = false;  // set_keep_freed_memory
/// set_memory_limit's bytes (0: none); kUnread until SHARD_MEMORY_LIMIT was read, at the first
/// allocation or call.
constexpr std::int64_t kUnread = -1;
std::atomic<std::int64_t> g_limit{kUnread};

/// SHARD_MEMORY_LIMIT in bytes (0 when unset): digits with an optional K, M or G (powers of 1024).
std::int64_t limit_from_environment() {
  const char* env = std::getenv("SHARD_MEMORY_LIMIT");
  if (!env || !*env) return 0;
  const std::string text(env);
  std::size_t used = 0;
  long long value = -1;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::int64_t scale = 1;
  if (used + 1 == text.size()) {
    const char unit = static_cast<char>(std::toupper(static_cast<unsigned char>(text[used])));
    scale = unit == 'K' ? 1024 : unit == 'M' ? 1024 * 1024 : unit == 'G' ? std::int64_t{1} << 30 : 0;
    used += scale ? 1 : 0;
  }
  if (used != text.size() || value < 0 || scale == 0 ||
      value > std::numeric_limits<std::int64_t>::max() / scale)
    raise<ValueError>("SHARD_MEMORY_LIMIT='", text,
                      "': expected a number of bytes, optionally with K, M or G (e.g. 512M; 0: no limit)");
  return static_cast<std::int64_t>(value) * scale;
}

/// The limit in force, reading the environment the first time.
std::int64_t current_limit() {
  std::int64_t limit = g_limit.load(std::memory_order_relaxed);
  if (limit == kUnread) {
    try {
      limit = limit_from_environment();
    } catch (...) {
      g_limit.store(0);  // raised once, at the first allocation; no limit after it
      throw;
    }
    std::int64_t unread = kUnread;
    if (!g_limit.compare_exchange_strong(unread, limit)) limit = unread;  // set meanwhile
  }
  return limit;
}

/// Large buffers start on a cache line: Open MPI's single-copy transfers (process_vm_readv)
/// and memcpy run at full speed only when source and destination share their offset within
/// a cache line. glibc's 16-byte alignment left that to chance: a 4-16 MiB Sendrecv between
/// buffers at line offsets 0 and 16 took 1.2-1.6x as long as between equal offsets here.
/// Aligned by hand (64 bytes more from plain operator new) rather than with an over-aligned
/// new: that goes through memalign, which splits heap chunks so freed blocks are not reused
/// exactly (200 allocate/free cycles of 1 MiB page-faulted 2305 times against 256).
///
/// Every buffer has kHeader bytes before its data: the jit buffer pool it belongs to (or null)
/// at data - 16, the pool's lane that took it at data - 8, and in the byte before the data the
/// offset from the start of the block.
constexpr std::size_t kLine = 64;
constexpr std::size_t kHeader = 16;
constexpr std::size_t kAlignFrom = 16 * 1024;  // smaller buffers: operator new's 16-byte alignment
std::atomic<std::int64_t> g_system_allocations{0};

void* system_new(std::size_t bytes) {
  auto* raw =
      static_cast<unsigned char*>(::operator new(bytes + kHeader + (bytes >= kAlignFrom ? kLine : 0)));
  std::size_t offset = kHeader;
  if (bytes >= kAlignFrom)
    offset += (kLine - reinterpret_cast<std::uintptr_t>(raw + kHeader) % kLine) % kLine;
  unsigned char* p = raw + offset;  // offset 16..79
  p[-1] = static_cast<unsigned char>(offset);
  detail::BufferPool::State* none = nullptr;
  std::memcpy(p - kHeader, &none, sizeof none);
  g_system_allocations.fetch_add(1, std::memory_order_relaxed);
  return p;
}

void system_delete(void* p) noexcept {
  auto* q = static_cast<unsigned char*>(p);
  ::operator delete(q - q[-1]);
}

detail::BufferPool::State* pool_of(void* p) noexcept {
  detail::BufferPool::State* st;
  std::memcpy(&st, static_cast<unsigned char*>(p) - kHeader, sizeof st);
  return st;
}
void set_pool_of(void* p, detail::BufferPool::State* st) noexcept {
  std::memcpy(static_cast<unsigned char*>(p) - kHeader, &st, sizeof st);
}
/// The pool's lane (core/buffer_pool.hpp) that took a pooled buffer, at data - 8.
unsigned lane_of(void* p) noexcept { return static_cast<unsigned char*>(p)[-8]; }
void set_lane_of(void* p, unsigned lane) noexcept {
  static_cast<unsigned char*>(p)[-8] = static_cast<unsigned char>(lane);
}

/// Freed large buffers kept for reuse at exactly the same size: a functional collective
/// frees its input and allocates an output of the same size, so the next call gets the
/// buffer back at the same address. Without it, glibc (after large blocks had been freed)
/// handed out a different address each call and Open MPI's single-copy transfers
/// (process_vm_readv) of 64 KiB-1 MiB ran 2-3x slower than into a fixed buffer.
class BufferCache {
 public:
  static constexpr std::size_t kMinBytes = kAlignFrom;
  static constexpr std::size_t kMaxEntries = 16;
  static constexpr std::size_t kMaxBytes = std::size_t{1} << 30;

  void* take(std::size_t bytes) {
    if (bytes < kMinBytes) return nullptr;
    std::lock_guard lock(mutex_);
    for (auto it = entries_.rbegin(); it != entries_.rend(); ++it)  // most recently freed first
      if (it->bytes == bytes) {
        void* p = it->p;
        held_ -= bytes;
        entries_.erase(std::next(it).base());
        return p;
      }
    return nullptr;
  }

  /// Keeps `p` if the cache is on and it fits; otherwise returns false.
  bool give(void* p, std::size_t bytes) {
    if (bytes < kMinBytes || !shard::keep_freed_memory() || bytes > kMaxBytes) return false;
    std::lock_guard lock(mutex_);
    while (!entries_.empty() && (entries_.size() >= kMaxEntries || held_ + bytes > kMaxBytes)) {
      system_delete(entries_.front().p);  // the oldest goes back to malloc
      held_ -= entries_.front().bytes;
      entries_.erase(entries_.begin());
    }
    entries_.push_back({p, bytes});
    held_ += bytes;
    return true;
  }

  void clear() {
    std::lock_guard lock(mutex_);
    for (auto& e : entries_) system_delete(e.p);
    entries_.clear();
    held_ = 0;
  }

 private:
  struct Entry {
    void* p;
    std::size_t bytes;
  };
  std::mutex mutex_;
  std::vector<Entry> entries_;
  std::size_t held_ = 0;
};

BufferCache& cache() {
  static BufferCache* c = new BufferCache;  // never destroyed: buffers may be freed during exit
  return *c;
}

}  // namespace

void set_memory_limit(std::int64_t bytes) { g_limit.store(std::max<std::int64_t>(0, bytes)); }
std::int64_t memory_limit() { return current_limit(); }

TensorMemoryStats tensor_memory_stats() {
  return {g_live.load(), g_peak.load(), g_system_allocations.load(std::memory_order_relaxed)};
}

void reset_tensor_memory_peak() { g_peak.store(g_live.load()); }

void release_cached_tensor_memory() { cache().clear(); }

void set_keep_freed_memory(bool keep) {
  // glibc defaults: blocks >= 128 KiB (adaptive up to 32 MiB) come from mmap and go back to
  // the OS on free; the top of the heap is trimmed above 128 KiB.
  mallopt(M_MMAP_MAX, keep ? 0 : 65536);
  mallopt(M_TRIM_THRESHOLD, keep ? INT_MAX : 128 * 1024);
  g_keep_freed = keep;
  if (!keep) release_cached_tensor_memory();
}

bool keep_freed_memory() { return g_keep_freed; }

namespace detail {

// ---- the jit buffer pool (core/buffer_pool.hpp)
struct BufferPool::State {
  struct Slot {
    std::vector<void*> free;
    // Per lane (core/buffer_pool.hpp): net buffers taken since the call began, and their peak.
    std::vector<std::int64_t> taken, peak;
    std::int64_t bound = 0;  // the sum of the lanes' peaks: what any interleaving has in use at once
    std::int64_t keep = 0;   // the largest bound of a call: how many free buffers are kept

    void count(unsigned lane, std::int64_t delta) {
      if (lane >= taken.size()) {
        taken.resize(lane + 1, 0);
        peak.resize(lane + 1, 0);
      }
      taken[lane] += delta;
      if (taken[lane] > peak[lane]) {
        bound += taken[lane] - peak[lane];
        peak[lane] = taken[lane];
      }
    }
  };
  std::mutex mutex;
  std::unordered_map<std::size_t, Slot> slots;
  std::int64_t refs = 1;  // the owner, and every buffer tagged with this pool
  bool closed = false;
  bool missed = false;  // the call allocated from the system

  /// A free buffer of `bytes` for `lane`, or null (then the caller allocates and adopt()s one).
  void* take(std::size_t bytes, unsigned lane) {
    const std::lock_guard lock(mutex);
    Slot& s = slots[bytes];
    s.count(lane, 1);
    if (s.free.empty()) {
      missed = true;
      return nullptr;
    }
    void* p = s.free.back();
    s.free.pop_back();
    set_lane_of(p, lane);
    return p;
  }
  void adopt(void* p, unsigned lane) {
    set_pool_of(p, this);
    set_lane_of(p, lane);
    const std::lock_guard lock(mutex);
    ++refs;
  }
  /// A tagged buffer whose last Tensor died: kept, or freed when the pool is gone.
  void give(void* p, std::size_t bytes) noexcept {
    bool last = false;
    {
      const std::lock_guard lock(mutex);
      if (!closed) {
        try {
          // Kept up to what a call had in use at once (results the caller held by the hundred
          // and then dropped go back to the system).
          Slot& s = slots[bytes];
          s.count(lane_of(p), -1);
          if (static_cast<std::int64_t>(s.free.size()) < std::max(s.keep, s.bound)) {
            s.free.push_back(p);
            return;
          }
        } catch (...) {  // the free list could not grow: the buffer goes to the system
        }
      }
      last = --refs == 0;
    }
    system_delete(p);
    if (last) delete this;
  }
};

namespace {
thread_local BufferPool* t_pool = nullptr;
thread_local unsigned t_lane = 0;
}  // namespace

BufferPool::BufferPool() : state_(new State) {}

BufferPool::~BufferPool() {
  bool last = false;
  {
    const std::lock_guard lock(state_->mutex);
    state_->closed = true;
    for (auto& [bytes, slot] : state_->slots) {
      for (void* p : slot.free) system_delete(p);
      state_->refs -= static_cast<std::int64_t>(slot.free.size());
      slot.free.clear();
    }
    last = --state_->refs == 0;
  }
  if (last) delete state_;
}

void BufferPool::begin_call() {
  const std::lock_guard lock(state_->mutex);
  state_->missed = false;
  for (auto& [bytes, slot] : state_->slots) {
    std::fill(slot.taken.begin(), slot.taken.end(), 0);
    std::fill(slot.peak.begin(), slot.peak.end(), 0);
    slot.bound = 0;
  }
}

void BufferPool::end_call() {
  const std::lock_guard lock(state_->mutex);
  for (auto& [bytes, slot] : state_->slots) slot.keep = std::max(slot.keep, slot.bound);
  if (!state_->missed) return;
  for (auto& [bytes, slot] : state_->slots)
    while (static_cast<std::int64_t>(slot.free.size()) < slot.bound) {
      void* p = system_new(bytes);
      set_pool_of(p, state_);
      slot.free.push_back(p);
      ++state_->refs;
    }
}

BufferPoolScope::BufferPoolScope(BufferPool* pool, int lane) noexcept
    : previous_(t_pool), previous_lane_(static_cast<int>(t_lane)) {
  t_pool = pool;
  t_lane = static_cast<unsigned>(std::clamp(lane, 0, 255));
}
BufferPoolScope::~BufferPoolScope() {
  t_pool = previous_;
  t_lane = static_cast<unsigned>(previous_lane_);
}
BufferPool* active_buffer_pool() noexcept { return t_pool; }

namespace {
void* new_buffer(std::size_t bytes, const Shape& shape, const char* dtype) {
  if (void* p = cache().take(bytes)) return p;
  try {
    return system_new(bytes);
  } catch (const std::bad_alloc&) {
    cache().clear();  // hand the kept buffers back and try once more
    try {
      return system_new(bytes);
    } catch (const std::bad_alloc&) {
      raise<AllocationError>("cannot allocate ", bytes, " bytes for a ", dtype, to_string(shape),
                             " array on this rank (", g_live.load(), " bytes of arrays are live here)");
    }
  }
}
}  // namespace

void* tensor_alloc(std::size_t bytes, const Shape& shape, const char* dtype) {
  if (g_limit.load(std::memory_order_relaxed) != 0) [[unlikely]]
    if (const std::int64_t limit = current_limit();
        limit > 0 && g_live.load() + static_cast<std::int64_t>(bytes) > limit)
      raise<AllocationError>("cannot allocate ", bytes, " bytes for a ", dtype, to_string(shape),
                             " array on this rank: ", g_live.load(),
                             " bytes of arrays are live here and the memory limit is ", limit,
                             " bytes (SHARD_MEMORY_LIMIT / shard::set_memory_limit)");
  // Buffers of at least 16 KiB start on a cache line (system_new).
  void* p = nullptr;
  if (BufferPool* pool = t_pool) {
    p = pool->state()->take(bytes, t_lane);
    if (!p) {
      p = new_buffer(bytes, shape, dtype);
      pool->state()->adopt(p, t_lane);
    }
  } else {
    p = new_buffer(bytes, shape, dtype);
  }
  const std::int64_t live =
      g_live.fetch_add(static_cast<std::int64_t>(bytes)) + static_cast<std::int64_t>(bytes);
  std::int64_t peak = g_peak.load();
  while (live > peak && !g_peak.compare_exchange_weak(peak, live)) {
  }
  return p;
}

void tensor_free(void* p, std::size_t bytes) noexcept {
  g_live.fetch_sub(static_cast<std::int64_t>(bytes));
  if (BufferPool::State* st = pool_of(p)) {
    st->give(p, bytes);
    return;
  }
  try {
    if (cache().give(p, bytes)) return;
  } catch (...) {  // the cache could not grow: free normally
  }
  system_delete(p);
}

SharedBuffer::~SharedBuffer() { tensor_free(data, bytes); }

void tensor_shape_error(const Shape& expected, const Shape& got, const char* what) {
  raise<ShapeError>(what, ": shape ", to_string(expected), " does not match ", to_string(got));
}

void tensor_index_error(const Shape& shape, std::size_t rank) {
  raise<ShapeError>("Tensor: ", rank, " indices for a tensor of shape ", to_string(shape), " (", shape.size(),
                    " dims)");
}

}  // namespace detail

#define SHARD_INSTANTIATE_TENSOR(T) template class Tensor<T>;
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_TENSOR)
#undef SHARD_INSTANTIATE_TENSOR

}  // namespace shard
