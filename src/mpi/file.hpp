#pragma once
/// \file MPI-IO for shard::io (the mpi/ layer; private to the library): a file opened
/// collectively over a communicator whose every step agrees on its outcome, and one collective
/// read or write of a rank's contiguous runs through a file view and a memory datatype of
/// absolute addresses, so nothing is packed.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "shard/mpi/communicator.hpp"

namespace shard::mpi {

/// A contiguous piece of the file and where its bytes live in this process's memory.
struct FileRun {
  std::int64_t file;   ///< byte offset in the file
  std::int64_t bytes;  ///< length
  MPI_Aint mem;        ///< absolute address (address_of)
};

/// The absolute address of `p`, for FileRun::mem.
MPI_Aint address_of(const void* p);

/// A file opened collectively over `comm`. Every step agrees on its outcome (an IoError on
/// every rank naming `op`, the path, the MPI routine and MPI's message, then `hint()`), so an
/// error unwinds every rank at the same point and the destructor's collective close is matched.
class File {
 public:
  enum class Mode { kRead, kWrite };
  /// `hint`: appended to errors (e.g. the free space of a file being written), or null.
  File(const Communicator& comm, std::string path, Mode mode, std::string op, std::function<std::string()> hint = {});
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  void truncate();
  void sync();
  std::int64_t size();
  /// One collective read or write of this rank's runs (sorted here by file offset, as a file
  /// view requires). A rank without runs takes part with zero bytes. Checks the byte count.
  void transfer(std::vector<FileRun> runs, bool write);
  void close();

 private:
  void agree(int rc, const char* routine, const char* doing) const;
  std::string hint() const;

  const Communicator& comm_;
  std::string path_, op_;
  std::function<std::string()> hint_;
  MPI_File fh_ = MPI_FILE_NULL;
};

}  // namespace shard::mpi
