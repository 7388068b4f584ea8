// reshard: pick the cheapest rule from metadata, then run it.
//   kNone / kLocal   x[from] -> x[to] by local copies or slices, no communication
//   kAllGather       x[.., (A, a), ..] -> x[.., A, ..]     all_gather(a, tiled) of the blocks
//   kAllToAll        x[(A, a), (B)] -> x[A, (B, a)]        all_to_all(a, split=j, concat=i)
//   kGeneral         one MPI_Alltoallv: each device receives exactly the intersections of its
//                    new box with the old boxes it does not hold, each from one holder (a
//                    holder on its own rank when there is one: then it is a local copy)

#include "shard/reshard.hpp"

#include <algorithm>
#include <climits>
#include <map>
#include <sstream>

#include "shard/comm_stats.hpp"
#include "shard/detail/collective.hpp"
#include "shard/detail/mesh_comms.hpp"
#include "shard/error.hpp"
#include "shard/runtime.hpp"

namespace shard {

namespace detail {

void check_same_mesh(const Mesh& a, const Mesh& b, const std::string& what) {
  if (a == b) return;
  raise<MeshMismatchError>(what, ": incompatible devices: one array is on device ids ", a.devices_string(), " (",
                           a.to_string(), ") and the other on device ids ", b.devices_string(), " (", b.to_string(),
                           "); put both on the same mesh (same devices in the same order) first");
}

}  // namespace detail

namespace {

using Kind = ReshardPlan::Kind;

/// A piece of the general plan: the part `box` of the array moves from device src to dst.
struct Piece {
  int src;
  int dst;
  Box box;
};

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

/// The general plan's pieces, identical on every rank. Target devices whose box another
/// device of the same rank already receives get nothing: they copy it locally afterwards.
std::vector<Piece> general_pieces(const Shape& shape, const NamedSharding& from, const NamedSharding& to) {
  const Mesh& mesh = from.mesh();
  const Topology& topo = mesh.topology();
  std::map<Box, std::vector<int>> holders;  // old box -> devices holding it, mesh order
  for (int d : mesh.device_ids()) {
    Box b = from.box(d, shape);
    if (!b.empty()) holders[b].push_back(d);
  }
  std::vector<Piece> pieces;
  std::map<std::pair<int, Box>, bool> received;  // (rank, new box) already covered
  int k = 0;
  for (int d : mesh.device_ids()) {
    const Box target = to.box(d, shape);
    if (target.empty() || !received.emplace(std::make_pair(topo.owner(d), target), true).second) continue;
    for (const auto& [box, hs] : holders) {
      const Box part = intersect(target, box);
      if (part.empty()) continue;
      int src = -1;
      if (std::find(hs.begin(), hs.end(), d) != hs.end()) src = d;
      for (int h : hs)
        if (src < 0 && topo.owner(h) == topo.owner(d)) src = h;
      if (src < 0) src = hs[static_cast<std::size_t>(k) % hs.size()];  // spread the load over replicas
      pieces.push_back({src, d, part});
    }
    ++k;
  }
  return pieces;
}

int mpi_int(std::int64_t n) {
  if (n > INT_MAX) raise<ValueError>("reshard: ", n, " elements between two ranks exceed MPI's int count limit");
  return static_cast<int>(n);
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
  const auto mx = bytes_sent.empty() ? 0 : *std::max_element(bytes_sent.begin(), bytes_sent.end());
  os << "; " << total_bytes() << " bytes sent in all, at most " << mx << " by one rank";
  return os.str();
}

ReshardPlan plan_reshard(const Shape& shape, const NamedSharding& from, const NamedSharding& to,
                         std::size_t elem_size, const std::string& dtype) {
  detail::check_same_mesh(from.mesh(), to.mesh(), "reshard");
  from.check_shape(shape);
  to.check_shape(shape);
  const Mesh& mesh = from.mesh();
  const Topology& topo = mesh.topology();
  ReshardPlan p;
  p.shape = shape;
  p.dtype = dtype;
  p.from = from.spec().to_string();
  p.to = to.spec().to_string();
  p.bytes_sent.assign(static_cast<std::size_t>(topo.process_count), 0);
  const int rank = static_cast<int>(shape.size());
  if (from.spec() == to.spec()) return p;

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
  if (even && single_axis_move(from.spec(), to.spec(), rank, axis, i, j)) {
    const std::int64_t block = num_elements(from.shard_shape(shape)) * static_cast<std::int64_t>(elem_size);
    p.kind = j < 0 ? Kind::kAllGather : Kind::kAllToAll;
    p.axis = axis;
    p.dim = i;
    p.dim2 = j;
    p.bytes_sent = group_bytes(mesh, axis, block, j >= 0);
    return p;
  }
  p.kind = Kind::kGeneral;
  for (const auto& pc : general_pieces(shape, from, to)) {
    const int rs = topo.owner(pc.src);
    if (rs == topo.owner(pc.dst)) continue;
    p.bytes_sent[rs] += pc.box.size() * static_cast<std::int64_t>(elem_size);
    ++p.pieces;
  }
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
  const Mesh& mesh = x.mesh();
  const Topology& topo = mesh.topology();
  const Shape& shape = x.shape();
  const int me = topo.process_index;
  const int ranks = topo.process_count;
  const auto pieces = general_pieces(shape, x.sharding(), to);

  std::vector<Shard<T>> shards;
  for (int d : mesh.local_device_ids()) {
    Box b = to.box(d, shape);
    shards.push_back(Shard<T>{d, b, Tensor<T>(b.extent)});
  }
  auto shard_of = [&](int d) -> Shard<T>& {
    for (auto& s : shards)
      if (s.device == d) return s;
    raise<Error>("reshard: device ", d, " is not local");
  };

  // Counts per rank pair, in piece order (the same order on every rank).
  std::vector<std::int64_t> scount(ranks, 0), rcount(ranks, 0);
  for (const auto& pc : pieces) {
    const int rs = topo.owner(pc.src), rd = topo.owner(pc.dst);
    if (rs == rd) continue;
    if (rs == me) scount[rd] += pc.box.size();
    if (rd == me) rcount[rs] += pc.box.size();
  }
  std::vector<int> sc(ranks), sd(ranks), rc(ranks), rd(ranks);
  std::int64_t st = 0, rt = 0;
  for (int r = 0; r < ranks; ++r) {
    sc[r] = mpi_int(scount[r]);
    sd[r] = mpi_int(st);
    rc[r] = mpi_int(rcount[r]);
    rd[r] = mpi_int(rt);
    st += scount[r];
    rt += rcount[r];
  }
  Tensor<T> send({st});
  std::vector<std::int64_t> soff(sd.begin(), sd.end());
  for (const auto& pc : pieces) {  // pack what goes to other ranks; copy what stays here
    const int rs = topo.owner(pc.src), rdst = topo.owner(pc.dst);
    if (rs != me) continue;
    const auto& src = x.shard_of(pc.src);
    if (rdst == me) {
      auto& dst = shard_of(pc.dst);
      copy_box(src.data.data(), src.box.extent, src.box.offset, dst.data.data(), dst.box.extent, dst.box.offset,
               pc.box, sizeof(T));
    } else {
      copy_box(src.data.data(), src.box.extent, src.box.offset, send.data() + soff[rdst], pc.box.extent,
               pc.box.offset, pc.box, sizeof(T));
      soff[rdst] += pc.box.size();
    }
  }
  Tensor<T> recv({rt});
  const auto& world = Runtime::current().world();
  mpi::check(MPI_Alltoallv(send.data(), sc.data(), sd.data(), mpi::datatype<T>(), recv.data(), rc.data(), rd.data(),
                           mpi::datatype<T>(), world.get()),
             "MPI_Alltoallv");
  if (st > 0) comm_stats().record("reshard", "", st * static_cast<std::int64_t>(sizeof(T)));
  std::vector<std::int64_t> roff(rd.begin(), rd.end());
  for (const auto& pc : pieces) {
    const int rs = topo.owner(pc.src), rdst = topo.owner(pc.dst);
    if (rdst != me || rs == me) continue;
    auto& dst = shard_of(pc.dst);
    copy_box(recv.data() + roff[rs], pc.box.extent, pc.box.offset, dst.data.data(), dst.box.extent, dst.box.offset,
             pc.box, sizeof(T));
    roff[rs] += pc.box.size();
  }
  // Devices of this rank that share a new box with an earlier one copy it.
  for (std::size_t a = 0; a < shards.size(); ++a)
    for (std::size_t b = 0; b < a; ++b)
      if (shards[b].box == shards[a].box) {
        shards[a].data = shards[b].data;
        break;
      }
  return ShardedArray<T>(shape, to, std::move(shards));
}

}  // namespace

template <typename T>
ShardedArray<T> reshard(const ShardedArray<T>& x, const NamedSharding& to) {
  const ReshardPlan p = reshard_plan(x, to);
  switch (p.kind) {
    case Kind::kNone:
      return ShardedArray<T>(x.shape(), to, x.addressable_shards());
    case Kind::kLocal: {
      std::vector<Shard<T>> shards;
      for (const auto& s : x.addressable_shards()) {
        Box b = to.box(s.device, x.shape());
        Box rel{Shape(b.offset.size()), b.extent};
        for (std::size_t d = 0; d < b.offset.size(); ++d) rel.offset[d] = b.offset[d] - s.box.offset[d];
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

template ShardedArray<float> reshard<float>(const ShardedArray<float>&, const NamedSharding&);
template ShardedArray<double> reshard<double>(const ShardedArray<double>&, const NamedSharding&);
template ShardedArray<std::int32_t> reshard<std::int32_t>(const ShardedArray<std::int32_t>&, const NamedSharding&);
template ShardedArray<std::int64_t> reshard<std::int64_t>(const ShardedArray<std::int64_t>&, const NamedSharding&);

}  // namespace shard
