// ScaLAPACK interop: descriptors of the no-copy views, the mesh's BLACS grid cache,
// p?gemm against cblas, solve and cholesky against host LAPACK, and the errors every rank
// must see (singular, not positive definite, a mesh with two devices on one rank).

#include <cblas.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>

#include "mpi_test.hpp"
#include "shard/comm/detail/mesh_comms.hpp"
#include "shard/linalg/detail/scalapack_api.hpp"
#include "shard/linalg/scalapack.hpp"
#include "test_util.hpp"

// Host LAPACK (liblapack / OpenBLAS, linked through ScaLAPACK). The trailing size_t is the
// hidden Fortran length of the character argument.
extern "C" {
void dgesv_(const int* n, const int* nrhs, double* a, const int* lda, int* ipiv, double* b, const int* ldb, int* info);
void dpotrf_(const char* uplo, const int* n, double* a, const int* lda, int* info, std::size_t uplo_len);
}

namespace shard::testing {
namespace {

using linalg::cholesky;
using linalg::scalapack_matmul;
using linalg::solve;

template <typename T>
double tol() {
  return std::is_same_v<T, float> ? 1e-5 : 1e-12;
}

/// Meshes of one device per rank that fit this job: devices {0, k, 2k, ...} (one per rank),
/// shapes 1x1, 2x2, 1x2, 2x1, 2x3 when there are enough ranks, plus one in reverse rank order.
std::vector<Mesh> meshes() {
  const int n = runtime().process_count(), k = runtime().devices_per_rank();
  std::vector<Mesh> out;
  for (const std::vector<int>& s : std::vector<std::vector<int>>{{1, 1}, {2, 2}, {1, 2}, {2, 1}, {2, 3}}) {
    if (s[0] * s[1] > n) continue;
    std::vector<int> ids;
    for (int i = 0; i < s[0] * s[1]; ++i) ids.push_back(i * k);
    out.emplace_back(s, std::vector<std::string>{"x", "y"}, ids);
  }
  if (n >= 2) {
    std::vector<int> ids;
    for (int i = n - 1; i >= 0; --i) ids.push_back(i * k);
    out.emplace_back(std::vector<int>{n >= 4 ? 2 : 1, n >= 4 ? n / 2 : n}, std::vector<std::string>{"x", "y"},
                     n >= 4 ? std::vector<int>(ids.begin(), ids.begin() + 2 * (n / 2)) : ids);
  }
  return out;
}

Tensor<double> to_double(const Tensor<float>& t) {
  Tensor<double> out(t.shape());
  std::copy(t.begin(), t.end(), out.begin());
  return out;
}
const Tensor<double>& to_double(const Tensor<double>& t) { return t; }

/// ||x - y||_F / ||y||_F.
double rel_diff(const Tensor<double>& x, const Tensor<double>& y) {
  double num = 0, den = 0;
  for (std::int64_t i = 0; i < y.size(); ++i) {
    num += (x.flat(i) - y.flat(i)) * (x.flat(i) - y.flat(i));
    den += y.flat(i) * y.flat(i);
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

Tensor<double> host_gemm(const Tensor<double>& a, const Tensor<double>& b) {
  const int m = static_cast<int>(a.shape()[0]), k = static_cast<int>(a.shape()[1]), n = static_cast<int>(b.shape()[1]);
  Tensor<double> c(Shape{m, n}, 0.0);
  if (m && n && k)
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0, a.data(), k, b.data(), n, 0.0, c.data(), n);
  return c;
}

/// Checks each local shard sits where the sharding says.
template <typename T>
void expect_layout(const ShardedArray<T>& x, const std::string& what) {
  for (const auto& s : x.addressable_shards())
    EXPECT_EQ(s.box, reference_box(x.mesh(), x.spec(), x.shape(), s.device)) << what;
}

// ---- descriptors and grids ----

SHARD_MPI_TEST(ScaLAPACK, NumrocMatchesJaxUnevenRule) {
  for (int n = 0; n <= 23; ++n)
    for (int p = 1; p <= 6; ++p) {
      const int nb = std::max(1, static_cast<int>((n + p - 1) / p)), zero = 0;
      for (int i = 0; i < p; ++i)
        EXPECT_EQ(detail::scalapack_api::numroc_(&n, &nb, &i, &zero, &p), chunk_of(n, p, i).extent)
            << "n " << n << " p " << p << " i " << i;
    }
}

SHARD_MPI_TEST(ScaLAPACK, DescriptorIsTheTransposedViewOfTheShard) {
  for (const auto& mesh : meshes())
    for (const auto& spec : {P("x", "y"), P("y", "x")})
      for (const Shape& shape : {Shape{8, 6}, Shape{7, 5}, Shape{2, 1}, Shape{1, 9}}) {
        const std::string what = mesh.to_string() + " " + spec.to_string() + " " + to_string(shape);
        const auto x = arange<double>(shape, NamedSharding(mesh, spec));
        const auto d = linalg::transposed_descriptor(x);
        const std::string r = spec[0].axes()[0], c = spec[1].axes()[0];
        EXPECT_EQ(d.rows(), shape[1]) << what;
        EXPECT_EQ(d.cols(), shape[0]) << what;
        EXPECT_EQ(d.row_block(), std::max<std::int64_t>(1, (shape[1] + mesh.axis_size(c) - 1) / mesh.axis_size(c))) << what;
        EXPECT_EQ(d.col_block(), std::max<std::int64_t>(1, (shape[0] + mesh.axis_size(r) - 1) / mesh.axis_size(r))) << what;
        EXPECT_EQ(d.in_grid, !x.addressable_shards().empty()) << what;
        if (!d.in_grid) {
          EXPECT_EQ(d.context(), -1) << what;
          continue;
        }
        const auto& s = x.addressable_shards()[0];
        EXPECT_EQ(d.local_rows, s.box.extent[1]) << what;
        EXPECT_EQ(d.local_cols, s.box.extent[0]) << what;
        EXPECT_EQ(d.lld(), std::max<std::int64_t>(1, s.box.extent[1])) << what;
        const auto g = linalg::blacs_grid(mesh, c, r);
        EXPECT_EQ(d.context(), g.context) << what;
        const auto coords = mesh.coords(s.device);
        EXPECT_EQ(g.myrow, coords[mesh.axis_position(c)]) << what;
        EXPECT_EQ(g.mycol, coords[mesh.axis_position(r)]) << what;
        EXPECT_EQ(g.nprow, mesh.axis_size(c)) << what;
        EXPECT_EQ(g.npcol, mesh.axis_size(r)) << what;
      }
}

SHARD_MPI_TEST(ScaLAPACK, GridIsCreatedOncePerMeshAndReused) {
  const int k = runtime().devices_per_rank(), n = runtime().process_count();
  const Mesh mesh({1, n}, {"x", "y"}, [&] {
    std::vector<int> ids;
    for (int i = 0; i < n; ++i) ids.push_back(i * k);
    return ids;
  }());
  EXPECT_EQ(mesh.comms().blacs_grids_created(), 0);
  const auto g1 = linalg::blacs_grid(mesh, "y", "x");
  EXPECT_TRUE(g1.in_grid());
  EXPECT_EQ(mesh.comms().blacs_grids_created(), 1);
  const auto a = device_put(random_tensor<double>({5, 5}, 1), NamedSharding(mesh, P("x", "y")));
  const auto c = scalapack_matmul(a, a);
  const auto s = solve(a, a);
  const auto g2 = linalg::blacs_grid(mesh, "y", "x");
  EXPECT_EQ(g2.context, g1.context);
  EXPECT_EQ(mesh.comms().blacs_grids_created(), 1);
  // A copy of the mesh handle shares the cache; the other orientation is a second grid.
  const Mesh copy = mesh;
  EXPECT_EQ(linalg::blacs_grid(copy, "y", "x").context, g1.context);
  const auto g3 = linalg::blacs_grid(mesh, "x", "y");
  EXPECT_TRUE(g3.in_grid());
  EXPECT_NE(g3.context, g1.context);
  EXPECT_EQ(g3.nprow, 1);
  EXPECT_EQ(g3.npcol, n);
  EXPECT_EQ(mesh.comms().blacs_grids_created(), 2);
}

SHARD_MPI_TEST(ScaLAPACK, ManyMeshesCreatedAndFreed) {
  // Grids are freed with their mesh: creating many does not exhaust MPI or BLACS.
  const int k = runtime().devices_per_rank();
  for (int i = 0; i < 50; ++i) {
    const Mesh mesh({1, 1}, {"x", "y"}, {(i % runtime().process_count()) * k});
    const auto a = device_put(random_tensor<float>({3, 3}, 7), NamedSharding(mesh, P("x", "y")));
    const auto c = scalapack_matmul(a, a);
    EXPECT_EQ(mesh.comms().blacs_grids_created(), 1);
  }
}

// ---- p?gemm ----

template <typename T>
void check_gemm(const Mesh& mesh, const PartitionSpec& pa, const PartitionSpec& pb, std::int64_t m, std::int64_t k,
                std::int64_t n, std::uint64_t seed) {
  const std::string what = std::string(dtype_name<T>()) + " " + mesh.to_string() + " " + pa.to_string() + " @ " +
                           pb.to_string() + " " + std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n);
  const Tensor<T> ha = random_tensor<T>({m, k}, seed), hb = random_tensor<T>({k, n}, seed + 1);
  const auto a = device_put(ha, NamedSharding(mesh, pa));
  const auto b = device_put(hb, NamedSharding(mesh, pb));
  comm_stats().reset();
  const auto c = scalapack_matmul(a, b);
  const std::string r = pa[0].axes().size() == 1 ? pa[0].axes()[0] : "";
  const std::string cc = pb[1].axes().size() == 1 ? pb[1].axes()[0] : "";
  if (pa == pb && !r.empty() && !cc.empty() && r != cc) {
    EXPECT_EQ(comm_stats().total().bytes, 0) << what << ": operands already P(r, c) must not be resharded";
  }
  if (!r.empty() && !cc.empty() && r != cc) {
    EXPECT_EQ(c.spec(), P(r, cc)) << what;
  }
  EXPECT_EQ(c.shape(), (Shape{m, n})) << what;
  expect_layout(c, what);
  const Tensor<double> ref = host_gemm(to_double(ha), to_double(hb));
  const double err = rel_diff(to_double(c.to_host()), ref);
  EXPECT_LE(err, tol<T>()) << what;
}

template <typename T>
void gemm_suite() {
  std::uint64_t seed = 100;
  const std::vector<std::array<std::int64_t, 3>> shapes{{8, 8, 8}, {12, 12, 12}, {7, 5, 3},  {3, 9, 4},
                                                        {13, 11, 9}, {2, 3, 1},  {1, 7, 2}, {17, 4, 23}};
  for (const auto& mesh : meshes())
    for (const auto& [m, k, n] : shapes) {
      check_gemm<T>(mesh, P("x", "y"), P("x", "y"), m, k, n, seed++);
      check_gemm<T>(mesh, P("y", "x"), P("y", "x"), m, k, n, seed++);
      check_gemm<T>(mesh, P("x", None), P(None, "y"), m, k, n, seed++);
      check_gemm<T>(mesh, P(None, "y"), P("y", None), m, k, n, seed++);
    }
}

SHARD_MPI_TEST(ScaLAPACK, GemmDoubleMatchesCblas) { gemm_suite<double>(); }
SHARD_MPI_TEST(ScaLAPACK, GemmFloatMatchesCblas) { gemm_suite<float>(); }

// ---- solve ----

/// Diagonally dominant: entries in [-1, 1] off the diagonal, n + 1 on it.
template <typename T>
Tensor<T> dominant(std::int64_t n, std::uint64_t seed) {
  Tensor<T> a = random_tensor<T>({n, n}, seed);
  for (auto& v : a) v = static_cast<T>(v / 100);
  for (std::int64_t i = 0; i < n; ++i) a(i, i) = static_cast<T>(n + 1);
  return a;
}

/// X of A X = B by host LAPACK dgesv (row-major in and out).
Tensor<double> host_solve(const Tensor<double>& a, const Tensor<double>& b) {
  const int n = static_cast<int>(a.shape()[0]), nrhs = static_cast<int>(b.shape()[1]);
  Tensor<double> at(Shape{n, n}), bt(Shape{std::max(1, nrhs), n}, 0.0);  // column-major copies
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) at.flat(j * n + i) = a(i, j);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < nrhs; ++j) bt.flat(j * n + i) = b(i, j);
  std::vector<int> ipiv(static_cast<std::size_t>(std::max(1, n)));
  int info = 0;
  const int lda = std::max(1, n);
  dgesv_(&n, &nrhs, at.data(), &lda, ipiv.data(), bt.data(), &lda, &info);
  EXPECT_EQ(info, 0);
  Tensor<double> x(Shape{n, nrhs});
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < nrhs; ++j) x(i, j) = bt.flat(j * n + i);
  return x;
}

