// Checkpoints: atomic commits with retention, manifests that round-trip, loads onto other
// meshes, and corrupt or hostile checkpoints rejected on every rank.

#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <iterator>

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
    t[0] = static_cast<float>(step);
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

}  // namespace
}  // namespace shard::testing
