// MPI-IO for shard::io: see file.hpp.

#include "file.hpp"

#include <algorithm>

#include "shard/error.hpp"
#include "shard/mpi/agree.hpp"

namespace shard::mpi {

namespace {

constexpr std::int64_t kMaxRunBytes = 1 << 30;  // MPI block lengths are ints: split longer runs

std::string mpi_error_text(int rc) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return "MPI error code " + std::to_string(rc);
  return std::string(text, static_cast<std::size_t>(len));
}

/// A committed MPI datatype, freed on scope exit unless `leak` is set. ROMIO (Open MPI's
/// io/romio321) caches flattened datatypes by handle and skips the clean-up when a
/// collective transfer fails; freeing the type would let the next type reuse the handle and
/// hit the stale entry (reads then returned wrong bytes), so after a failure it is leaked.
struct Datatype {
  MPI_Datatype t = MPI_DATATYPE_NULL;
  bool leak = false;
  Datatype() = default;
  Datatype(const Datatype&) = delete;
  Datatype& operator=(const Datatype&) = delete;
  ~Datatype() {
    if (t != MPI_DATATYPE_NULL && !leak) MPI_Type_free(&t);
  }
};

}  // namespace

MPI_Aint address_of(const void* p) {
  MPI_Aint addr = 0;
  check(MPI_Get_address(p, &addr), "MPI_Get_address");
  return addr;
}

File::File(const Communicator& comm, std::string path, Mode mode, std::string op, std::function<std::string()> hint)
    : comm_(comm), path_(std::move(path)), op_(std::move(op)), hint_(std::move(hint)) {
  const int amode = mode == Mode::kRead ? MPI_MODE_RDONLY : (MPI_MODE_CREATE | MPI_MODE_WRONLY);
  const int rc = MPI_File_open(comm_.get(), path_.c_str(), amode, MPI_INFO_NULL, &fh_);
  // If only some ranks opened the file, closing it (collective) on those could hang:
  // they forget the handle instead, a leak only in that rare case.
  if (comm_.any(rc != MPI_SUCCESS)) fh_ = MPI_FILE_NULL;
  agree(rc, "MPI_File_open", mode == Mode::kRead ? "cannot open for reading" : "cannot open for writing");
}

File::~File() {
  if (fh_ != MPI_FILE_NULL) MPI_File_close(&fh_);
}

std::string File::hint() const { return hint_ ? "; " + hint_() : ""; }

void File::agree(int rc, const char* routine, const char* doing) const {
  agreed(comm_, [&] {
    if (rc != MPI_SUCCESS)
      raise<IoError>(op_, ": ", doing, " '", path_, "': ", routine, ": ", mpi_error_text(rc), hint());
  });
}

void File::truncate() { agree(MPI_File_set_size(fh_, 0), "MPI_File_set_size", "cannot truncate"); }
void File::sync() { agree(MPI_File_sync(fh_), "MPI_File_sync", "cannot flush"); }

std::int64_t File::size() {
  MPI_Offset size = 0;
  agree(MPI_File_get_size(fh_, &size), "MPI_File_get_size", "cannot check");
  return static_cast<std::int64_t>(size);
}

void File::close() {
  const int rc = MPI_File_close(&fh_);
  fh_ = MPI_FILE_NULL;
  agree(rc, "MPI_File_close", "cannot close");
}

void File::transfer(std::vector<FileRun> runs, bool write) {
  Datatype file_type, mem_type;
  std::int64_t total = 0;
  agreed(comm_, [&] {
    std::sort(runs.begin(), runs.end(), [](const FileRun& a, const FileRun& b) { return a.file < b.file; });
    std::vector<int> lens;
    std::vector<MPI_Aint> file_disp, mem_disp;
    for (const FileRun& r : runs)
      for (std::int64_t done = 0; done < r.bytes; done += kMaxRunBytes) {
        lens.push_back(static_cast<int>(std::min(kMaxRunBytes, r.bytes - done)));
        file_disp.push_back(static_cast<MPI_Aint>(r.file + done));
        mem_disp.push_back(MPI_Aint_add(r.mem, static_cast<MPI_Aint>(done)));
        total += lens.back();
      }
    const int n = int_count<IoError>(static_cast<std::int64_t>(lens.size()),
                                     "row runs of this rank's shards (a spec that splits major dims makes fewer)",
                                     op_, ": '", path_, "'");
    if (n == 0) return;
    check(MPI_Type_create_hindexed(n, lens.data(), file_disp.data(), MPI_BYTE, &file_type.t),
          "MPI_Type_create_hindexed");
    check(MPI_Type_commit(&file_type.t), "MPI_Type_commit");
    check(MPI_Type_create_hindexed(n, lens.data(), mem_disp.data(), MPI_BYTE, &mem_type.t),
          "MPI_Type_create_hindexed");
    check(MPI_Type_commit(&mem_type.t), "MPI_Type_commit");
  });
  const bool any = total > 0;
  agree(MPI_File_set_view(fh_, 0, MPI_BYTE, any ? file_type.t : MPI_BYTE, "native", MPI_INFO_NULL),
        "MPI_File_set_view", write ? "cannot write" : "cannot read");
  MPI_Status status{};
  const MPI_Datatype mt = any ? mem_type.t : MPI_BYTE;
  const int rc = write ? MPI_File_write_at_all(fh_, 0, MPI_BOTTOM, any ? 1 : 0, mt, &status)
                       : MPI_File_read_at_all(fh_, 0, MPI_BOTTOM, any ? 1 : 0, mt, &status);
  file_type.leak = mem_type.leak = rc != MPI_SUCCESS;
  agree(rc, write ? "MPI_File_write_at_all" : "MPI_File_read_at_all", write ? "cannot write" : "cannot read");
  // OMPIO reports a short write only here; ROMIO leaves the status of a 0-byte call unset.
  MPI_Count moved = 0;
  const int rc2 = any ? MPI_Get_elements_x(&status, mt, &moved) : MPI_SUCCESS;
  agreed(comm_, [&] {
    if (rc2 == MPI_SUCCESS && moved != total)
      raise<IoError>(op_, ": '", path_, "': ", write ? "wrote " : "read ", moved, " of ", total, " bytes",
                     write ? hint() : std::string(" (the file is shorter than its header says)"));
  });
}

}  // namespace shard::mpi
