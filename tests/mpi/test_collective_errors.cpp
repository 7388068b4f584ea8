// Bad collectives and bad shard_map arguments raise a shard::Error subclass on every rank,
// with a message naming the rank and what is wrong; nothing hangs.

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "mpi_test.hpp"
#include "test_util.hpp"

namespace shard::testing {
namespace {

int n_devices() { return runtime().device_count(); }

Mesh mesh_1d() { return make_mesh({n_devices()}, {"a"}); }

using BadCall = std::function<void(DeviceContext&, const Tensor<double>&)>;

/// Runs `bad` on every device inside a shard_map over a 1-D mesh 'a' of all devices (each
/// device's block has shape (2, 3)) and expects E to come out of shard_map on every rank.
template <typename E>
void expect_body_error(const BadCall& bad, std::vector<std::string> needles) {
  const Mesh mesh = mesh_1d();
  const auto x = zeros<double>({2 * n_devices(), 3}, NamedSharding(mesh, P("a")));
  expect_error<E>(
      [&] {
        shard_map(mesh, P("a"), P("a"), [&](DeviceContext& ctx, const Tensor<double>& b) {
              bad(ctx, b);
              return b;
            })(x);
      },
      std::move(needles));
}

/// A (rows, 3) input of ones for a collective.
Tensor<double> rows(std::int64_t r) { return Tensor<double>({r, 3}, 1.0); }

SHARD_MPI_TEST(CollectiveErrors, AllGatherDimOutOfRange) {
  expect_body_error<ShapeError>([](DeviceContext& c, const Tensor<double>& b) { c.all_gather(b, "a", 5); },
                                {"all_gather", "dim 5 is out of range", "-3 to 2"});
  expect_body_error<ShapeError>([](DeviceContext& c, const Tensor<double>& b) { c.all_gather(b, "a", -4); },
                                {"all_gather", "dim -4 is out of range", "-3 to 2"});
  expect_body_error<ShapeError>(
      [](DeviceContext& c, const Tensor<double>& b) { c.all_gather(b, "a", 2, true); },
      {"all_gather", "dim 2 is out of range", "-2 to 1"});
  expect_body_error<ShapeError>(
      [](DeviceContext& c, const Tensor<double>&) {
        c.all_gather(Tensor<double>(Shape{}, 1.0), "a", 0, true);
      },
      {"all_gather", "tiled", "0-d"});
}

SHARD_MPI_TEST(CollectiveErrors, PsumScatterBadDims) {
  const int n = n_devices();
  const std::string ns = std::to_string(n), n1 = std::to_string(n + 1);
  expect_body_error<ShapeError>(
      [&](DeviceContext& c, const Tensor<double>&) { c.psum_scatter(rows(n + 1), "a"); },
      {"psum_scatter", "must have size " + ns + " but has " + n1});
  if (n > 1) {
    expect_body_error<ShapeError>(
        [&](DeviceContext& c, const Tensor<double>&) { c.psum_scatter(rows(n + 1), "a", 0, true); },
        {"psum_scatter", "tiled", "has size " + n1, ns + " does not evenly divide"});
  }
  expect_body_error<ShapeError>([](DeviceContext& c, const Tensor<double>& b) { c.psum_scatter(b, "a", 5); },
                                {"psum_scatter", "dim 5 is out of range", "-2 to 1"});
  expect_body_error<ShapeError>(
      [](DeviceContext& c, const Tensor<double>& b) { c.psum_scatter(b, "a", -4, true); },
      {"psum_scatter", "dim -4 is out of range"});
  expect_body_error<ShapeError>(
      [](DeviceContext& c, const Tensor<double>&) { c.psum_scatter(Tensor<double>(Shape{}, 1.0), "a"); },
      {"psum_scatter", "0-d"});
}

SHARD_MPI_TEST(CollectiveErrors, AllToAllBadDims) {
  const int n = n_devices();
  const std::string ns = std::to_string(n), n1 = std::to_string(n + 1);
  expect_body_error<ShapeError>(
      [&](DeviceContext& c, const Tensor<double>&) { c.all_to_all(rows(n + 1), "a", 0, 1); },
      {"all_to_all", "split_dim 0", "must have size " + ns + " but has " + n1});
  if (n > 1) {
    expect_body_error<ShapeError>(
        [&](DeviceContext& c, const Tensor<double>&) { c.all_to_all(rows(n + 1), "a", 0, 1, true); },
        {"all_to_all", "tiled", "has size " + n1, ns + " does not evenly divide"});
  }
  expect_body_error<ShapeError>(
      [&](DeviceContext& c, const Tensor<double>&) { c.all_to_all(rows(n), "a", 5, 0); },
      {"all_to_all", "split_dim 5 is out of range", "-2 to 1"});
  expect_body_error<ShapeError>(
      [&](DeviceContext& c, const Tensor<double>&) { c.all_to_all(rows(n), "a", 0, -4); },
      {"all_to_all", "concat_dim -4 is out of range"});
  expect_body_error<ShapeError>(
      [](DeviceContext& c, const Tensor<double>&) { c.all_to_all(Tensor<double>(Shape{}, 1.0), "a", 0, 0); },
      {"all_to_all", "0-d"});
}

SHARD_MPI_TEST(CollectiveErrors, PpermuteBadPerms) {
  const int n = n_devices();
  using Perm = std::vector<std::pair<int, int>>;
  auto bad = [](Perm perm) {
    return [perm](DeviceContext& c, const Tensor<double>& b) { c.ppermute(b, "a", perm); };
  };
  expect_body_error<ValueError>(bad({{0, 0}, {0, n - 1}}), {"ppermute", "source 0 appears twice"});
  if (n > 1) {
    expect_body_error<ValueError>(bad({{0, 1}, {1, 1}}), {"ppermute", "destination 1 appears twice"});
  }
  expect_body_error<ValueError>(bad({{0, n}}),
                                {"ppermute", "(0, " + std::to_string(n) + ") is out of range"});
  expect_body_error<ValueError>(bad({{-1, 0}}), {"ppermute", "(-1, 0) is out of range"});
}

SHARD_MPI_TEST(CollectiveErrors, UnknownAndRepeatedAxes) {
  expect_body_error<ShardingError>([](DeviceContext& c, const Tensor<double>& b) { c.psum(b, "zz"); },
                                   {"psum", "unknown mesh axis 'zz'", "'a'"});
  expect_body_error<ShardingError>(
      [](DeviceContext& c, const Tensor<double>& b) {
        c.all_gather(b, {"a", "zz"});
      },
      {"all_gather", "unknown mesh axis 'zz'"});
  expect_body_error<ShardingError>([](DeviceContext& c, const Tensor<double>&) { c.axis_index("zz"); },
                                   {"unknown mesh axis 'zz'"});
  expect_body_error<ShardingError>([](DeviceContext& c, const Tensor<double>&) { c.axis_size("zz"); },
                                   {"unknown mesh axis 'zz'"});
  expect_body_error<ShardingError>(
      [](DeviceContext& c, const Tensor<double>& b) {
        c.pmax(b, {"a", "a"});
      },
      {"pmax", "'a' is named twice"});
  expect_body_error<ShardingError>(
      [](DeviceContext& c, const Tensor<double>&) {
        c.psum(1.0, {"a", "a"});
      },
      {"psum", "'a' is named twice"});
}

SHARD_MPI_TEST(CollectiveErrors, CaughtInsideTheBody) {
  // The error is raised from metadata before any communication, so a body may catch it and
  // go on with valid collectives.
  const Mesh mesh = mesh_1d();
  const auto local = mesh.local_device_ids();
  const auto x = zeros<double>({2 * n_devices(), 3}, NamedSharding(mesh, P("a")));
  std::vector<std::string> messages(local.size());
  std::vector<double> sums(local.size(), -1);
  shard_map(mesh, P("a"), P("a"), [&](DeviceContext& ctx, const Tensor<double>& b) {
        const auto li =
            static_cast<std::size_t>(std::find(local.begin(), local.end(), ctx.device()) - local.begin());
        try {
          ctx.psum_scatter(b, {"a", "zz"});
        } catch (const ShardingError& e) {
          messages[li] = e.what();
        }
        sums[li] = ctx.psum(1.0, "a");
        return b;
      })(x);
  for (std::size_t li = 0; li < local.size(); ++li) {
    EXPECT_NE(messages[li].find("unknown mesh axis 'zz'"), std::string::npos) << messages[li];
    EXPECT_EQ(sums[li], n_devices());
  }
}

SHARD_MPI_TEST(CollectiveErrors, DevicesOfOneRankIssueDifferentCollectives) {
  if (runtime().devices_per_rank() < 2) GTEST_SKIP() << "needs two devices per rank";
  expect_body_error<ValueError>(
      [](DeviceContext& c, const Tensor<double>& b) {
        if (c.device() % runtime().devices_per_rank() == 0) {
          c.psum(b, "a");
        } else {
          c.pmax(b, "a");
        }
      },
      {"different collectives", "psum", "pmax"});
}

SHARD_MPI_TEST(CollectiveErrors, BodyFailsOnOneRank) {
  // No collective follows the failure, so the other ranks finish their bodies; shard_map then
  // raises the failing rank's error on every rank.
  const int culprit = runtime().process_count() - 1;
  std::vector<std::string> needles{"cannot compute block of rank " + std::to_string(culprit)};
  if (runtime().process_index() != culprit) needles.push_back("rank " + std::to_string(culprit) + " failed");
  expect_body_error<ValueError>(
      [&](DeviceContext&, const Tensor<double>&) {
        if (runtime().process_index() == culprit) raise<ValueError>("cannot compute block of rank ", culprit);
      },
      needles);
}

SHARD_MPI_TEST(ShardMapErrors, ArgumentDoesNotDivide) {
  const int n = n_devices();
  if (n == 1) GTEST_SKIP() << "every size divides over one device";
  const std::int64_t size = 5 * n - 1;  // 19 with 4 devices
  const std::string ns = std::to_string(n), ss = std::to_string(size);
  const Mesh mesh = mesh_1d();
  const auto x = zeros<float>({size, 3}, NamedSharding(mesh, P("a")));
  auto id = [](DeviceContext&, const Tensor<float>& b) { return b; };
  expect_error<ShapeError>([&] { shard_map(mesh, P("a"), P("a"), id)(x); },
                           {"in_specs[0]", "maps array axis 0 (of size " + ss + ")", "to mesh axes ('a',)",
                            "(of total size " + ns + "), but " + ns + " does not evenly divide " + ss});
  // A tuple of axes on dim 1 of a 2-D mesh.
  const auto f = factorisations(n, 2)[1];
  const Mesh m2 = make_mesh(f, {"a", "b"});
  const auto y = zeros<float>({2, size}, NamedSharding(m2, P(None, {"a", "b"})));
  expect_error<ShapeError>(
      [&] {
        shard_map(m2, P(None, {"a", "b"}), P(None, {"a", "b"}), id)(y);
      },
      {"maps array axis 1 (of size " + ss + ")", "'a'", "'b'", "(of total size " + ns + ")",
       ns + " does not evenly divide " + ss});
}

SHARD_MPI_TEST(ShardMap, ArgumentShardedDifferentlyIsResharded) {
  // As in JAX, an argument laid out otherwise is moved to its in_spec first.
  const int n = n_devices();
  const Mesh mesh = mesh_1d();
  const Tensor<double> h = random_tensor<double>({2 * n, 2 * n}, 51);
  const auto x = device_put(h, NamedSharding(mesh, P("a", None)));
  const auto y = shard_map(mesh, P(None, "a"), P(None, "a"), [](const Tensor<double>& b) { return b * 2.0; })(x);
  EXPECT_EQ(y.spec(), P(None, "a"));
  const Tensor<double> got = y.to_host();
  for (std::int64_t i = 0; i < h.size(); ++i) EXPECT_EQ(got.flat(i), 2.0 * h.flat(i));
}

SHARD_MPI_TEST(ShardMap, ArgumentOnAnotherMeshOverTheSameDevices) {
  // Same devices in another order: the argument moves onto the shard_map mesh.
  const int n = n_devices();
  std::vector<int> reversed;
  for (int d = n - 1; d >= 0; --d) reversed.push_back(d);
  const Mesh mesh = mesh_1d();
  const Mesh other({n}, {"z"}, reversed);
  const Tensor<double> h = random_tensor<double>({2 * n}, 52);
  const auto x = device_put(h, NamedSharding(other, P("z")));
  const auto y = shard_map(mesh, P("a"), P("a"), [](const Tensor<double>& b) { return b + 1.0; })(x);
  EXPECT_TRUE(y.mesh() == mesh);
  const Tensor<double> got = y.to_host();
  for (std::int64_t i = 0; i < h.size(); ++i) EXPECT_EQ(got.flat(i), h.flat(i) + 1.0);
}

SHARD_MPI_TEST(ShardMapErrors, ArgumentOnOtherDevices) {
  const int n = n_devices();
  if (n < 2) GTEST_SKIP() << "needs two devices";
  const Mesh mesh = mesh_1d();
  const Mesh first({1}, {"a"}, {mesh.device_ids()[0]});
  const auto x = zeros<double>({2}, NamedSharding(first, P()));
  expect_error<MeshMismatchError>(
      [&] { shard_map(mesh, P(), P(), [](const Tensor<double>& b) { return b; })(x); },
      {"shard_map argument 0", "device ids [" + std::to_string(mesh.device_ids()[0]) + "]"});
}

SHARD_MPI_TEST(ShardMapErrors, SpecListsAndBlockShapes) {
  const int n = n_devices();
  const Mesh mesh = mesh_1d();
  const auto x = zeros<double>({2 * n}, NamedSharding(mesh, P("a")));
  // A list argument with a spec list of another length; a list spec for a single array.
  const std::vector<ShardedArray<double>> xs{x, x, x};
  expect_error<ValueError>(
      [&] {
        shard_map(mesh, {std::vector<PartitionSpec>{P("a"), P("a")}}, {P("a")},
                  [](const std::vector<Tensor<double>>& b) { return b[0]; })(xs);
      },
      {"in_specs[0] lists 2 specs for a list of 3 arrays"});
  expect_error<ValueError>(
      [&] {
        shard_map(mesh, {std::vector<PartitionSpec>{P("a")}}, {P("a")}, [](const Tensor<double>& b) { return b; })(x);
      },
      {"in_specs[0] is a list of 1 specs but its value is one array"});
  // Rank-dependent block shapes: the ranks agree that they differ.
  if (runtime().process_count() > 1) {
    expect_error<ShapeError>(
        [&] {
          shard_map(mesh, P("a"), P("a"), [](DeviceContext&, const Tensor<double>&) {
                return Tensor<double>({1 + runtime().process_index()}, 0.0);
              })(x);
        },
        {"different shapes"});
    // Lists of rank-dependent length.
    expect_error<ShapeError>(
        [&] {
          shard_map(mesh, P("a"), P("a"), [](const Tensor<double>& b) {
                return std::vector<Tensor<double>>(static_cast<std::size_t>(1 + runtime().process_index()), b);
              })(x);
        },
        {"different"});
  }
}

SHARD_MPI_TEST(ArrayCollectiveErrors, PsumOverAnAxisTheSpecUses) {
  const int n = n_devices();
  const Mesh mesh = n % 2 == 0 ? make_mesh({n / 2, 2}, {"a", "b"}) : make_mesh({n, 1}, {"a", "b"});
  const auto x = zeros<double>({4, 2 * n}, NamedSharding(mesh, P(None, "a")));
  expect_error<ShardingError>([&] { psum(x, "a"); },
                              {"psum", "mesh axis 'a' splits the array", "P(None, 'a')"});
  expect_error<ShardingError>([&] { psum(x, {"b", "a"}); }, {"psum", "'a'"});
  expect_error<ShardingError>([&] { psum(x, "zz"); }, {"unknown mesh axis 'zz'"});
  expect_error<ShardingError>([&] { all_gather(x, "b"); }, {"all_gather", "'b' does not split the array"});
}

// Gathering a major axis of a tuple entry, or an unevenly split dim, is not a single
// all_gather; the array-level all_gather then reshards (moving only the missing pieces).
SHARD_MPI_TEST(ArrayCollectives, AllGatherOfMajorAxisOrUnevenDimReshards) {
  const int n = n_devices();
  const Mesh mesh = n % 2 == 0 ? make_mesh({n / 2, 2}, {"a", "b"}) : make_mesh({n, 1}, {"a", "b"});
  const Tensor<double> hy = random_tensor<double>({2 * n}, 41);
  const auto y = device_put(hy, NamedSharding(mesh, P(SpecEntry{"a", "b"})));
  const auto gy = all_gather(y, "a");
  EXPECT_EQ(gy.spec(), P("b"));
  EXPECT_TRUE(gy.to_host() == hy);
  const Tensor<double> hz = random_tensor<double>({2 * n + 1}, 42);
  const auto z = device_put(hz, NamedSharding(mesh_1d(), P("a")));
  const auto gz = all_gather(z, "a");
  EXPECT_EQ(gz.spec(), P());
  for (const auto& s : gz.addressable_shards()) EXPECT_TRUE(s.data == hz);
}

SHARD_MPI_TEST(ShardMapErrors, BadOutSpecsAndPmapArguments) {
  const int n = n_devices();
  const Mesh mesh = mesh_1d();
  const auto x = zeros<double>({2 * n}, NamedSharding(mesh, P("a")));
  auto id = [](DeviceContext&, const Tensor<double>& b) { return b; };
  expect_error<ShardingError>([&] { shard_map(mesh, P("a"), P("zz"), id)(x); }, {"'zz'"});
  expect_error<ShardingError>([&] { shard_map(mesh, P("a"), P("a", None, None), id)(x); },
                              {"out_specs[0]", "more entries"});
  expect_error<ShapeError>([&] { pmap(id, "p")(Tensor<double>(Shape{}, 1.0)); }, {"pmap", "in_axes[0] = 0", "()"});
  expect_error<ShapeError>([&] { pmap(id, "p")(Tensor<double>({n + 1, 2}, 1.0)); },
                           {"pmap", "size " + std::to_string(n + 1), "device count (" + std::to_string(n) + ")"});
  expect_error<ShapeError>([&] { pmap([](const Tensor<double>& a, const Tensor<double>&) { return a; }, "p")(
                                     Tensor<double>({1, 2}, 1.0), Tensor<double>({2, 2}, 1.0)); },
                           {"pmap", "mapped dims of different sizes"});
  expect_error<ValueError>([&] { pmap(id, "p", {0, 0})(Tensor<double>({1, 2}, 1.0)); },
                           {"pmap", "in_axes has 2 entries", "called with 1"});
}

}  // namespace
}  // namespace shard::testing
