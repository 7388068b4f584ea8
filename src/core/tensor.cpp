#include "shard/core/tensor.hpp"

#include <malloc.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <iterator>
#include <mutex>
#include <vector>

#include "shard/core/memory.hpp"
#include "shard/core/tensor_ops.hpp"  // Tensor::operator[](index list), instantiated below
#include "shard/error.hpp"

namespace shard {

namespace {
std::atomic<std::int64_t> g_live{0};
std::atomic<std::int64_t> g_peak{0};
bool g_keep_freed = false;  // set_keep_freed_memory

/// Large buffers start on a cache line: Open MPI's single-copy transfers (process_vm_readv)
/// and memcpy run at full speed only when source and destination share their offset within
/// a cache line. glibc's 16-byte alignment left that to chance: a 4-16 MiB Sendrecv between
/// buffers at line offsets 0 and 16 took 1.2-1.6x as long as between equal offsets here.
/// Aligned by hand (64 bytes more from plain operator new, the offset kept in the byte
/// before the data) rather than with an over-aligned new: that goes through memalign, which
/// splits heap chunks so freed blocks are not reused exactly (200 allocate/free cycles of
/// 1 MiB page-faulted 2305 times against 256).
constexpr std::size_t kLine = 64;

void* line_aligned_new(std::size_t bytes) {
  auto* raw = static_cast<unsigned char*>(::operator new(bytes + kLine));
  const std::size_t offset = kLine - reinterpret_cast<std::uintptr_t>(raw) % kLine;  // 1..64
  unsigned char* p = raw + offset;
  p[-1] = static_cast<unsigned char>(offset);
  return p;
}

void line_aligned_delete(void* p) noexcept {
  auto* q = static_cast<unsigned char*>(p);
  ::operator delete(q - q[-1]);
}

/// Freed large buffers kept for reuse at exactly the same size: a functional collective
/// frees its input and allocates an output of the same size, so the next call gets the
/// buffer back at the same address. Without it, glibc (after large blocks had been freed)
/// handed out a different address each call and Open MPI's single-copy transfers
/// (process_vm_readv) of 64 KiB-1 MiB ran 2-3x slower than into a fixed buffer.
class BufferCache {
 public:
  static constexpr std::size_t kMinBytes = 16 * 1024;
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
      line_aligned_delete(entries_.front().p);  // the oldest goes back to malloc
      held_ -= entries_.front().bytes;
      entries_.erase(entries_.begin());
    }
    entries_.push_back({p, bytes});
    held_ += bytes;
    return true;
  }

  void clear() {
    std::lock_guard lock(mutex_);
    for (auto& e : entries_) line_aligned_delete(e.p);
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

TensorMemoryStats tensor_memory_stats() { return {g_live.load(), g_peak.load()}; }

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

void* tensor_alloc(std::size_t bytes, const Shape& shape, const char* dtype) {
  // Buffers of at least BufferCache::kMinBytes start on a cache line; smaller ones come from
  // plain operator new.
  void* p = cache().take(bytes);
  if (!p) {
    try {
      p = bytes >= BufferCache::kMinBytes ? line_aligned_new(bytes) : ::operator new(bytes);
    } catch (const std::bad_alloc&) {
      cache().clear();  // hand the kept buffers back and try once more
      try {
        p = bytes >= BufferCache::kMinBytes ? line_aligned_new(bytes) : ::operator new(bytes);
      } catch (const std::bad_alloc&) {
        raise<AllocationError>("cannot allocate ", bytes, " bytes for a ", dtype, to_string(shape),
                               " array on this rank (", g_live.load(), " bytes of arrays are live here)");
      }
    }
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
  try {
    if (cache().give(p, bytes)) return;
  } catch (...) {  // the cache could not grow: free normally
  }
  if (bytes >= BufferCache::kMinBytes)
    line_aligned_delete(p);
  else
    ::operator delete(p);
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
