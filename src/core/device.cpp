#include "shard/core/device.hpp"

#include "shard/error.hpp"

namespace shard {

Topology Topology::single(int devices_per_rank) { return simulated(1, devices_per_rank, 0); }

Topology Topology::simulated(int processes, int devices_per_rank, int me,
                             std::vector<int> nodes_of) {
  if (processes < 1 || devices_per_rank < 1 || me < 0 || me >= processes)
    raise<ValueError>("Topology: need processes >= 1, devices_per_rank >= 1 and 0 <= me < processes, got ",
                      processes, ", ", devices_per_rank, ", ", me);
  Topology t;
  t.process_count = processes;
  t.devices_per_rank = devices_per_rank;
  t.process_index = me;
  t.node_of_process = nodes_of.empty() ? std::vector<int>(processes, 0) : std::move(nodes_of);
  if (static_cast<int>(t.node_of_process.size()) != processes)
    raise<ValueError>("Topology: ", t.node_of_process.size(), " node ids for ", processes, " processes");
  for (int p = 0; p < processes; ++p)
    t.host_of_process.push_back("node" + std::to_string(t.node_of_process[p]));
  return t;
}

Device Topology::device(int device_id) const {
  if (device_id < 0 || device_id >= device_count())
    raise<ValueError>("device id ", device_id, " does not exist: there are ", device_count(),
                      " devices (", process_count, " ranks x ", devices_per_rank, " devices per rank)");
  const int p = owner(device_id);
  return Device{device_id, p, device_id % devices_per_rank, node_of_process.at(p), host_of_process.at(p)};
}

std::vector<Device> Topology::devices() const {
  std::vector<Device> out;
  for (int d = 0; d < device_count(); ++d) out.push_back(device(d));
  return out;
}

std::vector<Device> Topology::local_devices() const {
  std::vector<Device> out;
  for (int j = 0; j < devices_per_rank; ++j) out.push_back(device(process_index * devices_per_rank + j));
  return out;
}

std::string device_label(int device_id) { return "CPU " + std::to_string(device_id); }

}  // namespace shard
