// Checkpoints: atomic commits with retention, manifests that round-trip, loads onto other
// meshes, and corrupt or hostile checkpoints rejected on every rank.

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>

#include "mpi_test.hpp"
#include "test_util.hpp"

namespace shard::testing {
namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

/// Collective: `fn` on rank 0, then a barrier.
template <typename F>
void on_root(F&& fn) {
  if (runtime().process_index() == 0) fn();
  MPI_Barrier(runtime().world().get());
}

/// Collective: the entries of `dir` as rank 0 sees them, sorted, on every rank.
std::vector<std::string> listing(const fs::path& dir) {
  std::string names;
  if (runtime().process_index() == 0) {
    std::vector<std::string> v;
    for (const auto& e : fs::directory_iterator(dir)) v.push_back(e.path().filename().string());
    std::sort(v.begin(), v.end());
    for (const auto& s : v) names += s + "\n";
  }
  int n = static_cast<int>(names.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, runtime().world().get());
  names.resize(static_cast<std::size_t>(n));
  MPI_Bcast(names.data(), n, MPI_CHAR, 0, runtime().world().get());
  std::vector<std::string> out;
  for (std::size_t p = 0, q; (q = names.find('\n', p)) != std::string::npos; p = q + 1)
    out.push_back(names.substr(p, q - p));
  return out;
}

Mesh mesh_a() { return make_mesh({runtime().device_count()}, {"a"}); }
Mesh mesh_ab() {
  const int n = runtime().device_count();
  return n % 2 == 0 ? make_mesh({n / 2, 2}, {"a", "b"}) : make_mesh({1, n}, {"a", "b"});
}

template <typename T>
bool equals_host(const ShardedArray<T>& x, const Tensor<T>& host) {
  if (x.shape() != host.shape()) return false;
  for (const auto& s : x.addressable_shards()) {
    const auto want = reference_slice(host, s.box);
    if (!std::equal(want.begin(), want.end(), s.data.begin())) return false;
  }
  return true;
}

/// A small model: weights, a bias, a step counter; committed at `step` into `dir`.
struct Model {
  Tensor<float> w = random_tensor<float>({13, 10}, 1);
  Tensor<float> b = random_tensor<float>({10}, 2);
  Tensor<std::int64_t> count = random_tensor<std::int64_t>({}, 3);

