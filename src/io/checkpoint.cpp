#include "shard/io/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <system_error>
#include <utility>

#include "io/json.hpp"
#include "io/manifest.hpp"
#include "shard/comm/detail/comm_verbs.hpp"
#include "shard/error.hpp"
#include "shard/io/io.hpp"
#include "shard/mpi/agree.hpp"
#include "shard/ops/ops.hpp"
#include "shard/runtime/runtime.hpp"

namespace shard {

namespace fs = std::filesystem;
using detail::json::quote;
using JsonValue = detail::json::Value;

namespace {

constexpr const char* kManifest = "manifest.json";
constexpr const char* kStepPrefix = "step-";
constexpr const char* kTmpPrefix = ".tmp-step-";

const mpi::Communicator& world() { return Runtime::current().world(); }

[[noreturn]] void fs_error(const std::string& doing, const fs::path& path, const std::string& why) {
  raise<IoError>("checkpoint: ", doing, " '", path.string(), "': ", why);
}

/// Writes `text` to `path` and fsyncs it, so the manifest is on storage before the rename.
void write_synced(const fs::path& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fs_error("cannot create", path, std::strerror(errno));
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      fs_error("cannot write", path, std::strerror(err));
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) fs_error("cannot flush", path, std::strerror(errno));
}

/// fsync of a directory makes the entries created or renamed in it durable.
void sync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fs_error("cannot open directory", dir, std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) fs_error("cannot flush directory", dir, std::strerror(err));
}

std::string step_dir_name(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%s%08lld", kStepPrefix, static_cast<long long>(step));
  return buf;
}

/// The step of a "step-<digits>" name, or -1.
std::int64_t step_of(const std::string& name) {
  const std::size_t p = std::strlen(kStepPrefix);
  if (name.size() <= p || name.compare(0, p, kStepPrefix) != 0) return -1;
  std::int64_t step = -1;
  const auto [end, ec] = std::from_chars(name.data() + p, name.data() + name.size(), step);
  return ec == std::errc() && end == name.data() + name.size() ? step : -1;
}

