#include "shard/io/io.hpp"

#include <fcntl.h>
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

#include "mpi/file.hpp"
#include "shard/comm/detail/comm_verbs.hpp"
#include "shard/error.hpp"
#include "shard/mpi/agree.hpp"
#include "shard/ops/ops.hpp"
#include "shard/runtime/runtime.hpp"

namespace shard::io {

// .npy data is little-endian and MPI-IO's "native" representation writes memory as is.
static_assert(std::endian::native == std::endian::little, "Shard's .npy IO assumes a little-endian host");

template <typename T>
const char* npy_descr() {
  return dtype_npy_descr<T>();
}

namespace {

constexpr std::int64_t kMaxHeaderBytes = 1 << 20;  // numpy itself refuses headers over 10000 bytes

// The dtype of a .npy descr, among those Shard loads (NumericDtypes).
const char* dtype_of_descr(const std::string& descr) {
  const char* name = "a dtype Shard does not load";
  for_each_dtype<NumericDtypes>([&]<typename T>(std::type_identity<T>) {
    if (descr == dtype_npy_descr<T>()) name = dtype_name<T>();
  });
  return name;
}

/// A cursor over the Python literal dict of a .npy header; errors name the file.

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
              std::vector<mpi::FileRun>& runs) {
  for_each_run(shape, box, [&](std::int64_t file, std::int64_t mem, std::int64_t len) {
    runs.push_back(mpi::FileRun{data_offset + file * static_cast<std::int64_t>(sizeof(T)),
                                len * static_cast<std::int64_t>(sizeof(T)), mpi::address_of(data + mem)});
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
         " bytes free, the file needs " + std::to_string(needed) +
         " (a full disk, a quota or a file size limit?)";
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

/// Rank 0's view of a .npy file: the header and the file size, checked against T (`also`: a
/// descr accepted as well, returned after the format checks alone: load_npy converts it).
template <typename T>
NpyHeader read_header_on_root(const std::string& path, const char* also = nullptr) {
  const std::string op = std::string("load_npy<") + dtype_name<T>() + ">";
  std::error_code ec;
  const auto file_size = static_cast<std::int64_t>(std::filesystem::file_size(path, ec));
  if (ec) raise<IoError>(op, ": cannot open '", path, "' for reading: ", ec.message());
  std::ifstream in(path, std::ios::binary);
  std::string bytes(static_cast<std::size_t>(std::min(file_size, kMaxHeaderBytes)), '\0');
  if (!in.read(bytes.data(), static_cast<std::streamsize>(bytes.size())))
    raise<IoError>(op, ": cannot read '", path, "': ", std::strerror(errno));
  NpyHeader h = parse_npy_header(bytes, path);
  if (also && h.descr == also) return h;
  if (h.descr != npy_descr<T>())
    raise<IoError>(
        op, ": '", path, "' holds '", h.descr, "' (", dtype_of_descr(h.descr), ") data, not '",
        npy_descr<T>(), "' (", dtype_name<T>(),
        "); load it with the file's dtype (only bfloat16 and float32 load from each other's files)");
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
  detail::check_transfer(detail::CommOp{
      "save_npy",
      detail::cat(dtype_name<T>(), to_string(x.shape()), " ", x.sharding().to_string(), " to '", path, "'")});
  std::vector<mpi::FileRun> runs;
  mpi::agreed(world, [&] {
    // Rank 0's header goes into the same collective write as the data.
    if (world.rank() == 0)
      runs.push_back(
          mpi::FileRun{0, static_cast<std::int64_t>(header.size()), mpi::address_of(header.data())});
    for (const auto& s : x.addressable_shards())
      if (x.sharding().replica_index(s.device) == 0)
        add_runs(x.shape(), s.box, static_cast<std::int64_t>(header.size()), s.data.data(), runs);
  });
  const std::int64_t expected = static_cast<std::int64_t>(header.size() + x.size() * sizeof(T));
  const auto hint = [&] { return space_hint(path, expected); };
  mpi::File f(world, path, mpi::File::Mode::kWrite, op, hint);
  f.truncate();
  // Rank 0 reserves the file's blocks with POSIX calls first, so a full disk, a quota or a
  // file size limit fails here, cleanly and the same on every rank, and not inside the
  // collective write: Open MPI 4.1's OMPIO can drop that error, and with 3 or more ranks its
  // collective writer hung after an aggregator hit ENOSPC. File systems without fallocate
  // (EOPNOTSUPP) skip this; the checks after the write still catch a failure there.
  mpi::agreed(world, [&] {
    if (world.rank() == 0) reserve_blocks(path, expected, op);
  });
  f.transfer(std::move(runs), true);
  f.sync();
  // Open MPI 4.1's OMPIO collective writers (fcoll vulcan, dynamic, two_phase) drop the error
  // of a failed pwritev and report success: a full disk shows up only as a short file.
  const std::int64_t size = f.size();
  mpi::agreed(world, [&] {
    if (size != expected)
      raise<IoError>(op, ": '", path, "' has ", size, " bytes after writing but needs ", expected,
                     " (the MPI-IO layer did not report the failed write); ", hint());
  });
  f.close();
}

template <typename T>
ShardedArray<T> load_npy(const std::string& path, const NamedSharding& sharding) {
  const mpi::Communicator& world = Runtime::current().world();
  const std::string op = std::string("load_npy<") + dtype_name<T>() + ">";
  // numpy has no bfloat16: JAX's files hold it as '<V2' (ml_dtypes), others save the same
  // model as float32. bfloat16 and float32 load from either, as checkpoints do: float32 data
  // into bfloat16 rounds to nearest even, bfloat16 data into float32 is exact.
  using Other = std::conditional_t<std::is_same_v<T, float>, bfloat16, float>;
  constexpr bool kConverts = std::is_same_v<T, bfloat16> || std::is_same_v<T, float>;
  // Rank 0 checks the header; the others receive [data offset, ndim, dims...], or [-1] when the
  // file holds the other of bfloat16 / float32.
  std::vector<std::int64_t> meta;
  mpi::agreed(world, [&] {
    if (world.rank() != 0) return;
    const NpyHeader h = read_header_on_root<T>(path, kConverts ? npy_descr<Other>() : nullptr);
    if (kConverts && h.descr == npy_descr<Other>()) {
      meta = {-1};
      return;
    }
    meta = {h.data_offset, static_cast<std::int64_t>(h.shape.size())};
    meta.insert(meta.end(), h.shape.begin(), h.shape.end());
  });
  const detail::CommOp meta_op{
      "load_npy", std::string(dtype_name<T>()) + " from '" + path + "', onto " + sharding.to_string()};
  detail::check_transfer(meta_op);
  std::int64_t n = static_cast<std::int64_t>(meta.size());
  detail::broadcast(detail::world_group(), meta_op, &n, 1, 0);
  meta.resize(static_cast<std::size_t>(n));
  detail::broadcast(detail::world_group(), meta_op, meta.data(), detail::transfer_count(n, meta_op), 0);
  if constexpr (kConverts)
    if (meta[0] == -1) return astype<T>(load_npy<Other>(path, sharding));
  const std::int64_t data_offset = meta[0];
  const Shape shape(meta.begin() + 2, meta.end());
  checked_num_elements(shape, sizeof(T), op.c_str());  // metadata: the same error on every rank
  sharding.check_shape(shape);

  // One buffer per distinct box of this rank's devices; replicas on this rank copy it after.
  std::vector<Shard<T>> shards;
  std::map<Box, std::size_t> first_with_box;
  std::vector<mpi::FileRun> runs;
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
  mpi::File f(world, path, mpi::File::Mode::kRead, op);
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
        std::conditional_t<sizeof(T) == 2, std::uint16_t,
                           std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>
            bits;  // exactly sizeof(T) bytes (bfloat16: 2)
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
SHARD_FOR_EACH_NUMERIC_DTYPE(SHARD_INSTANTIATE_IO)
#undef SHARD_INSTANTIATE_IO

}  // namespace shard::io