template <typename T>
void check_solve(const Mesh& mesh, const PartitionSpec& pa, const PartitionSpec& pb, std::int64_t n,
                 std::int64_t nrhs, std::uint64_t seed) {
  const std::string what = std::string(dtype_name<T>()) + " " + mesh.to_string() + " solve " + pa.to_string() + " " +
                           pb.to_string() + " n " + std::to_string(n) + " nrhs " + std::to_string(nrhs);
  const Tensor<T> ha = dominant<T>(n, seed), hb = random_tensor<T>({n, nrhs}, seed + 1);
  const auto a = device_put(ha, NamedSharding(mesh, pa));
  const auto b = device_put(hb, NamedSharding(mesh, pb));
  const auto x = solve(a, b);
  EXPECT_EQ(x.shape(), (Shape{n, nrhs})) << what;
  expect_layout(x, what);
  const Tensor<double> hx = to_double(x.to_host());
  const Tensor<double> da = to_double(ha), db = to_double(hb);
  // Relative residual ||A X - B|| / (||A|| ||X|| + ||B||) and the distance to host LAPACK's X.
  const Tensor<double> ax = host_gemm(da, hx);
  double res = 0, na = 0, nx = 0, nb = 0;
  for (std::int64_t i = 0; i < db.size(); ++i) res += (ax.flat(i) - db.flat(i)) * (ax.flat(i) - db.flat(i)), nb += db.flat(i) * db.flat(i);
  for (auto v : da) na += v * v;
  for (auto v : hx) nx += v * v;
  EXPECT_LE(std::sqrt(res) / (std::sqrt(na) * std::sqrt(nx) + std::sqrt(nb)), tol<T>()) << what;
  EXPECT_LE(rel_diff(hx, host_solve(da, db)), 10 * tol<T>()) << what;
  // A and B are untouched.
  EXPECT_EQ(rel_diff(to_double(a.to_host()), da), 0.0) << what;
  EXPECT_EQ(rel_diff(to_double(b.to_host()), db), 0.0) << what;
}