/// Finished checkpoints of `dir` (step, path), highest step first; none if `dir` is missing.
/// Only real directories: a symlinked step-* entry is never followed (it could lead anywhere,
/// and pruning would delete what it points to); `symlinks` receives those.
std::vector<std::pair<std::int64_t, fs::path>> list_steps(const fs::path& dir,
                                                          std::vector<fs::path>* symlinks = nullptr) {
  std::vector<std::pair<std::int64_t, fs::path>> out;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return out;
  fs::directory_iterator it(dir, ec), end;
  if (ec) fs_error("cannot list", dir, ec.message());
  for (; it != end; it.increment(ec)) {
    if (ec) fs_error("cannot list", dir, ec.message());
    const std::int64_t step = step_of(it->path().filename().string());
    if (step < 0) continue;
    const fs::file_status st = it->symlink_status(ec);
    if (st.type() == fs::file_type::symlink) {
      if (symlinks) symlinks->push_back(it->path());
    } else if (st.type() == fs::file_type::directory) {
      out.emplace_back(step, it->path());
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

/// Rank 0 sends a string to every rank.
std::string broadcast(std::string s) {
  const detail::CommOp op{"checkpoint", "the manifest from rank 0"};
  detail::check_transfer(op);
  std::int64_t n = static_cast<std::int64_t>(s.size());
  detail::broadcast(detail::world_group(), op, &n, 1, 0);
  s.resize(static_cast<std::size_t>(n));
  detail::broadcast(detail::world_group(), op, s.data(), detail::transfer_count(n, op), 0);
  return s;
}

/// Runs fn on rank 0 only and raises its error (if any) on every rank: a checked collective
/// (`what` names it and is compared across the ranks, paths included), so a rank that is
/// elsewhere, or asks for another directory or array, is met here, not in the raw agreement.
template <typename F>
void on_root(const std::string& what, F&& fn) {
  detail::check_transfer(detail::CommOp{"checkpoint", what});
  mpi::agreed(world(), [&] {
    if (world().rank() == 0) fn();
  });
}

std::string to_hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

template <typename V>
std::string json_list(const std::vector<V>& xs) {
  std::string s = "[";
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (i) s += ", ";
    if constexpr (std::is_arithmetic_v<V>)
      s += std::to_string(xs[i]);
    else
      s += quote(xs[i]);
  }
  return s + "]";
}

std::string manifest_json(const CheckpointManifest& m) {
  std::string s = "{\n  \"format\": \"" + std::string(detail::kManifestFormat) +
                  "\",\n  \"version\": 1,\n  \"step\": " + std::to_string(m.step) + ",\n  \"metadata\": {";
  const char* sep = "\n    ";
  for (const auto& [k, v] : m.metadata) s += std::exchange(sep, ",\n    ") + quote(k) + ": " + quote(v);
  s += m.metadata.empty() ? "},\n  \"arrays\": [" : "\n  },\n  \"arrays\": [";
  sep = "\n    ";
  for (const auto& e : m.arrays)
    s += std::string(std::exchange(sep, ",\n    ")) + "{\"name\": " + quote(e.name) +
         ", \"file\": " + quote(e.file) + ", \"dtype\": " + quote(e.dtype) +
         ", \"shape\": " + json_list(e.shape) + ", \"spec\": " + quote(e.spec) +
         ", \"mesh_shape\": " + json_list(e.mesh_shape) + ", \"mesh_axes\": " + json_list(e.mesh_axes) +
         ", \"checksum\": " + quote(to_hex(e.checksum)) + "}";
  return s + (m.arrays.empty() ? "]\n}\n" : "\n  ]\n}\n");
}

/// Field access with errors naming the manifest and the field.
/// Removes checkpoints beyond `keep` (by step, always keeping `current`) and temp
/// directories that crashed commits left behind.
void prune(const fs::path& dir, int keep, const fs::path& current) {
  std::error_code ec;
  std::vector<fs::path> stale;  // collected first: the directory is not changed while listed
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().filename().string().rfind(kTmpPrefix, 0) == 0) stale.push_back(it->path());
  if (ec) fs_error("checkpoint committed, but cannot list", dir, ec.message());
  int kept = 1;  // `current`
  for (const auto& [step, path] : list_steps(dir))
    if (path != current && kept++ >= keep) stale.push_back(path);
  for (const auto& path : stale)
    if (fs::remove_all(path, ec); ec) fs_error("checkpoint committed, but cannot remove", path, ec.message());
}

/// Whether process `pid` of this host has ended: no such process, or a zombie (a killed job's
/// rank whose parent went away before reaping it, as under a container's init).
bool process_gone(pid_t pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (!f) return false;
  char buf[512] = {};
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  const std::string stat(buf, n);
  const auto paren = stat.rfind(')');  // "pid (comm) S ...": the state follows the command name
  return paren != std::string::npos && paren + 2 < stat.size() &&
         (stat[paren + 2] == 'Z' || stat[paren + 2] == 'X');
}

/// One writer per checkpoint directory: rank 0 holds <dir>/.commit.lock while it commits, a
/// symlink whose target is "host pid" (made atomically, and stored in the inode: it needs no
/// free block on a full disk). Another live writer's lock is an error naming it (its temp
/// directories must not be swept); a lock whose process is gone on this host (a crashed job)
/// is taken over. Released on success and, by the destructor, on failure.
class CommitLock {
 public:
  CommitLock() = default;
  CommitLock(const CommitLock&) = delete;
  CommitLock& operator=(const CommitLock&) = delete;
  ~CommitLock() { release(); }

  void acquire(const fs::path& dir) {
    path_ = dir / ".commit.lock";
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    const std::string me = std::string(host) + " " + std::to_string(::getpid());
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (::symlink(me.c_str(), path_.c_str()) == 0) {
        held_ = true;
        return;
      }
      if (errno != EEXIST) fs_error("cannot create", path_, std::strerror(errno));
      char buf[300] = {};
      const ssize_t n = ::readlink(path_.c_str(), buf, sizeof buf - 1);
      const std::string owner = n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
      const auto space = owner.rfind(' ');
      const std::string owner_host = space == std::string::npos ? "" : owner.substr(0, space);
      const long pid = space == std::string::npos ? 0 : std::strtol(owner.c_str() + space + 1, nullptr, 10);
      const bool gone = owner_host == host && pid > 0 && process_gone(static_cast<pid_t>(pid));
      if (!gone)
        raise<IoError>("checkpoint: another writer (", owner.empty() ? std::string("unknown") : owner,
                       ") is committing to '", dir.string(),
                       "'; a checkpoint directory takes one writer at a time (",
                       "if no such job runs, remove '", path_.string(), "')");
      std::error_code ec;
      fs::remove(path_, ec);  // its process is gone: take the lock over
    }
    fs_error("cannot take over", path_, "it reappeared while being replaced");
  }
  void release() {
    if (!held_) return;
    std::error_code ec;
    fs::remove(path_, ec);
    held_ = false;
  }

 private:
  fs::path path_;
  bool held_ = false;
};

}  // namespace

