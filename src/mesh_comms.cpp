#include "shard/detail/mesh_comms.hpp"

#include <algorithm>

#include "mesh_state.hpp"
#include "shard/detail/scalapack_api.hpp"
#include "shard/error.hpp"
#include "shard/runtime.hpp"

namespace shard {

detail::MeshComms& Mesh::comms() const {
  std::lock_guard lock(state_->comms_mutex);
  if (!state_->comms)
    state_->comms = std::make_shared<detail::MeshComms>(state_->shape, state_->devices, state_->topology);
  return *state_->comms;
}

namespace detail {

MeshComms::~MeshComms() {
  if (!mpi::is_active()) return;
  for (const auto& [key, context] : blacs_)
    if (context >= 0) scalapack_api::Cblacs_gridexit(context);
}

int MeshComms::blacs_context(std::pair<int, int> key, const std::function<int()>& create) {
  std::lock_guard lock(mutex_);
  if (auto it = blacs_.find(key); it != blacs_.end()) return it->second;
  const int context = create();
  ++blacs_created_;
  return blacs_.emplace(key, context).first->second;
}

const std::vector<DeviceGroup>& MeshComms::groups(const std::vector<int>& axes) {
  std::lock_guard lock(mutex_);
  if (auto it = cache_.find(axes); it != cache_.end()) return it->second;
  return cache_.emplace(axes, build_groups(axes, true)).first->second;
}

const DeviceGroup& MeshComms::guard_group() {
  std::lock_guard lock(mutex_);
  if (!guard_built_) {
    std::vector<int> all(shape_.size());
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
    guard_ = build_groups(all, false);
    guard_built_ = true;
  }
  static const DeviceGroup kNone;  // this rank holds no device of the mesh
  return guard_.empty() ? kNone : guard_.front();
}

std::vector<DeviceGroup> MeshComms::build_groups(const std::vector<int>& axes, bool count) {
  const int nd = static_cast<int>(shape_.size());
  std::vector<bool> in_axes(static_cast<std::size_t>(nd), false);
  for (int a : axes) {
    if (a < 0 || a >= nd || in_axes[a]) raise<ShardingError>("MeshComms: bad or repeated axis position ", a);
    in_axes[a] = true;
  }
  // Group id and position inside the group of every device, from its mesh coordinates.
  std::map<int, std::vector<std::pair<int, int>>> members;  // group id -> (position, device)
  for (std::size_t f = 0; f < devices_.size(); ++f) {
    std::vector<int> c(static_cast<std::size_t>(nd));
    int rest = static_cast<int>(f);
    for (int i = nd - 1; i >= 0; --i) {
      c[i] = rest % shape_[i];
      rest /= shape_[i];
    }
    int gid = 0;
    for (int i = 0; i < nd; ++i)
      if (!in_axes[i]) gid = gid * shape_[i] + c[i];
    int pos = 0;
    for (int a : axes) pos = pos * shape_[a] + c[a];
    members[gid].emplace_back(pos, devices_[f]);
  }

  const int me = topology_.process_index;
  std::vector<DeviceGroup> out;
  const mpi::Communicator& world = Runtime::current().world();
  MPI_Group world_group = MPI_GROUP_NULL;
  mpi::check(MPI_Comm_group(world.get(), &world_group), "MPI_Comm_group");
  try {
    for (auto& [gid, list] : members) {
      std::sort(list.begin(), list.end());
      DeviceGroup g;
      g.id = gid;
      for (const auto& [pos, dev] : list) {
        g.devices.push_back(dev);
        const int r = topology_.owner(dev);
        if (std::find(g.ranks.begin(), g.ranks.end(), r) == g.ranks.end()) g.ranks.push_back(r);
      }
      if (std::find(g.ranks.begin(), g.ranks.end(), me) == g.ranks.end()) continue;
      if (g.ranks.size() > 1) {
        MPI_Group sub = MPI_GROUP_NULL;
        mpi::check(MPI_Group_incl(world_group, static_cast<int>(g.ranks.size()), g.ranks.data(), &sub),
                   "MPI_Group_incl");
        MPI_Comm c = MPI_COMM_NULL;
        const int rc = MPI_Comm_create_group(world.get(), sub, gid, &c);
        MPI_Group_free(&sub);
        mpi::check(rc, "MPI_Comm_create_group");
        g.comm = mpi::Communicator::adopt(c);
        mpi::check(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
        if (count) ++created_;
      }
      out.push_back(std::move(g));
    }
  } catch (...) {
    MPI_Group_free(&world_group);
    throw;
  }
  MPI_Group_free(&world_group);
  return out;
}

}  // namespace detail
}  // namespace shard
