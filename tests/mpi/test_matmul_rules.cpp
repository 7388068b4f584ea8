// matmul with sharding rules against a host reference: every local shard of C on every rank,
// the result layout of each rule, and the communication CommStats saw.

#include <algorithm>
#include <cmath>

#include "mpi_test.hpp"
#include "test_util.hpp"

namespace shard::testing {
namespace {

template <typename T>
Tensor<T> host_matmul(const Tensor<T>& a, const Tensor<T>& b) {
  const int ra = a.rank();
  const std::int64_t m = a.shape()[ra - 2], k = a.shape()[ra - 1], n = b.shape().back();
  Shape cs(a.shape().begin(), a.shape().end() - 1);
  cs.push_back(n);
  Tensor<T> c(cs, T(0));
  const std::int64_t batches = num_elements(Shape(a.shape().begin(), a.shape().end() - 2));
  for (std::int64_t i = 0; i < batches; ++i)
    for (std::int64_t r = 0; r < m; ++r)
      for (std::int64_t col = 0; col < n; ++col) {
        double s = 0;
        for (std::int64_t q = 0; q < k; ++q)
          s += static_cast<double>(a.flat(i * m * k + r * k + q)) *
               static_cast<double>(b.flat((b.rank() > 2 ? i * k * n : 0) + q * n + col));
        c.flat(i * m * n + r * n + col) = static_cast<T>(s);
      }
  return c;
}

/// For bfloat16, whose products' partial sums are rounded to 8 bits before they are summed
/// over devices: each element of c's tolerance scales with sum |a| |b| (cancellation).
template <typename T>
Tensor<double> host_abs_matmul(const Tensor<T>& a, const Tensor<T>& b) {
  Tensor<double> da(a.shape()), db(b.shape());
  for (std::int64_t i = 0; i < a.size(); ++i) da.flat(i) = std::abs(static_cast<double>(a.flat(i)));
  for (std::int64_t i = 0; i < b.size(); ++i) db.flat(i) = std::abs(static_cast<double>(b.flat(i)));
  return host_matmul(da, db);
}

template <typename T>
void expect_close(const ShardedArray<T>& c, const Tensor<T>& ref, const std::string& what,
                  const Tensor<double>* magnitude = nullptr) {
  const double tol = tol_for<T>(1e-4, 1e-10, 2e-2);
  for (const auto& s : c.addressable_shards()) {
    EXPECT_EQ(s.box, reference_box(c.mesh(), c.spec(), c.shape(), s.device)) << what;
    const auto want = reference_slice(ref, s.box);
    const auto mag = magnitude ? reference_slice(*magnitude, s.box) : std::vector<double>(want.size(), 0.0);
    ASSERT_EQ(static_cast<std::int64_t>(want.size()), s.data.size()) << what;
    for (std::size_t i = 0; i < want.size(); ++i) {
      const double w = static_cast<double>(want[i]);
      const double got = static_cast<double>(s.data.flat(static_cast<std::int64_t>(i)));
      const double scale = mag[i];
      if (std::abs(got - w) > tol * (1 + std::abs(w) + scale)) {
        ADD_FAILURE() << what << " device " << s.device << " element " << i << ": " << got << " vs " << w;
        return;
      }
    }
  }
}

template <typename T>
void check_pair(const Mesh& mesh, const PartitionSpec& pa, const PartitionSpec& pb, const Shape& as, const Shape& bs,
                std::uint64_t seed) {
  const std::string what = mesh.to_string() + " " + pa.to_string() + " @ " + pb.to_string() + " " +
                           to_string(as) + " x " + to_string(bs);
  const Tensor<T> ha = random_tensor<T>(as, seed), hb = random_tensor<T>(bs, seed + 1);
  const auto a = device_put(ha, NamedSharding(mesh, pa));
  const auto b = device_put(hb, NamedSharding(mesh, pb));
  const auto c = matmul(a, b);
  const Tensor<double> mag = host_abs_matmul(ha, hb);
  expect_close(c, host_matmul(ha, hb), what, std::is_same_v<T, bfloat16> ? &mag : nullptr);
}

std::vector<Mesh> meshes() {
  const int n = runtime().device_count();
  std::vector<Mesh> out{make_mesh({n}, {"a"})};
  for (const auto& f : factorisations(n, 2)) out.push_back(make_mesh(f, {"a", "b"}));
  return out;
}

SHARD_MPI_TEST(MatmulRules, EveryPairOfSpecs) {
  std::uint64_t seed = 100;
  for (const auto& mesh : meshes()) {
    const auto specs = all_specs(mesh.axis_names(), 2);
    for (const auto& pa : specs)
      for (const auto& pb : specs) check_pair<double>(mesh, pa, pb, {13, 7}, {7, 9}, seed++);
  }
}

SHARD_MPI_TEST(MatmulRules, ThreeDMeshSampledPairs) {
  const int n = runtime().device_count();
  std::vector<int> shape;
  for (const auto& f : factorisations(n, 3))
    if (std::count(f.begin(), f.end(), 1) <= (n >= 8 ? 0 : n >= 4 ? 1 : 2)) shape = f;
  if (shape.empty()) shape = {1, 1, n};
  const Mesh mesh = make_mesh(shape, {"a", "b", "c"});
  const auto specs = all_specs(mesh.axis_names(), 2);
  std::uint64_t seed = 5000;
  int k = 0, checked = 0;
  for (const auto& pa : specs)
    for (const auto& pb : specs)
      if (k++ % 11 == 0) {  // every 11th pair keeps the run short; the order walks all rules
        check_pair<double>(mesh, pa, pb, {10, 12}, {12, 6}, seed++);
        ++checked;
      }
  EXPECT_GT(checked, 10);
}

template <typename T>
class MatmulTyped : public MpiTest {};
using Types = ::testing::Types<float, double, std::int32_t, std::int64_t, bfloat16>;
TYPED_TEST_SUITE(MatmulTyped, Types);

TYPED_TEST(MatmulTyped, RulesAndBatches) {
  const int n = runtime().device_count();
  const Mesh m2 = n % 2 == 0 ? make_mesh({n / 2, 2}, {"a", "b"}) : make_mesh({n, 1}, {"a", "b"});
  check_pair<TypeParam>(m2, P("a", None), P(None, "b"), {12, 5}, {5, 6}, 1);
  check_pair<TypeParam>(m2, P(None, "a"), P("a", None), {9, 16}, {16, 4}, 2);  // contracting dim sharded
  check_pair<TypeParam>(m2, P("a", "b"), P("a", "b"), {8, 8}, {8, 8}, 3);      // Cannon layout: resharded
  check_pair<TypeParam>(m2, P("a", None, None), P(None, "b"), {3, 5, 4}, {4, 7}, 4);       // batched A
  check_pair<TypeParam>(m2, P("a", None, "b"), P("a", "b", None), {4, 3, 6}, {4, 6, 5}, 5);  // batched A and B
}

SHARD_MPI_TEST(MatmulRules, RowsTimesColumnsSendsNothing) {
  const int n = runtime().device_count();
  const Mesh mesh = n % 2 == 0 ? make_mesh({n / 2, 2}, {"a", "b"}) : make_mesh({n, 1}, {"a", "b"});
  const auto ha = random_tensor<double>({10, 6}, 7), hb = random_tensor<double>({6, 8}, 8);
  const auto a = device_put(ha, NamedSharding(mesh, P("a", None)));
  const auto b = device_put(hb, NamedSharding(mesh, P(None, "b")));
  comm_stats().reset();
  const auto c = matmul(a, b);
  EXPECT_EQ(comm_stats().total().calls, 0);
  EXPECT_EQ(comm_stats().total().bytes, 0);
  EXPECT_EQ(c.spec(), P("a", "b"));
  expect_close(c, host_matmul(ha, hb), "P('a',None) @ P(None,'b')");
}

SHARD_MPI_TEST(MatmulRules, ContractingDimPsumOrPsumScatter) {
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"k"});
  const auto ha = random_tensor<double>({2 * n, 3 * n}, 9), hb = random_tensor<double>({3 * n, 4}, 10);
  const auto a = device_put(ha, NamedSharding(mesh, P(None, "k")));
  const auto b = device_put(hb, NamedSharding(mesh, P("k", None)));
  const auto ref = host_matmul(ha, hb);
  comm_stats().reset();
  const auto c = matmul(a, b);
  EXPECT_EQ(c.spec(), P());  // replicated over the contracting axis after the psum
  EXPECT_EQ(comm_stats().get("reshard").calls, 0);
  expect_close(c, ref, "psum");
  const NamedSharding rows(mesh, P("k", None));
  comm_stats().reset();
  const auto d = matmul(a, b, &rows);
  EXPECT_EQ(d.spec(), P("k", None));
  EXPECT_EQ(comm_stats().get("psum").calls, 0);
  if (runtime().process_count() > 1) {
    EXPECT_GT(comm_stats().get("psum_scatter").calls, 0);
  }
  expect_close(d, ref, "psum_scatter");
}

SHARD_MPI_TEST(MatmulRules, Errors) {
  const Mesh mesh = make_mesh({runtime().device_count()}, {"a"});
  const auto a = zeros<double>({4, 5}, NamedSharding(mesh, P("a")));
  const auto b = zeros<double>({6, 3}, NamedSharding(mesh, P()));
  EXPECT_THROW(matmul(a, b), ShapeError);
}

}  // namespace
}  // namespace shard::testing
