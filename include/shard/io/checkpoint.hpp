#pragma once
/// \file Checkpoints: named ShardedArrays plus string metadata, committed atomically.
///
/// A checkpoint is a directory `<dir>/step-<step, 8 digits>` holding one .npy file per array
/// (shard::io::save_npy, so numpy reads them) and `manifest.json`: the step, the metadata,
/// and per array its file, dtype, shape, the spec and mesh it was saved from, and a
/// mesh-independent checksum (shard::io::checksum). A commit writes everything into a
/// hidden `<dir>/.tmp-step-*` directory, flushes it to storage, then renames it into place,
/// so a crash leaves either the whole new checkpoint or none of it, never a torn one; older
/// checkpoints beyond `keep` and temp directories of crashed runs are removed afterwards.
/// Arrays load onto any mesh, spec, rank count or devices per rank.
///
/// One writer per directory at a time. Every function is collective over all ranks of the
/// Runtime; failures are agreed and raised on every rank (IoError for the file system,
/// ValueError for bad names or manifests, ShapeError for shapes that disagree).

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shard/array/sharded_array.hpp"
#include "shard/core/dtype.hpp"
#include "shard/core/tree.hpp"
#include "shard/sharding/named_sharding.hpp"

namespace shard {

/// One array of a checkpoint, as manifest.json records it.
struct CheckpointEntry {
  std::string name;
  std::string file;   ///< "<name>.npy", relative to the checkpoint directory
  std::string dtype;  ///< dtype_name of one of NumericDtypes ("float32", "bfloat16", ...); a
                      ///< bfloat16 file is a .npy of '<V2' (2-byte records, as ml_dtypes saves)
  Shape shape;
  std::string spec;  ///< PartitionSpec::to_string() of the saved array, e.g. "P('a', None)"
  std::vector<int> mesh_shape;
  std::vector<std::string> mesh_axes;
  std::uint64_t checksum = 0;  ///< io::checksum of the saved array (hex in the manifest)
};

struct CheckpointManifest {
  std::int64_t step = 0;
  std::map<std::string, std::string> metadata;
  std::vector<CheckpointEntry> arrays;

  /// The entry of `name`; ValueError listing the names present if there is none.
  const CheckpointEntry& entry(const std::string& name) const;
  /// The metadata value of `key` as an integer; ValueError naming the key when it is missing,
  /// or not a whole decimal integer of int64 range.
  std::int64_t integer(const std::string& key) const;
};

/// Collects arrays and metadata, then writes them as one checkpoint with commit().
class CheckpointWriter {
 public:
  /// Checkpoints go to `directory` (created on commit); the newest `keep` >= 1 are kept.
  CheckpointWriter(std::string directory, int keep);

  /// Records `x` under `name` (a plain file name: letters, digits, '_', '-', '.', not starting
  /// with '.'; ValueError otherwise or if the name is taken). Local. The lvalue overload
  /// keeps a reference: `x` must stay alive and unchanged until commit(); a temporary is
  /// moved in and owned.
  template <typename T>
  void add(const std::string& name, const ShardedArray<T>& x);
  template <typename T>
  void add(const std::string& name, ShardedArray<T>&& x);
  /// Records every leaf (a ShardedArray) of a parameter tree (shard/core/tree.hpp) under
  /// `prefix` and its path joined by '.' ("params" + .layers[0].w -> "params.layers.0.w"; map
  /// keys must be plain names). As add's lvalue overload, the tree must stay alive and
  /// unchanged until commit(). Local. load_checkpoint_tree reads it back on any mesh.
  template <typename Tree>
  void add_tree(const std::string& prefix, const Tree& tree) {
    tree_for_each_with_path(
        [&](const TreePath& path, const auto& leaf) {
          static_assert(detail::is_sharded_v<std::remove_cvref_t<decltype(leaf)>>,
                        "add_tree: a checkpoint holds ShardedArrays; device_put host Tensors first");
          add(path.dotted(prefix), leaf);
        },
        tree);
  }
  /// Records a metadata string (epoch, random key, model layout...). Local.
  void set(const std::string& key, const std::string& value);

  /// Collective: writes the recorded arrays and metadata as checkpoint `step` (>= 0) and
  /// returns its path. Every file is read back and checksummed before the checkpoint is
  /// renamed into place (MPI-IO layers can lose write errors; see save_npy). Replaces an
  /// existing checkpoint of the same step atomically. Then keeps the checkpoint just written
  /// plus the `keep` - 1 others with the highest steps. The writer is then empty and can
  /// record the next checkpoint. On failure every rank raises IoError and the checkpoints
  /// already in the directory are untouched.
  std::string commit(std::int64_t step, shard::source_location where = shard::source_location::current());

  const std::string& directory() const { return directory_; }