template <typename T>
void solve_suite() {
  std::uint64_t seed = 500;
  const std::vector<std::array<std::int64_t, 2>> shapes{{8, 8}, {12, 3}, {13, 5}, {7, 1}, {2, 2}, {1, 1}, {30, 7}};
  for (const auto& mesh : meshes())
    for (const auto& [n, nrhs] : shapes) {
      check_solve<T>(mesh, P("x", "y"), P("x", "y"), n, nrhs, seed++);
      check_solve<T>(mesh, P("y", "x"), P(None, "x"), n, nrhs, seed++);
      check_solve<T>(mesh, P("x", None), P(), n, nrhs, seed++);
    }
}

SHARD_MPI_TEST(ScaLAPACK, SolveDoubleMatchesLapack) { solve_suite<double>(); }
SHARD_MPI_TEST(ScaLAPACK, SolveFloatMatchesLapack) { solve_suite<float>(); }

// ---- cholesky ----

/// Symmetric positive definite: M M^T + n I with M's entries in [-1, 1].
template <typename T>
Tensor<T> spd(std::int64_t n, std::uint64_t seed) {
  Tensor<double> m = to_double(random_tensor<T>({n, n}, seed));
  for (auto& v : m) v /= 100;
  Tensor<double> mt(Shape{n, n});
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < n; ++j) mt(i, j) = m(j, i);
  Tensor<double> a = host_gemm(m, mt);
  Tensor<T> out(Shape{n, n});
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < n; ++j) out(i, j) = static_cast<T>(a(i, j) + (i == j ? n : 0));
  return out;
}

