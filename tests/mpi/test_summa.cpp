// SUMMA against a host reference on every p x q factorisation of the device count
// (including 1 x p, p x 1 and non-square grids), uneven and rectangular shapes, panel widths.

#include <cmath>

#include "mpi_test.hpp"
#include "shard/linalg/linalg.hpp"
#include "test_util.hpp"

namespace shard::testing {
namespace {

template <typename T>
void check(const Mesh& mesh, const Shape& as, const Shape& bs, std::uint64_t seed, std::int64_t panel,
           bool overlap = true) {
  const NamedSharding s(mesh, P("r", "c"));
  const Tensor<double> ha = random_tensor<double>(as, seed), hb = random_tensor<double>(bs, seed + 1);
  Tensor<T> ta(as), tb(bs);
  for (std::int64_t i = 0; i < ta.size(); ++i) ta.flat(i) = static_cast<T>(ha.flat(i));
  for (std::int64_t i = 0; i < tb.size(); ++i) tb.flat(i) = static_cast<T>(hb.flat(i));
  Tensor<double> ref({as[0], bs[1]}, 0.0);
  for (std::int64_t i = 0; i < as[0]; ++i)
    for (std::int64_t k = 0; k < as[1]; ++k)
      for (std::int64_t j = 0; j < bs[1]; ++j)
        ref(i, j) += static_cast<double>(ta(i, k)) * static_cast<double>(tb(k, j));
  // B arrives in another layout on purpose: summa reshards it to P('r', 'c').
  const auto c = linalg::summa(device_put(ta, s), device_put(tb, NamedSharding(mesh, P("c", None))),
                               linalg::SummaOptions{panel, overlap});
  EXPECT_EQ(c.spec(), P("r", "c"));
  const MaxError me = max_error(c, ref);
  EXPECT_TRUE(me.boxes_ok);
  const double err = me.err, norm = me.norm;
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
  EXPECT_LE(err / norm, tol) << mesh.to_string() << " " << to_string(as) << " x " << to_string(bs) << " panel "
                             << panel;
}

SHARD_MPI_TEST(Summa, EveryGrid) {
  std::uint64_t seed = 1;
  for (const auto& f : factorisations(runtime().device_count(), 2)) {
    const Mesh mesh = make_mesh(f, {"r", "c"});
    check<double>(mesh, {12, 12}, {12, 12}, seed++, 0);
    check<double>(mesh, {13, 7}, {7, 11}, seed++, 0);   // m != k != n, uneven
    check<double>(mesh, {9, 17}, {17, 5}, seed++, 3);   // panels cut inside blocks
    check<double>(mesh, {3, 2}, {2, 3}, seed++, 1);     // empty blocks
    check<float>(mesh, {10, 14}, {14, 6}, seed++, 4);
    check<double>(mesh, {300, 40}, {40, 20}, seed++, 8);         // several row pieces per update
    check<double>(mesh, {300, 40}, {40, 20}, seed++, 8, false);  // each broadcast waited at once
  }
}

SHARD_MPI_TEST(Summa, Errors) {
  const Mesh mesh = make_mesh({runtime().device_count()}, {"r"});
  const auto a = zeros<double>({4, 4}, NamedSharding(mesh, P("r")));
  expect_error<ShardingError>([&] { linalg::summa(a, a); }, {"P(r, c)"});
}

}  // namespace
}  // namespace shard::testing
