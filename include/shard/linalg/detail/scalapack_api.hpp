#pragma once
/// \file The BLACS, PBLAS and ScaLAPACK routines Shard calls (internal). Written from
/// ScaLAPACK's documented interfaces (LP64: Fortran INTEGER is int); the C BLACS interface
/// (Cblacs_*, Csys2blacs_handle) takes values, the Fortran routines (trailing underscore)
/// take every argument by pointer. Arrays a routine only reads are declared const.

#include <mpi.h>

namespace shard::detail::scalapack_api {

extern "C" {

// ---- BLACS (C interface) ----
/// The BLACS system handle of an MPI communicator (input context of Cblacs_gridmap).
int Csys2blacs_handle(MPI_Comm comm);
/// Queries BLACS internals (what = 0: the default system context).
void Cblacs_get(int context, int what, int* value);
/// Collective over the processes of the system context `*context`: a nprow x npcol grid
/// whose process (i, j) is system process usermap[i + j * ldumap]. Processes left out get
/// *context = -1.
void Cblacs_gridmap(int* context, int* usermap, int ldumap, int nprow, int npcol);
/// This process's position in a grid (-1 everywhere if it is not in the grid).
void Cblacs_gridinfo(int context, int* nprow, int* npcol, int* myrow, int* mycol);
/// Frees a grid's communicators.
void Cblacs_gridexit(int context);

// ---- ScaLAPACK tools ----
/// Rows (or columns) of a block-cyclically distributed dim owned by process `iproc`.
int numroc_(const int* n, const int* nb, const int* iproc, const int* isrcproc, const int* nprocs);
/// Fills an array descriptor, checking its arguments (info < 0 names the bad one).
void descinit_(int* desc, const int* m, const int* n, const int* mb, const int* nb, const int* irsrc,
               const int* icsrc, const int* ictxt, const int* lld, int* info);

// ---- PBLAS ----
void pdgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
             const double* alpha, const double* a, const int* ia, const int* ja, const int* desca,
             const double* b, const int* ib, const int* jb, const int* descb, const double* beta,
             double* c, const int* ic, const int* jc, const int* descc);
void psgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
             const float* alpha, const float* a, const int* ia, const int* ja, const int* desca,
             const float* b, const int* ib, const int* jb, const int* descb, const float* beta,
             float* c, const int* ic, const int* jc, const int* descc);
/// sub(C) (m x n) := beta sub(C) + alpha sub(A)^T, sub(A) is n x m.
void pdtran_(const int* m, const int* n, const double* alpha, const double* a, const int* ia, const int* ja,
             const int* desca, const double* beta, double* c, const int* ic, const int* jc, const int* descc);
void pstran_(const int* m, const int* n, const float* alpha, const float* a, const int* ia, const int* ja,
             const int* desca, const float* beta, float* c, const int* ic, const int* jc, const int* descc);

// ---- ScaLAPACK redistribution (REDIST) ----
/// Copies an m x n sub-matrix between two distributions; collective over `ictxt`, a context
/// holding every process of both grids.
void pdgemr2d_(const int* m, const int* n, const double* a, const int* ia, const int* ja, const int* desca,
               double* b, const int* ib, const int* jb, const int* descb, const int* ictxt);
void psgemr2d_(const int* m, const int* n, const float* a, const int* ia, const int* ja, const int* desca,
               float* b, const int* ib, const int* jb, const int* descb, const int* ictxt);

// ---- ScaLAPACK ----
/// LU with partial pivoting (needs MB_A == NB_A); ipiv holds LOCr(M_A) + MB_A entries.
void pdgetrf_(const int* m, const int* n, double* a, const int* ia, const int* ja, const int* desca, int* ipiv,
              int* info);
void psgetrf_(const int* m, const int* n, float* a, const int* ia, const int* ja, const int* desca, int* ipiv,
              int* info);
/// Solves op(A) X = B with the factors of p?getrf (trans 'N' or 'T').
void pdgetrs_(const char* trans, const int* n, const int* nrhs, const double* a, const int* ia, const int* ja,
              const int* desca, const int* ipiv, double* b, const int* ib, const int* jb, const int* descb,
              int* info);
void psgetrs_(const char* trans, const int* n, const int* nrhs, const float* a, const int* ia, const int* ja,
              const int* desca, const int* ipiv, float* b, const int* ib, const int* jb, const int* descb,
              int* info);
/// Cholesky factorisation of a symmetric positive definite matrix (needs MB_A == NB_A).
void pdpotrf_(const char* uplo, const int* n, double* a, const int* ia, const int* ja, const int* desca, int* info);
void pspotrf_(const char* uplo, const int* n, float* a, const int* ia, const int* ja, const int* desca, int* info);

}  // extern "C"

}  // namespace shard::detail::scalapack_api
