#include "shard/comm/detail/mesh_comms.hpp"

#include <algorithm>
#include <cstring>

#include "comm/collective_shared.hpp"
#include "shard/error.hpp"
#include "shard/runtime/runtime.hpp"
#include "sharding/mesh_state.hpp"

namespace shard {

detail::MeshComms& Mesh::comms() const {
  (void)st();  // ValueError for an empty mesh
  std::lock_guard lock(state_->comms_mutex);
  if (!state_->comms)
    state_->comms = std::make_shared<detail::MeshComms>(state_->shape, state_->devices, state_->topology);
  return *state_->comms;
}

namespace detail {

MeshComms::MeshComms(std::vector<int> shape, std::vector<int> devices, Topology topology)
    : shape_(std::move(shape)), devices_(std::move(devices)), topology_(std::move(topology)) {
  std::vector<int> owners;
  for (int d : devices_) owners.push_back(topology_.owner(d));
  std::sort(owners.begin(), owners.end());
  ranks_ = static_cast<int>(std::unique(owners.begin(), owners.end()) - owners.begin());
}

MeshComms::~MeshComms() {
  forget_shared_calls(this);
  if (!mpi::is_active()) return;
  for (auto& [key, w] : windows_) {  // collective over each window's group (see group_shared.hpp)
    MPI_Win_unlock_all(w->win);
    MPI_Win_free(&w->win);
  }
  for (const auto& [key, h] : handles_) h.release(h.value);
}

int MeshComms::cached_handle(const std::string& kind, std::pair<int, int> key,
                             const std::function<int()>& create, void (*release)(int)) {
  std::lock_guard lock(mutex_);
  auto k = std::make_pair(kind, key);
  if (auto it = handles_.find(k); it != handles_.end()) return it->second.value;
  const int value = create();
  return handles_.emplace(std::move(k), Handle{value, release}).first->second.value;
}

int MeshComms::handles_created(const std::string& kind) const {
  std::lock_guard lock(mutex_);
  return static_cast<int>(
      std::count_if(handles_.begin(), handles_.end(), [&](const auto& h) { return h.first.first == kind; }));
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

bool MeshComms::groups_share_node(const std::vector<int>& axes) {
  {
    std::lock_guard lock(mutex_);
    if (auto it = share_node_.find(axes); it != share_node_.end()) return it->second;
  }
  const int me = topology_.process_index;
  const auto mine =
      std::count_if(devices_.begin(), devices_.end(), [&](int d) { return topology_.owner(d) == me; });
  bool ok = mine == 1;
  if (mine > 0)  // the groups' properties are the same on all their ranks, so the splits match
    for (const auto& g : groups(axes)) {
      if (g.devices.size() == 1) continue;  // a group of one: memory of its own (MPI_COMM_SELF)
      if (g.comm.is_null() || g.ranks.size() != g.devices.size()) {
        ok = false;
        continue;
      }
      if (g.comm.split_shared().size() != g.comm.size()) ok = false;
    }
  const DeviceGroup& all = guard_group();  // every rank of the mesh agrees
  if (mine > 0 && !all.comm.is_null()) ok = all.comm.allreduce<int>(ok ? 1 : 0, MPI_MIN) != 0;
  std::lock_guard lock(mutex_);
  share_node_[axes] = ok;
  return ok;
}

SharedWindow& MeshComms::shared_window(const std::vector<int>& axes, const std::string& name,
                                       std::size_t bytes) {
  const auto key = std::make_tuple(axes, name, bytes);
  {
    std::lock_guard lock(mutex_);
    if (auto it = windows_.find(key); it != windows_.end()) return *it->second;
  }
  if (!groups_share_node(axes))
    raise<ShardingError>("group-shared memory '", name,
                         "' is not available on this mesh (it needs one device per rank ",
                         "and every rank of the group on one node; check shard::group_shared_available)");
  const DeviceGroup& g = groups(axes).front();
  const bool alone = g.devices.size() == 1;
  const MPI_Comm comm = alone ? MPI_COMM_SELF : g.comm.get();
  // Every slot the same size: a mismatch is a clear error on every rank of the group, not a
  // silent overrun.
  if (!alone) {
    const auto lo = g.comm.allreduce<std::uint64_t>(bytes, MPI_MIN);
    const auto hi = g.comm.allreduce<std::uint64_t>(bytes, MPI_MAX);
    if (lo != hi)
      raise<ValueError>("group-shared memory '", name,
                        "': the devices of a group asked for different sizes (", lo, " to ", hi,
                        " bytes per slot)");
  }
  auto w = std::make_unique<SharedWindow>();
  w->bytes = bytes;
  w->axes = axes;
  w->index = alone ? 0 : g.comm.rank();
  // One segment on the group's first rank holds every slot, back to back, so the slots form
  // one array (GroupShared::stacked) whatever layout the MPI library would pick per rank.
  const int n = alone ? 1 : g.comm.size();
  const MPI_Aint size = w->index == 0 ? static_cast<MPI_Aint>(bytes) * n : 0;
  void* base = nullptr;
  mpi::check(MPI_Win_allocate_shared(size, 1, MPI_INFO_NULL, comm, &base, &w->win),
             "MPI_Win_allocate_shared");
  mpi::check(MPI_Win_lock_all(MPI_MODE_NOCHECK, w->win), "MPI_Win_lock_all");
  MPI_Aint sz = 0;
  int disp = 0;
  char* first = nullptr;
  mpi::check(MPI_Win_shared_query(w->win, 0, &sz, &disp, &first), "MPI_Win_shared_query");
  w->base = first;
  w->size = n;
  // Every slot starts zeroed (counters kept in a window start at 0): each member its own, then
  // the group's barrier (collective_async.cpp's gathers keep their counters in a window).
  std::memset(w->base + static_cast<std::size_t>(w->index) * bytes, 0, bytes);
  mpi::check(MPI_Win_sync(w->win), "MPI_Win_sync");
  mpi::check(MPI_Barrier(comm), "MPI_Barrier");
  mpi::check(MPI_Win_sync(w->win), "MPI_Win_sync");
  std::lock_guard lock(mutex_);
  return *windows_.emplace(key, std::move(w)).first->second;
}

void MeshComms::sync_windows(const std::vector<int>& axes) {
  std::lock_guard lock(mutex_);
  for (const auto& [key, w] : windows_)
    if (w->axes == axes) mpi::check(MPI_Win_sync(w->win), "MPI_Win_sync");
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
