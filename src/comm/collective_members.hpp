#pragma once
// The members of a device group on this rank (comm layer internals, shared by the blocking
// collectives and the nonblocking ones), and the placement of chunks by group position.

#include <cstdint>
#include <vector>

#include "shard/comm/detail/collective.hpp"
#include "shard/comm/detail/mesh_comms.hpp"
#include "shard/core/box.hpp"
#include "shard/core/tensor.hpp"
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

/// Positions of the group owned by each of its ranks (in communicator order).
inline std::vector<std::vector<int>> positions_by_rank(const DeviceGroup& g, const Topology& topo) {
  std::vector<std::vector<int>> out(g.ranks.size());
  for (int p = 0; p < static_cast<int>(g.devices.size()); ++p) {
    const int owner = topo.owner(g.devices[p]);
    for (std::size_t r = 0; r < g.ranks.size(); ++r)
      if (g.ranks[r] == owner) out[r].push_back(p);
  }
  return out;
}

/// The box of chunk `p` along `dim` of a `shape` array cut into chunks of `extent`.
inline Box chunk_box(const Shape& shape, int dim, std::int64_t extent, int p) {
  Box b = full_box(shape);
  b.offset[dim] = p * extent;
  b.extent[dim] = extent;
  return b;
}

template <typename T>
void copy_in(const T* src, const Shape& src_shape, const Box& b, Tensor<T>& out) {
  copy_box(src, src_shape, b.offset, out.data(), out.shape(), Shape(out.shape().size(), 0), b, sizeof(T));
}

}  // namespace shard::detail
