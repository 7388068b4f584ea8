// Mesh construction, index math and make_mesh ordering on simulated topologies (no MPI).

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "shard/core/device.hpp"
#include "shard/error.hpp"
#include "shard/sharding/mesh.hpp"
#include "unit_util.hpp"

namespace shard {
namespace {

using unit::iota_ids;
using unit::thrown_message;



TEST(Topology, SimulatedDevices) {
  const Topology topo = Topology::simulated(4, 2, 1, {0, 0, 1, 1});
  EXPECT_EQ(topo.device_count(), 8);
  EXPECT_EQ(topo.owner(5), 2);
  EXPECT_TRUE(topo.is_local(2));
  EXPECT_TRUE(topo.is_local(3));
  EXPECT_FALSE(topo.is_local(4));
  const Device d = topo.device(7);
  EXPECT_EQ(d.id, 7);
  EXPECT_EQ(d.process_index, 3);
  EXPECT_EQ(d.local_index, 1);
  EXPECT_EQ(d.node_id, 1);
  const auto local = topo.local_devices();
  ASSERT_EQ(local.size(), 2u);
  EXPECT_EQ(local[0].id, 2);
  EXPECT_EQ(local[1].id, 3);
  EXPECT_EQ(topo.devices().size(), 8u);
  EXPECT_THROW(topo.device(8), ValueError);
  EXPECT_THROW(Topology::simulated(2, 1, 2), ValueError);
  EXPECT_THROW(Topology::simulated(2, 1, 0, {0}), ValueError);
  EXPECT_EQ(device_label(3), "CPU 3");
}

TEST(Mesh, BasicAccessors) {
  const Topology topo = Topology::simulated(4, 2, 1);
  const Mesh mesh({4, 2}, {"a", "b"}, iota_ids(8), topo);
  EXPECT_EQ(mesh.ndim(), 2);
  EXPECT_EQ(mesh.shape(), (std::vector<int>{4, 2}));
  EXPECT_EQ(mesh.axis_names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(mesh.size(), 8);
  EXPECT_EQ(mesh.axis_position("b"), 1);
  EXPECT_TRUE(mesh.has_axis("a"));
  EXPECT_FALSE(mesh.has_axis("c"));
  EXPECT_EQ(mesh.axis_size("a"), 4);
  EXPECT_EQ(mesh.axes_size(0), 1);
  EXPECT_EQ(mesh.axes_size(0b01), 4);
  EXPECT_EQ(mesh.axes_size(0b11), 8);
  EXPECT_EQ(mesh.mask_of({"b"}), 0b10u);
  EXPECT_EQ(mesh.mask_of({"b", "a"}), 0b11u);
  EXPECT_EQ(mesh.to_string(), "Mesh('a': 4, 'b': 2)");
  EXPECT_EQ(mesh.devices_string(), "[0, 1, 2, 3, 4, 5, 6, 7]");
  EXPECT_TRUE(mesh.topology() == topo);
}

TEST(Mesh, ShapeDeviceListMismatch) {
  const Topology topo = Topology::simulated(4, 2, 0);
  EXPECT_THROW(Mesh({4, 2}, {"a", "b"}, iota_ids(7), topo), ShardingError);
  EXPECT_THROW(Mesh({3, 2}, {"a", "b"}, iota_ids(8), topo), ShardingError);
  EXPECT_THROW(Mesh({8}, {"a", "b"}, iota_ids(8), topo), ShardingError);  // names vs axes
  EXPECT_THROW(Mesh({0, 2}, {"a", "b"}, {}, topo), ShardingError);
  EXPECT_THROW(Mesh({2}, {"a"}, {0, 8}, topo), ShardingError);  // device 8 does not exist
  EXPECT_THROW(Mesh({2}, {"a"}, {-1, 0}, topo), ShardingError);
  EXPECT_THROW(Mesh({2}, {"a"}, {3, 3}, topo), ShardingError);  // listed twice
  // A mesh over a subset of the devices is fine.
  EXPECT_NO_THROW(Mesh({2}, {"a"}, {5, 2}, topo));
}

TEST(Mesh, AxisNameErrors) {
  const Topology topo = Topology::simulated(4, 2, 0);
  const std::string dup = thrown_message<ShardingError>([&] { Mesh({4, 2}, {"x", "x"}, iota_ids(8), topo); });
  EXPECT_NE(dup.find("'x'"), std::string::npos) << dup;
  EXPECT_THROW(Mesh({4, 2}, {"a", ""}, iota_ids(8), topo), ShardingError);
  const Mesh mesh({4, 2}, {"a", "b"}, iota_ids(8), topo);
  const std::string unk = thrown_message<ShardingError>([&] { (void)mesh.axis_position("zz"); });
  EXPECT_NE(unk.find("'zz'"), std::string::npos) << unk;
  EXPECT_THROW((void)mesh.axis_size("zz"), ShardingError);
  EXPECT_THROW((void)mesh.mask_of({"a", "zz"}), ShardingError);
}

// Without MPI the rank prefix is "[rank ?] "; message() is the text without it.
TEST(Mesh, ErrorsCarryRankPrefix) {
  const Topology topo = Topology::simulated(2, 1, 0);
  try {
    Mesh({2}, {"a"}, {0}, topo);
    FAIL() << "no exception";
  } catch (const ShardingError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("[rank ?] ", 0), 0u) << what;
    EXPECT_EQ(what, "[rank ?] " + e.message());
    EXPECT_NE(e.message().find("Mesh"), std::string::npos) << e.message();
  }
  // Every Shard exception can be caught as shard::Error.
  EXPECT_THROW(Mesh({2}, {"a", "a"}, {0, 1}, topo), Error);
}

TEST(Mesh, CoordsDeviceAtRoundTrip) {
  const Topology topo = Topology::simulated(6, 2, 0);
  // A scrambled device order over a 3x2x2 mesh.
  const std::vector<int> ids = {7, 2, 11, 0, 5, 9, 1, 3, 10, 4, 8, 6};
  const Mesh mesh({3, 2, 2}, {"x", "y", "z"}, ids, topo);
  EXPECT_EQ(mesh.device_ids(), ids);
  for (int f = 0; f < 12; ++f) {
    const std::vector<int> expect = {f / 4, (f / 2) % 2, f % 2};  // row-major, first axis major
    const int d = ids[f];
    EXPECT_EQ(mesh.flat_index(d), f);
    EXPECT_TRUE(mesh.contains(d));
    EXPECT_EQ(mesh.coords(d), expect) << "device " << d;
    EXPECT_EQ(mesh.device_at(expect), d);
  }
  EXPECT_THROW(mesh.device_at({3, 0, 0}), ShardingError);
  EXPECT_THROW(mesh.device_at({0, 0}), ShardingError);
  EXPECT_THROW(mesh.device_at({0, -1, 0}), ShardingError);
}

TEST(Mesh, FlatIndexOutsideMesh) {
  const Topology topo = Topology::simulated(4, 2, 0);
  const Mesh mesh({2, 2}, {"a", "b"}, {6, 4, 2, 0}, topo);
  EXPECT_EQ(mesh.flat_index(6), 0);
  EXPECT_EQ(mesh.flat_index(0), 3);
  EXPECT_EQ(mesh.flat_index(1), -1);
  EXPECT_EQ(mesh.flat_index(-3), -1);
  EXPECT_EQ(mesh.flat_index(100), -1);
  EXPECT_FALSE(mesh.contains(7));
  EXPECT_THROW(mesh.coords(7), ShardingError);
}

TEST(Mesh, LocalDeviceIds) {
  // Rank 1 of 4 with 2 devices each owns devices 2 and 3; they are listed in mesh order.
  const Topology topo = Topology::simulated(4, 2, 1);
  const Mesh mesh({4, 2}, {"a", "b"}, {7, 3, 0, 4, 2, 1, 6, 5}, topo);
  EXPECT_EQ(mesh.local_device_ids(), (std::vector<int>{3, 2}));
  const Mesh sub({2}, {"a"}, {0, 4}, topo);
  EXPECT_TRUE(sub.local_device_ids().empty());
  for (int me = 0; me < 4; ++me) {
    const Topology t = Topology::simulated(4, 2, me);
    const Mesh m({8}, {"a"}, iota_ids(8), t);
    EXPECT_EQ(m.local_device_ids(), (std::vector<int>{2 * me, 2 * me + 1}));
  }
}

TEST(Mesh, Equality) {
  const Topology topo = Topology::simulated(4, 2, 0);
  const Mesh a({4, 2}, {"a", "b"}, iota_ids(8), topo);
  const Mesh a2({4, 2}, {"a", "b"}, iota_ids(8), topo);
  const Mesh copy = a;
  EXPECT_TRUE(a == a2);
  EXPECT_TRUE(a.same_state(a2));  // equal meshes share one state (and communicator cache)
  EXPECT_TRUE(copy.same_state(a));
  EXPECT_TRUE(copy == a);
  // Same devices, another order: not equal.
  const Mesh reordered({4, 2}, {"a", "b"}, {1, 0, 2, 3, 4, 5, 6, 7}, topo);
  EXPECT_FALSE(a == reordered);
  // Other names, other shape.
  EXPECT_FALSE(a == Mesh({4, 2}, {"a", "c"}, iota_ids(8), topo));
  EXPECT_FALSE(a == Mesh({2, 4}, {"a", "b"}, iota_ids(8), topo));
  EXPECT_FALSE(a == Mesh({8}, {"a"}, iota_ids(8), topo));
}

TEST(MakeMesh, SingleNodeIsIdentityOrder) {
  const Topology topo = Topology::simulated(4, 2, 0);
  const Mesh mesh = make_mesh({4, 2}, {"a", "b"}, topo);
  EXPECT_EQ(mesh.device_ids(), iota_ids(8));
  EXPECT_EQ(mesh.shape(), (std::vector<int>{4, 2}));
  EXPECT_EQ(mesh.axis_names(), (std::vector<std::string>{"a", "b"}));
}

TEST(MakeMesh, NodesAndRanksContiguous) {
  // Ranks 0 and 2 on node 0, ranks 1 and 3 on node 1.
  const std::vector<int> nodes_of = {0, 1, 0, 1};
  const Topology topo = Topology::simulated(4, 2, 0, nodes_of);
  const Mesh mesh = make_mesh({4, 2}, {"a", "b"}, topo);
  const auto& ids = mesh.device_ids();
  ASSERT_EQ(ids.size(), 8u);
  // Every device exactly once.
  EXPECT_EQ(std::set<int>(ids.begin(), ids.end()).size(), 8u);
  // The devices of one node form one contiguous run; so do those of one rank.
  auto contiguous_runs = [&](auto key) {
    std::map<int, int> runs;
    for (std::size_t i = 0; i < ids.size(); ++i)
      if (i == 0 || key(ids[i]) != key(ids[i - 1])) ++runs[key(ids[i])];
    for (const auto& [k, n] : runs) EXPECT_EQ(n, 1) << "key " << k << " appears in " << n << " runs";
    return runs.size();
  };
  EXPECT_EQ(contiguous_runs([&](int d) { return nodes_of[d / 2]; }), 2u);
  EXPECT_EQ(contiguous_runs([&](int d) { return d / 2; }), 4u);
  // The rank's devices sit together along the minor axis 'b': mesh row i is one rank.
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(topo.owner(mesh.device_at({i, 0})), topo.owner(mesh.device_at({i, 1})));
  // Within a rank, devices keep their local order; node 0 comes first, ranks ascend.
  EXPECT_EQ(ids, (std::vector<int>{0, 1, 4, 5, 2, 3, 6, 7}));
}

TEST(MakeMesh, ThreeNodesOneDevicePerRank) {
  const std::vector<int> nodes_of = {2, 0, 1, 0, 2, 1};
  const Topology topo = Topology::simulated(6, 1, 3, nodes_of);
  const Mesh mesh = make_mesh({3, 2}, {"node", "local"}, topo);
  // Each mesh row is one node (the minor axis stays on one host).
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(nodes_of[mesh.device_at({i, 0})], nodes_of[mesh.device_at({i, 1})]) << "row " << i;
  EXPECT_EQ(mesh.local_device_ids(), (std::vector<int>{3}));
}

TEST(MakeMesh, WrongDeviceCount) {
  const Topology topo = Topology::simulated(4, 2, 0);
  EXPECT_THROW(make_mesh({4, 4}, {"a", "b"}, topo), ShardingError);
  EXPECT_THROW(make_mesh({3}, {"a"}, topo), ShardingError);
  EXPECT_THROW(make_mesh({8}, {"a", "b"}, topo), ShardingError);
  EXPECT_NO_THROW(make_mesh({2, 2, 2}, {"x", "y", "z"}, topo));
}

}  // namespace
}  // namespace shard
