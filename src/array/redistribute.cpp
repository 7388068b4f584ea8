// Redistribution of box pieces: plan (identical on every rank, from metadata), pack what goes
// to other ranks, one MPI_Alltoallv, unpack; transfers inside a rank are direct copies.

#include "shard/core/time_split.hpp"
#include "shard/core/timeline.hpp"
#include "array/redistribute.hpp"

#include <algorithm>
#include <map>

#include "shard/comm/detail/comm_verbs.hpp"
#include "shard/error.hpp"

namespace shard::detail {

std::vector<Transfer> plan_transfers(const Shape& shape, const NamedSharding& to, const std::vector<SourcePiece>& pieces) {
  const Topology& topo = to.mesh().topology();
  std::map<std::pair<int, Box>, std::vector<int>> holders;  // (source, box) -> devices, in listing order
  for (const auto& p : pieces)
    if (!p.box.empty()) holders[{p.source, p.box}].push_back(p.device);
  std::vector<Transfer> plan;
  std::map<std::pair<int, Box>, bool> received;  // (rank, target box) already covered
  int k = 0;
  for (int d : to.mesh().device_ids()) {
    const Box target = to.box(d, shape);
    if (target.empty() || !received.emplace(std::make_pair(topo.owner(d), target), true).second) continue;
    for (const auto& [key, hs] : holders) {
      const Box part = intersect(target, key.second);
      if (part.empty()) continue;
      int src = -1;
      if (std::find(hs.begin(), hs.end(), d) != hs.end()) src = d;
      for (int h : hs)
        if (src < 0 && topo.owner(h) == topo.owner(d)) src = h;
      if (src < 0) src = hs[static_cast<std::size_t>(k) % hs.size()];  // spread the load over replicas
      plan.push_back({src, d, key.first, part});
    }
    ++k;
  }
  return plan;
}

std::vector<std::int64_t> transfer_bytes(const std::vector<Transfer>& plan, const Topology& topo, std::size_t elem_size) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(topo.process_count), 0);
  for (const auto& t : plan) {
    const int rs = topo.owner(t.src);
    if (rs != topo.owner(t.dst)) out[rs] += t.box.size() * static_cast<std::int64_t>(elem_size);
  }
  return out;
}

template <typename T>
ShardedArray<T> redistribute(const Shape& shape, const NamedSharding& to, const std::vector<SourcePiece>& pieces,
                             const FetchPiece<T>& fetch, const std::string& name, bool zero_fill) {
  const Mesh& mesh = to.mesh();
  const Topology& topo = mesh.topology();
  const int me = topo.process_index;
  const int ranks = topo.process_count;
  // Every rank takes part in one exchange (even with nothing to send): check it is this one.
  const CommOp op{name, cat(dtype_name<T>(), to_string(shape), " to ", to.to_string())};
  check_transfer(op);
  const auto plan = plan_transfers(shape, to, pieces);

  std::vector<Shard<T>> shards;
  for (int d : mesh.local_device_ids()) {
    Box b = to.box(d, shape);
    shards.push_back(Shard<T>{d, b, zero_fill ? Tensor<T>(b.extent, T(0)) : Tensor<T>(b.extent)});
  }
  auto shard_of = [&](int d) -> Shard<T>& {
    for (auto& s : shards)
      if (s.device == d) return s;
    raise<Error>(name, ": device ", d, " is not local");
  };
  auto place = [&](const T* src, const Box& box, Shard<T>& dst) {
    copy_box(src, box.extent, box.offset, dst.data.data(), dst.box.extent, dst.box.offset, box, sizeof(T));
  };

  // Counts per rank pair, in plan order (the same order on every rank).
  std::vector<std::int64_t> scount(ranks, 0), rcount(ranks, 0);
  bool any_remote = false;
  for (const auto& t : plan) {
    const int rs = topo.owner(t.src), rd = topo.owner(t.dst);
    if (rs == rd) continue;
    any_remote = true;
    if (rs == me) scount[rd] += t.box.size();
    if (rd == me) rcount[rs] += t.box.size();
  }
  std::vector<int> sc(ranks), sd(ranks), rc(ranks), rd(ranks);
  std::int64_t st = 0, rt = 0;
  for (int r = 0; r < ranks; ++r) {
    sc[r] = mpi::int_count(scount[r], "elements between two ranks", name);
    sd[r] = mpi::int_count(st, "elements between two ranks", name);
    rc[r] = mpi::int_count(rcount[r], "elements between two ranks", name);
    rd[r] = mpi::int_count(rt, "elements between two ranks", name);
    st += scount[r];
    rt += rcount[r];
  }
  Tensor<T> send({st});
  std::vector<std::int64_t> soff(sd.begin(), sd.end());
  Tensor<T> tmp;
  for (const auto& t : plan) {  // pack what goes to other ranks; copy what stays here
    const int rs = topo.owner(t.src), rdst = topo.owner(t.dst);
    if (rs != me) continue;
    if (rdst == me) {
      if (tmp.size() < t.box.size()) tmp = Tensor<T>({t.box.size()});
      fetch(t.src, t.source, t.box, tmp.data());
      place(tmp.data(), t.box, shard_of(t.dst));
    } else {
      fetch(t.src, t.source, t.box, send.data() + soff[rdst]);
      soff[rdst] += t.box.size();
    }
  }
  if (any_remote) {
    Tensor<T> recv({rt});
    const ScopedTime timed(TimeKind::kCommunication);
    const TimelineScope traced("collective", "reshard (alltoallv)");
    alltoallv(world_group(), op, send.data(), sc, sd, recv.data(), rc, rd, st * static_cast<std::int64_t>(sizeof(T)));
    std::vector<std::int64_t> roff(rd.begin(), rd.end());
    for (const auto& t : plan) {
      const int rs = topo.owner(t.src), rdst = topo.owner(t.dst);
      if (rdst != me || rs == me) continue;
      place(recv.data() + roff[rs], t.box, shard_of(t.dst));
      roff[rs] += t.box.size();
    }
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

#define SHARD_INSTANTIATE_REDISTRIBUTE(T)                                                                    \
  template ShardedArray<T> redistribute<T>(const Shape&, const NamedSharding&, const std::vector<SourcePiece>&, \
                                           const FetchPiece<T>&, const std::string&, bool);
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_REDISTRIBUTE)
#undef SHARD_INSTANTIATE_REDISTRIBUTE

}  // namespace shard::detail
