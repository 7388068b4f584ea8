#pragma once
// The members of a device group on this rank (comm layer internals, shared by the blocking
// collectives and the nonblocking row sums).

#include <cstdint>
#include <vector>

#include "shard/comm/detail/collective.hpp"
#include "shard/comm/detail/mesh_comms.hpp"
#include "shard/mpi/communicator.hpp"

namespace shard::detail {

struct Member {
  int local;  // index into devices / ins / outs
  int pos;    // position in the group (axis index over spec.axes)
};

/// This rank's devices in the group, by position.
inline std::vector<Member> members_of(const DeviceGroup& g, const std::vector<int>& devices) {
  std::vector<Member> out;
  for (int p = 0; p < static_cast<int>(g.devices.size()); ++p)
    for (int l = 0; l < static_cast<int>(devices.size()); ++l)
      if (devices[l] == g.devices[p]) out.push_back({l, p});
  return out;
}

/// MPI's int count (mpi::int_count), or a ValueError naming the collective and its axes.
inline int count_of(std::int64_t n, const CollectiveSpec& s) {
  return mpi::int_count(n, "elements in one MPI call", s.name, " over ", s.axes_text);
}

}  // namespace shard::detail