template <typename T>
void CheckpointWriter::add_shared(const std::string& name, std::shared_ptr<const ShardedArray<T>> x) {
  if (!detail::is_plain_name(name, 251))
    raise<ValueError>("CheckpointWriter::add: array name '", name,
                      "' must be a plain file name (letters, digits, ",
                      "'_', '-', '.', not starting with '.', at most 251 characters)");
  for (const auto& p : pending_)
    if (p.entry.name == name)
      raise<ValueError>("CheckpointWriter::add: array '", name, "' was already added");
  CheckpointEntry e;
  e.name = name;
  e.file = name + ".npy";
  e.dtype = dtype_name<T>();
  e.shape = x->shape();
  e.spec = x->spec().to_string();
  e.mesh_shape = x->mesh().shape();
  e.mesh_axes = x->mesh().axis_names();
  pending_.push_back(
      Pending{std::move(e), [x](const std::string& path) { io::save_npy(*x, path); },
              [x] { return io::checksum(*x); },
              [x](const std::string& path) { return io::checksum(io::load_npy<T>(path, x->sharding())); }});
}

template <typename T>
void CheckpointWriter::add(const std::string& name, const ShardedArray<T>& x) {
  add_shared<T>(name, std::shared_ptr<const ShardedArray<T>>(&x, [](const ShardedArray<T>*) {}));
}

template <typename T>
void CheckpointWriter::add(const std::string& name, ShardedArray<T>&& x) {
  add_shared<T>(name, std::make_shared<const ShardedArray<T>>(std::move(x)));
}

void CheckpointWriter::set(const std::string& key, const std::string& value) {
  if (key.empty()) raise<ValueError>("CheckpointWriter::set: the metadata key is empty");
  metadata_[key] = value;
}

