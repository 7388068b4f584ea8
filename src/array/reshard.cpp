// reshard: pick the cheapest rule from metadata, then run it.
//   kNone / kLocal   x[from] -> x[to] by local copies or slices, no communication
//   kAllGather       x[.., (A, a), ..] -> x[.., A, ..]     all_gather(a, tiled) of the blocks
//   kAllToAll        x[(A, a), (B)] -> x[A, (B, a)]        all_to_all(a, split=j, concat=i)
//   kGeneral         one MPI_Alltoallv (redistribute.hpp): each device receives exactly the
//                    intersections of its new box with the old boxes it does not hold, each
//                    from one holder (a holder on its own rank when there is one: then it is
//                    a local copy)
// Across meshes over the same devices, the old layout is first spelled on the new mesh when
// it can be (equivalent_sharding: no data moves), and the rules above apply; otherwise the
// local or general rule runs between the two meshes.

#include "shard/array/reshard.hpp"

#include <algorithm>
#include <climits>
#include <map>
#include <source_location>
#include <sstream>

#include "shard/array/driver.hpp"
#include "shard/comm/comm_stats.hpp"
#include "shard/comm/detail/collective.hpp"
#include "shard/comm/detail/mesh_comms.hpp"
#include "shard/core/trace.hpp"
#include "shard/error.hpp"
#include "shard/runtime/runtime.hpp"
#include "array/plan_cache.hpp"
#include "array/redistribute.hpp"

