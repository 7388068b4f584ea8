#include "shard/linalg/scalapack.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "shard/comm/detail/mesh_comms.hpp"
#include "shard/linalg/detail/scalapack_api.hpp"
#include "shard/error.hpp"
#include "shard/array/reshard.hpp"
#include "shard/core/tensor_ops.hpp"
#include "shard/runtime/runtime.hpp"

namespace shard::linalg {

namespace api = detail::scalapack_api;

namespace {

// ---- typed dispatch to the s/d routines ----

void gemm(const int* m, const int* n, const int* k, const double* alpha, const double* a, const int* desca,
          const double* b, const int* descb, const double* beta, double* c, const int* descc) {
  const int one = 1;
  api::pdgemm_("N", "N", m, n, k, alpha, a, &one, &one, desca, b, &one, &one, descb, beta, c, &one, &one, descc);
}
void gemm(const int* m, const int* n, const int* k, const float* alpha, const float* a, const int* desca,
          const float* b, const int* descb, const float* beta, float* c, const int* descc) {
  const int one = 1;
  api::psgemm_("N", "N", m, n, k, alpha, a, &one, &one, desca, b, &one, &one, descb, beta, c, &one, &one, descc);
}
void tran(int m, int n, const double* a, const int* desca, double* c, const int* descc) {
  const int one = 1;
  const double alpha = 1, beta = 0;
  api::pdtran_(&m, &n, &alpha, a, &one, &one, desca, &beta, c, &one, &one, descc);
}
void tran(int m, int n, const float* a, const int* desca, float* c, const int* descc) {
  const int one = 1;
  const float alpha = 1, beta = 0;
  api::pstran_(&m, &n, &alpha, a, &one, &one, desca, &beta, c, &one, &one, descc);
}
void gemr2d(int m, int n, const double* a, const int* desca, double* b, const int* descb, int ctxt) {
  const int one = 1;
  api::pdgemr2d_(&m, &n, a, &one, &one, desca, b, &one, &one, descb, &ctxt);
}
void gemr2d(int m, int n, const float* a, const int* desca, float* b, const int* descb, int ctxt) {
  const int one = 1;
  api::psgemr2d_(&m, &n, a, &one, &one, desca, b, &one, &one, descb, &ctxt);
}
int getrf(int n, double* a, const int* desca, int* ipiv) {
  const int one = 1;
  int info = 0;
  api::pdgetrf_(&n, &n, a, &one, &one, desca, ipiv, &info);
  return info;
}
int getrf(int n, float* a, const int* desca, int* ipiv) {
  const int one = 1;
  int info = 0;
  api::psgetrf_(&n, &n, a, &one, &one, desca, ipiv, &info);
  return info;
}
int getrs(int n, int nrhs, const double* a, const int* desca, const int* ipiv, double* b, const int* descb) {
  const int one = 1;
  int info = 0;
  api::pdgetrs_("T", &n, &nrhs, a, &one, &one, desca, ipiv, b, &one, &one, descb, &info);
  return info;
}
int getrs(int n, int nrhs, const float* a, const int* desca, const int* ipiv, float* b, const int* descb) {
  const int one = 1;
  int info = 0;
  api::psgetrs_("T", &n, &nrhs, a, &one, &one, desca, ipiv, b, &one, &one, descb, &info);
  return info;
}
int potrf(int n, double* a, const int* desca) {
  const int one = 1;
  int info = 0;
  api::pdpotrf_("U", &n, a, &one, &one, desca, &info);
  return info;
}
int potrf(int n, float* a, const int* desca) {
  const int one = 1;
  int info = 0;
  api::pspotrf_("U", &n, a, &one, &one, desca, &info);
  return info;
}

int numroc(int n, int nb, int iproc, int nprocs) {
  const int zero = 0;
  return api::numroc_(&n, &nb, &iproc, &zero, &nprocs);
}

// ---- layout checks (metadata only: identical on every rank, before any communication) ----

/// ScaLAPACK needs a 2-D mesh whose devices all live on different ranks.
void check_mesh(const Mesh& mesh, const std::string& what) {
  if (mesh.ndim() != 2)
    raise<ValueError>(what, ": ScaLAPACK needs a 2-D mesh (its devices form one BLACS process grid), but the array is on ",
                      mesh.to_string(), " with ", mesh.ndim(), " axes; build a 2-D mesh such as shard::Mesh({R, C}, {\"x\", \"y\"}, ids)");
  const Topology& topo = mesh.topology();
  std::map<int, std::vector<int>> by_rank;
  for (int d : mesh.device_ids()) by_rank[topo.owner(d)].push_back(d);
  for (const auto& [rank, devs] : by_rank) {
    if (devs.size() < 2) continue;
    std::string list;
    for (std::size_t i = 0; i < devs.size(); ++i) list += (i ? ", " : "") + std::to_string(devs[i]);
    std::string example;
    for (int i = 0; i < std::min(topo.process_count, 4); ++i)
      example += (i ? ", " : "") + std::to_string(i * topo.devices_per_rank);
    raise<ValueError>(what, ": ScaLAPACK needs exactly one mesh device per rank (each block is one BLACS process), but rank ",
                      rank, " holds devices [", list, "] of ", mesh.to_string(), " on devices ", mesh.devices_string(),
                      "; with ", topo.devices_per_rank,
                      " devices per rank build the mesh over one device of each rank, e.g. shard::Mesh(shape, names, {",
                      example, topo.process_count > 4 ? ", ..." : "", "})");
  }
}

void check_matrix(const Shape& shape, const std::string& what, const char* name) {
  if (shape.size() != 2)
    raise<ShapeError>(what, ": ", name, " must be a 2-D matrix, got shape ", to_string(shape));
  for (auto d : shape)
    if (d > INT_MAX)
      raise<ShapeError>(what, ": ", name, " of shape ", to_string(shape), " has a dim above ScaLAPACK's int range");
}

/// The single mesh axis of spec entry `dim`, or "" if it is None or a tuple.
std::string single_axis(const PartitionSpec& spec, int dim) {
  const auto& axes = spec[dim].axes();
  return axes.size() == 1 ? axes[0] : std::string();
}

/// Completes (r, c) into the two distinct axes of a 2-D mesh.
std::pair<std::string, std::string> complete_axes(const Mesh& mesh, std::string r, std::string c) {
  const auto& names = mesh.axis_names();
  auto other = [&](const std::string& x) { return x == names[0] ? names[1] : names[0]; };
  if (r.empty()) r = c.empty() ? names[0] : other(c);
  if (c.empty() || c == r) c = other(r);
  return {r, c};
}

int ceil_div(std::int64_t n, std::int64_t p) { return static_cast<int>((n + p - 1) / p); }

template <typename T>
const T* local_ptr(const ShardedArray<T>& x, const T* dummy) {
  if (x.addressable_shards().empty() || x.addressable_shards()[0].data.empty()) return dummy;
  return x.addressable_shards()[0].data.data();
}
template <typename T>
T* local_ptr(ShardedArray<T>& x, T* dummy) {
  if (x.addressable_shards().empty() || x.addressable_shards()[0].data.empty()) return dummy;
  return x.addressable_shards()[0].data.data();
}

/// `x` itself when it already has `to`, else a reshard (held in `tmp`).
template <typename T>
const ShardedArray<T>& with_sharding(const ShardedArray<T>& x, const NamedSharding& to,
                                     std::optional<ShardedArray<T>>& tmp) {
  if (x.sharding() == to) return x;
  tmp.emplace(reshard(x, to));
  return *tmp;
}

template <typename T>
ShardedArray<T> zeros_like_layout(const Shape& shape, const NamedSharding& sharding) {
  std::vector<Shard<T>> shards;
  for (int d : sharding.mesh().local_device_ids()) {
    Box box = sharding.box(d, shape);
    Tensor<T> data(box.extent, T(0));
    shards.push_back(Shard<T>{d, std::move(box), std::move(data)});
  }
  return ShardedArray<T>(shape, sharding, std::move(shards));
}

/// The square-block (nb x nb) block-cyclic work layout of a rows x cols matrix on `grid`.
Descriptor work_descriptor(const BlacsGrid& grid, int rows, int cols, int nb, const std::string& what) {
  Descriptor d;
  d.in_grid = true;
  d.local_rows = numroc(rows, nb, grid.myrow, grid.nprow);
  d.local_cols = numroc(cols, nb, grid.mycol, grid.npcol);
  const int lld = std::max(1, d.local_rows), zero = 0;
  int info = 0;
  api::descinit_(d.data(), &rows, &cols, &nb, &nb, &zero, &zero, &grid.context, &lld, &info);
  if (info != 0) raise<Error>(what, ": internal error: descinit_ rejected argument ", -info);
  return d;
}

/// Agrees a ScaLAPACK info over all ranks (ranks outside the grid pass 0): returns the
/// smallest positive info of any rank (0 if none); a negative info (a bad argument, a bug
/// of this library) raises Error on every rank.
int agree_info(int info, const std::string& what, const char* routine) {
  const mpi::Communicator& world = Runtime::current().world();
  const int neg = world.allreduce<int>(info < 0 ? info : 0, MPI_MIN);
  if (neg < 0) raise<Error>(what, ": internal error: ", routine, " rejected argument ", -neg);
  const int pos = world.allreduce<int>(info > 0 ? info : INT_MAX, MPI_MIN);
  return pos == INT_MAX ? 0 : pos;
}

}  // namespace

// ---- grids and descriptors ----

BlacsGrid blacs_grid(const Mesh& mesh, const std::string& row_axis, const std::string& col_axis) {
  check_mesh(mesh, "blacs_grid");
  const int rp = mesh.axis_position(row_axis), cp = mesh.axis_position(col_axis);
  if (rp == cp)
    raise<ValueError>("blacs_grid: the grid's rows and columns need two different mesh axes, got '", row_axis,
                      "' twice on ", mesh.to_string());
  const int nprow = mesh.shape()[rp], npcol = mesh.shape()[cp];
  const int context = mesh.comms().blacs_context({rp, cp}, [&] {
    std::vector<int> usermap(static_cast<std::size_t>(nprow) * npcol);
    std::vector<int> coords(2);
    for (int j = 0; j < npcol; ++j)
      for (int i = 0; i < nprow; ++i) {
        coords[rp] = i;
        coords[cp] = j;
        usermap[static_cast<std::size_t>(i) + static_cast<std::size_t>(j) * nprow] =
            mesh.topology().owner(mesh.device_at(coords));
      }
    int ctxt = api::Csys2blacs_handle(Runtime::current().world().get());
    api::Cblacs_gridmap(&ctxt, usermap.data(), nprow, nprow, npcol);
    return ctxt < 0 ? -1 : ctxt;
  });
  BlacsGrid g;
  g.context = context;
  if (context >= 0) {
    api::Cblacs_gridinfo(context, &g.nprow, &g.npcol, &g.myrow, &g.mycol);
    if (g.nprow != nprow || g.npcol != npcol)
      raise<Error>("blacs_grid: internal error: BLACS grid ", g.nprow, "x", g.npcol, " instead of ", nprow, "x", npcol);
  }
  return g;
}

Descriptor transposed_descriptor(const Shape& shape, const NamedSharding& sharding) {
  const std::string what = "ScaLAPACK view";
  const Mesh& mesh = sharding.mesh();
  check_matrix(shape, what, "the array");
  check_mesh(mesh, what);
  const std::string r = single_axis(sharding.spec(), 0), c = single_axis(sharding.spec(), 1);
  if (r.empty() || c.empty() || sharding.spec().size() > 2)
    raise<ValueError>(what, ": a ScaLAPACK matrix must be block-sharded over both mesh axes, P(row_axis, col_axis), but the ",
                      to_string(shape), " array is ", sharding.to_string(), "; reshard it to P('",
                      mesh.axis_names()[0], "', '", mesh.axis_names()[1], "') first");
  const BlacsGrid g = blacs_grid(mesh, c, r);
  // The view is x^T: rows = x's columns (over c, the grid rows), cols = x's rows (over r).
  const int M = static_cast<int>(shape[1]), N = static_cast<int>(shape[0]);
  const int MB = std::max(1, ceil_div(M, mesh.axis_size(c))), NB = std::max(1, ceil_div(N, mesh.axis_size(r)));
  Descriptor d;
  if (!g.in_grid()) {
    d.desc = {1, -1, M, N, MB, NB, 0, 0, 1};
    return d;
  }
  d.in_grid = true;
  d.local_rows = numroc(M, MB, g.myrow, g.nprow);
  d.local_cols = numroc(N, NB, g.mycol, g.npcol);
  const int lld = std::max(1, d.local_rows), zero = 0;
  int info = 0;
  api::descinit_(d.data(), &M, &N, &MB, &NB, &zero, &zero, &g.context, &lld, &info);
  if (info != 0) raise<Error>(what, ": internal error: descinit_ rejected argument ", -info);
  // numroc with one block per process is JAX's uneven rule: the local shard is the block.
  const auto local = mesh.local_device_ids();
  if (local.size() != 1) raise<Error>(what, ": internal error: rank in the BLACS grid holds ", local.size(), " devices");
  const Box box = sharding.box(local[0], shape);
  if (box.extent[0] != d.local_cols || box.extent[1] != d.local_rows)
    raise<Error>(what, ": internal error: numroc gives a ", d.local_cols, "x", d.local_rows, " block, the shard is ",
                 to_string(box.extent));
  return d;
}

// ---- p?gemm ----

template <typename T>
ShardedArray<T> scalapack_matmul(const ShardedArray<T>& a_in, const ShardedArray<T>& b_in) {
  const std::string what = "scalapack_matmul";
  detail::check_same_mesh(a_in.mesh(), b_in.mesh(), what);
  check_matrix(a_in.shape(), what, "A");
  check_matrix(b_in.shape(), what, "B");
  if (a_in.shape()[1] != b_in.shape()[0])
    raise<ShapeError>(what, ": A ", to_string(a_in.shape()), " and B ", to_string(b_in.shape()),
                      " do not fit: A's columns must equal B's rows");
  const Mesh& mesh = a_in.mesh();
  check_mesh(mesh, what);
  const auto [r, c] = complete_axes(mesh, single_axis(a_in.spec(), 0), single_axis(b_in.spec(), 1));
  const NamedSharding target(mesh, PartitionSpec(r, c));
  std::optional<ShardedArray<T>> ta, tb;
  const ShardedArray<T>& a = with_sharding(a_in, target, ta);
  const ShardedArray<T>& b = with_sharding(b_in, target, tb);

  const int m = static_cast<int>(a.shape()[0]), k = static_cast<int>(a.shape()[1]), n = static_cast<int>(b.shape()[1]);
  ShardedArray<T> out = zeros_like_layout<T>(Shape{m, n}, target);
  const Descriptor da = transposed_descriptor(a), db = transposed_descriptor(b), dc = transposed_descriptor(out);
  if (dc.in_grid && m > 0 && n > 0 && k > 0) {
    T dummy[1] = {T(0)}, dummy_out[1] = {T(0)};
    const T one = 1, zero = 0;
    // C^T (n x m) = B^T (n x k) A^T (k x m), all three column-major views of row-major shards.
    gemm(&n, &m, &k, &one, local_ptr(b, dummy), db.data(), local_ptr(a, dummy), da.data(), &zero,
         local_ptr(out, dummy_out), dc.data());
  }
  return out;
}

// ---- LU solve ----

namespace {
int work_block(int n, const BlacsGrid& g) { return std::clamp(ceil_div(n, std::max(g.nprow, g.npcol)), 1, 64); }
}  // namespace

template <typename T>
ShardedArray<T> solve(const ShardedArray<T>& a_in, const ShardedArray<T>& b_in) {
  const std::string what = "solve";
  detail::check_same_mesh(a_in.mesh(), b_in.mesh(), what);
  check_matrix(a_in.shape(), what, "A");
  check_matrix(b_in.shape(), what, "B");
  if (a_in.shape()[0] != a_in.shape()[1])
    raise<ShapeError>(what, ": A must be square, got shape ", to_string(a_in.shape()));
  if (b_in.shape()[0] != a_in.shape()[0])
    raise<ShapeError>(what, ": B ", to_string(b_in.shape()), " must have as many rows as A ", to_string(a_in.shape()));
  const Mesh& mesh = a_in.mesh();
  check_mesh(mesh, what);
  const auto [r, c] = complete_axes(mesh, single_axis(a_in.spec(), 0), single_axis(a_in.spec(), 1));
  const NamedSharding target(mesh, PartitionSpec(r, c));
  std::optional<ShardedArray<T>> ta, tb;
  const ShardedArray<T>& a = with_sharding(a_in, target, ta);
  const ShardedArray<T>& b = with_sharding(b_in, target, tb);
  const int n = static_cast<int>(a.shape()[0]), nrhs = static_cast<int>(b.shape()[1]);

  ShardedArray<T> x = zeros_like_layout<T>(Shape{n, nrhs}, target);
  const Descriptor da = transposed_descriptor(a), db = transposed_descriptor(b), dx = transposed_descriptor(x);
  const BlacsGrid g = blacs_grid(mesh, c, r);
  const bool run = g.in_grid() && n > 0;
  T dummy[1] = {T(0)}, dummy_out[1] = {T(0)};

  // Factor a copy of the view A^T in square nb x nb blocks: A^T = P L U.
  std::vector<T> w;
  std::vector<int> ipiv;
  Descriptor dw;
  int info = 0;
  if (run) {
    const int nb = work_block(n, g);
    dw = work_descriptor(g, n, n, nb, what);
    w.assign(std::max<std::size_t>(1, static_cast<std::size_t>(dw.local_rows) * dw.local_cols), T(0));
    gemr2d(n, n, local_ptr(a, dummy), da.data(), w.data(), dw.data(), g.context);
    ipiv.assign(static_cast<std::size_t>(dw.local_rows) + nb, 0);
    info = getrf(n, w.data(), dw.data(), ipiv.data());
  }
  if (const int bad = agree_info(info, what, "p?getrf"))
    raise<ValueError>(what, ": the matrix is singular (U(i,i) is exactly zero at i = ", bad,
                      ", counting from 1, in the LU factorisation of the ", n, "x", n,
                      " matrix); no solution is defined for a singular A");

  // B (n x nrhs, column-major, rows aligned with A's) = transpose of the view B^T; solve
  // (A^T)^T X = B with TRANS = 'T'; X^T back into the row-major shards of X.
  info = 0;
  if (run && nrhs > 0) {
    const int nb = dw.row_block();
    const Descriptor dwb = work_descriptor(g, n, nrhs, nb, what);
    std::vector<T> wb(std::max<std::size_t>(1, static_cast<std::size_t>(dwb.local_rows) * dwb.local_cols), T(0));
    tran(n, nrhs, local_ptr(b, dummy), db.data(), wb.data(), dwb.data());
    info = getrs(n, nrhs, w.data(), dw.data(), ipiv.data(), wb.data(), dwb.data());
    tran(nrhs, n, wb.data(), dwb.data(), local_ptr(x, dummy_out), dx.data());
  }
  agree_info(info, what, "p?getrs");
  return x;
}

// ---- Cholesky ----

template <typename T>
ShardedArray<T> cholesky(const ShardedArray<T>& a_in) {
  const std::string what = "cholesky";
  check_matrix(a_in.shape(), what, "A");
  if (a_in.shape()[0] != a_in.shape()[1])
    raise<ShapeError>(what, ": A must be square, got shape ", to_string(a_in.shape()));
  const Mesh& mesh = a_in.mesh();
  check_mesh(mesh, what);
  const auto [r, c] = complete_axes(mesh, single_axis(a_in.spec(), 0), single_axis(a_in.spec(), 1));
  const NamedSharding target(mesh, PartitionSpec(r, c));
  std::optional<ShardedArray<T>> ta;
  const ShardedArray<T>& a = with_sharding(a_in, target, ta);
  const int n = static_cast<int>(a.shape()[0]);

  ShardedArray<T> l = zeros_like_layout<T>(Shape{n, n}, target);
  const Descriptor da = transposed_descriptor(a), dl = transposed_descriptor(l);
  const BlacsGrid g = blacs_grid(mesh, c, r);
  const bool run = g.in_grid() && n > 0;
  T dummy[1] = {T(0)}, dummy_out[1] = {T(0)};

  // The view is A^T = A: factor it as U^T U in its upper triangle (A's lower one).
  std::vector<T> w;
  Descriptor dw;
  int info = 0;
  if (run) {
    dw = work_descriptor(g, n, n, work_block(n, g), what);
    w.assign(std::max<std::size_t>(1, static_cast<std::size_t>(dw.local_rows) * dw.local_cols), T(0));
    gemr2d(n, n, local_ptr(a, dummy), da.data(), w.data(), dw.data(), g.context);
    info = potrf(n, w.data(), dw.data());
  }
  if (const int bad = agree_info(info, what, "p?potrf"))
    raise<ValueError>(what, ": the matrix is not positive definite (the leading minor of order ", bad,
                      " is not positive); Cholesky needs a symmetric positive definite A");

  // U into the view of L: read row-major, the buffer holds U^T = L. Then clear what lies
  // above L's diagonal (the untouched lower part of the view).
  if (run) gemr2d(n, n, w.data(), dw.data(), local_ptr(l, dummy_out), dl.data(), g.context);
  for (auto& s : l.addressable_shards()) {
    const std::int64_t rows = s.box.extent[0], cols = s.box.extent[1];
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j)
        if (s.box.offset[1] + j > s.box.offset[0] + i) s.data.flat(i * cols + j) = T(0);
  }
  return l;
}