std::string CheckpointWriter::commit(std::int64_t step, shard::source_location where) {
  const detail::CallScope scope("CheckpointWriter::commit", where);
  // Every rank must commit the same checkpoint: the saves below are collective one array at a
  // time, so ranks that recorded different arrays (or steps) would wait in different collectives.
  // Agreed first, on every rank, before anything is created.
  {
    std::string plan = "step " + std::to_string(step) + "\ndirectory '" + directory_ + "'\nkeep " +
                       std::to_string(keep_) + "\n" + std::to_string(pending_.size()) + " arrays\n";
    for (const auto& p : pending_) {
      std::string mesh;
      for (std::size_t k = 0; k < p.entry.mesh_axes.size(); ++k)
        mesh += (k ? ", '" : "'") + p.entry.mesh_axes[k] + "': " + std::to_string(p.entry.mesh_shape[k]);
      plan += "array '" + p.entry.name + "' " + p.entry.dtype + to_string(p.entry.shape) + " " +
              p.entry.spec + " on Mesh(" + mesh + ")\n";
    }
    for (const auto& [k, v] : metadata_) plan += "metadata '" + k + "' = '" + v + "'\n";
    const std::string root = broadcast(plan);
    mpi::agreed(world(), [&] {
      if (plan == root) return;
      auto lines = [](const std::string& s) {
        std::vector<std::string> out;
        std::size_t at = 0;
        for (std::size_t nl; (nl = s.find('\n', at)) != std::string::npos; at = nl + 1)
          out.push_back(s.substr(at, nl - at));
        return out;
      };
      const auto mine = lines(plan), theirs = lines(root);
      std::size_t k = 0;
      while (k < mine.size() && k < theirs.size() && mine[k] == theirs[k]) ++k;
      raise<ValueError>(
          "CheckpointWriter::commit: this rank commits ",
          k < mine.size() ? mine[k] : std::string("nothing more"), " where rank 0 commits ",
          k < theirs.size() ? theirs[k] : std::string("nothing more"),
          ": every rank must add the same arrays and metadata (in the same order) and commit the "
          "same step; nothing was written");
    });
  }
  if (step < 0) raise<ValueError>("CheckpointWriter::commit: step must be >= 0, got ", step);
  const fs::path dir(directory_);
  const fs::path final_dir = dir / step_dir_name(step);
  std::string tmp;
  CommitLock lock;
  on_root("the commit lock and its temporary directory", [&] {
    std::error_code ec;
    if (fs::create_directories(dir, ec); ec) fs_error("cannot create directory", dir, ec.message());
    lock.acquire(dir);
    const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
    tmp = (dir /
           (kTmpPrefix + std::to_string(step) + "-" + std::to_string(::getpid()) + "-" + std::to_string(now)))
              .string();
    if (fs::create_directory(tmp, ec); ec) fs_error("cannot create directory", tmp, ec.message());
  });
  tmp = broadcast(tmp);
  try {
    CheckpointManifest m;
    m.step = step;
    m.metadata = metadata_;
    for (auto& p : pending_) {
      const std::string file = (fs::path(tmp) / p.entry.file).string();
      p.save(file);  // collective; synced to storage
      p.entry.checksum = p.checksum();
      // The same value on every rank (both are allreduced), so every rank raises or none.
      if (const std::uint64_t back = p.reread(file); back != p.entry.checksum)
        raise<IoError>("checkpoint: '", file, "' reads back with checksum ", to_hex(back), " instead of ",
                       to_hex(p.entry.checksum), " (a write failed without an error?)");
      m.arrays.push_back(p.entry);
    }
    // Everything below runs on rank 0 after every rank has written and closed its files.
    on_root("the manifest and the rename into place", [&] {
      write_synced(fs::path(tmp) / kManifest, manifest_json(m));
      sync_dir(tmp);
      std::error_code ec;
      if (fs::exists(final_dir, ec)) {
        // Same step again: swap the directories atomically, then drop the old one. File
        // systems without RENAME_EXCHANGE (EINVAL: Lustre, NFS) move the old one aside first,
        // under a temp name the next commit sweeps if we crash in between.
        if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) != 0) {
          const std::string aside = tmp + "-old";
          if (errno != EINVAL && errno != ENOSYS) fs_error("cannot replace", final_dir, std::strerror(errno));
          if (::rename(final_dir.c_str(), aside.c_str()) != 0 ||
              ::rename(tmp.c_str(), final_dir.c_str()) != 0)
            fs_error("cannot replace", final_dir, std::strerror(errno));
          tmp = aside;
        }
        fs::remove_all(tmp, ec);
      } else if (::rename(tmp.c_str(), final_dir.c_str()) != 0) {
        fs_error("cannot rename the new checkpoint to", final_dir, std::strerror(errno));
      }
      sync_dir(dir);
    });
  } catch (...) {
    if (world().rank() == 0) {
      std::error_code ec;
      fs::remove_all(tmp, ec);  // best effort: the next commit sweeps what is left
    }
    // Every rank holds the same kind of error here (each step above is agreed).
    try {
      throw;
    } catch (const IoError& e) {
      raise<IoError>("checkpoint: step ", step, " not committed (the checkpoints already in '", directory_,
                     "' are untouched): ", e.message());
    }
  }
  pending_.clear();
  metadata_.clear();
  on_root("pruning older steps", [&] { prune(dir, keep_, final_dir); });
  on_root("releasing the commit lock", [&] { lock.release(); });
  return final_dir.string();
}

