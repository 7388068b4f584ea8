#include "shard/io.hpp"

#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

#include "shard/error.hpp"
#include "shard/mpi/agree.hpp"
#include "shard/runtime.hpp"

namespace shard::io {

// .npy data is little-endian and MPI-IO's "native" representation writes memory as is.
static_assert(std::endian::native == std::endian::little, "Shard's .npy IO assumes a little-endian host");

template <typename T>
const char* npy_descr() {
  return std::is_same_v<T, float>    ? "<f4"
         : std::is_same_v<T, double> ? "<f8"
         : sizeof(T) == 4            ? "<i4"
                                     : "<i8";
}

namespace {

constexpr std::int64_t kMaxRunBytes = 1 << 30;     // MPI block lengths are ints: split longer runs
constexpr std::int64_t kMaxHeaderBytes = 1 << 20;  // numpy itself refuses headers over 10000 bytes

const char* dtype_of_descr(const std::string& descr) {
  if (descr == "<f4") return "float32";
  if (descr == "<f8") return "float64";
  if (descr == "<i4") return "int32";
  if (descr == "<i8") return "int64";
  return "a dtype Shard does not load";
}


/// A cursor over the Python literal dict of a .npy header; errors name the file.

/// A contiguous piece of the file and where its bytes live in this process's memory.
struct Run {
  MPI_Offset file;
  std::int64_t bytes;
  MPI_Aint mem;
};

/// Calls fn(file element offset, box element offset, element count) for each contiguous row
/// run of `box` in the row-major array of `shape`; trailing dims the box spans whole merge
/// into one run, so P('a', None) gives one run per box.
template <typename F>
void for_each_run(const Shape& shape, const Box& box, F&& fn) {
  if (box.empty()) return;
  const int nd = static_cast<int>(shape.size());
  if (nd == 0) return fn(std::int64_t{0}, std::int64_t{0}, std::int64_t{1});
  const Shape st = strides_of(shape);
  int j = nd - 1;
  std::int64_t len = box.extent[j];
  while (j > 0 && box.extent[j] == shape[j]) {
    --j;
    len = box.extent[j] * st[j];
  }
  Shape idx(static_cast<std::size_t>(j), 0);  // position among the outer dims 0..j-1
  for (std::int64_t mem = 0;; mem += len) {
    std::int64_t file = box.offset[j] * st[j];
    for (int d = 0; d < j; ++d) file += (box.offset[d] + idx[d]) * st[d];
    fn(file, mem, len);
    int d = j - 1;
    for (; d >= 0; --d) {
      if (++idx[d] < box.extent[d]) break;
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

template <typename T>
void add_runs(const Shape& shape, const Box& box, std::int64_t data_offset, const T* data,
              std::vector<Run>& runs) {
  for_each_run(shape, box, [&](std::int64_t file, std::int64_t mem, std::int64_t len) {
    MPI_Aint addr = 0;
    mpi::check(MPI_Get_address(data + mem, &addr), "MPI_Get_address");
    runs.push_back(Run{data_offset + file * static_cast<std::int64_t>(sizeof(T)),
                       len * static_cast<std::int64_t>(sizeof(T)), addr});
  });
}

/// The free space next to `path`, for the errors of a failed write of a `needed`-byte file
/// (MPI-IO layers report a full disk as a generic error, or not at all).
std::string space_hint(const std::string& path, std::int64_t needed) {
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::absolute(path, ec).parent_path();
  const std::filesystem::space_info si = std::filesystem::space(dir, ec);
  if (ec) return "cannot check the free space of '" + dir.string() + "': " + ec.message();
  return "the file system of '" + dir.string() + "' has " + std::to_string(si.available) +
         " bytes free, the file needs " + std::to_string(needed) + " (a full disk, a quota or a file size limit?)";
}

/// fallocate(2) of the first `bytes` of the existing file `path` (which grows to that size).
void reserve_blocks(const std::string& path, std::int64_t bytes, const std::string& op) {
  if (bytes <= 0) return;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) raise<IoError>(op, ": cannot open '", path, "' for writing: ", std::strerror(errno));
  int rc = 0;
  do {
    rc = ::fallocate(fd, 0, 0, static_cast<off_t>(bytes));
  } while (rc != 0 && errno == EINTR);
  const int err = rc == 0 ? 0 : errno;
  ::close(fd);
  if (rc != 0 && err != EOPNOTSUPP && err != ENOSYS)
    raise<IoError>(op, ": cannot allocate the ", bytes, " bytes of '", path, "': ", std::strerror(err), "; ",
                   space_hint(path, bytes));
}

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

/// A file opened collectively over the world. Every step agrees on its outcome, so an error
/// unwinds every rank at the same point and the destructor's collective close is matched.
class File {
 public:
  /// `write_bytes`: the size the file will have (writes), for the free-space hint of errors.
  File(const mpi::Communicator& world, std::string path, int amode, std::string op, std::int64_t write_bytes = -1)
      : world_(world), path_(std::move(path)), op_(std::move(op)), write_bytes_(write_bytes) {
    const int rc = MPI_File_open(world_.get(), path_.c_str(), amode, MPI_INFO_NULL, &fh_);
    // If only some ranks opened the file, closing it (collective) on those could hang:
    // they forget the handle instead, a leak only in that rare case.
    if (world_.any(rc != MPI_SUCCESS)) fh_ = MPI_FILE_NULL;
    agree(rc, "MPI_File_open",
          (amode & MPI_MODE_RDONLY) ? "cannot open for reading" : "cannot open for writing");
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File() {
    if (fh_ != MPI_FILE_NULL) MPI_File_close(&fh_);
  }

  MPI_File get() const { return fh_; }
  /// Every rank raises IoError if `rc` failed on any rank.
  void agree(int rc, const char* routine, const char* doing) const {
    mpi::agreed(world_, [&] {
      if (rc != MPI_SUCCESS)
        raise<IoError>(op_, ": ", doing, " '", path_, "': ", routine, ": ", mpi_error_text(rc), hint());
    });
  }
  /// "; <space_hint>" for a file being written, else "".
  std::string hint() const { return write_bytes_ < 0 ? "" : "; " + space_hint(path_, write_bytes_); }
  void close() {
    const int rc = MPI_File_close(&fh_);
    fh_ = MPI_FILE_NULL;
    agree(rc, "MPI_File_close", "cannot close");
  }

  /// One collective read or write of this rank's runs (sorted by file offset, as a file
  /// view requires) through a file view and a memory datatype of absolute addresses, so
  /// nothing is packed. A rank without runs takes part with zero bytes.
  void transfer(std::vector<Run> runs, bool write) {
    Datatype file_type, mem_type;
    std::int64_t total = 0;
    mpi::agreed(world_, [&] {
      std::sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) { return a.file < b.file; });
      std::vector<int> lens;
      std::vector<MPI_Aint> file_disp, mem_disp;
      for (const Run& r : runs)
        for (std::int64_t done = 0; done < r.bytes; done += kMaxRunBytes) {
          lens.push_back(static_cast<int>(std::min(kMaxRunBytes, r.bytes - done)));
          file_disp.push_back(static_cast<MPI_Aint>(r.file + done));
          mem_disp.push_back(MPI_Aint_add(r.mem, static_cast<MPI_Aint>(done)));
          total += lens.back();
        }
      if (lens.size() > static_cast<std::size_t>(INT_MAX))
        raise<IoError>(
            op_, ": '", path_, "': this rank's shards form ", lens.size(),
            " row runs, more than one MPI datatype can describe; use a spec that splits major dims");
      if (lens.empty()) return;
      const int n = static_cast<int>(lens.size());
      mpi::check(MPI_Type_create_hindexed(n, lens.data(), file_disp.data(), MPI_BYTE, &file_type.t),
                 "MPI_Type_create_hindexed");
      mpi::check(MPI_Type_commit(&file_type.t), "MPI_Type_commit");
      mpi::check(MPI_Type_create_hindexed(n, lens.data(), mem_disp.data(), MPI_BYTE, &mem_type.t),
                 "MPI_Type_create_hindexed");
      mpi::check(MPI_Type_commit(&mem_type.t), "MPI_Type_commit");
    });
    const bool any = total > 0;
    agree(MPI_File_set_view(fh_, 0, MPI_BYTE, any ? file_type.t : MPI_BYTE, "native", MPI_INFO_NULL),
          "MPI_File_set_view", write ? "cannot write" : "cannot read");
    MPI_Status status{};
    const MPI_Datatype mt = any ? mem_type.t : MPI_BYTE;
    const int rc = write ? MPI_File_write_at_all(fh_, 0, MPI_BOTTOM, any ? 1 : 0, mt, &status)
                         : MPI_File_read_at_all(fh_, 0, MPI_BOTTOM, any ? 1 : 0, mt, &status);
    file_type.leak = mem_type.leak = rc != MPI_SUCCESS;
    agree(rc, write ? "MPI_File_write_at_all" : "MPI_File_read_at_all",
          write ? "cannot write" : "cannot read");
    // OMPIO reports a short write only here; ROMIO leaves the status of a 0-byte call unset.
    MPI_Count moved = 0;
    const int rc2 = any ? MPI_Get_elements_x(&status, mt, &moved) : MPI_SUCCESS;
    mpi::agreed(world_, [&] {
      if (rc2 == MPI_SUCCESS && moved != total)
        raise<IoError>(op_, ": '", path_, "': ", write ? "wrote " : "read ", moved, " of ", total, " bytes",
                       write ? "; " + space_hint(path_, write_bytes_)
                             : std::string(" (the file is shorter than its header says)"));
    });
  }

 private:
  const mpi::Communicator& world_;
  std::string path_, op_;
  std::int64_t write_bytes_ = -1;
  MPI_File fh_ = MPI_FILE_NULL;
};

/// Rank 0's view of a .npy file: the header and the file size, checked against T.
template <typename T>
NpyHeader read_header_on_root(const std::string& path) {
  const std::string op = std::string("load_npy<") + dtype_name<T>() + ">";
  std::error_code ec;
  const auto file_size = static_cast<std::int64_t>(std::filesystem::file_size(path, ec));
  if (ec) raise<IoError>(op, ": cannot open '", path, "' for reading: ", ec.message());
  std::ifstream in(path, std::ios::binary);
  std::string bytes(static_cast<std::size_t>(std::min(file_size, kMaxHeaderBytes)), '\0');
  if (!in.read(bytes.data(), static_cast<std::streamsize>(bytes.size())))
    raise<IoError>(op, ": cannot read '", path, "': ", std::strerror(errno));
  NpyHeader h = parse_npy_header(bytes, path);
  if (h.descr != npy_descr<T>())
    raise<IoError>(op, ": '", path, "' holds '", h.descr, "' (", dtype_of_descr(h.descr), ") data, not '",
                   npy_descr<T>(), "' (", dtype_name<T>(), "); load it with the file's dtype");
  if (h.fortran_order)
    raise<IoError>(op, ": '", path, "' is in Fortran order; save it in C order (np.ascontiguousarray)");
  std::int64_t bytes_needed = sizeof(T);
  for (std::int64_t d : h.shape)
    if (__builtin_mul_overflow(bytes_needed, d, &bytes_needed))
      raise<IoError>(op, ": '", path, "': header shape ", to_string(h.shape), " is too large");
  if (bytes_needed > file_size - h.data_offset)  // not data_offset + bytes_needed: that can overflow
    raise<IoError>(op, ": '", path, "' is truncated: its header says ", to_string(h.shape), " ",
                   dtype_name<T>(), " (", bytes_needed, " bytes after a ", h.data_offset,
                   "-byte header) but the file has ", file_size, " bytes");
  return h;
}

}  // namespace

template <typename T>
void save_npy(const ShardedArray<T>& x, const std::string& path) {
  const mpi::Communicator& world = Runtime::current().world();
  const std::string op = std::string("save_npy<") + dtype_name<T>() + ">";
  const std::string header = npy_header(npy_descr<T>(), x.shape());  // metadata: same on every rank
  std::vector<Run> runs;
  mpi::agreed(world, [&] {
    // Rank 0's header goes into the same collective write as the data.
    if (world.rank() == 0) {
      MPI_Aint addr = 0;
      mpi::check(MPI_Get_address(header.data(), &addr), "MPI_Get_address");
      runs.push_back(Run{0, static_cast<std::int64_t>(header.size()), addr});
    }
    for (const auto& s : x.addressable_shards())
      if (x.sharding().replica_index(s.device) == 0)
        add_runs(x.shape(), s.box, static_cast<std::int64_t>(header.size()), s.data.data(), runs);
  });
  const std::int64_t expected = static_cast<std::int64_t>(header.size() + x.size() * sizeof(T));
  File f(world, path, MPI_MODE_CREATE | MPI_MODE_WRONLY, op, expected);
  f.agree(MPI_File_set_size(f.get(), 0), "MPI_File_set_size", "cannot truncate");
  // Rank 0 reserves the file's blocks with POSIX calls first, so a full disk, a quota or a
  // file size limit fails here, cleanly and the same on every rank, and not inside the
  // collective write: Open MPI 4.1's OMPIO can drop that error, and with 3 or more ranks its
  // collective writer hung after an aggregator hit ENOSPC. File systems without fallocate
  // (EOPNOTSUPP) skip this; the checks after the write still catch a failure there.
  mpi::agreed(world, [&] {
    if (world.rank() == 0) reserve_blocks(path, expected, op);
  });
  f.transfer(std::move(runs), true);
  f.agree(MPI_File_sync(f.get()), "MPI_File_sync", "cannot flush");
  // Open MPI 4.1's OMPIO collective writers (fcoll vulcan, dynamic, two_phase) drop the error
  // of a failed pwritev and report success: a full disk shows up only as a short file.
  MPI_Offset size = 0;
  f.agree(MPI_File_get_size(f.get(), &size), "MPI_File_get_size", "cannot check");
  mpi::agreed(world, [&] {
    if (size != expected)
      raise<IoError>(op, ": '", path, "' has ", size, " bytes after writing but needs ", expected,
                     " (the MPI-IO layer did not report the failed write); ", f.hint().substr(2));
  });
  f.close();
}

template <typename T>
ShardedArray<T> load_npy(const std::string& path, const NamedSharding& sharding) {
  const mpi::Communicator& world = Runtime::current().world();
  const std::string op = std::string("load_npy<") + dtype_name<T>() + ">";
  // Rank 0 checks the header; the others receive [data offset, ndim, dims...].
  std::vector<std::int64_t> meta;
  mpi::agreed(world, [&] {
    if (world.rank() != 0) return;
    const NpyHeader h = read_header_on_root<T>(path);
    meta = {h.data_offset, static_cast<std::int64_t>(h.shape.size())};
    meta.insert(meta.end(), h.shape.begin(), h.shape.end());
  });
  int n = static_cast<int>(meta.size());
  mpi::check(MPI_Bcast(&n, 1, MPI_INT, 0, world.get()), "MPI_Bcast");
  meta.resize(static_cast<std::size_t>(n));
  mpi::check(MPI_Bcast(meta.data(), n, MPI_INT64_T, 0, world.get()), "MPI_Bcast");
  const std::int64_t data_offset = meta[0];
  const Shape shape(meta.begin() + 2, meta.end());
  checked_num_elements(shape, sizeof(T), op.c_str());  // metadata: the same error on every rank
  sharding.check_shape(shape);

  // One buffer per distinct box of this rank's devices; replicas on this rank copy it after.
  std::vector<Shard<T>> shards;
  std::map<Box, std::size_t> first_with_box;
  std::vector<Run> runs;
  mpi::agreed(world, [&] {
    for (int d : sharding.mesh().local_device_ids()) {
      Box b = sharding.box(d, shape);
      if (first_with_box.count(b)) {
        shards.push_back(Shard<T>{d, b, Tensor<T>()});
        continue;
      }
      first_with_box.emplace(b, shards.size());
      Tensor<T> t(b.extent);
      add_runs(shape, b, data_offset, t.data(), runs);
      shards.push_back(Shard<T>{d, std::move(b), std::move(t)});
    }
  });
  File f(world, path, MPI_MODE_RDONLY, op);
  f.transfer(std::move(runs), false);
  f.close();
  for (auto& s : shards)
    if (auto i = first_with_box.at(s.box); shards[i].device != s.device) s.data = shards[i].data;
  return ShardedArray<T>(shape, sharding, std::move(shards));
}

template <typename T>
std::uint64_t checksum(const ShardedArray<T>& x) {
  // splitmix64's finaliser: a bijection on 64-bit words with good avalanche.
  auto mix = [](std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  std::uint64_t sum = 0;
  for (const auto& s : x.addressable_shards()) {
    if (x.sharding().replica_index(s.device) != 0) continue;
    const T* data = s.data.data();
    for_each_run(x.shape(), s.box, [&](std::int64_t file, std::int64_t mem, std::int64_t len) {
      for (std::int64_t i = 0; i < len; ++i) {
        std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t> bits;
        std::memcpy(&bits, data + mem + i, sizeof(T));
        sum += mix(mix(static_cast<std::uint64_t>(file + i) ^ 0x9e3779b97f4a7c15ull) ^ bits);
      }
    });
  }
  std::uint64_t total = Runtime::current().world().allreduce<std::uint64_t>(sum, MPI_SUM);
  total = mix(total ^ static_cast<std::uint64_t>(x.ndim()));
  for (std::int64_t d : x.shape()) total = mix(total ^ static_cast<std::uint64_t>(d));
  return total;
}

#define SHARD_INSTANTIATE_IO(T)                                                   \
  template const char* npy_descr<T>();                                            \
  template void save_npy<T>(const ShardedArray<T>&, const std::string&);          \
  template ShardedArray<T> load_npy<T>(const std::string&, const NamedSharding&); \
  template std::uint64_t checksum<T>(const ShardedArray<T>&);
SHARD_INSTANTIATE_IO(float)
SHARD_INSTANTIATE_IO(double)
SHARD_INSTANTIATE_IO(std::int32_t)
SHARD_INSTANTIATE_IO(std::int64_t)
#undef SHARD_INSTANTIATE_IO

}  // namespace shard::io
