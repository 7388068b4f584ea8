// .npy IO: files byte-identical to numpy's np.save (checked against bytes the test builds
// itself, and against numpy when it is installed), loads onto any other mesh and spec,
// mesh-independent checksums, and errors raised on every rank.

#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "mpi_test.hpp"
#include "test_util.hpp"

namespace shard::testing {
namespace {

namespace fs = std::filesystem;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

/// Collective: rank 0's `flag` on every rank.
bool from_root(bool flag) {
  int v = flag ? 1 : 0;
  MPI_Bcast(&v, 1, MPI_INT, 0, runtime().world().get());
  return v != 0;
}

/// Collective: `fn` on rank 0, then a barrier.
template <typename F>
void on_root(F&& fn) {
  if (runtime().process_index() == 0) fn();
  MPI_Barrier(runtime().world().get());
}

/// The .npy file numpy 1.24 writes for a C-order array, built here from the format's rules
/// (not with the library): dict, room to grow dim 0 to 21 digits, then 1..64 spaces and a
/// newline so the header length is a multiple of 64, then the raw little-endian data.
std::string expected_npy(const std::string& descr, const Shape& shape, const void* data, std::size_t bytes) {
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (";
  for (std::size_t i = 0; i < shape.size(); ++i) dict += (i ? ", " : "") + std::to_string(shape[i]);
  dict += shape.size() == 1 ? ",), }" : "), }";
  if (!shape.empty()) dict += std::string(21 - std::to_string(shape[0]).size(), ' ');
  const std::size_t unpadded = 10 + dict.size() + 1;
  const std::size_t total = (unpadded / 64 + 1) * 64;
  dict += std::string(total - unpadded, ' ') + "\n";
  const std::size_t hlen = dict.size();
  std::string out =
      std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(hlen & 0xff) + static_cast<char>(hlen >> 8);
  return out + dict + std::string(static_cast<const char*>(data), bytes);
}

template <typename T>
std::string expected_npy(const Tensor<T>& host) {
  return expected_npy(io::npy_descr<T>(), host.shape(), host.data(), host.bytes());
}

std::vector<Mesh> meshes_2d() {
  std::vector<Mesh> out;
  for (const auto& f : factorisations(runtime().device_count(), 2)) out.push_back(make_mesh(f, {"a", "b"}));
  return out;
}

/// True if every shard of x holds exactly the elements of `host` its box names.
template <typename T>
bool equals_host(const ShardedArray<T>& x, const Tensor<T>& host) {
  if (x.shape() != host.shape()) return false;
  for (const auto& s : x.addressable_shards()) {
    const auto want = reference_slice(host, s.box);
    if (s.data.shape() != s.box.extent || !std::equal(want.begin(), want.end(), s.data.begin())) return false;
  }
  return true;
}

/// Rank 0 compares the file with the bytes numpy would write; every rank gets the verdict.
template <typename T>
bool file_matches(const std::string& path, const Tensor<T>& host) {
  return from_root(runtime().process_index() != 0 || read_file(path) == expected_npy(host));
}

SHARD_MPI_TEST(Npy, HeaderIsNumpys) {
  const std::string h34 = io::npy_header("<f4", {3, 4});
  EXPECT_EQ(
      h34,
      std::string("\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }", 69) +
          std::string(58, ' ') + "\n");
  EXPECT_EQ(io::npy_header("<i8", {}), std::string("\x93NUMPY\x01\x00v\x00", 10) +
                                           "{'descr': '<i8', 'fortran_order': False, 'shape': (), }" +
                                           std::string(62, ' ') + "\n");
  EXPECT_EQ(io::npy_header("<f8", {5}).substr(10, 57),
            "{'descr': '<f8', 'fortran_order': False, 'shape': (5,), }");
  // An unpadded length that is already a multiple of 64 still gets 64 spaces, as in numpy.
  const Shape wide{2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 1234567890};
  const std::string hw = io::npy_header("<f4", wide);
  EXPECT_EQ(hw.size(), 192u);
  EXPECT_EQ(hw.substr(hw.size() - 66), std::string(65, ' ') + "\n");
  for (const Shape& s : {Shape{}, Shape{7}, Shape{3, 4}, Shape{0, 9}, Shape{123456, 7, 1}, wide}) {
    const std::string h = io::npy_header("<i4", s);
    EXPECT_EQ(h, expected_npy("<i4", s, nullptr, 0)) << to_string(s);
    const io::NpyHeader p = io::parse_npy_header(h, "mem");
    EXPECT_EQ(p.shape, s);
    EXPECT_EQ(p.descr, "<i4");
    EXPECT_FALSE(p.fortran_order);
    EXPECT_EQ(p.data_offset, static_cast<std::int64_t>(h.size()));
  }
}

/// Every spec of a 2-D array on every 2-D mesh, uneven shapes included: the file is numpy's
/// bytes, and it loads onto another mesh and spec with the same contents and checksum.
SHARD_MPI_TEST(Npy, SaveEverySpecLoadOnAnotherMesh) {
  TempDir dir("shard-test-io-", true);
  const auto meshes = meshes_2d();
  for (const Shape& shape : {Shape{13, 10}, Shape{4, 6}}) {
    const Tensor<float> host = random_tensor<float>(shape, 7 + static_cast<std::uint64_t>(shape[0]));
    std::vector<NamedSharding> shardings;
    for (const auto& m : meshes)
      for (const auto& spec : all_specs({"a", "b"}, 2)) shardings.emplace_back(m, spec);
    std::uint64_t sum0 = 0;
    for (std::size_t i = 0; i < shardings.size(); ++i) {
      const auto x = device_put(host, shardings[i]);
      const std::string path = dir.file("a.npy");
      io::save_npy(x, path);
      EXPECT_TRUE(file_matches(path, host)) << shardings[i].to_string();
      const NamedSharding& other = shardings[(i * 7 + 3) % shardings.size()];
      const auto y = io::load_npy<float>(path, other);
      EXPECT_TRUE(equals_host(y, host)) << shardings[i].to_string() << " -> " << other.to_string();
      const std::uint64_t sx = io::checksum(x);
      if (i == 0) sum0 = sx;
      EXPECT_EQ(sx, sum0) << shardings[i].to_string();
      EXPECT_EQ(io::checksum(y), sx);
    }
  }
}

template <typename T>
void round_trip_all_ranks(const TempDir& dir) {
  const int n = runtime().device_count();
  const Mesh m1 = make_mesh({n}, {"a"});
  const Mesh m2 = n % 2 == 0 ? make_mesh({2, n / 2}, {"a", "b"}) : make_mesh({1, n}, {"a", "b"});
  struct Case {
    Shape shape;
    NamedSharding from, to;
  };
  const std::vector<Case> cases = {
      {{}, NamedSharding(m1, P()), NamedSharding(m2, P())},                         // 0-d
      {{7}, NamedSharding(m1, P("a")), NamedSharding(m2, P(SpecEntry{"b", "a"}))},  // uneven 1-d
      {{7}, NamedSharding(m2, P()), NamedSharding(m1, P("a"))},                     // replicated
      {{0, 5}, NamedSharding(m2, P("a", "b")), NamedSharding(m1, P(None, "a"))},    // empty
      {{9, 2, 5}, NamedSharding(m2, P("b", None, "a")), NamedSharding(m1, P(None, None, "a"))},
  };
  for (const auto& c : cases) {
    const Tensor<T> host = random_tensor<T>(c.shape, 11);
    const std::string path = dir.file(std::string("t_") + dtype_name<T>() + ".npy");
    io::save_npy(device_put(host, c.from), path);
    EXPECT_TRUE(file_matches(path, host)) << dtype_name<T>() << " " << to_string(c.shape);
    const auto y = io::load_npy<T>(path, c.to);
    EXPECT_TRUE(equals_host(y, host))
        << dtype_name<T>() << " " << to_string(c.shape) << " " << c.to.to_string();
  }
}

SHARD_MPI_TEST(Npy, EveryDtypeAndRank) {
  TempDir dir("shard-test-io-", true);
  round_trip_all_ranks<float>(dir);
  round_trip_all_ranks<double>(dir);
  round_trip_all_ranks<std::int32_t>(dir);
  round_trip_all_ranks<std::int64_t>(dir);
}

/// The python3 that has numpy ("" if none); decided on rank 0.
std::string numpy_python() {
  std::string found;
  if (runtime().process_index() == 0)
    for (const char* py : {"python3", "/usr/bin/python3"})
      if (std::system((std::string(py) + " -c 'import numpy' >/dev/null 2>&1").c_str()) == 0) {
        found = py;
        break;
      }
  return from_root(!found.empty()) ? (found.empty() ? "python3" : found) : "";
}

/// numpy's own np.load and np.save agree with Shard's files, and Shard loads numpy's file.
SHARD_MPI_TEST(Npy, NumpyReadsAndWritesTheSameFiles) {
  const std::string py = numpy_python();
  if (py.empty()) {
    if (runtime().process_index() == 0) std::printf("numpy not installed: skipping the numpy cross-check\n");
    return;
  }
  TempDir dir("shard-test-io-", true);
  const int n = runtime().device_count();
  const Mesh mesh = n % 2 == 0 ? make_mesh({n / 2, 2}, {"a", "b"}) : make_mesh({n, 1}, {"a", "b"});
  std::string list;  // one line per file: shard file, raw data file, descr, shape
  auto add = [&](const auto& host, const PartitionSpec& spec, const std::string& name) {
    using T = typename std::decay_t<decltype(host)>::value_type;
    io::save_npy(device_put(host, NamedSharding(mesh, spec)), dir.file(name + ".npy"));
    on_root([&] {
      write_file(dir.file(name + ".raw"),
                 std::string(reinterpret_cast<const char*>(host.data()), host.bytes()));
    });
    std::string shape;
    for (auto d : host.shape()) shape += std::to_string(d) + " ";
    list += dir.file(name + ".npy") + "\t" + dir.file(name + ".raw") + "\t" + io::npy_descr<T>() + "\t" +
            shape + "\n";
  };
  add(random_tensor<float>({13, 10}, 1), P("a", "b"), "f4");
  add(random_tensor<double>({5, 3, 4}, 2), P(None, "b", "a"), "f8");
  add(random_tensor<std::int32_t>({9}, 3), P(SpecEntry{"a", "b"}), "i4");
  add(random_tensor<std::int64_t>({}, 4), P(), "i8");
  const std::string script = R"(
import io, sys, numpy as np
d = sys.argv[1]
np.save(d + '/from_numpy.npy', (np.arange(35, dtype='<f8') * 0.5 - 3).reshape(5, 7))
bad = 0
for line in open(d + '/list.txt'):
    shard, raw, descr, shape = line.rstrip('\n').split('\t')
    shape = tuple(int(s) for s in shape.split())
    a = np.load(shard)
    want = np.fromfile(raw, dtype=np.dtype(descr)).reshape(shape)
    b = io.BytesIO(); np.save(b, want)
    if a.dtype != want.dtype or a.shape != shape or a.tobytes() != want.tobytes():
        print('np.load of', shard, 'differs', a.dtype, a.shape); bad += 1
    if b.getvalue() != open(shard, 'rb').read():
        print('np.save bytes differ from', shard); bad += 1
sys.exit(1 if bad else 0)
)";
  bool ok = true;
  on_root([&] {
    write_file(dir.file("list.txt"), list);
    write_file(dir.file("check.py"), script);
    ok = std::system((py + " " + dir.file("check.py") + " " + dir.file("")).c_str()) == 0;
  });
  EXPECT_TRUE(from_root(ok)) << "numpy disagrees with Shard's files (see rank 0's output)";
  // And Shard reads what numpy wrote.
  Tensor<double> want({5, 7});
  for (std::int64_t i = 0; i < 35; ++i) want.flat(i) = static_cast<double>(i) * 0.5 - 3;
  const auto y = io::load_npy<double>(dir.file("from_numpy.npy"), NamedSharding(mesh, P("b", "a")));
  EXPECT_TRUE(equals_host(y, want));
}

SHARD_MPI_TEST(Npy, ChecksumIgnoresLayoutAndSeesOneElement) {
  const int n = runtime().device_count();
  const Mesh m1 = make_mesh({n}, {"a"});
  const Mesh m2 = n % 2 == 0 ? make_mesh({2, n / 2}, {"a", "b"}) : make_mesh({n, 1}, {"a", "b"});
  Tensor<double> host = random_tensor<double>({11, 6}, 5);
  const std::uint64_t base = io::checksum(device_put(host, NamedSharding(m1, P("a"))));
  EXPECT_EQ(io::checksum(device_put(host, NamedSharding(m1, P(None, "a")))), base);
  EXPECT_EQ(io::checksum(device_put(host, NamedSharding(m2, P("b", "a")))), base);
  EXPECT_EQ(io::checksum(device_put(host, NamedSharding(m2, P()))), base);  // replicas counted once
  EXPECT_NE(io::checksum(device_put(host.reshaped({6, 11}), NamedSharding(m1, P("a")))), base);
  for (std::int64_t i : {std::int64_t{0}, std::int64_t{37}, std::int64_t{65}}) {
    Tensor<double> changed = host;
    changed.flat(i) = std::nextafter(changed.flat(i), 1e9);  // one bit of one element
    EXPECT_NE(io::checksum(device_put(changed, NamedSharding(m2, P("a", "b")))), base) << i;
  }
}

SHARD_MPI_TEST(Npy, ErrorsOnEveryRank) {
  TempDir dir("shard-test-io-", true);
  const int n = runtime().device_count();
  const NamedSharding s(make_mesh({n}, {"a"}), P("a"));
  const std::string path = dir.file("x.npy");
  const Tensor<float> host = random_tensor<float>({20, 3}, 9);
  io::save_npy(device_put(host, s), path);

  expect_error<IoError>([&] { io::load_npy<double>(path, s); },
                        {path, "'<f4' (float32)", "not '<f8' (float64)"});
  expect_error<IoError>([&] { io::load_npy<float>(dir.file("missing.npy"), s); },
                        {dir.file("missing.npy"), "cannot open", "No such file"});
  expect_error<ShardingError>([&] { io::load_npy<float>(path, NamedSharding(s.mesh(), P(None, None, "a"))); },
                              {"3 entries"});

  on_root([&] { fs::resize_file(path, 128 + 20 * 3 * 4 - 5); });
  expect_error<IoError>([&] { io::load_npy<float>(path, s); }, {path, "truncated", "(20, 3)", "bytes"});

  // Header shapes whose byte count overflows or nears int64 (an adversarial 176-byte file): the
  // truncation check still answers, nothing is allocated.
  on_root([&] { write_file(path, io::npy_header("<f4", {1152921504606846975}) + std::string(48, '\0')); });
  expect_error<IoError>([&] { io::load_npy<float>(path, s); }, {path, "truncated", "(1152921504606846975,)"});
  on_root([&] {
    write_file(path, io::npy_header("<f4", {1152921504606846975, 16}) + std::string(48, '\0'));
  });
  expect_error<IoError>([&] { io::load_npy<float>(path, s); }, {path, "too large"});

  on_root([&] { write_file(path, "PK\x03\x04 this is a zip file, not a .npy"); });
  expect_error<IoError>([&] { io::load_npy<float>(path, s); }, {path, "not a valid .npy file", "magic"});

  on_root([&] {
    std::string h = io::npy_header("<f4", {20, 3});
    h.replace(h.find("False"), 5, "True ");
    write_file(path, h + std::string(240, '\0'));
  });
  expect_error<IoError>([&] { io::load_npy<float>(path, s); }, {path, "Fortran order"});

  on_root([&] {
    std::string h = io::npy_header("<f4", {20, 3});
    h.replace(h.find("'shape'"), 7, "'shapes'");
    write_file(path, h.substr(0, h.size() - 1) + std::string(240, '\0'));
  });
  expect_error<IoError>([&] { io::load_npy<float>(path, s); }, {path, "unexpected key 'shapes'"});

  const std::string nodir = dir.file("no/such/dir/x.npy");
  expect_error<IoError>([&] { io::save_npy(device_put(host, s), nodir); },
                        {nodir, "cannot open for writing"});
}

/// Every number of a .npy header's shape, in valid syntax, set in turn to values out of range
/// (negative, zero, one off, past int32 and int64, not an integer): each load raises a shard::Error
/// on every rank or gives the array the header describes, read from the file's bytes; never a
/// crash, never other values. The counts are printed (docs/reliability.md lists them).
SHARD_MPI_TEST(Npy, EveryShapeNumberOutOfRange) {
  TempDir dir("shard-test-io-", true);
  const int n = runtime().device_count();
  const NamedSharding s(make_mesh({n}, {"a"}), P("a"));
  const std::string path = dir.file("x.npy");
  const Tensor<float> host = random_tensor<float>({20, 3}, 19);
  io::save_npy(device_put(host, s), path);
  std::string original;
  on_root([&] { original = read_file(path); });
  int len = static_cast<int>(original.size());
  MPI_Bcast(&len, 1, MPI_INT, 0, runtime().world().get());
  original.resize(static_cast<std::size_t>(len));
  MPI_Bcast(original.data(), len, MPI_CHAR, 0, runtime().world().get());
  const std::size_t header_end = original.find('\n') + 1;  // the dict ends the header
  const std::size_t open = original.find("'shape': (") + 10, close = original.find(')', open);
  const std::vector<std::string> values{"-1",
                                        "0",
                                        "1",
                                        "19",
                                        "21",
                                        "2147483648",
                                        "9223372036854775807",
                                        "9223372036854775808",
                                        "99999999999999999999999",
                                        "1.5",
                                        "1e308",
                                        "-0"};
  int refused = 0, loaded = 0, cases = 0;
  for (int dim = 0; dim < 2; ++dim) {
    const std::size_t at = dim == 0 ? open : original.find(", ", open) + 2;
    const std::size_t end = dim == 0 ? original.find(',', open) : close;
    for (const std::string& v : values) {
      // The same header length: the padding before the newline absorbs the change.
      std::string header = original.substr(0, header_end);
      header.replace(at, end - at, v);
      const std::ptrdiff_t grow =
          static_cast<std::ptrdiff_t>(header.size()) - static_cast<std::ptrdiff_t>(header_end);
      const std::size_t pad_end = header.size() - 1,
                        pad_begin = header.find_last_not_of(' ', pad_end - 1) + 1;
      ASSERT_LT(grow, static_cast<std::ptrdiff_t>(pad_end - pad_begin)) << header;
      if (grow > 0)
        header.erase(pad_begin, static_cast<std::size_t>(grow));
      else
        header.insert(pad_begin, static_cast<std::size_t>(-grow), ' ');
      ASSERT_EQ(header.size(), header_end);
      on_root([&] { write_file(path, header + original.substr(header_end)); });
      ++cases;
      bool threw = false;
      std::string wrong;
      try {
        const ShardedArray<float> x = io::load_npy<float>(path, s);
        // Only valid integers can load: the shape the header says, the file's first values.
        const Shape want = dim == 0 ? Shape{std::stoll(v), 3} : Shape{20, std::stoll(v)};
        if (x.shape() != want) wrong = "shape " + to_string(x.shape());
        const Tensor<float> got = x.to_host();
        for (std::int64_t i = 0; wrong.empty() && i < got.size(); ++i)
          if (got.flat(i) != host.flat(i)) wrong = "element " + std::to_string(i);
      } catch (const Error&) {
        threw = true;
      }
      EXPECT_TRUE(same_on_every_rank(threw)) << "some ranks raised, some did not: dim " << dim << " -> " << v;
      EXPECT_EQ(wrong, "") << "dim " << dim << " -> " << v << " loaded other values";
      (threw ? refused : loaded) += 1;
    }
  }
  if (runtime().process_index() == 0)
    std::printf(
        "[ npy      ] 2 shape numbers x %zu values: %d cases, %d refused on every rank, %d loaded as the "
        "header says\n",
        values.size(), cases, refused, loaded);
}

/// A write that fails part-way (a full disk, simulated with a file size limit on the ranks
/// that write) raises IoError on every rank instead of hanging or returning.
SHARD_MPI_TEST(Npy, FailedWriteRaisesEverywhere) {
  TempDir dir("shard-test-io-", true);
  const int n = runtime().device_count();
  const auto x =
      device_put(random_tensor<double>({256, 64}, 3), NamedSharding(make_mesh({n}, {"a"}), P("a")));
  const std::string path = dir.file("full.npy");
  rlimit saved{};
  getrlimit(RLIMIT_FSIZE, &saved);
  auto* old = std::signal(SIGXFSZ, SIG_IGN);  // the write must fail with EFBIG, not kill us
  rlimit lim = saved;
  lim.rlim_cur = 4096;
  setrlimit(RLIMIT_FSIZE, &lim);
  expect_error<IoError>([&] { io::save_npy(x, path); }, {path, "save_npy<float64>"});
  setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, old);
  io::save_npy(x, path);  // and the next save works
  EXPECT_TRUE(equals_host(io::load_npy<double>(path, x.sharding()), random_tensor<double>({256, 64}, 3)));
}

}  // namespace
}  // namespace shard::testing