namespace shard {

namespace detail {

void check_same_mesh(const Mesh& a, const Mesh& b, const std::string& what) {
  if (a == b) return;
  raise<MeshMismatchError>(what, ": incompatible devices: one array is on device ids ", a.devices_string(), " (",
                           a.to_string(), ") and the other on device ids ", b.devices_string(), " (", b.to_string(),
                           "); put both on the same mesh (same devices in the same order) first");
}

void check_same_devices(const Mesh& a, const Mesh& b, const std::string& what) {
  if (a == b) return;
  std::vector<int> da = a.device_ids(), db = b.device_ids();
  std::sort(da.begin(), da.end());
  std::sort(db.begin(), db.end());
  if (da == db) return;
  auto list = [](const std::vector<int>& v) {
    std::string t = "[";
    for (std::size_t i = 0; i < v.size(); ++i) t += (i ? ", " : "") + std::to_string(v[i]);
    return t + "]";
  };
  raise<MeshMismatchError>(what, ": devices of all arrays should be the same: one array is on device ids ", list(da),
                           " (", a.to_string(), ") and another on device ids ", list(db), " (", b.to_string(),
                           "); put both on one set of devices first");
}

}  // namespace detail

namespace {

using Kind = ReshardPlan::Kind;

/// The kAllGather / kAllToAll shape of a spec change, if it has one: exactly one axis leaves
/// the minor end of entry i, and (all_to_all) joins the minor end of entry j.
bool single_axis_move(const PartitionSpec& from, const PartitionSpec& to, int rank, std::string& axis, int& i,
                      int& j) {
  i = j = -1;
  for (int d = 0; d < rank; ++d) {
    const auto& a = from[d].axes();
    const auto& b = to[d].axes();
    if (a == b) continue;
    if (a.size() == b.size() + 1 && std::equal(b.begin(), b.end(), a.begin()) && i < 0) {
      i = d;
      axis = a.back();
    } else if (b.size() == a.size() + 1 && std::equal(a.begin(), a.end(), b.begin()) && j < 0) {
      j = d;
    } else {
      return false;
    }
  }
  if (i < 0) return false;
  return j < 0 || to[j].axes().back() == axis;
}

/// Per-rank bytes of a collective over `axis` where each device contributes `per_device(r)`
/// bytes to every group with members on other ranks.
std::vector<std::int64_t> group_bytes(const Mesh& mesh, const std::string& axis, std::int64_t block_bytes,
                                      bool all_to_all) {
  const Topology& topo = mesh.topology();
  std::vector<std::int64_t> out(static_cast<std::size_t>(topo.process_count), 0);
  const int a = mesh.axis_position(axis);
  const int n = mesh.shape()[a];
  std::map<std::vector<int>, std::vector<int>> groups;  // other coords -> devices
  for (int d : mesh.device_ids()) {
    auto c = mesh.coords(d);
    c[a] = 0;
    groups[c].push_back(d);
  }
  for (const auto& [key, devs] : groups) {
    std::map<int, int> per_rank;
    for (int d : devs) ++per_rank[topo.owner(d)];
    if (per_rank.size() < 2) continue;
    for (const auto& [r, count] : per_rank) {
      if (all_to_all)  // each member sends one chunk (block / n) to every device on another rank
        out[r] += count * (n - count) * (block_bytes / n);
      else
        out[r] += count * block_bytes;
    }
  }
  return out;
}

/// The general plan's sources: every box of the old layout with the devices holding it.
std::vector<detail::SourcePiece> old_boxes(const Shape& shape, const NamedSharding& from) {
  std::vector<detail::SourcePiece> pieces;
  for (int d : from.mesh().device_ids()) pieces.push_back({d, 0, from.box(d, shape)});
  return pieces;
}

}  // namespace

std::int64_t ReshardPlan::total_bytes() const {
  std::int64_t t = 0;
  for (auto b : bytes_sent) t += b;
  return t;
}

std::string ReshardPlan::to_string() const {
  static const char* kNames[] = {"no change: copy the local shards", "local slices, no communication",
                                 "all_gather", "all_to_all", "one MPI_Alltoallv of box intersections"};
  std::ostringstream os;
  os << dtype << shard::to_string(shape) << " " << from << " -> " << to << ": " << kNames[static_cast<int>(kind)];
  if (kind == Kind::kAllGather) os << " over '" << axis << "' along dim " << dim;
  if (kind == Kind::kAllToAll) os << " over '" << axis << "' (split dim " << dim2 << ", concat dim " << dim << ")";
  if (kind == Kind::kGeneral) os << " (" << pieces << " pieces between ranks)";
  if (!translated.empty()) os << " [the source layout is " << translated << " on the target mesh]";
  const auto mx = bytes_sent.empty() ? 0 : *std::max_element(bytes_sent.begin(), bytes_sent.end());
  os << "; " << total_bytes() << " bytes sent in all, at most " << mx << " by one rank";
  return os.str();
}

namespace {

/// The plan of plan_reshard, computed (the cache below remembers it; no dtype label).
ReshardPlan compute_plan_reshard(const Shape& shape, const NamedSharding& from, const NamedSharding& to,
                                 std::size_t elem_size) {
  detail::check_same_devices(from.mesh(), to.mesh(), "reshard");
  from.check_shape(shape);
  to.check_shape(shape);
  const bool across = !(from.mesh() == to.mesh());
  if (across)
    if (auto eq = equivalent_sharding(from, shape, to.mesh())) {
      ReshardPlan p = compute_plan_reshard(shape, *eq, to, elem_size);
      p.from = from.spec().to_string() + " on " + from.mesh().to_string();
      p.translated = eq->spec().to_string();
      return p;
    }
  const Mesh& mesh = to.mesh();
  const Topology& topo = mesh.topology();
  ReshardPlan p;
  p.shape = shape;
  p.from = from.spec().to_string() + (across ? " on " + from.mesh().to_string() : "");
  p.to = to.spec().to_string();
  p.bytes_sent.assign(static_cast<std::size_t>(topo.process_count), 0);
  const int rank = static_cast<int>(shape.size());
  if (!across && from.spec() == to.spec()) return p;

  bool local = true;
  for (int d : mesh.device_ids()) {
    const Box a = from.box(d, shape);
    const Box b = to.box(d, shape);
    if (!b.empty() && intersect(a, b) != b) local = false;
  }
  if (local) {
    p.kind = Kind::kLocal;
    return p;
  }
  std::string axis;
  int i = -1, j = -1;
  // The collective rules run on equal blocks: every dim must split evenly in both layouts.
  bool even = true;
  for (int d = 0; d < rank; ++d)
    even = even && shape[d] % from.num_parts(d) == 0 && shape[d] % to.num_parts(d) == 0;
  if (!across && even && single_axis_move(from.spec(), to.spec(), rank, axis, i, j)) {
    const std::int64_t block = num_elements(from.shard_shape(shape)) * static_cast<std::int64_t>(elem_size);
    p.kind = j < 0 ? Kind::kAllGather : Kind::kAllToAll;
    p.axis = axis;
    p.dim = i;
    p.dim2 = j;
    p.bytes_sent = group_bytes(mesh, axis, block, j >= 0);
    return p;
  }
  p.kind = Kind::kGeneral;
  const auto plan = detail::plan_transfers(shape, to, old_boxes(shape, from));
  p.bytes_sent = detail::transfer_bytes(plan, topo, elem_size);
  for (const auto& t : plan) p.pieces += topo.owner(t.src) != topo.owner(t.dst);
  return p;
}

}  // namespace

namespace detail {

std::shared_ptr<const ReshardPlan> cached_plan_reshard(const Shape& shape, const NamedSharding& from,
                                                       const NamedSharding& to, std::size_t elem_size) {
  thread_local SignatureKey key;
  key.clear();
  key.add(shape);
  key.add(from);
  key.add(to);
  key.add(static_cast<std::int64_t>(elem_size));
  return reshard_plan_cache().get(key, [&] { return compute_plan_reshard(shape, from, to, elem_size); });
}

}  // namespace detail

ReshardPlan plan_reshard(const Shape& shape, const NamedSharding& from, const NamedSharding& to,
                         std::size_t elem_size, const std::string& dtype) {
  ReshardPlan p = *detail::cached_plan_reshard(shape, from, to, elem_size);
  p.dtype = dtype;
  return p;
}

namespace {

template <typename T>
ShardedArray<T> run_collective_rule(const ShardedArray<T>& x, const NamedSharding& to, const ReshardPlan& p) {
  const Shape block = x.sharding().shard_shape(x.shape());
  detail::CollectiveSpec spec =
      p.kind == Kind::kAllGather
          ? detail::all_gather_spec(x.mesh(), SpecEntry(p.axis), block, p.dim, true)
          : detail::all_to_all_spec(x.mesh(), SpecEntry(p.axis), block, p.dim2, p.dim, true);
  spec.name = "reshard";
  spec.dtype = dtype_name<T>();
  std::vector<const Tensor<T>*> ins;  // read in place: no copy of the shards
  std::vector<Tensor<T>> outs;
  std::vector<int> devices;
  for (const auto& s : x.addressable_shards()) {
    ins.push_back(&s.data);
    devices.push_back(s.device);
  }
  detail::execute_gather_like<T>(x.mesh(), spec, devices, ins, outs);
  std::vector<Shard<T>> shards;
  for (std::size_t k = 0; k < devices.size(); ++k)
    shards.push_back(Shard<T>{devices[k], to.box(devices[k], x.shape()), std::move(outs[k])});
  return ShardedArray<T>(x.shape(), to, std::move(shards));
}

template <typename T>
ShardedArray<T> run_general(const ShardedArray<T>& x, const NamedSharding& to) {
  const detail::FetchPiece<T> fetch = [&](int device, int, const Box& box, T* out) {
    const auto& src = x.shard_of(device);
    copy_box(src.data.data(), src.box.extent, src.box.offset, out, box.extent, box.offset, box, sizeof(T));
  };
  return detail::redistribute<T>(x.shape(), to, old_boxes(x.shape(), x.sharding()), fetch, "reshard");
}

/// x's shards in the local order of `to`'s mesh, relabelled with `to` (which gives every
/// device the box x's sharding gives it).
template <typename T>
ShardedArray<T> relabel(const ShardedArray<T>& x, const NamedSharding& to) {
  std::vector<Shard<T>> shards;
  for (int d : to.mesh().local_device_ids()) shards.push_back(x.shard_of(d));
  return ShardedArray<T>(x.shape(), to, std::move(shards));
}

}  // namespace

template <typename T>
ShardedArray<T> reshard(const ShardedArray<T>& x, const NamedSharding& to, shard::source_location where) {
  const detail::CallScope scope("reshard", where);
  return detail::bind_at(prim::Reshard{{}, std::make_shared<const NamedSharding>(to)}, where, x);
}

template <Dtype T>
ShardedArray<T> prim::Reshard::sharded(const ShardedArray<T>& x) const {
  const NamedSharding& to = *this->to;
  if (!(x.mesh() == to.mesh())) {
    detail::check_same_devices(x.mesh(), to.mesh(), "reshard");
    if (auto eq = equivalent_sharding(x.sharding(), x.shape(), to.mesh())) return reshard(relabel(x, *eq), to);
  }
  const std::shared_ptr<const ReshardPlan> plan = detail::cached_plan_reshard(x.shape(), x.sharding(), to, sizeof(T));
  const ReshardPlan& p = *plan;
  switch (p.kind) {
    case Kind::kNone:
      return ShardedArray<T>(x.shape(), to, x.addressable_shards());
    case Kind::kLocal: {
      std::vector<Shard<T>> shards;
      for (int d : to.mesh().local_device_ids()) {
        const Shard<T>& s = x.shard_of(d);
        Box b = to.box(s.device, x.shape());
        Box rel{Shape(b.offset.size()), b.extent};
        for (std::size_t k = 0; k < b.offset.size(); ++k) rel.offset[k] = b.offset[k] - s.box.offset[k];
        shards.push_back(Shard<T>{s.device, b, b.empty() ? Tensor<T>(b.extent) : s.data.slice(rel)});
      }
      return ShardedArray<T>(x.shape(), to, std::move(shards));
    }
    case Kind::kAllGather:
    case Kind::kAllToAll:
      return run_collective_rule(x, to, p);
    case Kind::kGeneral:
      break;
  }
  return run_general(x, to);
}

namespace detail {

namespace {

/// An all_gather in flight: its blocks arrive in `outs`.
template <typename T>
struct GatherInFlight final : InFlight {
  GatherInFlight(Shape shape_, NamedSharding to_) : shape(std::move(shape_)), to(std::move(to_)) {}
  bool test() override { return pending.test(); }
  std::any finish() override {
    pending.wait();
    std::vector<Shard<T>> shards;
    for (std::size_t k = 0; k < devices.size(); ++k)
      shards.push_back(Shard<T>{devices[k], to.box(devices[k], shape), std::move((*outs)[k])});
    return std::any(ShardedArray<T>(shape, to, std::move(shards)));
  }
  Shape shape;
  NamedSharding to;
  std::vector<int> devices;
  std::shared_ptr<std::vector<Tensor<T>>> outs = std::make_shared<std::vector<Tensor<T>>>();
  PendingCollective pending;  // declared last: completes (or drains) before the buffers go
};

/// A reshard that ran when started.
struct DoneInFlight final : InFlight {
  explicit DoneInFlight(std::any x_) : x(std::move(x_)) {}
  bool test() override { return true; }
  std::any finish() override { return std::move(x); }
  std::any x;
};

}  // namespace

template <typename T>
std::shared_ptr<InFlight> start_reshard(const ShardedArray<T>& x, const NamedSharding& to) {
  if (x.mesh() == to.mesh()) {
    const std::shared_ptr<const ReshardPlan> plan =
        cached_plan_reshard(x.shape(), x.sharding(), to, sizeof(T));
    if (plan->kind == Kind::kAllGather) {
      auto f = std::make_shared<GatherInFlight<T>>(x.shape(), to);
      CollectiveSpec spec = all_gather_spec(x.mesh(), SpecEntry(plan->axis),
                                            x.sharding().shard_shape(x.shape()), plan->dim, true);
      spec.name = "reshard";
      spec.dtype = dtype_name<T>();
      std::vector<Tensor<T>> ins;
      for (const auto& sh : x.addressable_shards()) {
        ins.push_back(sh.data.alias());
        f->devices.push_back(sh.device);
      }
      f->pending = start_all_gather<T>(x.mesh(), spec, f->devices, std::move(ins), f->outs);
      return f;
    }
  }
  return std::make_shared<DoneInFlight>(std::any(reshard(x, to)));
}

}  // namespace detail

#define SHARD_INSTANTIATE_RESHARD(T)                                                                         \
  template ShardedArray<T> reshard<T>(const ShardedArray<T>&, const NamedSharding&, shard::source_location); \
  template ShardedArray<T> prim::Reshard::sharded<T>(const ShardedArray<T>&) const;                          \
  template std::shared_ptr<detail::InFlight> detail::start_reshard<T>(const ShardedArray<T>&,                \
                                                                      const NamedSharding&);
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_RESHARD)
#undef SHARD_INSTANTIATE_RESHARD

}  // namespace shard