/// Lower L with A = L L^T by host LAPACK dpotrf (zeros above the diagonal).
Tensor<double> host_cholesky(const Tensor<double>& a) {
  const int n = static_cast<int>(a.shape()[0]);
  Tensor<double> l = a;  // row-major A = column-major A^T = A; 'U' of the column-major view is L
  int info = 0;
  const int lda = std::max(1, n);
  dpotrf_("U", &n, l.data(), &lda, &info, 1);
  EXPECT_EQ(info, 0);
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j) l(i, j) = 0;
  return l;
}

template <typename T>
void check_cholesky(const Mesh& mesh, const PartitionSpec& pa, std::int64_t n, std::uint64_t seed) {
  const std::string what = std::string(dtype_name<T>()) + " " + mesh.to_string() + " cholesky " + pa.to_string() +
                           " n " + std::to_string(n);
  const Tensor<T> ha = spd<T>(n, seed);
  const auto a = device_put(ha, NamedSharding(mesh, pa));
  const auto l = cholesky(a);
  EXPECT_EQ(l.shape(), (Shape{n, n})) << what;
  expect_layout(l, what);
  const Tensor<double> hl = to_double(l.to_host()), da = to_double(ha);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = i + 1; j < n; ++j) EXPECT_EQ(hl(i, j), 0.0) << what << " (" << i << ", " << j << ")";
  Tensor<double> lt(Shape{n, n});
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < n; ++j) lt(i, j) = hl(j, i);
  EXPECT_LE(rel_diff(host_gemm(hl, lt), da), tol<T>()) << what << ": L L^T != A";
  EXPECT_LE(rel_diff(hl, host_cholesky(da)), tol<T>()) << what << ": differs from LAPACK";
  EXPECT_EQ(rel_diff(to_double(a.to_host()), da), 0.0) << what << ": A was modified";
}

