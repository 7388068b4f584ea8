// Usage errors name the user's line (detail::CallScope): a named op, reshard, device_put,
// to_host/item, an optimizer update and grad name the line that called them; an error inside a
// shard_map body names the body's line (or, for an operator, the shard_map call), the device it
// ran on and the arguments' global shapes beside the blocks; a collective mismatch names each
// rank's line. Checked on every rank, and no message carries a path of Shard's own build.

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "check_on.hpp"
#include "mpi_test.hpp"
#include "shard/comm/detail/collective_guard.hpp"
#include "shard/train/optim.hpp"
#include "test_util.hpp"

namespace shard::testing {
namespace {

/// This file's name as messages show it ("test_call_sites.cpp:<line>").
std::string here(int line) { return "test_call_sites.cpp:" + std::to_string(line); }

/// The library's source tree (this file is <root>/tests/mpi/test_call_sites.cpp).
std::string library_root() {
  const std::string f = __FILE__;
  return f.substr(0, f.rfind("tests/mpi/"));
}

/// expect_error, then: no path of Shard's headers or sources in the message.
template <typename E, typename F>
void expect_site(F&& fn, std::vector<std::string> needles) {
  std::string what;
  expect_error<E>(
      [&] {
        try {
          fn();
        } catch (const Error& e) {
          what = e.what();
          throw;
        }
      },
      std::move(needles));
  const std::string root = library_root();
  if (!root.empty()) {
    EXPECT_EQ(what.find(root + "src/"), std::string::npos) << what;
    EXPECT_EQ(what.find(root + "include/"), std::string::npos) << what;
  }
  EXPECT_EQ(what.find(".hpp:"), std::string::npos) << what;
  EXPECT_EQ(what.find("src/"), std::string::npos) << what;
}

Mesh mesh_1d() { return make_mesh({runtime().device_count()}, {"a"}); }

SHARD_MPI_TEST(CallSites, NamedOpsNameTheirLine) {
  const Mesh mesh = mesh_1d();
  const int n = runtime().device_count();
  const auto a = device_put(random_tensor<double>({2 * n, 3}, 1), NamedSharding(mesh, P("a")));
  const auto b = device_put(random_tensor<double>({4, 5}, 2), NamedSharding(mesh, P()));
  int line = __LINE__ + 1;
  expect_site<Error>([&] { (void)matmul(a, b); }, {here(line), "shard::matmul", "(4, 5)"});
  line = __LINE__ + 1;
  expect_site<Error>([&] { (void)reshape(a, Shape{7, 5}); }, {here(line), "shard::reshape"});
  line = __LINE__ + 1;
  expect_site<Error>([&] { (void)add(a, b); }, {here(line), "shard::add"});
  line = __LINE__ + 1;
  expect_site<Error>([&] { (void)sum(a, Dims{5}); }, {here(line), "shard::sum"});
  // Host Tensors the same way.
  const Tensor<double> h = random_tensor<double>({3, 4}, 3);
  line = __LINE__ + 1;
  expect_site<Error>([&] { (void)matmul(h, h); }, {here(line), "shard::matmul"});
  line = __LINE__ + 1;
  expect_site<Error>([&] { (void)transpose(h, {0, 0}); }, {here(line), "shard::transpose"});
  line = __LINE__ + 1;
  expect_site<Error>([&] { (void)a.item(); }, {here(line), "item()"});
  line = __LINE__ + 1;
  expect_site<Error>([&] { (void)reshard(a, NamedSharding(mesh, P(None, None, "a"))); }, {here(line)});
  line = __LINE__ + 1;
  expect_site<Error>([&] { (void)device_put(h, NamedSharding(mesh, P("a", None, None))); }, {here(line)});
  line = __LINE__ + 1;
  expect_site<Error>([&] { (void)psum(a, "a"); }, {here(line), "shard::psum"});
  // The constructors a newcomer meets first.
  line = __LINE__ + 1;
  expect_site<ShardingError>([&] { (void)NamedSharding(mesh, P("model")); }, {here(line), "'model'"});
  line = __LINE__ + 3;
  expect_site<ShardingError>(
      [&] {
        (void)make_mesh({n + 1, 2}, {"a", "b"});
      },
      {here(line), "shard::make_mesh"});
}

SHARD_MPI_TEST(CallSites, BodyErrorsNameTheBodyTheDeviceAndTheGlobalShapes) {
  const Mesh mesh = mesh_1d();
  const int n = runtime().device_count();
  const auto x = device_put(random_tensor<double>({2 * n, 6}, 4), NamedSharding(mesh, P("a")));
  // A named op in the body: the body's line.
  int line = __LINE__ + 2;
  expect_site<Error>(
      [&] { shard_map(mesh, P("a"), P("a"), [](const Tensor<double>& b) { return matmul(b, b); })(x); },
      {here(line), "shard::matmul", "in the body of the shard_map called at ", "on device",
       "argument 0 float64(" + std::to_string(2 * n) + ", 6)", "block (2, 6)"});
  // An operator in the body: the shard_map call's line.
  line = __LINE__ + 3;
  expect_site<Error>(
      [&] {
        shard_map(mesh, P("a"), P("a"),
                  [](const Tensor<double>& b) { return b + Tensor<double>({4}, 1.0); })(x);
      },
      {here(line), "shard::shard_map", "in the body of the shard_map called at ", "coordinates (a="});
  // A collective in the body with an axis the mesh lacks: the collective's line.
  line = __LINE__ + 4;
  expect_site<Error>(
      [&] {
        shard_map(mesh, P("a"), P("a"),
                  [](DeviceContext& ctx, const Tensor<double>& b) { return ctx.psum(b, "model"); })(x);
      },
      {here(line), "'model'"});
}

SHARD_MPI_TEST(CallSites, ABodyReturningAPairFillsTwoOutSpecs) {
  const Mesh mesh = mesh_1d();
  const int n = runtime().device_count();
  const Tensor<double> h = random_tensor<double>({2 * n, 3}, 9);
  const auto x = device_put(h, NamedSharding(mesh, P("a")));
  const auto [twice, total] =
      shard_map(mesh, P("a"), {P("a"), P()}, [](DeviceContext& ctx, const Tensor<double>& b) {
        return std::make_pair(b * 2.0, ctx.psum(sum(b, Dims{0}), "a"));
      })(x);
  const Tensor<double> t = twice.to_host(), s = total.to_host(), want_s = sum(h, Dims{0});
  for (std::int64_t i = 0; i < h.size(); ++i) EXPECT_DOUBLE_EQ(t.data()[i], 2.0 * h.data()[i]);
  for (std::int64_t j = 0; j < 3; ++j) EXPECT_NEAR(s.data()[j], want_s.data()[j], 1e-12);
}

SHARD_MPI_TEST(CallSites, EmptyArraysAreAssignedLaterAndRaiseUntilThen) {
  const Mesh mesh = mesh_1d();
  const int n = runtime().device_count();
  ShardedArray<float> y;  // assigned in a branch, as in `if (...) y = f(x);`
  EXPECT_TRUE(y.empty());
  int line = __LINE__ + 1;
  expect_site<ValueError>([&] { (void)exp(y); }, {here(line), "empty ShardedArray"});
  line = __LINE__ + 1;
  expect_site<ValueError>([&] { (void)y.to_host(); }, {here(line), "empty"});
  expect_error<ValueError>([&] { (void)y.item(); }, {"empty"});
  expect_error<ValueError>(
      [&] { (void)shard_map(mesh, P("a"), P("a"), [](const Tensor<float>& b) { return b; })(y); },
      {"argument 0", "empty"});
  EXPECT_EQ(y.sharding().mesh().to_string(), "Mesh(empty)");
  const Tensor<float> h = random_tensor<float>({2 * n, 3}, 10);
  if (n > 0) y = device_put(h, NamedSharding(mesh, P("a")));
  EXPECT_FALSE(y.empty());
  EXPECT_EQ(y.to_host(), h);
  std::vector<ShardedArray<float>> slots(2);  // containers of empty arrays, filled later
  slots[1] = y * 2.0f;
  EXPECT_TRUE(slots[0].empty());
  EXPECT_EQ(slots[1].to_host(), h * 2.0f);
}

SHARD_MPI_TEST(CallSites, GradAndOptimizersNameTheirLines) {
  const Mesh mesh = mesh_1d();
  const int n = runtime().device_count();
  std::map<std::string, ShardedArray<double>> params = {
      {"w", device_put(random_tensor<double>({2 * n, 3}, 5), NamedSharding(mesh, P("a")))},
      {"b", device_put(random_tensor<double>({3}, 6), NamedSharding(mesh, P()))}};
  // An operator inside the differentiated function: the grad() line.
  const int line = __LINE__ + 1;
  auto bad = grad([](const std::map<std::string, ShardedArray<double>>& p) {
    return mean(p.at("w") + Tensor<double>({4}, 1.0));
  });
  expect_site<Error>([&] { (void)bad(params); }, {here(line), "shard::grad"});
  // An optimizer given gradients of another structure: the update's line.
  const optim::Optimizer opt = optim::adam(1e-3);
  auto state = opt.init(params);
  std::map<std::string, ShardedArray<double>> grads = {{"w", params.at("w")}};
  const int update_line = __LINE__ + 1;
  expect_site<ValueError>([&] { opt.update(params, grads, state); },
                          {here(update_line), "Optimizer::update"});
}

SHARD_MPI_TEST(CallSites, CollectiveMismatchNamesEachRanksLine) {
  if (runtime().process_count() < 2) GTEST_SKIP() << "needs 2 ranks";
  const CheckOn on;
  const Mesh mesh = mesh_1d();
  const auto x =
      device_put(random_tensor<double>({runtime().device_count(), 3}, 7), NamedSharding(mesh, P("a")));
  const auto r = device_put(random_tensor<double>({2, 3}, 8), NamedSharding(mesh, P()));
  const int host_line = __LINE__ + 4, psum_line = host_line + 2;
  expect_site<CollectiveMismatchError>(
      [&] {
        if (runtime().process_index() == 0) {
          (void)x.to_host();
        } else {
          (void)psum(r, "a");
        }
      },
      {"collective mismatch", here(host_line), here(psum_line)});
}

SHARD_MPI_TEST(CallSites, CheckpointsNameTheirLines) {
  const Mesh mesh = mesh_1d();
  const NamedSharding s(mesh, P("a"));
  const auto x = device_put(random_tensor<float>({2 * runtime().device_count(), 3}, 9), s);
  TempDir dir("shard-test-sites-", false);
  CheckpointWriter w(dir.str(), 1);
  w.add("x", x);
  int line = __LINE__ + 1;
  expect_site<ValueError>([&] { (void)w.commit(-3); },
                          {here(line), "CheckpointWriter::commit", "step must be >= 0"});
  const std::string p = w.commit(2);
  const CheckpointManifest m = read_manifest(p);
  line = __LINE__ + 1;
  expect_site<ValueError>([&] { (void)load_checkpoint_array<double>(p, m, "x", s); },
                          {here(line), "load_checkpoint_array"});
  line = __LINE__ + 1;
  expect_site<ShapeError>([&] { (void)load_checkpoint_array<float>(p, m, "x", s, Shape{1}); }, {here(line)});
  line = __LINE__ + 1;
  expect_site<IoError>([&] { (void)read_manifest(dir.str() + "/step-00000009"); },
                       {here(line), "read_manifest"});
  if (runtime().process_count() < 2) return;
  // A collective mismatch inside a commit (rank 1 recorded one more array) names the commit's line.
  CheckpointWriter v(dir.str(), 1);
  v.add("x", x);
  if (runtime().process_index() == 1) v.add("y", x);
  line = __LINE__ + 1;
  expect_site<Error>([&] { (void)v.commit(3); }, {here(line), "CheckpointWriter::commit"});
}

}  // namespace
}  // namespace shard::testing