  std::string commit(const std::string& dir, std::int64_t step, int keep) const {
    CheckpointWriter w(dir, keep);
    const auto wx = device_put(w_for(step), NamedSharding(mesh_ab(), P("a", "b")));
    w.add("w", wx);                                              // by reference: alive until commit
    w.add("b", device_put(b, NamedSharding(mesh_a(), P("a"))));  // a temporary, moved in
    w.add("count", device_put(count, NamedSharding(mesh_a(), P())));
    w.set("epoch", std::to_string(step / 10));
    w.set("note", "tab\there, \"quotes\", unicode \xc3\xa9");
    return w.commit(step);
  }
  /// Weights that differ per step, so a load shows which step it came from.
  Tensor<float> w_for(std::int64_t step) const {
    Tensor<float> t = w;
    t.flat(0) = static_cast<float>(step);
    return t;
  }
};

SHARD_MPI_TEST(Checkpoint, CommitKeepsTheNewestAndLoadsOnAnotherMesh) {
  TempDir dir("shard-test-ckpt-", false);
  const Model model;
  EXPECT_EQ(latest_checkpoint(dir.str()), "");  // no directory yet
  const std::string p1 = model.commit(dir.str(), 1, 1);
  EXPECT_EQ(p1, (dir.path() / "step-00000001").string());
  const std::string p2 = model.commit(dir.str(), 20, 1);
  EXPECT_EQ(listing(dir.path()), std::vector<std::string>{"step-00000020"});
  EXPECT_EQ(listing(p2), (std::vector<std::string>{"b.npy", "count.npy", "manifest.json", "w.npy"}));
  EXPECT_EQ(latest_checkpoint(dir.str()), p2);

  const CheckpointManifest m = read_manifest(p2);
  EXPECT_EQ(m.step, 20);
  EXPECT_EQ(m.metadata.at("epoch"), "2");
  EXPECT_EQ(m.metadata.at("note"), "tab\there, \"quotes\", unicode \xc3\xa9");
  ASSERT_EQ(m.arrays.size(), 3u);
  const CheckpointEntry& w = m.entry("w");
  EXPECT_EQ(w.file, "w.npy");
  EXPECT_EQ(w.dtype, "float32");
  EXPECT_EQ(w.shape, (Shape{13, 10}));
  EXPECT_EQ(w.spec, "P('a', 'b')");
  EXPECT_EQ(w.mesh_shape, mesh_ab().shape());
  EXPECT_EQ(w.mesh_axes, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(w.checksum, io::checksum(device_put(model.w_for(20), NamedSharding(mesh_a(), P("a")))));
  EXPECT_EQ(m.entry("count").shape, Shape{});
  EXPECT_EQ(m.entry("count").spec, "P()");

  // Onto other meshes and specs than the ones saved from.
  EXPECT_TRUE(equals_host(load_checkpoint_array<float>(p2, m, "w", NamedSharding(mesh_a(), P(None, "a"))),
                          model.w_for(20)));
  EXPECT_TRUE(equals_host(load_checkpoint_array<float>(p2, m, "b", NamedSharding(mesh_ab(), P())), model.b));
  EXPECT_TRUE(equals_host(load_checkpoint_array<std::int64_t>(p2, m, "count", NamedSharding(mesh_ab(), P())),
                          model.count));
}

SHARD_MPI_TEST(Checkpoint, RetentionStaleTempDirsAndSameStepAgain) {
  TempDir dir("shard-test-ckpt-", false);
  const Model model;
  model.commit(dir.str(), 5, 2);
  on_root([&] { fs::create_directories(dir.path() / ".tmp-step-9-crashed" / "junk"); });
  model.commit(dir.str(), 7, 2);
  model.commit(dir.str(), 6, 2);  // an older step than the newest: kept as the one just written
  EXPECT_EQ(listing(dir.path()), (std::vector<std::string>{"step-00000006", "step-00000007"}));
  EXPECT_EQ(latest_checkpoint(dir.str()), (dir.path() / "step-00000007").string());
  // Committing a step that exists replaces it whole.
  Model other;
  other.w = random_tensor<float>({13, 10}, 99);
  const std::string p = other.commit(dir.str(), 7, 2);
  EXPECT_EQ(listing(dir.path()), (std::vector<std::string>{"step-00000006", "step-00000007"}));
  EXPECT_TRUE(
      equals_host(load_checkpoint_array<float>(p, read_manifest(p), "w", NamedSharding(mesh_a(), P("a"))),
                  other.w_for(7)));
}

SHARD_MPI_TEST(Checkpoint, SymlinkedStepsAndASecondWriterAreRefused) {
  TempDir dir("shard-test-ckpt-", false);
  TempDir elsewhere("shard-test-ckpt-elsewhere-", false);
  const Model model;
  model.commit(dir.str(), 3, 2);
  model.commit(elsewhere.str(), 9, 2);
  // A step directory that is a symlink (to a real checkpoint elsewhere) is never followed.
  on_root([&] {
    fs::create_directory_symlink(elsewhere.path() / "step-00000009", dir.path() / "step-00000009");
  });
  expect_error<IoError>([&] { latest_checkpoint(dir.str()); }, {"step-00000009", "symlink"});
  on_root([&] { fs::remove(dir.path() / "step-00000009"); });
  EXPECT_EQ(latest_checkpoint(dir.str()), (dir.path() / "step-00000003").string());
  // A live writer's lock (pid 1 on this host is alive): the commit fails on every rank naming
  // it, and the checkpoints already there stay.
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  auto write_lock = [&](long pid) {  // as a writer leaves it: a symlink to "host pid"
    on_root([&] {
      fs::remove(dir.path() / ".commit.lock");
      fs::create_symlink(std::string(host) + " " + std::to_string(pid), dir.path() / ".commit.lock");
    });
  };
  write_lock(1);
  expect_error<IoError>([&] { model.commit(dir.str(), 4, 2); }, {"another writer", " 1)", ".commit.lock"});
  EXPECT_EQ(latest_checkpoint(dir.str()), (dir.path() / "step-00000003").string());
  // A lock whose process is gone (a crashed job on this host) is taken over, then released.
  write_lock(999999999);
  model.commit(dir.str(), 4, 2);
  EXPECT_EQ(latest_checkpoint(dir.str()), (dir.path() / "step-00000004").string());
  EXPECT_EQ(listing(dir.path()), (std::vector<std::string>{"step-00000003", "step-00000004"}));
}

SHARD_MPI_TEST(Checkpoint, BadNamesAndArguments) {
  TempDir dir("shard-test-ckpt-", false);
  CheckpointWriter w(dir.str(), 1);
  const auto x = zeros<float>({4}, NamedSharding(mesh_a(), P()));
  for (const char* bad : {"../w", "/etc/passwd", ".hidden", "a/b", "", "w x"})
    expect_error<ValueError>([&] { w.add(bad, x); }, {"plain file name"});
  w.add("w.1_a-b", x);
  expect_error<ValueError>([&] { w.add("w.1_a-b", x); }, {"already added"});
  expect_error<ValueError>([&] { CheckpointWriter(dir.str(), 0); }, {"keep must be at least 1"});
  expect_error<ValueError>([&] { w.commit(-1); }, {"step must be >= 0"});
  const std::string p = w.commit(3);
  const auto m = read_manifest(p);
  expect_error<ValueError>([&] { m.entry("v"); }, {"no array 'v'", "'w.1_a-b'"});
  expect_error<ValueError>([&] { load_checkpoint_array<double>(p, m, "w.1_a-b", x.sharding()); },
                           {"'w.1_a-b'", "float32", "not float64"});
  // A directory that cannot be created (a file is in the way): IoError everywhere.
  on_root([&] { write_file(dir.path() / "file", "x"); });
  CheckpointWriter blocked((dir.path() / "file" / "ckpt").string(), 1);
  expect_error<IoError>([&] { blocked.commit(1); }, {"cannot create directory"});
}

/// Rewrites the manifest of `ckpt` on rank 0 by replacing `from` with `to`.
void edit_manifest(const std::string& ckpt, const std::string& from, const std::string& to) {
  on_root([&] {
    std::string text = read_file(fs::path(ckpt) / "manifest.json");
    const auto at = text.find(from);
    ASSERT_NE(at, std::string::npos) << text;
    write_file(fs::path(ckpt) / "manifest.json", text.replace(at, from.size(), to));
  });
}

SHARD_MPI_TEST(Checkpoint, HostileOrCorruptCheckpointsAreRejected) {
  TempDir dir("shard-test-ckpt-", false);
  const Model model;
  const std::string p = model.commit(dir.str(), 4, 1);
  const std::string original = read_file(fs::path(p) / "manifest.json");
  const NamedSharding s(mesh_ab(), P("b", "a"));

  for (const char* path : {"../x.npy", "/etc/passwd", "..", "sub/w.npy"}) {
    edit_manifest(p, "\"file\": \"w.npy\"", std::string("\"file\": \"") + path + "\"");
    expect_error<ValueError>([&] { read_manifest(p); },
                             {"manifest names a path outside its directory", path});
    on_root([&] { write_file(fs::path(p) / "manifest.json", original); });
  }
  edit_manifest(p, "\"dtype\": \"float32\", ", "");
  expect_error<ValueError>([&] { read_manifest(p); }, {"manifest.json", "lacks the field 'dtype'"});
  on_root([&] { write_file(fs::path(p) / "manifest.json", original); });
  for (const std::string dtype : {"bool", "float16"}) {  // checkpoints hold the numeric dtypes
    edit_manifest(p, "\"dtype\": \"float32\"", "\"dtype\": \"" + dtype + "\"");
    expect_error<ValueError>([&] { read_manifest(p); }, {"manifest.json", "unknown dtype '" + dtype + "'"});
    on_root([&] { write_file(fs::path(p) / "manifest.json", original); });
  }
  edit_manifest(p, "\"step\": 4,", "\"step\": 4");
  expect_error<ValueError>([&] { read_manifest(p); }, {"manifest.json", "not valid JSON", "line 5"});
  on_root([&] { write_file(fs::path(p) / "manifest.json", original); });
  expect_error<IoError>([&] { read_manifest(dir.str()); }, {"cannot open", "manifest.json"});

  // A manifest whose shape disagrees with the file: ShapeError naming the array.
  edit_manifest(p, "\"shape\": [13, 10]", "\"shape\": [10, 13]");
  expect_error<ShapeError>([&] { load_checkpoint_array<float>(p, read_manifest(p), "w", s); },
                           {"'w'", "(13, 10)", "records (10, 13)"});
  on_root([&] { write_file(fs::path(p) / "manifest.json", original); });

  // One flipped bit in the data: the checksum catches it on every rank.
  const CheckpointManifest m = read_manifest(p);
  on_root([&] {
    std::string bytes = read_file(fs::path(p) / "w.npy");
    bytes[128 + 4 * 57 + 1] ^= 0x10;
    write_file(fs::path(p) / "w.npy", bytes);
  });
  expect_error<IoError>([&] { load_checkpoint_array<float>(p, m, "w", s); },
                        {"checksum mismatch", "'w'", "w.npy"});
  // The other arrays of that checkpoint still load.
  EXPECT_TRUE(
      equals_host(load_checkpoint_array<float>(p, m, "b", NamedSharding(mesh_ab(), P("a"))), model.b));
}

/// A commit that fails while writing (a file size limit stands in for a full disk) raises
/// IoError on every rank, leaves the previous checkpoint intact and no temp directory.
SHARD_MPI_TEST(Checkpoint, FailedCommitKeepsThePreviousCheckpoint) {
  TempDir dir("shard-test-ckpt-", false);
  const Model model;
  const std::string p1 = model.commit(dir.str(), 1, 1);
  {
    rlimit saved{};
    getrlimit(RLIMIT_FSIZE, &saved);
    auto* old = std::signal(SIGXFSZ, SIG_IGN);
    rlimit lim = saved;
    lim.rlim_cur = 256;  // w.npy needs 128 + 520 bytes
    setrlimit(RLIMIT_FSIZE, &lim);
    expect_error<IoError>([&] { model.commit(dir.str(), 2, 1); }, {"w.npy"});
    setrlimit(RLIMIT_FSIZE, &saved);
    std::signal(SIGXFSZ, old);
  }
  EXPECT_EQ(listing(dir.path()), std::vector<std::string>{"step-00000001"});
  EXPECT_EQ(latest_checkpoint(dir.str()), p1);
  const auto m = read_manifest(p1);
  EXPECT_TRUE(equals_host(load_checkpoint_array<float>(p1, m, "w", NamedSharding(mesh_ab(), P("a"))),
                          model.w_for(1)));
}

/// Collective: rank 0's string on every rank.
std::string bcast_string(std::string s) {
  int n = static_cast<int>(s.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, runtime().world().get());
  s.resize(static_cast<std::size_t>(n));
  MPI_Bcast(s.data(), n, MPI_CHAR, 0, runtime().world().get());
  return s;
}

/// Collective: true on every rank if `b` is true on every rank.
bool all_ranks(bool b) {
  int v = b ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MIN, runtime().world().get());
  return v == 1;
}

/// The error every rank raised from `fn` (checked to be the same kind on every rank, with
/// this rank's prefix), or "" if every rank returned normally.
template <typename F>
std::string error_on_every_rank(F&& fn) {
  std::string what;
  try {
    fn();
  } catch (const Error& e) {
    what = e.what();
    EXPECT_NE(what.find("[rank " + std::to_string(runtime().process_index()) + "]"), std::string::npos)
        << what;
  }
  EXPECT_EQ(all_ranks(what.empty()), !all_ranks(!what.empty()))
      << "some ranks raised and others did not: '" << what << "'";
  return what;
}

/// Each way a checkpoint's .npy files can be damaged is caught when loading, with an error
/// on every rank that names the file; the undamaged arrays of the checkpoint still load.
SHARD_MPI_TEST(Checkpoint, TruncatedMissingAndFlippedFilesAreRejected) {
  TempDir dir("shard-test-ckpt-", false);
  const Model model;
  const std::string p = model.commit(dir.str(), 4, 1);
  const CheckpointManifest m = read_manifest(p);
  const NamedSharding s(mesh_ab(), P("b", "a"));
  const fs::path w = fs::path(p) / "w.npy";
  // 128-byte header + 13 x 10 float32; read by rank 0 before any rank changes the file.
  const std::string original = bcast_string(runtime().process_index() == 0 ? read_file(w) : "");
  auto restore = [&] { on_root([&] { write_file(w, original); }); };
  auto with_bytes = [&](const std::string& bytes) { on_root([&] { write_file(w, bytes); }); };

  // Truncated in the data, in the header, to nothing.
  with_bytes(original.substr(0, original.size() - 1));
  expect_error<IoError>([&] { load_checkpoint_array<float>(p, m, "w", s); },
                        {"w.npy", "is truncated", "(13, 10) float32 (520 bytes after a 128-byte header)",
                         "the file has 647 bytes"});
  with_bytes(original.substr(0, 60));
  expect_error<IoError>([&] { load_checkpoint_array<float>(p, m, "w", s); },
                        {"w.npy", "not a valid .npy file", "runs past the end of the file"});
  with_bytes("");
  expect_error<IoError>([&] { load_checkpoint_array<float>(p, m, "w", s); },
                        {"w.npy", "not a valid .npy file", "magic"});

  // One flipped byte in the data: first, middle and last element.
  for (std::size_t at : {std::size_t{128}, std::size_t{128 + 4 * 65 + 2}, original.size() - 1}) {
    std::string bytes = original;
    bytes[at] = static_cast<char>(bytes[at] ^ 0xff);
    with_bytes(bytes);
    expect_error<IoError>(
        [&] { load_checkpoint_array<float>(p, m, "w", s); },
        {"checksum mismatch for array 'w'", "w.npy", "the file is corrupt or was modified"});
  }
  // A byte appended: the data is intact, so it loads (as numpy does).
  with_bytes(original + "x");
  EXPECT_TRUE(equals_host(load_checkpoint_array<float>(p, m, "w", s), model.w_for(4)));

  // One flipped byte in the header, some by hand with the message each gives...
  auto flipped = [&](std::size_t at, char to) {
    std::string bytes = original;
    bytes[at] = to;
    return bytes;
  };
  const std::size_t descr = original.find("<f4") + 2, dim = original.find("(13, 10)") + 1;
  with_bytes(flipped(0, 'X'));
  expect_error<IoError>([&] { load_checkpoint_array<float>(p, m, "w", s); }, {"w.npy", "magic \\x93NUMPY"});
  with_bytes(flipped(6, '\x07'));
  expect_error<IoError>([&] { load_checkpoint_array<float>(p, m, "w", s); },
                        {"w.npy", "unsupported format version 7.0"});
  with_bytes(flipped(descr, '8'));
  expect_error<IoError>([&] { load_checkpoint_array<float>(p, m, "w", s); },
                        {"w.npy", "holds '<f8' (float64) data, not '<f4' (float32)"});
  with_bytes(flipped(dim, '2'));  // (23, 10): more than the file holds
  expect_error<IoError>([&] { load_checkpoint_array<float>(p, m, "w", s); }, {"w.npy", "is truncated"});
  with_bytes(flipped(dim + 1, '2'));  // (12, 10): fits the file, not the manifest
  expect_error<ShapeError>([&] { load_checkpoint_array<float>(p, m, "w", s); },
                           {"'w'", "w.npy", "has shape (12, 10)", "records (13, 10)"});
  with_bytes(flipped(original.size() - 520 - 2, 'x'));  // the padding before the final '\n'
  expect_error<IoError>([&] { load_checkpoint_array<float>(p, m, "w", s); },
                        {"w.npy", "text after the closing '}'"});
  // ...then every byte of the header, each flipped two ways: the load fails on every rank
  // with the file's name, or (a change numpy's parser ignores too) gives the saved data.
  int rejected = 0;
  for (std::size_t at = 0; at < 128; ++at)
    for (unsigned char mask : {0x01, 0xff}) {
      with_bytes(flipped(at, static_cast<char>(original[at] ^ mask)));
      std::optional<ShardedArray<float>> x;
      const std::string what = error_on_every_rank([&] { x = load_checkpoint_array<float>(p, m, "w", s); });
      if (!what.empty()) {
        ++rejected;
        EXPECT_NE(what.find("w.npy"), std::string::npos) << "byte " << at << ": " << what;
      } else {
        EXPECT_TRUE(x && equals_host(*x, model.w_for(4))) << "byte " << at << " ^ " << int(mask);
      }
    }
  EXPECT_GE(rejected, 200);
  restore();

  // A missing file.
  on_root([&] { fs::remove(fs::path(p) / "b.npy"); });
  expect_error<IoError>([&] { load_checkpoint_array<float>(p, m, "b", NamedSharding(mesh_a(), P("a"))); },
                        {p, "lacks 'b.npy', the file of array 'b'", "incomplete or was modified"});
  // The undamaged arrays still load.
  EXPECT_TRUE(equals_host(load_checkpoint_array<float>(p, m, "w", s), model.w_for(4)));
  EXPECT_TRUE(equals_host(load_checkpoint_array<std::int64_t>(p, m, "count", NamedSharding(mesh_ab(), P())),
                          model.count));
}

/// Manifests that lead out of the checkpoint directory, or whose arrays do not match the
/// files or the model loading them: the same error on every rank, before anything is read.
SHARD_MPI_TEST(Checkpoint, HostileManifestsAndModelMismatches) {
  TempDir dir("shard-test-ckpt-", false);
  const Model model;
  const std::string p = model.commit(dir.str(), 4, 1);
  const std::string original =
      bcast_string(runtime().process_index() == 0 ? read_file(fs::path(p) / "manifest.json") : "");
  const CheckpointManifest m = read_manifest(p);
  const NamedSharding s(mesh_ab(), P("a", "b"));

  // Paths out of the directory in the manifest's "file" and "name" fields...
  for (const char* path :
       {"../step-00000004/w.npy", "/etc/passwd", "./w.npy", "w.npy/..", "..\\u002fw.npy"}) {
    edit_manifest(p, "\"file\": \"w.npy\"", std::string("\"file\": \"") + path + "\"");
    expect_error<ValueError>([&] { read_manifest(p); }, {"manifest names a path outside its directory"});
    on_root([&] { write_file(fs::path(p) / "manifest.json", original); });
  }
  edit_manifest(p, "\"name\": \"w\"", "\"name\": \"../w\"");
  expect_error<ValueError>([&] { read_manifest(p); }, {"array name '../w' is not a plain name"});
  on_root([&] { write_file(fs::path(p) / "manifest.json", original); });
  // ...and in a manifest built in memory, which read_manifest did not check.
  for (const char* path : {"../w.npy", "/etc/passwd", "sub/w.npy"}) {
    CheckpointManifest hostile = m;
    for (auto& e : hostile.arrays)
      if (e.name == "w") e.file = path;
    expect_error<ValueError>([&] { load_checkpoint_array<float>(p, hostile, "w", s); },
                             {"manifest names a path outside its directory", path});
  }
  // A file of the checkpoint that is a symlink to a file outside it.
  on_root([&] {
    fs::rename(fs::path(p) / "w.npy", dir.path() / "outside.npy");
    fs::create_symlink(dir.path() / "outside.npy", fs::path(p) / "w.npy");
  });
  expect_error<ValueError>([&] { load_checkpoint_array<float>(p, m, "w", s); },
                           {"manifest names a path outside its directory", "w.npy", "is a symlink"});
  on_root([&] {
    fs::remove(fs::path(p) / "w.npy");
    fs::rename(dir.path() / "outside.npy", fs::path(p) / "w.npy");
  });

  // A checksum in the manifest that the file does not match.
  edit_manifest(p, "\"checksum\": \"0x", "\"checksum\": \"0x1");
  expect_error<ValueError>([&] { read_manifest(p); }, {"must be a hexadecimal checksum"});  // 17 digits
  on_root([&] { write_file(fs::path(p) / "manifest.json", original); });
  {
    CheckpointManifest other = m;
    for (auto& e : other.arrays)
      if (e.name == "w") e.checksum ^= 1;
    expect_error<IoError>([&] { load_checkpoint_array<float>(p, other, "w", s); },
                          {"checksum mismatch for array 'w'", "the manifest records"});
  }

  // The dtype: the model asks for another dtype than the manifest records; the manifest
  // records another dtype than the file holds.
  expect_error<ValueError>([&] { load_checkpoint_array<double>(p, m, "w", s); },
                           {"array 'w'", "is float32, not float64", "load it as float32"});
  expect_error<ValueError>([&] { load_checkpoint_array<std::int32_t>(p, m, "count", s); },
                           {"array 'count'", "is int64, not int32"});
  edit_manifest(p, "\"dtype\": \"float32\"", "\"dtype\": \"float64\"");
  expect_error<IoError>([&] { load_checkpoint_array<double>(p, read_manifest(p), "w", s); },
                        {"w.npy", "holds '<f4' (float32) data, not '<f8' (float64)"});
  on_root([&] { write_file(fs::path(p) / "manifest.json", original); });

  // The shape: the model expects another shape than the checkpoint has (checked before any
  // file is read); the manifest records another shape than the file holds.
  expect_error<ShapeError>(
      [&] {
        load_checkpoint_array<float>(p, m, "w", s, Shape{10, 13});
      },
      {"array 'w'", p, "has shape (13, 10) but the model expects (10, 13)"});
  expect_error<ShapeError>(
      [&] {
        load_checkpoint_array<float>(p, m, "b", s, Shape{10, 1});
      },
      {"array 'b'", "has shape (10,) but the model expects (10, 1)"});
  EXPECT_TRUE(equals_host(load_checkpoint_array<float>(p, m, "w", s, Shape{13, 10}), model.w_for(4)));
  edit_manifest(p, "\"shape\": [10]", "\"shape\": [10, 1]");
  expect_error<ShapeError>(
      [&] {
        load_checkpoint_array<float>(p, read_manifest(p), "b", NamedSharding(mesh_a(), P()), Shape{10, 1});
      },
      {"'b'", "b.npy", "has shape (10,)", "records (10, 1)"});
  on_root([&] { write_file(fs::path(p) / "manifest.json", original); });
  // An array the model needs that the checkpoint lacks.
  expect_error<ValueError>([&] { load_checkpoint_array<float>(p, m, "w2", s); },
                           {"no array 'w2'", "'w', 'b', 'count'"});
}

/// A tmpfs of `size` mounted over a fresh temp directory by rank 0 for the object's life
/// (the ranks of these tests share one host) and unmounted on every exit path: by the
/// destructor, and if rank 0 dies first (a crash, a ctest TIMEOUT kill) by a forked watchdog
/// that waits for rank 0's end of a pipe to close. usable() is the same on every rank: false,
/// with why(), unless this process may mount (root) and every rank sees the mount.
class TinyTmpfs {
 public:
  explicit TinyTmpfs(const std::string& size) : dir_("shard-test-tmpfs-", true) {
    std::string why;
    if (runtime().process_index() == 0) {
      if (::geteuid() != 0)
        why = "not running as root";
      else if (::mount("tmpfs", dir_.str().c_str(), "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                       ("size=" + size).c_str()) != 0)
        why = std::string("mount -t tmpfs failed: ") + std::strerror(errno);
      else
        mounted_ = true;
      if (mounted_) start_watchdog();
    }
    why_ = bcast_string(why);
    struct statfs st {};
    const bool sees = ::statfs(dir_.str().c_str(), &st) == 0 && st.f_type == TMPFS_MAGIC;
    if (why_.empty() && !all_ranks(sees)) why_ = "not every rank sees the tmpfs rank 0 mounted";
  }
  ~TinyTmpfs() {
    MPI_Barrier(runtime().world().get());
    if (mounted_ && ::umount2(dir_.str().c_str(), MNT_DETACH) != 0)
      std::fprintf(stderr, "TinyTmpfs: umount %s: %s\n", dir_.str().c_str(), std::strerror(errno));
    if (guard_fd_ >= 0) ::close(guard_fd_);  // the watchdog wakes, finds nothing to do, exits
    if (watchdog_ > 0) ::waitpid(watchdog_, nullptr, 0);
  }  // then dir_ removes the (now empty) mount point
  TinyTmpfs(const TinyTmpfs&) = delete;
  TinyTmpfs& operator=(const TinyTmpfs&) = delete;

  bool usable() const { return why_.empty(); }
  const std::string& why() const { return why_; }
  std::string file(const std::string& name) const { return dir_.file(name); }
  /// Bytes still free (rank 0's view, on every rank).
  std::int64_t free_bytes() const {
    struct statvfs st {};
    ::statvfs(dir_.str().c_str(), &st);
    std::int64_t n = static_cast<std::int64_t>(st.f_bavail) * static_cast<std::int64_t>(st.f_frsize);
    MPI_Bcast(&n, 1, MPI_INT64_T, 0, runtime().world().get());
    return n;
  }

 private:
  /// A child that blocks reading a pipe whose only writer is this process; when this process
  /// ends, however it ends, the read returns and the child unmounts. It calls only
  /// async-signal-safe functions (the parent has MPI's threads).
  void start_watchdog() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return;
    const std::string path = dir_.str();
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[1]);
      char c;
      while (::read(fds[0], &c, 1) < 0 && errno == EINTR) {
      }
      ::umount2(path.c_str(), MNT_DETACH);
      ::rmdir(path.c_str());
      ::_exit(0);
    }
    ::close(fds[0]);
    if (pid < 0) {
      ::close(fds[1]);
      return;
    }
    watchdog_ = pid;
    guard_fd_ = fds[1];
  }