template <typename T>
void cholesky_suite() {
  std::uint64_t seed = 900;
  for (const auto& mesh : meshes())
    for (std::int64_t n : {1, 2, 7, 8, 13, 30}) {
      check_cholesky<T>(mesh, P("x", "y"), n, seed++);
      check_cholesky<T>(mesh, P("y", "x"), n, seed++);
      check_cholesky<T>(mesh, P(None, "x"), n, seed++);
    }
}

SHARD_MPI_TEST(ScaLAPACK, CholeskyDoubleMatchesLapack) { cholesky_suite<double>(); }
SHARD_MPI_TEST(ScaLAPACK, CholeskyFloatMatchesLapack) { cholesky_suite<float>(); }

// ---- errors on every rank ----

template <typename T>
void singular_suite() {
  for (const auto& mesh : meshes()) {
    // All ones: the second pivot is exactly zero.
    const std::int64_t n = 6;
    const auto ones = full<T>({n, n}, T(1), NamedSharding(mesh, P("x", "y")));
    const auto b = full<T>({n, 2}, T(1), NamedSharding(mesh, P("x", "y")));
    expect_error<ValueError>([&] { solve(ones, b); }, {"solve: the matrix is singular", "i = 2"});
    // A zero row of A (a zero column of the factored view): U(3,3) is exactly zero.
    Tensor<T> h = dominant<T>(n, 3);
    for (std::int64_t j = 0; j < n; ++j) h(2, j) = 0;
    const auto a = device_put(h, NamedSharding(mesh, P("y", "x")));
    expect_error<ValueError>([&] { solve(a, b); }, {"singular", "i = 3"});
  }
}

template <typename T>
void not_pd_suite() {
  for (const auto& mesh : meshes()) {
    const std::int64_t n = 7;
    Tensor<T> h(Shape{n, n}, T(0));
    for (std::int64_t i = 0; i < n; ++i) h(i, i) = T(1);
    h(2, 2) = T(-1);
    const auto a = device_put(h, NamedSharding(mesh, P("x", "y")));
    expect_error<ValueError>([&] { cholesky(a); },
                             {"cholesky: the matrix is not positive definite", "leading minor of order 3"});
  }
}

SHARD_MPI_TEST(ScaLAPACK, SingularMatrixErrorsOnEveryRank) {
  singular_suite<double>();
  singular_suite<float>();
}

SHARD_MPI_TEST(ScaLAPACK, NotPositiveDefiniteErrorsOnEveryRank) {
  not_pd_suite<double>();
  not_pd_suite<float>();
}

SHARD_MPI_TEST(ScaLAPACK, LayoutErrorsOnEveryRank) {
  const int n = runtime().process_count(), k = runtime().devices_per_rank();
  if (k >= 2) {
    // make_mesh puts a rank's devices next to each other: rank 0 holds two devices.
    const Mesh two = make_mesh({n, k}, {"x", "y"});
    const auto a = zeros<double>({4, 4}, NamedSharding(two, P("x", "y")));
    expect_error<ValueError>([&] { scalapack_matmul(a, a); }, {"exactly one mesh device per rank", "rank 0 holds devices [0, 1]"});
    expect_error<ValueError>([&] { solve(a, a); }, {"exactly one mesh device per rank"});
    expect_error<ValueError>([&] { cholesky(a); }, {"exactly one mesh device per rank"});
    expect_error<ValueError>([&] { linalg::transposed_descriptor(a); }, {"exactly one mesh device per rank"});
  }
  std::vector<int> ids;
  for (int i = 0; i < n; ++i) ids.push_back(i * k);
  const Mesh flat({n}, {"x"}, ids);
  const auto v = zeros<double>({4, 4}, NamedSharding(flat, P("x")));
  expect_error<ValueError>([&] { scalapack_matmul(v, v); }, {"2-D mesh"});
  const Mesh grid({1, n}, {"x", "y"}, ids);
  const auto r = zeros<float>({4, 4}, NamedSharding(grid, P("y", None)));
  expect_error<ValueError>([&] { linalg::transposed_descriptor(r); }, {"P(row_axis, col_axis)"});
  const auto rect = zeros<float>({4, 3}, NamedSharding(grid, P("x", "y")));
  expect_error<ShapeError>([&] { solve(rect, rect); }, {"square"});
  expect_error<ShapeError>([&] { cholesky(rect); }, {"square"});
  expect_error<ShapeError>([&] { scalapack_matmul(rect, rect); }, {"do not fit"});
}

}  // namespace
}  // namespace shard::testing
