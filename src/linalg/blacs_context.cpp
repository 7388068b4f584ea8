// The BLACS grids a mesh keeps with its communicators (MeshComms::blacs_context, declared in
// shard/comm/detail/mesh_comms.hpp). BLACS belongs to linalg (DESIGN.md "Layers"): the comm
// layer caches only an int handle and the function that frees it.

#include <functional>
#include <utility>

#include "shard/comm/detail/mesh_comms.hpp"
#include "shard/linalg/detail/scalapack_api.hpp"

namespace shard::detail {

namespace {

void exit_grid(int context) {
  if (context >= 0) scalapack_api::Cblacs_gridexit(context);  // -1: this rank is outside the grid
}

}  // namespace

int MeshComms::blacs_context(std::pair<int, int> key, const std::function<int()>& create) {
  return cached_handle("blacs", key, create, exit_grid);
}

}  // namespace shard::detail