  TempDir dir_;  // constructed before the mount, destroyed after the unmount
  bool mounted_ = false;
  std::string why_;
  pid_t watchdog_ = -1;
  int guard_fd_ = -1;
};

/// A real full disk: commits into a 256 KiB tmpfs that do not fit (the data, only the
/// manifest, not a byte) fail with an IoError on every rank, leave no temp directory and
/// keep the previous checkpoint loadable and the newest; once space is free again, commits
/// work.
SHARD_MPI_TEST(Checkpoint, FullDiskKeepsThePreviousCheckpoint) {
  TinyTmpfs disk("256k");
  if (!disk.usable()) GTEST_SKIP() << "needs to mount a tmpfs (root, one host): " << disk.why();
  const std::string dir = disk.file("ckpt");
  const std::string filler = disk.file("filler");
  const NamedSharding s(mesh_ab(), P("a", "b"));
  const Tensor<float> first = random_tensor<float>({64, 100}, 7);  // 25 KiB
  std::string p1;
  {
    CheckpointWriter w(dir, 2);
    w.add("w", device_put(first, s));
    w.set("epoch", "1");
    p1 = w.commit(1);
  }
  auto first_still_loads = [&](const char* after) {
    SCOPED_TRACE(after);
    EXPECT_EQ(listing(dir), std::vector<std::string>{"step-00000001"});
    EXPECT_EQ(latest_checkpoint(dir), p1);
    const CheckpointManifest m = read_manifest(p1);
    EXPECT_EQ(m.metadata.at("epoch"), "1");
    EXPECT_TRUE(
        equals_host(load_checkpoint_array<float>(p1, m, "w", NamedSharding(mesh_a(), P(None, "a"))), first));
  };

  // The data does not fit: two 156 KiB arrays.
  {
    CheckpointWriter w(dir, 2);
    w.add("w", device_put(random_tensor<float>({400, 100}, 8), s));
    w.add("v", device_put(random_tensor<float>({400, 100}, 9), s));
    w.set("epoch", "2");
    expect_error<IoError>([&] { w.commit(2); }, {".npy", "step 2", "No space left on device"});
  }
  first_still_loads("after data that does not fit");

  // The data fits exactly, the manifest does not: fill all but two pages, write 8 KiB.
  const std::int64_t page = 4096;
  const std::int64_t free = disk.free_bytes();  // collective: not inside on_root
  on_root([&] { write_file(filler, std::string(static_cast<std::size_t>(free - 2 * page), 'f')); });
  ASSERT_EQ(disk.free_bytes(), 2 * page);
  {
    const std::int64_t n = (2 * page - static_cast<std::int64_t>(io::npy_header("<f4", {2000}).size())) / 4;
    CheckpointWriter w(dir, 2);
    w.add("w", device_put(random_tensor<float>({n}, 10), NamedSharding(mesh_a(), P("a"))));
    expect_error<IoError>([&] { w.commit(2); }, {"manifest.json", "No space left on device", "step 2"});
  }
  EXPECT_EQ(disk.free_bytes(), 2 * page);  // the temp directory is gone
  first_still_loads("after a manifest that does not fit");

  // Not one byte free.
  on_root([&] { std::ofstream(filler, std::ios::binary | std::ios::app) << std::string(2 * page, 'f'); });
  ASSERT_EQ(disk.free_bytes(), 0);
  {
    CheckpointWriter w(dir, 2);
    w.add("w", device_put(first, s));
    expect_error<IoError>([&] { w.commit(2); }, {"w.npy", "step 2", "No space left on device"});
  }
  first_still_loads("on a full disk");

  // Space again: the next commit works and becomes the newest.
  on_root([&] { fs::remove(filler); });
  CheckpointWriter w(dir, 2);
  w.add("w", device_put(first, s));
  const std::string p2 = w.commit(2);
  EXPECT_EQ(listing(dir), (std::vector<std::string>{"step-00000001", "step-00000002"}));
  EXPECT_EQ(latest_checkpoint(dir), p2);
  EXPECT_TRUE(equals_host(load_checkpoint_array<float>(p2, read_manifest(p2), "w", s), first));
}

