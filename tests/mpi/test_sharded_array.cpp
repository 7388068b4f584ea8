// ShardedArray creation and host transfer for every spec over 1-D, 2-D and 3-D meshes, on
// arrays of 0 to 4 dims with uneven sizes and empty shards, checked on every rank against
// a serial reference.

#include <numeric>

#include "mpi_test.hpp"
#include "shard/comm/detail/mesh_comms.hpp"
#include "test_util.hpp"

namespace shard::testing {
namespace {

const std::vector<Shape> kShapes = {{}, {19}, {3}, {0}, {19, 10}, {5, 7}, {4, 3, 5}, {3, 2, 5, 2}};

/// The meshes tested at this device count: 1-D, every 2-D factorisation, a few 3-D ones.
std::vector<Mesh> test_meshes() {
  const int n = runtime().device_count();
  std::vector<Mesh> out{make_mesh({n}, {"a"})};
  for (const auto& f : factorisations(n, 2)) out.push_back(make_mesh(f, axis_names(2)));
  int three = 0;
  for (const auto& f : factorisations(n, 3))
    if ((std::count(f.begin(), f.end(), 1) <= 1 || n < 4) && three++ < 3) out.push_back(make_mesh(f, axis_names(3)));
  return out;
}

/// Checks every local shard of `a` against the host array, box by box.
template <typename T>
void expect_shards_match(const ShardedArray<T>& a, const Tensor<T>& host, const std::string& what) {
  const Mesh& mesh = a.mesh();
  const auto local = mesh.local_device_ids();
  ASSERT_EQ(a.addressable_shards().size(), local.size()) << what;
  for (std::size_t i = 0; i < local.size(); ++i) {
    const auto& s = a.addressable_shards()[i];
    const Box ref = reference_box(mesh, a.spec(), host.shape(), local[i]);
    EXPECT_EQ(s.device, local[i]) << what;
    EXPECT_EQ(s.box, ref) << what << " device " << local[i] << ": " << to_string(s.box) << " vs " << to_string(ref);
    EXPECT_EQ(s.data.shape(), ref.extent) << what;
    const auto expected = reference_slice(host, ref);
    EXPECT_TRUE(std::equal(expected.begin(), expected.end(), s.data.begin(), s.data.end()))
        << what << " device " << local[i] << " box " << to_string(ref);
  }
}

template <typename T>
void check_round_trip(const Mesh& mesh, const PartitionSpec& spec, const Shape& shape, std::uint64_t seed) {
  const std::string what = mesh.to_string() + " " + spec.to_string() + " " + to_string(shape);
  const NamedSharding sharding(mesh, spec);
  const Tensor<T> host = random_tensor<T>(shape, seed);
  const auto a = device_put(host, sharding);
  expect_shards_match(a, host, what);
  EXPECT_TRUE(a.to_host() == host) << what << " to_host";
  const int root = runtime().process_count() - 1;
  const Tensor<T> g = a.gather(root);
  if (runtime().process_index() == root) {
    EXPECT_TRUE(g == host) << what << " gather";
  } else {
    EXPECT_EQ(g.size(), 0) << what;
  }
  const auto b = from_callback<T>(shape, sharding, [&](const Box& box) {
    const auto v = reference_slice(host, box);
    return Tensor<T>(box.extent, v);
  });
  expect_shards_match(b, host, what + " from_callback");
}

SHARD_MPI_TEST(ShardedArray, EverySpecEveryMeshDouble) {
  std::uint64_t seed = 1;
  int cases = 0;
  for (const auto& mesh : test_meshes())
    for (const auto& shape : kShapes)
      for (const auto& spec : all_specs(mesh.axis_names(), static_cast<int>(shape.size()))) {
        check_round_trip<double>(mesh, spec, shape, seed++);
        ++cases;
      }
  EXPECT_GT(cases, 50);
  if (runtime().process_index() == 0) std::printf("[ shard    ] %d (mesh, spec, shape) cases\n", cases);
}

template <typename T>
class ShardedArrayTyped : public MpiTest {};
using Types = ::testing::Types<float, double, std::int32_t, std::int64_t, bfloat16>;
TYPED_TEST_SUITE(ShardedArrayTyped, Types);

TYPED_TEST(ShardedArrayTyped, UnevenAndEmptyShards) {
  const int n = runtime().device_count();
  const Mesh m1 = make_mesh({n}, {"x"});
  check_round_trip<TypeParam>(m1, P("x"), {19, 10}, 7);
  check_round_trip<TypeParam>(m1, P(None, "x"), {2, 3}, 8);  // empty shards when n > 3
  check_round_trip<TypeParam>(m1, P(), {4, 4}, 9);
  if (n % 2 == 0) {
    const Mesh m2 = make_mesh({n / 2, 2}, {"a", "b"});
    check_round_trip<TypeParam>(m2, P({"b", "a"}, None), {19, 3}, 10);
    check_round_trip<TypeParam>(m2, P("b", None, "a"), {3, 1, 5}, 11);
  }
}

TYPED_TEST(ShardedArrayTyped, ZerosFullArange) {
  const int n = runtime().device_count();
  const NamedSharding s(make_mesh({n}, {"x"}), P("x"));
  const Shape shape{13, 3};
  const auto z = zeros<TypeParam>(shape, s).to_host();
  const auto f = full<TypeParam>(shape, TypeParam(7), s).to_host();
  const auto r = arange<TypeParam>(shape, s).to_host();
  for (std::int64_t i = 0; i < num_elements(shape); ++i) {
    EXPECT_EQ(z.flat(i), TypeParam(0));
    EXPECT_EQ(f.flat(i), TypeParam(7));
    EXPECT_EQ(r.flat(i), static_cast<TypeParam>(i));
  }
}

SHARD_MPI_TEST(ShardedArray, PermutedAndPartialMeshes) {
  const int n = runtime().device_count();
  std::vector<int> ids(static_cast<std::size_t>(n));
  std::iota(ids.rbegin(), ids.rend(), 0);  // reversed device order
  const Mesh reversed({n}, {"x"}, ids);
  check_round_trip<double>(reversed, P("x"), {19, 2}, 21);
  if (n >= 2) {
    // A mesh over the upper half of the devices: ranks without devices still take part.
    std::vector<int> half(ids.begin(), ids.begin() + n / 2);
    const Mesh part({n / 2}, {"x"}, half);
    check_round_trip<double>(part, P("x"), {7, 3}, 22);
    check_round_trip<double>(part, P(), {5}, 23);
  }
}

SHARD_MPI_TEST(ShardedArray, PositionalShardingTutorial) {
  const int n = runtime().device_count();
  if (n % 2 != 0) GTEST_SKIP() << "needs an even device count";
  std::vector<int> ids(static_cast<std::size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  const PositionalSharding ps(ids);
  const Tensor<float> host = random_tensor<float>({16, 8}, 31);
  for (const NamedSharding& s : {ps.reshape({n / 2, 2}).to_named(), ps.reshape({1, n}).to_named(),
                                 ps.reshape({n / 2, 2}).replicate(0).to_named(),
                                 ps.reshape({n / 2, 2}).replicate(1).to_named(), ps.replicate().to_named()}) {
    const auto a = device_put(host, s);
    EXPECT_TRUE(a.to_host() == host) << s.to_string();
    for (const auto& sh : a.addressable_shards()) {
      const auto v = reference_slice(host, sh.box);
      EXPECT_TRUE(std::equal(v.begin(), v.end(), sh.data.begin(), sh.data.end())) << s.to_string();
    }
  }
  // reshape(n/2, 2).replicate(0): column j is held by the devices j, j+2, j+4, ...
  const NamedSharding cols = ps.reshape({n / 2, 2}).replicate(0).to_named();
  for (int d = 0; d < n; ++d) EXPECT_EQ(cols.box(d, {16, 8}).offset[1], d % 2 == 0 ? 0 : 4);
}

SHARD_MPI_TEST(MeshComms, GroupsAndCache) {
  const int n = runtime().device_count();
  const int k = runtime().devices_per_rank();
  if (n % 2 != 0) GTEST_SKIP() << "needs an even device count";
  const Mesh mesh = make_mesh({n / 2, 2}, {"a", "b"});
  auto& comms = mesh.comms();
  for (const std::vector<int>& axes : {std::vector<int>{0}, {1}, {0, 1}, {1, 0}}) {
    const auto& groups = comms.groups(axes);
    int size = 1;
    for (int a : axes) size *= mesh.shape()[a];
    for (const auto& g : groups) {
      EXPECT_EQ(static_cast<int>(g.devices.size()), size);
      // The group's devices differ only along `axes`.
      const auto c0 = mesh.coords(g.devices[0]);
      for (int d : g.devices) {
        const auto c = mesh.coords(d);
        for (int ax = 0; ax < 2; ++ax)
          if (std::find(axes.begin(), axes.end(), ax) == axes.end()) {
            EXPECT_EQ(c[ax], c0[ax]);
          }
      }
      if (g.ranks.size() > 1) {
        ASSERT_FALSE(g.comm.is_null());
        EXPECT_EQ(g.comm.size(), static_cast<int>(g.ranks.size()));
        EXPECT_EQ(g.ranks[g.comm.rank()], runtime().process_index());
        // Membership check: the sum of world ranks over the communicator.
        const int sum = g.comm.allreduce(runtime().process_index(), MPI_SUM);
        EXPECT_EQ(sum, std::accumulate(g.ranks.begin(), g.ranks.end(), 0));
      } else {
        EXPECT_TRUE(g.comm.is_null());
        EXPECT_EQ(g.ranks[0], runtime().process_index());
      }
    }
    EXPECT_FALSE(groups.empty());
    EXPECT_LE(static_cast<int>(groups.size()), k);
  }
  const int created = comms.communicators_created();
  comms.groups({0});
  comms.groups({1});
  const Mesh copy = mesh;  // a copy is a handle to the same cache
  copy.comms().groups({0, 1});
  EXPECT_EQ(comms.communicators_created(), created);
}

}  // namespace
}  // namespace shard::testing
