// Group-shared memory (group_shared.hpp): availability, what every device of a group reads
// after a barrier against a host reference, the stacked layout, several rounds through one
// buffer, the window cache, and the errors (several devices per rank, sizes that differ).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "mpi_test.hpp"
#include "shard/comm/detail/mesh_comms.hpp"
#include "test_util.hpp"

namespace shard::testing {
namespace {

/// The devices of `device`'s group over the mesh axes at positions `axes`, in axis-index
/// order (row-major over those axes).
std::vector<int> group_of(const Mesh& mesh, int device, const std::vector<int>& axes) {
  std::vector<int> c = mesh.coords(device);
  int n = 1;
  for (int a : axes) n *= mesh.shape()[a];
  std::vector<int> out;
  for (int i = 0; i < n; ++i) {
    int rest = i;
    for (auto it = axes.rbegin(); it != axes.rend(); ++it) {
      c[*it] = rest % mesh.shape()[*it];
      rest /= mesh.shape()[*it];
    }
    out.push_back(mesh.device_at(c));
  }
  return out;
}

/// What device d writes in round r: random, different for every device and round.
Tensor<double> contribution(int d, int round, std::int64_t count) {
  return random_tensor<double>({count}, 9000 + 131 * static_cast<std::uint64_t>(d) + static_cast<std::uint64_t>(round));
}

struct Case {
  std::vector<int> shape;
  std::vector<std::string> names;
  Axes axes;
  std::vector<int> positions;
};

std::vector<Case> cases(int devices) {
  std::vector<Case> out{{{devices}, {"a"}, "a", {0}}};
  for (const auto& f : factorisations(devices, 2)) {
    out.push_back({f, {"a", "b"}, "a", {0}});
    out.push_back({f, {"a", "b"}, "b", {1}});
    out.push_back({f, {"a", "b"}, Axes({"a", "b"}), {0, 1}});
  }
  return out;
}

SHARD_MPI_TEST(GroupShared, AvailableWithOneDevicePerRankOnOneNode) {
  const Runtime& rt = runtime();
  for (const auto& c : cases(rt.device_count())) {
    const Mesh mesh = make_mesh(c.shape, c.names);
    // The tests run on one node: available exactly when each rank has one device.
    EXPECT_EQ(group_shared_available(mesh, c.axes), rt.devices_per_rank() == 1 && rt.node_count() == 1)
        << mesh.to_string();
  }
}

SHARD_MPI_TEST(GroupShared, EveryDeviceReadsItsGroupAfterTheBarrier) {
  const Runtime& rt = runtime();
  if (rt.devices_per_rank() != 1 || rt.node_count() != 1) GTEST_SKIP() << "needs one device per rank on one node";
  const std::int64_t count = 37;  // not a multiple of a cache line: slots still stack exactly
  for (const auto& c : cases(rt.device_count())) {
    const Mesh mesh = make_mesh(c.shape, c.names);
    const auto x = zeros<double>({static_cast<std::int64_t>(mesh.size())}, NamedSharding(mesh, P(Axes(c.names))));
    shard_map(mesh, {P(Axes(c.names))}, {P(Axes(c.names))}, [&](DeviceContext& ctx, const Tensor<double>& b) {
          const auto buf = ctx.group_shared<double>(c.axes, count, "test.slots");
          const std::vector<int> group = group_of(mesh, ctx.device(), c.positions);
          EXPECT_EQ(buf.size(), static_cast<int>(group.size()));
          EXPECT_EQ(buf.index(), ctx.axis_index(c.axes));
          EXPECT_EQ(buf.count(), count);
          for (int i = 0; i < buf.size(); ++i) EXPECT_EQ(buf.slot(i), buf.stacked() + i * count);
          for (int round = 0; round < 3; ++round) {  // the same buffer, rewritten between barriers
            const Tensor<double> mine = contribution(ctx.device(), round, count);
            std::copy(mine.begin(), mine.end(), buf.mine());
            buf.barrier();
            Tensor<double> sum({count}, 0.0), host_sum({count}, 0.0);
            for (int i = 0; i < buf.size(); ++i) {
              const Tensor<double> expect = contribution(group[static_cast<std::size_t>(i)], round, count);
              for (std::int64_t k = 0; k < count; ++k) {
                EXPECT_EQ(buf.slot(i)[k], expect.flat(k)) << mesh.to_string() << " slot " << i << " round " << round;
                sum.flat(k) += buf.slot(i)[k];
                host_sum.flat(k) += expect.flat(k);
              }
            }
            EXPECT_TRUE(sum == host_sum);
            buf.barrier();  // nobody rewrites a slot that another device still reads
          }
          return b;
        })(x);
  }
}

SHARD_MPI_TEST(GroupShared, DevicesWriteTheirRowsOfTheStackedArray) {
  // One array for the whole group, each device writing rows that do not follow slot
  // boundaries: after the barrier every device sees the whole array.
  const Runtime& rt = runtime();
  if (rt.devices_per_rank() != 1 || rt.node_count() != 1) GTEST_SKIP() << "needs one device per rank on one node";
  const Mesh mesh = make_mesh({rt.device_count()}, {"a"});
  const auto x = zeros<double>({static_cast<std::int64_t>(mesh.size())}, NamedSharding(mesh, P("a")));
  const int n = mesh.size();
  const std::int64_t total = 5 * n + 3;  // rows; device i writes rows i, i + n, i + 2n, ...
  const std::int64_t count = (total + n - 1) / n;
  const Tensor<double> host = random_tensor<double>({total}, 4242);
  shard_map(mesh, {P("a")}, {P("a")}, [&](DeviceContext& ctx, const Tensor<double>& b) {
        const auto buf = ctx.group_shared<double>("a", count, "test.stacked");
        double* all = buf.stacked();
        for (std::int64_t r = buf.index(); r < total; r += n) all[r] = host.flat(r);
        buf.barrier();
        for (std::int64_t r = 0; r < total; ++r) EXPECT_EQ(all[r], host.flat(r)) << "row " << r;
        buf.barrier();
        return b;
      })(x);
}

SHARD_MPI_TEST(GroupShared, WindowsAreCachedByNameAndSize) {
  const Runtime& rt = runtime();
  if (rt.devices_per_rank() != 1 || rt.node_count() != 1) GTEST_SKIP() << "needs one device per rank on one node";
  const Mesh mesh = make_mesh({rt.device_count()}, {"a"});
  const auto x = zeros<float>({static_cast<std::int64_t>(mesh.size())}, NamedSharding(mesh, P("a")));
  auto body = [&](DeviceContext& ctx, const Tensor<float>& b) {
    const auto one = ctx.group_shared<float>("a", 16, "test.cache");
    const auto again = ctx.group_shared<float>("a", 16, "test.cache");
    EXPECT_EQ(one.stacked(), again.stacked());
    const auto other = ctx.group_shared<float>("a", 32, "test.cache");  // another size: another window
    EXPECT_NE(other.stacked(), one.stacked());
    return b;
  };
  shard_map(mesh, {P("a")}, {P("a")}, body)(x);
  const int created = mesh.comms().windows_created();
  EXPECT_EQ(created, 2);
  shard_map(mesh, {P("a")}, {P("a")}, body)(x);
  EXPECT_EQ(mesh.comms().windows_created(), created);
}

SHARD_MPI_TEST(GroupShared, Errors) {
  const Runtime& rt = runtime();
  const Mesh mesh = make_mesh({rt.device_count()}, {"a"});
  const auto x = zeros<float>({static_cast<std::int64_t>(mesh.size())}, NamedSharding(mesh, P("a")));
  auto run = [&](const std::function<void(DeviceContext&)>& f) {
    shard_map(mesh, {P("a")}, {P("a")}, [&](DeviceContext& ctx, const Tensor<float>& b) {
          f(ctx);
          return b;
        })(x);
  };
  if (rt.devices_per_rank() > 1) {
    expect_error<ShardingError>([&] { run([](DeviceContext& ctx) { ctx.group_shared<float>("a", 4, "test.err"); }); },
                                {"group_shared 'test.err'", "needs one device per rank"});
    return;
  }
  // Unknown axis: the usual collective error, before any communication.
  expect_error<Error>([&] { run([](DeviceContext& ctx) { ctx.group_shared<float>("nope", 4, "test.err"); }); },
                      {"nope"});
  // Devices that ask for different slot sizes: an error on every rank, not an overrun.
  if (rt.node_count() == 1 && rt.device_count() > 1)
    expect_error<ValueError>(
        [&] { run([](DeviceContext& ctx) { ctx.group_shared<float>("a", 4 + ctx.axis_index("a"), "test.sizes"); }); },
        {"test.sizes", "asked for different sizes"});
}

}  // namespace
}  // namespace shard::testing
