#pragma once
/// \file ScaLAPACK interop (layer 6, linalg): BLACS grids owned by the mesh, descriptors of
/// block-sharded arrays, p?gemm, LU solve and Cholesky.
///
/// The no-copy view. A ShardedArray A (m x n) sharded P(r, c) on a 2-D mesh with one device
/// per rank stores on the device at (r = i, c = j) the row-major block A[i-th row chunk,
/// j-th col chunk] (JAX's uneven rule: chunks of ceil(m/R) rows and ceil(n/C) cols, the last
/// ones short or empty). Read column-major, that very buffer is block (j, i) of A^T (n x m).
/// So the local shards *are* the ScaLAPACK matrix A^T, distributed on the BLACS grid whose
/// process rows run along mesh axis c and process columns along mesh axis r, with block sizes
/// MB = ceil(n/C), NB = ceil(m/R), source process (0, 0) and LLD = the shard's row length.
/// With one block per process, ScaLAPACK's block-cyclic layout with block ceil(n/p) is exactly
/// JAX's uneven rule (numroc gives the same, possibly short or empty, local extents). Nothing
/// is copied or transposed to build the view.
///
/// What copies:
///   - scalapack_matmul: nothing (C^T = B^T A^T with p?gemm on the views, C written in place
///     into its new shards). Operands not sharded P(r, c) are resharded first (a reshard,
///     as matmul would do).
///   - solve and cholesky: the factorisations overwrite their input, so A is copied once into
///     a ScaLAPACK work matrix (p?gemr2d) with square NB x NB block-cyclic blocks, which p?getrf
///     and p?potrf require (MB_A == NB_A) and which balance the load. A itself is never
///     transposed: solve factors the view A^T and calls p?getrs with TRANS = 'T'; cholesky
///     factors the view (A^T = A) with UPLO = 'U' and copies U back, whose row-major reading
///     is L = U^T. The right-hand side B is transposed into the work layout with p?tran (the
///     one unavoidable transposition: p?getrs wants B column-major) and X back with p?tran.
///
/// The BLACS grid of a mesh is created on first use (Cblacs_gridmap over the Runtime's world
/// communicator, collective over all ranks), cached on the mesh per (row axis, col axis) and
/// freed (Cblacs_gridexit) with the mesh. Ranks that hold no device of the mesh take part in
/// the creation, are outside the grid (BLACS context -1) and get no block.
///
/// Errors: layout requirements are checked from metadata on every rank before anything
/// communicates; ScaLAPACK's `info` is agreed over all ranks (an allreduce) and becomes the
/// same ValueError everywhere.

#include <array>
#include <string>

#include "shard/core/dtype.hpp"
#include "shard/array/sharded_array.hpp"

namespace shard::linalg {

/// A ScaLAPACK array descriptor with the local extents of this process.
struct Descriptor {
  /// DTYPE_ (1), CTXT_, M_, N_, MB_, NB_, RSRC_, CSRC_, LLD_, as ScaLAPACK expects.
  std::array<int, 9> desc{};
  int local_rows = 0;   ///< rows of this process's column-major block (LOCr(M_))
  int local_cols = 0;   ///< its columns (LOCc(N_))
  bool in_grid = false; ///< false on ranks holding no device of the mesh: nothing to pass

