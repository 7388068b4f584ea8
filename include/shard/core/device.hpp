#pragma once
/// \file Logical devices and the process topology they live on. No MPI: the Runtime fills
/// a Topology from MPI, tests build one by hand.

#include <string>
#include <vector>

namespace shard {

/// A logical device. Ids are global: rank r owns devices [r*k, (r+1)*k) for k devices per rank.
struct Device {
  int id = 0;
  int process_index = 0;  ///< owning MPI rank
  int local_index = 0;    ///< position among the owning rank's devices
  int node_id = 0;        ///< dense id of the host (ranks sharing memory share a node id)
  std::string host;       ///< host name of the owning rank

  bool operator==(const Device&) const = default;
};

/// Where devices live: how many ranks, devices per rank, and which node each rank is on.
struct Topology {
  int process_count = 1;
  int devices_per_rank = 1;
  int process_index = 0;                  ///< this process
  std::vector<int> node_of_process;       ///< dense node id per rank
  std::vector<std::string> host_of_process;

  /// One process with `devices_per_rank` devices on host "localhost".
  static Topology single(int devices_per_rank = 1);
  /// `processes` ranks seen from rank `me`, `nodes_of` gives each rank's node id.
  static Topology simulated(int processes, int devices_per_rank, int me,
                            std::vector<int> nodes_of = {});

  int device_count() const { return process_count * devices_per_rank; }
  int owner(int device_id) const { return device_id / devices_per_rank; }
  bool is_local(int device_id) const { return owner(device_id) == process_index; }
  Device device(int device_id) const;
  std::vector<Device> devices() const;
  std::vector<Device> local_devices() const;
  bool operator==(const Topology&) const = default;
};

/// "CPU 3" — the label JAX's CPU backend prints.
std::string device_label(int device_id);

}  // namespace shard