std::string latest_checkpoint(const std::string& directory, shard::source_location where) {
  const detail::CallScope scope("latest_checkpoint", where);
  std::string found;
  on_root("listing the steps of '" + directory + "'", [&] {
    std::error_code ec;
    std::vector<fs::path> symlinks;
    const auto steps = list_steps(directory, &symlinks);
    if (!symlinks.empty())
      fs_error("refusing to read", symlinks.front(),
               "a checkpoint directory is a symlink; checkpoints must be real directories (move or copy it "
               "in place)");
    for (const auto& [step, path] : steps)
      if (fs::exists(path / kManifest, ec)) {
        found = path.string();
        break;
      }
  });
  return broadcast(found);
}

CheckpointManifest read_manifest(const std::string& checkpoint_path, shard::source_location where) {
  const detail::CallScope scope("read_manifest", where);
  const fs::path path = fs::path(checkpoint_path) / kManifest;
  std::string text;
  on_root("reading the manifest of '" + checkpoint_path + "'", [&] {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) fs_error("cannot open", path, std::strerror(errno));
    char buf[65536];
    std::size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
    const bool failed = std::ferror(f) != 0;
    std::fclose(f);
    if (failed) fs_error("cannot read", path, "read error");
  });
  // Every rank parses the same text, so a bad manifest raises the same error everywhere.
  CheckpointManifest m = detail::parse_manifest_text(broadcast(std::move(text)), path.string());
  // A commit names the directory after the manifest's step (a copy renamed by hand to another
  // name is fine): a step-N directory whose manifest says another step was edited or damaged.
  const fs::path dir = fs::path(checkpoint_path).lexically_normal();
  const std::string name = (dir.has_filename() ? dir : dir.parent_path()).filename().string();
  if (const std::int64_t named = step_of(name); named >= 0 && named != m.step)
    raise<ValueError>(path.string(), ": the manifest says step ", m.step, " but its directory is ", name,
                      " (the manifest was edited or damaged)");
  return m;
}

