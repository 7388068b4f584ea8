// Cannon's algorithm against a host reference on q x q meshes (q*q <= devices; the mesh may
// leave ranks out), uneven and rectangular shapes, and the exact bytes it sends.

#include <cmath>

#include "mpi_test.hpp"
#include "shard/linalg/linalg.hpp"
#include "test_util.hpp"

namespace shard::testing {
namespace {

Tensor<double> host_product(const Tensor<double>& a, const Tensor<double>& b) {
  const std::int64_t m = a.shape()[0], k = a.shape()[1], n = b.shape()[1];
  Tensor<double> c({m, n}, 0.0);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t q = 0; q < k; ++q)
      for (std::int64_t j = 0; j < n; ++j) c(i, j) += a(i, q) * b(q, j);
  return c;
}

/// A q x q mesh ('r', 'c') over the first q*q devices in make_mesh order.
Mesh square_mesh(int q) {
  const Mesh all = make_mesh({runtime().device_count()}, {"x"});
  return Mesh({q, q}, {"r", "c"}, std::vector<int>(all.device_ids().begin(), all.device_ids().begin() + q * q));
}

template <typename T>
void check(int q, const Shape& as, const Shape& bs, std::uint64_t seed, int panels = 0, bool overlap = true) {
  const Mesh mesh = square_mesh(q);
  const NamedSharding s(mesh, P("r", "c"));
  const Tensor<double> ha = random_tensor<double>(as, seed), hb = random_tensor<double>(bs, seed + 1);
  Tensor<T> ta(as), tb(bs);
  for (std::int64_t i = 0; i < ta.size(); ++i) ta.flat(i) = static_cast<T>(ha.flat(i));
  for (std::int64_t i = 0; i < tb.size(); ++i) tb.flat(i) = static_cast<T>(hb.flat(i));
  Tensor<double> da(as), db(bs);  // the reference uses exactly the values T can hold
  for (std::int64_t i = 0; i < ta.size(); ++i) da.flat(i) = static_cast<double>(ta.flat(i));
  for (std::int64_t i = 0; i < tb.size(); ++i) db.flat(i) = static_cast<double>(tb.flat(i));
  const Tensor<double> ref = host_product(da, db);
  const auto c = linalg::cannon(device_put(ta, s), device_put(tb, s), linalg::CannonOptions{panels, overlap});
  EXPECT_EQ(c.spec(), P("r", "c"));
  EXPECT_EQ(c.shape(), (Shape{as[0], bs[1]}));
  const MaxError me = max_error(c, ref);
  EXPECT_TRUE(me.boxes_ok);
  const double err = me.err, norm = me.norm;
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
  EXPECT_LE(err / norm, tol)
      << "q=" << q << " " << to_string(as) << " x " << to_string(bs) << " max error " << err;
}

std::vector<int> square_sides() {
  std::vector<int> out;
  for (int q = 1; q * q <= runtime().device_count(); ++q) out.push_back(q);
  return out;
}

SHARD_MPI_TEST(Cannon, SquareRectangularUnevenDouble) {
  std::uint64_t seed = 1;
  for (int q : square_sides()) {
    check<double>(q, {8 * q, 8 * q}, {8 * q, 8 * q}, seed++);
    check<double>(q, {13, 7}, {7, 11}, seed++);          // m != k != n, uneven
    check<double>(q, {5, 3 * q + 1}, {3 * q + 1, 2}, seed++);  // short and empty blocks
    check<double>(q, {40, 33}, {33, 29}, seed++, 3);     // panels
    check<double>(q, {40, 33}, {33, 29}, seed++, 3, false);  // each shift waited at once
  }
}

SHARD_MPI_TEST(Cannon, Float) {
  std::uint64_t seed = 50;
  for (int q : square_sides()) {
    check<float>(q, {6 * q, 5 * q}, {5 * q, 7 * q}, seed++);
    check<float>(q, {11, 9}, {9, 10}, seed++);
  }
}

SHARD_MPI_TEST(Cannon, SendsSkewPlusQMinusOneShifts) {
  const int q = square_sides().back();
  const Mesh mesh = square_mesh(q);
  const NamedSharding s(mesh, P("r", "c"));
  const Shape as{6 * q + 1, 4 * q}, bs{4 * q, 5 * q};
  const auto a = device_put(random_tensor<double>(as, 7), s);
  const auto b = device_put(random_tensor<double>(bs, 8), s);
  const std::int64_t mb = (as[0] + q - 1) / q, kb = (as[1] + q - 1) / q, nb = (bs[1] + q - 1) / q;
  // Independent count: each local device sends its A block to (i, j-i) and its B block to
  // (i-j, j) when that device is on another rank, then q-1 times to (i, j-1) and (i-1, j).
  const Topology& topo = mesh.topology();
  std::int64_t expect = 0;
  auto other_rank = [&](int device, int i, int j) {
    return topo.owner(mesh.device_at({((i % q) + q) % q, ((j % q) + q) % q})) != topo.owner(device);
  };
  for (int d : mesh.local_device_ids()) {
    const auto co = mesh.coords(d);
    const int i = co[0], j = co[1];
    if (other_rank(d, i, j - i)) expect += mb * kb * 8;
    if (other_rank(d, i - j, j)) expect += kb * nb * 8;
    if (other_rank(d, i, j - 1)) expect += (q - 1) * mb * kb * 8;
    if (other_rank(d, i - 1, j)) expect += (q - 1) * kb * nb * 8;
  }
  comm_stats().reset();
  const auto c = linalg::cannon(a, b);
  EXPECT_EQ(comm_stats().get("cannon").bytes, expect);
  EXPECT_EQ(comm_stats().total().bytes, expect);  // nothing else moved
  (void)c;
}

SHARD_MPI_TEST(Cannon, Errors) {
  const int n = runtime().device_count();
  const Mesh line = make_mesh({n, 1}, {"r", "c"});
  const auto a = zeros<double>({4, 4}, NamedSharding(line, P("r", "c")));
  if (n > 1) {
    expect_error<ShardingError>([&] { linalg::cannon(a, a); }, {"square", "'r' has size"});
  }
  const auto b = zeros<double>({4, 4}, NamedSharding(line, P("r")));
  expect_error<ShardingError>([&] { linalg::cannon(b, b); }, {"P(.., r, c)"});
  const Mesh sq = square_mesh(1);
  const auto x = zeros<double>({4, 3}, NamedSharding(sq, P("r", "c")));
  expect_error<ShapeError>([&] { linalg::cannon(x, x); }, {"do not multiply"});
}

}  // namespace
}  // namespace shard::testing
