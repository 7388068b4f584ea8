#include "shard/runtime/detail/device_executor.hpp"

#include "shard/core/buffer_pool.hpp"
#include "shard/core/timeline.hpp"

namespace shard::detail {

namespace {
thread_local int t_in_device_function = 0;
/// Marks the thread as running a device's function for the scope.
struct InDeviceFunction {
  InDeviceFunction() { ++t_in_device_function; }
  ~InDeviceFunction() { --t_in_device_function; }
  InDeviceFunction(const InDeviceFunction&) = delete;
  InDeviceFunction& operator=(const InDeviceFunction&) = delete;
};
}  // namespace

bool in_device_function() { return t_in_device_function > 0; }

DeviceExecutor::~DeviceExecutor() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void DeviceExecutor::ensure_workers(int count) {
  while (static_cast<int>(workers_.size()) < count) {
    const int index = static_cast<int>(workers_.size()) + 1;  // device 0 is the caller
    workers_.emplace_back([this, index] { worker_loop(index); });
  }
}

void DeviceExecutor::worker_loop(int index) {
  timeline_set_lane(index);
  long seen = 0;
  std::unique_lock lock(mutex_);
  while (true) {
    wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    if (index >= job_size_) continue;
    const auto* job = job_;
    const auto* on_failure = on_failure_;
    BufferPool* const pool = pool_;
    lock.unlock();
    try {
      const BufferPoolScope buffers(pool, index);  // the caller's (jit's buffers), counted as lane `index`
      const InDeviceFunction marked;
      (*job)(index);
    } catch (...) {
      record_failure(std::current_exception());  // before waking peers: the root cause wins
      (*on_failure)(index);
    }
    lock.lock();
    if (--pending_ == 0) done_.notify_all();
  }
}

void DeviceExecutor::record_failure(std::exception_ptr e) {
  std::lock_guard lock(mutex_);
  if (!first_error_) first_error_ = std::move(e);
}

void DeviceExecutor::run(int n, const std::function<void(int)>& fn,
                         const std::function<void(int)>& on_failure) {
  if (n <= 1) {
    const InDeviceFunction marked;
    if (n == 1) fn(0);
    return;
  }
  {
    std::lock_guard lock(mutex_);
    ensure_workers(n - 1);
    job_ = &fn;
    on_failure_ = &on_failure;
    job_size_ = n;
    pool_ = active_buffer_pool();
    pending_ = n - 1;
    first_error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  try {
    const InDeviceFunction marked;
    fn(0);
  } catch (...) {
    record_failure(std::current_exception());
    on_failure(0);
  }
  std::unique_lock lock(mutex_);
  done_.wait(lock, [&] { return pending_ == 0; });
  job_ = nullptr;
  if (first_error_) {
    auto e = first_error_;
    first_error_ = nullptr;
    std::rethrow_exception(e);
  }
}

}  // namespace shard::detail
