#pragma once
/// \file Parallel .npy IO: one numpy file per array, written and read with MPI-IO so that
/// every rank moves only the bytes of its own shards (the global array is never built), and
/// a mesh-independent checksum of an array's contents.
///
/// Files are numpy's format 1.0 (C order, little-endian), byte-for-byte what numpy >= 1.24
/// np.save writes for the same array, so np.load reads them and Shard reads numpy's files.
/// A file written on one mesh loads onto any other mesh, spec, rank count or devices per rank.
///
/// Every function here is collective over all ranks of the Runtime (ranks whose devices hold
/// nothing of the array still take part). Failures only some ranks see (a missing file, a
/// failed write, a full disk) are agreed and raised as the same IoError on every rank, with
/// the path and MPI's error string; nothing hangs.

#include <cstdint>
#include <string>

#include "shard/core/dtype.hpp"
#include "shard/sharding/named_sharding.hpp"
#include "shard/array/sharded_array.hpp"

namespace shard::io {

/// numpy's type string of T (dtype_npy_descr): "<f4", "<f8", "<i4", "<i8". .npy files and
/// checkpoints hold the numeric dtypes (NumericDtypes, SHARD_FOR_EACH_NUMERIC_DTYPE).
template <typename T>
const char* npy_descr();

/// The exact header numpy (format 1.0, numpy >= 1.24) writes before the data of a C-order
/// array: "\x93NUMPY", version 1.0, the uint16 little-endian length of the rest, then
/// "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }" plus numpy's spare space
/// for growing the first dim, padded with spaces and a final '\n' to a multiple of 64
/// bytes. Throws ValueError if the shape needs more than a uint16 header length.
std::string npy_header(const std::string& descr, const Shape& shape);

/// What a .npy header says (see parse_npy_header).
struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  Shape shape;
  std::int64_t data_offset = 0;  ///< bytes before the first element
};

/// Parses the bytes at the start of a .npy file (versions 1.0, 2.0 and 3.0); `bytes` must
/// hold at least the whole header. Local (no communication); throws IoError naming `path`
/// if the magic, version, length or dict is malformed.
NpyHeader parse_npy_header(const std::string& bytes, const std::string& path);

/// Collective: writes `x` to `path` (created or truncated) as a .npy file. Rank 0 adds the
/// header; every rank writes the boxes of its devices that hold the primary copy (replicas
/// are written once) in one collective MPI_File_write_at_all through a file view of its row
/// runs. Rank 0 first reserves the file's blocks (fallocate, where the file system has it),
/// so a full disk, a quota or a file size limit raises IoError ("No space left on device",
/// with the free space) on every rank before the collective write: Open MPI 4.1's OMPIO can
/// drop such a write error, or hang after it with 3 or more ranks. The data is flushed to
/// storage (MPI_File_sync) and the file size checked before the file is closed.
template <typename T>
void save_npy(const ShardedArray<T>& x, const std::string& path);

/// Collective: reads the .npy file at `path` into an array laid out by `sharding`. Rank 0
/// reads and checks the header (magic, version, descr equal to T's, C order, the file long
/// enough for the shape) and broadcasts it; bfloat16 and float32 also load each other's files
/// ('<V2' as ml_dtypes writes bfloat16, '<f4'): into bfloat16 rounded to nearest even, into
/// float32 exactly; every rank then reads only the boxes of its own
/// devices in one collective MPI_File_read_at_all. Errors: IoError naming the path on every
/// rank; ShardingError if the sharding's spec does not fit the file's shape.
template <typename T>
ShardedArray<T> load_npy(const std::string& path, const NamedSharding& sharding);

/// Collective: a 64-bit checksum of the array's shape and element bits that does not depend
/// on the mesh, spec or rank count: the sum (mod 2^64) over the primary copy of every
/// element of mix(mix(global flat index) ^ bits(value)), reduced with one MPI_Allreduce, then
/// mixed with the shape. mix is a bijection, so changing any one element always changes it.
template <typename T>
std::uint64_t checksum(const ShardedArray<T>& x);

#define SHARD_DECLARE_IO(T)                                                              \
  extern template const char* npy_descr<T>();                                            \
  extern template void save_npy<T>(const ShardedArray<T>&, const std::string&);          \
  extern template ShardedArray<T> load_npy<T>(const std::string&, const NamedSharding&); \
  extern template std::uint64_t checksum<T>(const ShardedArray<T>&);
SHARD_FOR_EACH_NUMERIC_DTYPE(SHARD_DECLARE_IO)
#undef SHARD_DECLARE_IO

}  // namespace shard::io