/// Every number in a checkpoint's manifest (steps, shapes, mesh sizes, the optimizer's step count
/// in the metadata), in valid JSON, set in turn to values out of range (negative, zero, past
/// int32 and int64, not an integer): each load either raises a shard::Error on every rank or
/// gives exactly the arrays the files hold and the step count the manifest says; never a crash,
/// never other values. The counts are printed (docs/reliability.md lists them).
SHARD_MPI_TEST(Checkpoint, EveryNumberOfAManifestOutOfRange) {
  TempDir dir("shard-test-ckpt-", false);
  const NamedSharding ws(mesh_ab(), P("a", "b")), bs(mesh_a(), P("a"));
  const Tensor<float> wh = random_tensor<float>({13, 10}, 61), bh = random_tensor<float>({10}, 62);
  std::vector<ShardedArray<float>> params{device_put(wh, ws), device_put(bh, bs)};
  const auto opt = optim::adam(1e-2);
  optim::State<float> st = opt.init(params);
  std::vector<ShardedArray<float>> grads{device_put(random_tensor<float>({13, 10}, 63), ws),
                                         device_put(random_tensor<float>({10}, 64), bs)};
  opt.update(params, grads, st);
  opt.update(params, grads, st);
  std::string p;
  {
    CheckpointWriter w(dir.str(), 1);
    w.add("w", params[0]);
    w.add("b", params[1]);
    st.save(w);
    p = w.commit(4);
  }
  const std::string original =
      bcast_string(runtime().process_index() == 0 ? read_file(fs::path(p) / "manifest.json") : "");
  const Tensor<float> w_want = params[0].to_host(), b_want = params[1].to_host();
  std::map<std::string, Tensor<float>> state_want;
  for (const auto& [name, a] : st.arrays) state_want[name] = a.to_host();

  // The numbers outside strings, and the strings that hold only an integer (the metadata).
  std::vector<std::pair<std::size_t, std::size_t>> tokens;  // offset, length
  bool in_string = false;
  for (std::size_t i = 0; i < original.size(); ++i) {
    const char c = original[i];
    if (c == '\\' && in_string) {
      ++i;
      continue;
    }
    if (c == '"') {
      if (!in_string) {
        std::size_t e = i + 1;
        while (e < original.size() && std::isdigit(static_cast<unsigned char>(original[e]))) ++e;
        if (e > i + 1 && e < original.size() && original[e] == '"') tokens.emplace_back(i + 1, e - i - 1);
      }
      in_string = !in_string;
      continue;
    }
    if (!in_string && (std::isdigit(static_cast<unsigned char>(c)) || c == '-')) {
      std::size_t e = i + 1;
      while (e < original.size() &&
             (std::isdigit(static_cast<unsigned char>(original[e])) || original[e] == '.' ||
              original[e] == 'e' || original[e] == 'E' || original[e] == '+' || original[e] == '-'))
        ++e;
      tokens.emplace_back(i, e - i);
      i = e - 1;
    }
  }
  ASSERT_GE(tokens.size(), 8u) << original;
  const std::vector<std::string> values{"-1",
                                        "0",
                                        "2147483648",
                                        "-9223372036854775808",
                                        "9223372036854775807",
                                        "9223372036854775808",
                                        "99999999999999999999999",
                                        "1.5",
                                        "1e308"};
  int refused = 0, same = 0, cases = 0;
  for (const auto& [at, len] : tokens) {
    const std::string context = original.substr(at > 40 ? at - 40 : 0, std::min<std::size_t>(at, 40) + len);
    const std::string key = "\"opt.step\": \"";
    const bool is_step_count = at >= key.size() && original.compare(at - key.size(), key.size(), key) == 0;
    for (const std::string& v : values) {
      ++cases;
      std::string text = original;
      text.replace(at, len, v);
      on_root([&] { write_file(fs::path(p) / "manifest.json", text); });
      bool threw = false;
      std::string wrong;
      try {
        const CheckpointManifest m = read_manifest(p);
        const auto w2 = load_checkpoint_array<float>(p, m, "w", ws, wh.shape());
        const auto b2 = load_checkpoint_array<float>(p, m, "b", bs, bh.shape());
        optim::State<float> st2 = opt.init(params);
        st2.load(p, m);
        if (!equals_host(w2, w_want)) wrong += " w";
        if (!equals_host(b2, b_want)) wrong += " b";
        for (const auto& [name, a] : st2.arrays)
          if (!equals_host(a, state_want.at(name))) wrong += " state " + name;
        const std::int64_t want_step = is_step_count ? std::stoll(v) : st.step.item();
        if (st2.step.item() != want_step) wrong += " step " + std::to_string(st2.step.item());
      } catch (const Error&) {
        threw = true;
      }
      EXPECT_TRUE(same_on_every_rank(threw))
          << "some ranks raised, some did not: '" << context << "' -> " << v;
      EXPECT_EQ(wrong, "") << "loaded other values:" << wrong << " after '" << context << "' -> " << v;
      (threw ? refused : same) += 1;
    }
  }
  on_root([&] { write_file(fs::path(p) / "manifest.json", original); });
  if (runtime().process_index() == 0)
    std::printf(
        "[ manifest ] %zu numbers x %zu values: %d cases, %d refused on every rank, %d loaded the same "
        "values\n",
        tokens.size(), values.size(), cases, refused, same);
}

