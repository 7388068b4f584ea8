#include "shard/tensor.hpp"

#include <atomic>

#include "shard/error.hpp"

namespace shard {

namespace {
std::atomic<std::int64_t> g_live{0};
std::atomic<std::int64_t> g_peak{0};
constexpr std::align_val_t kAlign{64};
}  // namespace

TensorMemoryStats tensor_memory_stats() { return {g_live.load(), g_peak.load()}; }

void reset_tensor_memory_peak() { g_peak.store(g_live.load()); }

namespace detail {

void* tensor_alloc(std::size_t bytes) {
  void* p = ::operator new(bytes, kAlign);
  const std::int64_t live = g_live.fetch_add(static_cast<std::int64_t>(bytes)) + static_cast<std::int64_t>(bytes);
  std::int64_t peak = g_peak.load();
  while (live > peak && !g_peak.compare_exchange_weak(peak, live)) {
  }
  return p;
}

void tensor_free(void* p, std::size_t bytes) noexcept {
  ::operator delete(p, kAlign);
  g_live.fetch_sub(static_cast<std::int64_t>(bytes));
}

void tensor_shape_error(const Shape& expected, const Shape& got, const char* what) {
  raise<ShapeError>(what, ": shape ", to_string(expected), " does not match ", to_string(got));
}

void tensor_index_error(const Shape& shape, std::size_t rank) {
  raise<ShapeError>("Tensor: ", rank, " indices for a tensor of shape ", to_string(shape), " (", shape.size(),
                    " dims)");
}

}  // namespace detail

template class Tensor<float>;
template class Tensor<double>;
template class Tensor<std::int32_t>;
template class Tensor<std::int64_t>;

}  // namespace shard
