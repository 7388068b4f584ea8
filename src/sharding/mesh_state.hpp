#pragma once
// The shared state behind Mesh handles (internal).

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "shard/sharding/mesh.hpp"

namespace shard {

struct Mesh::State {
  std::vector<int> shape;
  std::vector<std::string> names;
  std::vector<int> devices;     // row-major mesh order
  std::vector<int> flat_of;     // device id -> flat index, -1 when not in the mesh
  Topology topology;
  std::mutex comms_mutex;
  std::shared_ptr<detail::MeshComms> comms;  // created by the comm layer on first use
};

}  // namespace shard
