// Every bad input raises a shard::Error subclass on every rank, with a message that names
// the rank and the thing that is wrong; nothing hangs.

#include "mpi_test.hpp"
#include "test_util.hpp"

namespace shard::testing {
namespace {

Mesh mesh_2d() {
  const int n = runtime().device_count();
  return n % 2 == 0 ? make_mesh({n / 2, 2}, {"a", "b"}) : make_mesh({n, 1}, {"a", "b"});
}

SHARD_MPI_TEST(Errors, UnknownAxis) {
  expect_error<ShardingError>([] { NamedSharding(mesh_2d(), P("a", "model")); }, {"'model'", "'a'", "'b'"});
}

SHARD_MPI_TEST(Errors, AxisUsedTwice) {
  expect_error<ShardingError>(
      [] {
        NamedSharding(mesh_2d(), P("a", {"b", "a"}));
      },
      {"'a'", "more than once"});
}

SHARD_MPI_TEST(Errors, MeshSizeDoesNotMatchDeviceList) {
  const int n = runtime().device_count();
  std::vector<int> ids(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) ids[i] = i;
  expect_error<ShardingError>(
      [&] {
        Mesh({n, 2}, {"a", "b"}, ids);
      },
      {std::to_string(2 * n) + " devices", "device list has " + std::to_string(n)});
  expect_error<ShardingError>([&] { Mesh({n}, {"a", "b"}, ids); }, {"axis names"});
  expect_error<ShardingError>([&] { make_mesh({n, 3}, {"a", "b"}); }, {"make_mesh", std::to_string(3 * n)});
}

SHARD_MPI_TEST(Errors, SpecLongerThanArrayRank) {
  const NamedSharding s(mesh_2d(), P("a", None, "b"));
  const Tensor<double> host = random_tensor<double>({4, 4}, 3);
  expect_error<ShardingError>([&] { device_put(host, s); }, {"P('a', None, 'b')", "(4, 4)", "3 entries"});
  expect_error<ShardingError>([&] { zeros<float>({4}, s); }, {"3 entries"});
}

SHARD_MPI_TEST(Errors, DevicePutShapeDiffersAcrossRanks) {
  const NamedSharding s(mesh_2d(), P("a"));
  if (runtime().process_count() == 1) {
    // One rank cannot disagree with itself; check the other host-shape rule instead.
    const Tensor<double> host = random_tensor<double>({4}, 3);
    expect_error<ShardingError>([&] { device_put(host, NamedSharding(mesh_2d(), P("a", "b"))); }, {"(4,)"});
    return;
  }
  const std::int64_t rows = 8 + runtime().process_index();  // differs on every rank
  const Tensor<double> host = random_tensor<double>({rows, 3}, 3);
  expect_error<ShapeError>([&] { device_put(host, s); }, {"different shapes", to_string(host.shape())});
}

SHARD_MPI_TEST(Errors, FromCallbackWrongShapeOnOneRank) {
  const NamedSharding s(mesh_2d(), P("a"));
  const int culprit = runtime().process_count() - 1;
  expect_error<ShapeError>(
      [&] {
        from_callback<float>({16, 2}, s, [&](const Box& b) {
          Shape e = b.extent;
          if (runtime().process_index() == culprit) e[1] += 1;
          return Tensor<float>(e, 1.5f);
        });
      },
      {"has shape", "needs"});
}

SHARD_MPI_TEST(Errors, FromCallbackThrowsOnOneRank) {
  const NamedSharding s(mesh_2d(), P("a"));
  expect_error<ValueError>(
      [&] {
        from_callback<double>({8}, s, [&](const Box& b) {
          if (runtime().process_index() == 0) raise<ValueError>("cannot read block ", to_string(b));
          return Tensor<double>(b.extent, 2.0);
        });
      },
      {"cannot read block"});
}

SHARD_MPI_TEST(Errors, BadRootAndNonLocalShard) {
  const NamedSharding s(mesh_2d(), P("a"));
  const auto a = arange<std::int32_t>({8}, s);
  expect_error<ValueError>([&] { a.gather(runtime().process_count()); }, {"root"});
  expect_error<ValueError>([&] { a.shard_of(runtime().device_count() + 5); }, {"holds no shard"});
}

SHARD_MPI_TEST(Errors, BadPartitionSpecText) {
  expect_error<ValueError>([] { PartitionSpec::parse("P('a', ('b', None))"); },
                           {"cannot parse", "None inside"});
  expect_error<ValueError>([] { PartitionSpec::parse("P('a'"); }, {"cannot parse"});
}

SHARD_MPI_TEST(Errors, ShardMapInsideABodyIsRefused) {
  // A shard_map called inside a shard_map body: ValueError on every rank naming the restriction, at
  // one device per rank as at several (it crashed at 2 devices per rank), and the next call works.
  const Mesh mesh = make_mesh({runtime().device_count()}, {"d"});
  const auto x = device_put(random_tensor<float>({2 * mesh.size()}, 5), NamedSharding(mesh, P("d")));
  auto outer = shard_map(mesh, P("d"), P("d"), [&](const Tensor<float>& b) {
    (void)shard_map(mesh, P("d"), P("d"), [](const Tensor<float>& c) { return c * 2.0f; })(x);
    return b;
  });
  expect_error<ValueError>([&] { (void)outer(x); }, {"inside a shard_map", "nesting is not supported"});
  const auto y = shard_map(mesh, P("d"), P("d"), [](const Tensor<float>& b) { return b * 2.0f; })(x);
  EXPECT_EQ(y.to_host().flat(1), 2.0f * random_tensor<float>({2 * mesh.size()}, 5).flat(1));
}

}  // namespace
}  // namespace shard::testing
