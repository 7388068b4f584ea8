// matmul's algorithms against a host cblas_dgemm: Auto, Cannon, SUMMA, ScaLAPACK and the
// rules on the grids 1x1, 2x2, 3x3, 1x2, 2x1, 2x3 (those that fit the device count), square,
// rectangular and uneven shapes, float and double, batched Cannon; which algorithm Auto picks;
// the errors of a forced algorithm that cannot run.

#include <cblas.h>

#include "mpi_test.hpp"
#include "shard/linalg/linalg.hpp"
#include "shard/ops/matmul.hpp"
#include "shard/linalg/scalapack.hpp"
#include "test_util.hpp"

namespace shard::testing {
namespace {

/// A p x q mesh ('r', 'c') over the first p*q devices in make_mesh order.
Mesh grid(int p, int q) {
  const Mesh all = make_mesh({runtime().device_count()}, {"x"});
  return Mesh({p, q}, {"r", "c"}, std::vector<int>(all.device_ids().begin(), all.device_ids().begin() + p * q));
}

std::vector<std::pair<int, int>> grids() {
  std::vector<std::pair<int, int>> out;
  for (auto [p, q] : std::vector<std::pair<int, int>>{{1, 1}, {2, 2}, {3, 3}, {1, 2}, {2, 1}, {2, 3}})
    if (p * q <= runtime().device_count()) out.emplace_back(p, q);
  return out;
}

/// Random values of type T and the same values as double.
template <typename T>
std::pair<Tensor<T>, Tensor<double>> operand(const Shape& shape, std::uint64_t seed) {
  const Tensor<double> r = random_tensor<double>(shape, seed);
  Tensor<T> t(shape);
  Tensor<double> d(shape);
  for (std::int64_t i = 0; i < t.size(); ++i) {
    t.flat(i) = static_cast<T>(r.flat(i));
    d.flat(i) = static_cast<double>(t.flat(i));
  }
  return {t, d};
}

/// Host reference: c[.., m, n] = a[.., m, k] @ b[(..,) k, n] with cblas_dgemm per batch element.
Tensor<double> reference(const Tensor<double>& a, const Tensor<double>& b) {
  const int ra = a.rank(), rb = b.rank();
  const std::int64_t m = a.shape()[ra - 2], k = a.shape()[ra - 1], n = b.shape()[rb - 1];
  Shape cs = a.shape();
  cs[ra - 1] = n;
  Tensor<double> c(cs, 0.0);
  const std::int64_t batches = m * n == 0 ? 0 : c.size() / (m * n);
  for (std::int64_t e = 0; e < batches; ++e)
    if (m > 0 && n > 0 && k > 0)
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
                  static_cast<int>(k), 1.0, a.data() + e * m * k, static_cast<int>(k),
                  b.data() + (rb > 2 ? e * k * n : 0), static_cast<int>(n), 0.0, c.data() + e * m * n,
                  static_cast<int>(n));
  return c;
}

template <typename T>
double tolerance() {
  return std::is_same_v<T, float> ? 1e-5 : 1e-12;
}

/// Multiplies with `algorithm` and checks C's layout and values (relative error against the
/// largest reference entry) on every rank.
template <typename T>
void check(const NamedSharding& sa, const NamedSharding& sb, const Shape& as, const Shape& bs, Algorithm algorithm,
           const PartitionSpec& want_spec, std::uint64_t seed) {
  const auto [ta, da] = operand<T>(as, seed);
  const auto [tb, db] = operand<T>(bs, seed + 1);
  const Tensor<double> ref = reference(da, db);
  const auto c = matmul(device_put(ta, sa), device_put(tb, sb), algorithm);
  const std::string what = sa.mesh().to_string() + " " + algorithm_name(algorithm) + " " + to_string(as) + " x " +
                           to_string(bs) + " " + dtype_name<T>();
  EXPECT_EQ(c.shape(), ref.shape()) << what;
  EXPECT_EQ(c.spec(), want_spec) << what;
  const MaxError me = max_error(c, ref);
  EXPECT_TRUE(me.boxes_ok) << what;
  EXPECT_LE(me.err / me.norm, tolerance<T>()) << what << ": max error " << me.err << ", largest entry " << me.norm;
}

/// The algorithms that can run on a p x q grid here.
std::vector<Algorithm> algorithms(int p, int q) {
  std::vector<Algorithm> out{Algorithm::kAuto, Algorithm::kSumma, Algorithm::kRules};
  if (p == q) out.push_back(Algorithm::kCannon);
  // ScaLAPACK: one mesh device per rank, every rank in the grid.
  if (runtime().devices_per_rank() == 1 && p * q == runtime().process_count()) out.push_back(Algorithm::kScaLAPACK);
  return out;
}

SHARD_MPI_TEST(LinalgMatmul, EveryAlgorithmOnEveryGrid) {
  std::uint64_t seed = 1;
  for (auto [p, q] : grids()) {
    const NamedSharding s(grid(p, q), P("r", "c"));
    for (Algorithm alg : algorithms(p, q)) {
      check<double>(s, s, {6 * p * q, 6 * p * q}, {6 * p * q, 6 * p * q}, alg, P("r", "c"), seed++);  // square
      check<double>(s, s, {17, 9}, {9, 13}, alg, P("r", "c"), seed++);  // m != k != n, uneven
      check<double>(s, s, {2, 5}, {5, 3}, alg, P("r", "c"), seed++);    // empty blocks
      check<float>(s, s, {12, 10}, {10, 14}, alg, P("r", "c"), seed++);
      check<float>(s, s, {7, 11}, {11, 5}, alg, P("r", "c"), seed++);
    }
  }
}

SHARD_MPI_TEST(LinalgMatmul, AutoPicksByLayout) {
  const Shape sq{8, 8};
  for (auto [p, q] : grids()) {
    const Mesh mesh = grid(p, q);
    const NamedSharding rc(mesh, P("r", "c"));
    const Algorithm two_d = p * q == 1 ? Algorithm::kRules : p == q ? Algorithm::kCannon : Algorithm::kSumma;
    EXPECT_EQ(choose_algorithm(sq, rc, sq, rc), two_d) << mesh.to_string();
    EXPECT_EQ(choose_algorithm(sq, NamedSharding(mesh, P("r")), sq, NamedSharding(mesh, P(None, "c"))),
              Algorithm::kRules);
    EXPECT_EQ(choose_algorithm(sq, rc, sq, NamedSharding(mesh, P("c", "r"))), Algorithm::kRules);
    const Shape batched{3, 8, 8};
    const NamedSharding brc(mesh, P(None, "r", "c"));
    EXPECT_EQ(choose_algorithm(batched, brc, batched, brc), p == q && p > 1 ? Algorithm::kCannon : Algorithm::kRules);
  }
  EXPECT_EQ(parse_algorithm("summa"), Algorithm::kSumma);
  for (Algorithm a : {Algorithm::kAuto, Algorithm::kRules, Algorithm::kCannon, Algorithm::kSumma, Algorithm::kScaLAPACK})
    EXPECT_EQ(parse_algorithm(algorithm_name(a)), a);
  expect_error<ValueError>([] { parse_algorithm("strassen"); }, {"'strassen'", "cannon, summa"});
}

SHARD_MPI_TEST(LinalgMatmul, AutoRunsTheRulesOtherwise) {
  const Mesh mesh = make_mesh({runtime().device_count()}, {"x"});
  const NamedSharding rows(mesh, P("x")), cols(mesh, P(None, "x"));
  check<double>(rows, cols, {11, 6}, {6, 9}, Algorithm::kAuto, P("x"), 300);
  check<double>(cols, rows, {5, 14}, {14, 7}, Algorithm::kAuto, P(), 301);
  const auto ai = device_put(random_tensor<std::int32_t>({4, 4}, 5), rows);
  expect_error<ValueError>([&] { matmul(ai, ai, Algorithm::kCannon); }, {"float and double only", "int32"});
}

/// Batched Cannon: A[B, M, K] sharded P(batch, r, c) with the batch over a third mesh axis
/// (or None) and B[K, N] or B[B, K, N].
SHARD_MPI_TEST(LinalgMatmul, BatchedCannon) {
  const int n = runtime().device_count();
  std::uint64_t seed = 500;
  for (int q = 1; q * q <= n; ++q) {
    const int batch_axis = n / (q * q) >= 2 ? 2 : 1;
    const Mesh all = make_mesh({n}, {"x"});
    const Mesh mesh({batch_axis, q, q}, {"b", "r", "c"},
                    std::vector<int>(all.device_ids().begin(), all.device_ids().begin() + batch_axis * q * q));
    for (const PartitionSpec& spec : {P("b", "r", "c"), P(None, "r", "c")}) {
      const NamedSharding sa(mesh, spec);
      check<double>(sa, sa, {3, 9, 7}, {3, 7, 10}, Algorithm::kCannon, spec, seed++);       // batched B
      check<double>(sa, NamedSharding(mesh, P("r", "c")), {5, 8, 6}, {6, 11}, Algorithm::kCannon, spec, seed++);
      check<float>(sa, sa, {2, 6, 6}, {2, 6, 6}, Algorithm::kCannon, spec, seed++);
      if (q > 1) check<double>(sa, sa, {3, 9, 7}, {3, 7, 10}, Algorithm::kAuto, spec, seed++);
    }
  }
}

SHARD_MPI_TEST(LinalgMatmul, ForcedAlgorithmErrors) {
  const int n = runtime().device_count();
  const Mesh line = make_mesh({n}, {"x"});
  const auto v = device_put(random_tensor<double>({4, 4}, 9), NamedSharding(line, P("x")));
  expect_error<ShardingError>([&] { matmul(v, v, Algorithm::kCannon); }, {"cannon", "P(.., r, c)"});
  expect_error<ShardingError>([&] { matmul(v, v, Algorithm::kSumma); }, {"summa", "P(r, c)"});
  if (n > 1) {
    const NamedSharding rc(grid(1, n), P("r", "c"));
    const auto a = device_put(random_tensor<double>({4, 4}, 10), rc);
    expect_error<ShardingError>([&] { matmul(a, a, Algorithm::kCannon); }, {"square", "use SUMMA"});
  }
}

}  // namespace
}  // namespace shard::testing