template <typename T>
ShardedArray<T> load_checkpoint_array(const std::string& checkpoint_path, const CheckpointManifest& manifest,
                                      const std::string& name, const NamedSharding& sharding,
                                      shard::source_location where) {
  const detail::CallScope scope("load_checkpoint_array", where);
  const CheckpointEntry& e = manifest.entry(name);
  if (e.dtype != dtype_name<T>()) {
    // bfloat16 and float32 load as each other (numpy has no bfloat16: a model may be saved in
    // either): a float32 entry into bfloat16 rounds to nearest even, bfloat16 into float32 is
    // exact. Other dtypes must match.
    std::optional<ShardedArray<T>> converted;
    if constexpr (std::is_same_v<T, bfloat16>) {
      if (e.dtype == dtype_name<float>())
        converted.emplace(astype<T>(load_checkpoint_array<float>(checkpoint_path, manifest, name, sharding)));
    } else if constexpr (std::is_same_v<T, float>) {
      if (e.dtype == dtype_name<bfloat16>())
        converted.emplace(
            astype<T>(load_checkpoint_array<bfloat16>(checkpoint_path, manifest, name, sharding)));
    }
    if (converted) return std::move(*converted);
    raise<ValueError>("load_checkpoint_array: array '", name, "' of ", checkpoint_path, " is ", e.dtype,
                      ", not ", dtype_name<T>(), "; load it as ", e.dtype,
                      " (only bfloat16 and float32 load as each other)");
  }
  if (!detail::is_plain_name(e.file))
    raise<ValueError>("load_checkpoint_array: manifest names a path outside its directory: '", e.file, "'");
  const std::string file = (fs::path(checkpoint_path) / e.file).string();
  // Rank 0 looks at the entry itself (not what it points to): a symlink could lead out of
  // the checkpoint directory, and a missing file deserves a message naming the array.
  on_root(detail::cat("the entry of array '", name, "' of '", checkpoint_path, "' as ", dtype_name<T>()),
          [&] {
            std::error_code ec;
            const fs::file_status st = fs::symlink_status(file, ec);
            if (st.type() == fs::file_type::not_found)
              raise<IoError>("load_checkpoint_array: ", checkpoint_path, " lacks '", e.file,
                             "', the file of array '", name,
                             "' that its manifest lists (the checkpoint is incomplete or was modified)");
            if (ec) fs_error("cannot inspect", file, ec.message());
            if (st.type() == fs::file_type::symlink)
              raise<ValueError>("load_checkpoint_array: manifest names a path outside its directory: '", file,
                                "' (the file of array '", name,
                                "') is a symlink; checkpoint files must be regular files");
            if (st.type() != fs::file_type::regular)
              raise<IoError>("load_checkpoint_array: '", file, "' (the file of array '", name,
                             "') is not a regular file");
          });
  ShardedArray<T> x = io::load_npy<T>(file, sharding);
  if (x.shape() != e.shape)
    raise<ShapeError>("load_checkpoint_array: array '", name, "' in ", file, " has shape ",
                      to_string(x.shape()), " but the manifest of ", checkpoint_path, " records ",
                      to_string(e.shape));
  if (const std::uint64_t sum = io::checksum(x); sum != e.checksum)
    raise<IoError>("load_checkpoint_array: checksum mismatch for array '", name, "': ", file, " gives ",
                   to_hex(sum), " but the manifest records ", to_hex(e.checksum),
                   "; the file is corrupt or was modified");
  return x;
}

template <typename T>
ShardedArray<T> load_checkpoint_array(const std::string& checkpoint_path, const CheckpointManifest& manifest,
                                      const std::string& name, const NamedSharding& sharding,
                                      const Shape& expected_shape, shard::source_location where) {
  const detail::CallScope scope("load_checkpoint_array", where);
  const CheckpointEntry& e = manifest.entry(name);
  if (e.shape != expected_shape)
    raise<ShapeError>("load_checkpoint_array: array '", name, "' of ", checkpoint_path, " has shape ",
                      to_string(e.shape), " but the model expects ", to_string(expected_shape),
                      "; the checkpoint was saved from a different model");
  return load_checkpoint_array<T>(checkpoint_path, manifest, name, sharding, where);
}

#define SHARD_INSTANTIATE_CHECKPOINT(T)                                                                     \
  template void CheckpointWriter::add<T>(const std::string&, const ShardedArray<T>&);                       \
  template void CheckpointWriter::add<T>(const std::string&, ShardedArray<T>&&);                            \
  template ShardedArray<T> load_checkpoint_array<T>(const std::string&, const CheckpointManifest&,          \
                                                    const std::string&, const NamedSharding&,               \
                                                    shard::source_location);                                \
  template ShardedArray<T> load_checkpoint_array<T>(const std::string&, const CheckpointManifest&,          \
                                                    const std::string&, const NamedSharding&, const Shape&, \
                                                    shard::source_location);
SHARD_FOR_EACH_NUMERIC_DTYPE(SHARD_INSTANTIATE_CHECKPOINT)
#undef SHARD_INSTANTIATE_CHECKPOINT

}  // namespace shard