// ScaLAPACK has no bfloat16: its calls run in float32 and round the result once.
namespace {
/// x with every shard converted to U (same sharding; local, not recorded for autodiff as
/// ScaLAPACK's calls are not).
template <typename U, typename T>
ShardedArray<U> converted(const ShardedArray<T>& x) {
  std::vector<Shard<U>> shards;
  for (const auto& s : x.addressable_shards()) shards.push_back(Shard<U>{s.device, s.box, detail::astype_kernel<U>(s.data)});
  return ShardedArray<U>(x.shape(), x.sharding(), std::move(shards));
}
}  // namespace

template <>
ShardedArray<bfloat16> scalapack_matmul<bfloat16>(const ShardedArray<bfloat16>& a, const ShardedArray<bfloat16>& b) {
  return converted<bfloat16>(scalapack_matmul(converted<float>(a), converted<float>(b)));
}
template <>
ShardedArray<bfloat16> solve<bfloat16>(const ShardedArray<bfloat16>& a, const ShardedArray<bfloat16>& b) {
  return converted<bfloat16>(solve(converted<float>(a), converted<float>(b)));
}
template <>
ShardedArray<bfloat16> cholesky<bfloat16>(const ShardedArray<bfloat16>& a) {
  return converted<bfloat16>(cholesky(converted<float>(a)));
}

#define SHARD_INSTANTIATE_SCALAPACK(T)                                                             \
  template ShardedArray<T> scalapack_matmul<T>(const ShardedArray<T>&, const ShardedArray<T>&); \
  template ShardedArray<T> solve<T>(const ShardedArray<T>&, const ShardedArray<T>&);            \
  template ShardedArray<T> cholesky<T>(const ShardedArray<T>&);
SHARD_FOR_EACH_FLOAT_DTYPE(SHARD_INSTANTIATE_SCALAPACK)
#undef SHARD_INSTANTIATE_SCALAPACK

}  // namespace shard::linalg