  int* data() { return desc.data(); }
  const int* data() const { return desc.data(); }
  int context() const { return desc[1]; }
  int rows() const { return desc[2]; }       ///< global rows M_
  int cols() const { return desc[3]; }       ///< global columns N_
  int row_block() const { return desc[4]; }  ///< MB_
  int col_block() const { return desc[5]; }  ///< NB_
  int lld() const { return desc[8]; }        ///< local leading dimension LLD_
};

/// A BLACS process grid of a mesh and this process's place in it (-1s outside the grid).
struct BlacsGrid {
  int context = -1;
  int nprow = -1, npcol = -1, myrow = -1, mycol = -1;
  bool in_grid() const { return context >= 0; }
};

/// Collective over all ranks on first use for this (mesh, axes) pair, then cached: the BLACS
/// grid whose process rows run along mesh axis `row_axis` and columns along `col_axis`
/// (grid process (i, j) = the rank owning the mesh device at row_axis = i, col_axis = j).
/// Requires a 2-D mesh with one device per rank; otherwise ValueError on every rank.
BlacsGrid blacs_grid(const Mesh& mesh, const std::string& row_axis, const std::string& col_axis);

/// Collective over all ranks (creates the mesh's BLACS grid on first use): the descriptor of
/// the column-major view x^T of an array x (m x n) sharded P(r, c) on a 2-D mesh with one
/// device per rank; the local data is this rank's shard buffer, used as is (no copy). Throws
/// ValueError on every rank, explaining the requirement, for any other layout.
Descriptor transposed_descriptor(const Shape& shape, const NamedSharding& sharding);
/// The same for an array.
template <typename T>
Descriptor transposed_descriptor(const ShardedArray<T>& x) {
  return transposed_descriptor(x.shape(), x.sharding());
}

/// Collective over all ranks: C = A B (A m x k, B k x n) with p?gemm on the ScaLAPACK views,
/// computed as C^T = B^T A^T without copying A or B. Mesh axes: r from A's P(r, k), c from
/// B's P(k, c) (the other mesh axis when missing or equal); operands not sharded P(r, c) are
/// resharded to it. C is sharded P(r, c). Needs a 2-D mesh with one device per rank. This is
/// what linalg::Algorithm::kScaLAPACK runs.
template <typename T>
ShardedArray<T> scalapack_matmul(const ShardedArray<T>& a, const ShardedArray<T>& b);

/// Collective over all ranks: X with A X = B (A n x n, B n x nrhs) by LU with partial pivoting
/// (p?getrf on the view A^T, then p?getrs with TRANS = 'T'). Axes (r, c) from A's spec P(r, c)
/// (resharded to it otherwise); B is resharded to P(r, c) if needed; X is sharded P(r, c).
/// A singular matrix raises ValueError on every rank ("the matrix is singular ...").
template <typename T>
ShardedArray<T> solve(const ShardedArray<T>& a, const ShardedArray<T>& b);

/// Collective over all ranks: the lower Cholesky factor L of a symmetric positive definite A
/// (A = L L^T; zeros above the diagonal; only A's lower triangle is read — by symmetry, the
/// upper one of the view A^T) with p?potrf, sharded P(r, c) like A (axes as in solve). A
/// matrix that is not positive definite raises ValueError on every rank.
template <typename T>
ShardedArray<T> cholesky(const ShardedArray<T>& a);

/// bfloat16 (which ScaLAPACK lacks): the three run in float32 and round the result once.
template <>
ShardedArray<bfloat16> scalapack_matmul<bfloat16>(const ShardedArray<bfloat16>& a, const ShardedArray<bfloat16>& b);
template <>
ShardedArray<bfloat16> solve<bfloat16>(const ShardedArray<bfloat16>& a, const ShardedArray<bfloat16>& b);
template <>
ShardedArray<bfloat16> cholesky<bfloat16>(const ShardedArray<bfloat16>& a);

#define SHARD_DECLARE_SCALAPACK(T)                                                             \
  extern template ShardedArray<T> scalapack_matmul<T>(const ShardedArray<T>&, const ShardedArray<T>&); \
  extern template ShardedArray<T> solve<T>(const ShardedArray<T>&, const ShardedArray<T>&);    \
  extern template ShardedArray<T> cholesky<T>(const ShardedArray<T>&);
SHARD_FOR_EACH_FLOAT_DTYPE(SHARD_DECLARE_SCALAPACK)
#undef SHARD_DECLARE_SCALAPACK

}  // namespace shard::linalg