/// What an adversarial pass found the manifest reader let through, now refused on every rank:
/// a key given twice (parsers differ on which wins), numbers JSON does not allow (leading zeros),
/// a spec longer than the shape or naming an axis the mesh lacks, mesh axes and shape of other
/// lengths, a shape past 2^60 elements, control characters in names and keys (printed escaped);
/// and ranks that ask for different checkpoints or arrays meet a mismatch at the call.
SHARD_MPI_TEST(Checkpoint, InconsistentManifestsAndRanksAskingForOthers) {
  TempDir dir("shard-test-ckpt-", false);
  const Model model;
  const std::string p = model.commit(dir.str(), 4, 1);
  const std::string original =
      bcast_string(runtime().process_index() == 0 ? read_file(fs::path(p) / "manifest.json") : "");
  auto refused = [&](const std::string& from, const std::string& to, std::vector<std::string> needles) {
    edit_manifest(p, from, to);
    expect_error<ValueError>([&] { (void)read_manifest(p); }, std::move(needles));
    on_root([&] { write_file(fs::path(p) / "manifest.json", original); });
  };
  refused("\"step\": 4,", "\"step\": 4, \"step\": 5,", {"the key 'step' is given twice"});
  refused("\"step\": 4", "\"step\": 0004", {"'0004' is not a JSON number"});
  refused("\"spec\": \"P('a', 'b')\"", "\"spec\": \"P('a', 'b', None)\"",
          {"has more entries than its 2 dims"});
  refused("\"spec\": \"P('a', 'b')\"", "\"spec\": \"P('zz', None)\"", {"names axis 'zz'"});
  refused("\"mesh_axes\": [\"a\", \"b\"]", "\"mesh_axes\": [\"a\"]", {"1 mesh axes but a mesh shape of 2"});
  refused("\"mesh_axes\": [\"a\", \"b\"]", "\"mesh_axes\": [\"a\", \"a\"]", {"distinct non-empty names"});
  refused("\"shape\": [13, 10]", "\"shape\": [4611686018427387904, 4]", {"more than 2^60 elements"});
  refused("\"name\": \"w\"", "\"name\": \"w\\u0000x\"", {"array name 'w\\x00x' is not a plain name"});
  refused("\"epoch\":", "\"ep\\u001boch\":", {"metadata key 'ep\\x1boch'", "control characters"});
  if (runtime().process_count() < 2) return;
  // Rank 1 asks for another directory, another checkpoint, another array: a mismatch at the call.
  TempDir other("shard-test-ckpt-", false);
  const std::string q = model.commit(other.str(), 6, 1);
  const bool one = runtime().process_index() == 1;
  expect_error<CollectiveMismatchError>([&] { (void)latest_checkpoint(one ? other.str() : dir.str()); },
                                        {"collective mismatch", "listing the steps of"});
  expect_error<CollectiveMismatchError>([&] { (void)read_manifest(one ? q : p); },
                                        {"collective mismatch", "reading the manifest of"});
  const CheckpointManifest m = read_manifest(p);
  const NamedSharding s(mesh_ab(), P("a", "b"));
  expect_error<CollectiveMismatchError>(
      [&] { (void)load_checkpoint_array<float>(p, m, one ? "b" : "w", NamedSharding(mesh_a(), P())); },
      {"collective mismatch", "the entry of array 'w'", "the entry of array 'b'"});
  EXPECT_TRUE(equals_host(load_checkpoint_array<float>(p, m, "w", s), model.w_for(4)));  // and then it works
}

}  // namespace
}  // namespace shard::testing
