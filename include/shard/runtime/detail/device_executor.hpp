#pragma once
/// \file The per-rank device executor: runs one function per local device, device 0 on the
/// calling thread and the others on persistent worker threads (none when there is one device).

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace shard::detail {

class BufferPool;

/// True on a thread while it runs one device's function of DeviceExecutor::run (a shard_map or
/// pmap body): a rank-level collective there would be issued once per device thread.
bool in_device_function();

class DeviceExecutor {
 public:
  DeviceExecutor() = default;
  ~DeviceExecutor();
  DeviceExecutor(const DeviceExecutor&) = delete;
  DeviceExecutor& operator=(const DeviceExecutor&) = delete;

  /// Runs fn(0..n-1) concurrently and waits for all. `on_failure(i)` is called (from the
  /// failing thread) as soon as fn(i) throws, so peers blocked on each other can be released.
  /// After all return, the first exception thrown (in time) is rethrown.
  void run(int n, const std::function<void(int)>& fn, const std::function<void(int)>& on_failure);

 private:
  void ensure_workers(int count);
  void worker_loop(int index);
  void record_failure(std::exception_ptr e);

  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::vector<std::thread> workers_;
  const std::function<void(int)>* job_ = nullptr;
  int job_size_ = 0;
  long generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::exception_ptr first_error_;
  const std::function<void(int)>* on_failure_ = nullptr;
  BufferPool* pool_ = nullptr;  // the caller's buffer pool, named on the workers too
};

}  // namespace shard::detail
