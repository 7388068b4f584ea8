#pragma once
// The state one shard_map call shares between its device threads (internal).

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <vector>

#include "shard/comm/detail/collective.hpp"
#include "shard/sharding/mesh.hpp"

namespace shard::detail {

/// Rendezvous of this rank's device threads at each collective: every device deposits its
/// input; device 0 (the calling thread, which alone talks to MPI) checks that all issued the
/// same collective, runs it for all of them, and releases them.
class SpmdState {
 public:
  SpmdState(Mesh mesh, std::vector<int> local_devices)
      : mesh_(std::move(mesh)), devices_(std::move(local_devices)), slots_(devices_.size()) {}

  const Mesh& mesh() const { return mesh_; }
  const std::vector<int>& devices() const { return devices_; }
  int size() const { return static_cast<int>(devices_.size()); }

  /// Device `local` arrives with `spec` and its input; returns its output. `exec(slots)` runs
  /// on device 0's thread with every device's (spec, in, out).
  struct Slot {
    const CollectiveSpec* spec = nullptr;
    void* in = nullptr;
    void* out = nullptr;
  };
  void arrive(int local, const CollectiveSpec& spec, void* in, void* out,
              const std::function<void(std::vector<Slot>&)>& exec);
  /// Releases every device waiting in arrive() with an error (a device's body threw).
  void fail(int local);

 private:
  Mesh mesh_;
  std::vector<int> devices_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<Slot> slots_;
  int arrived_ = 0;
  long generation_ = 0;
  int failed_device_ = -1;
  std::vector<std::exception_ptr>
      errors_;  // per local device: the last collective's failure, each its own copy
};

}  // namespace shard::detail