 private:
  struct Pending {
    CheckpointEntry entry;                                    // checksum filled in by commit
    std::function<void(const std::string&)> save;             // save_npy of the array to a path
    std::function<std::uint64_t()> checksum;                  // io::checksum of the array
    std::function<std::uint64_t(const std::string&)> reread;  // io::checksum of the file, loaded back
  };
  template <typename T>
  void add_shared(const std::string& name, std::shared_ptr<const ShardedArray<T>> x);

  std::string directory_;
  int keep_;
  std::vector<Pending> pending_;
  std::map<std::string, std::string> metadata_;
};

/// Collective: the path of the checkpoint with the highest step in `directory`, or "" if
/// there is none (or no directory). Temp directories of unfinished commits are ignored.
std::string latest_checkpoint(const std::string& directory,
                              shard::source_location where = shard::source_location::current());

/// Collective: rank 0 reads `<checkpoint_path>/manifest.json` and broadcasts it; every rank
/// parses and validates it (required fields, known dtypes, unique names, file names that
/// stay inside the checkpoint directory), raising the same error everywhere.
CheckpointManifest read_manifest(const std::string& checkpoint_path,
                                 shard::source_location where = shard::source_location::current());

/// Collective: loads array `name` of the checkpoint onto `sharding`. Checks T against the
/// recorded dtype (ValueError; except that bfloat16 and float32 load as each other: a float32
/// entry into bfloat16 rounded to nearest even, a bfloat16 one into float32 exactly), that the file is a
/// regular file inside the checkpoint directory (ValueError for a path or symlink leading out of it, IoError
/// if it is missing), the file's shape against the manifest (ShapeError), and the checksum of what was read
/// against the manifest (IoError: the file is truncated, corrupt or was modified). Every
/// failure is raised on every rank.
template <typename T>
ShardedArray<T> load_checkpoint_array(const std::string& checkpoint_path, const CheckpointManifest& manifest,
                                      const std::string& name, const NamedSharding& sharding,
                                      shard::source_location where = shard::source_location::current());

/// The same, for a model that needs a given shape: ShapeError naming the array, both shapes
/// and the checkpoint, before any file is read, if the manifest records another shape.
template <typename T>
ShardedArray<T> load_checkpoint_array(const std::string& checkpoint_path, const CheckpointManifest& manifest,
                                      const std::string& name, const NamedSharding& sharding,
                                      const Shape& expected_shape,
                                      shard::source_location where = shard::source_location::current());

/// Collective: the tree CheckpointWriter::add_tree(prefix, ...) recorded, loaded onto the
/// shardings of `like` (a tree of the same structure: e.g. the model initialised on the mesh to
/// resume on, any mesh, any rank count), each leaf checked against like's shape and dtype as
/// load_checkpoint_array does.
template <typename Tree>
Tree load_checkpoint_tree(const std::string& checkpoint_path, const CheckpointManifest& manifest,
                          const std::string& prefix, const Tree& like,
                          shard::source_location where = shard::source_location::current()) {
  const detail::CallScope scope("load_checkpoint_tree", where);
  return tree_map_with_path(
      [&](const TreePath& path, const auto& leaf) {
        using A = std::remove_cvref_t<decltype(leaf)>;
        static_assert(detail::is_sharded_v<A>,
                      "load_checkpoint_tree: `like` must be a tree of ShardedArrays");
        return load_checkpoint_array<elem_t<A>>(checkpoint_path, manifest, path.dotted(prefix),
                                                leaf.sharding(), leaf.shape());
      },
      like);
}

#define SHARD_DECLARE_CHECKPOINT(T)                                                                       \
  extern template void CheckpointWriter::add<T>(const std::string&, const ShardedArray<T>&);              \
  extern template void CheckpointWriter::add<T>(const std::string&, ShardedArray<T>&&);                   \
  extern template ShardedArray<T> load_checkpoint_array<T>(const std::string&, const CheckpointManifest&, \
                                                           const std::string&, const NamedSharding&,      \
                                                           shard::source_location);                       \
  extern template ShardedArray<T> load_checkpoint_array<T>(const std::string&, const CheckpointManifest&, \
                                                           const std::string&, const NamedSharding&,      \
                                                           const Shape&, shard::source_location);
SHARD_FOR_EACH_NUMERIC_DTYPE(SHARD_DECLARE_CHECKPOINT)
#undef SHARD_DECLARE_CHECKPOINT

namespace detail {
/// A manifest.json's text parsed and validated (read_manifest's parser; `what` names it in
/// errors). Local; fuzzed by fuzz/fuzz_manifest.cpp.
CheckpointManifest parse_manifest_text(const std::string& text, const std::string& what);
}  // namespace detail

}  // namespace shard
