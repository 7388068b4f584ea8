// Calling MPI yourself next to Shard (shard/spmd/interop.hpp).

#include "shard/spmd/interop.hpp"

#include <string>
#include <vector>

#include "shard/comm/detail/mesh_comms.hpp"
#include "shard/error.hpp"

namespace shard {

MPI_Comm axis_communicator(const Mesh& mesh, const Axes& axes) {
  std::vector<int> positions;
  for (const auto& a : axes.axes()) positions.push_back(mesh.axis_position(a));
  const auto& groups = mesh.comms().groups(positions);
  const std::string named = detail::cat("axis_communicator(", mesh.to_string(), ", ", axes.to_string(), ")");
  if (groups.size() != 1)
    raise<ValueError>(named, ": this rank holds devices of ", groups.size(),
                      " groups along those axes; a communicator serves one group (use shard_map)");
  const auto& g = groups.front();
  if (g.comm.is_null()) return MPI_COMM_NULL;
  if (g.ranks.size() != g.devices.size())
    raise<ValueError>(named, ": the group's ", g.devices.size(), " devices live on ", g.ranks.size(),
                      " ranks; the communicator has one rank per device only with one device per rank along "
                      "those axes (use shard_map)");
  return g.comm.get();
}

}  // namespace shard
