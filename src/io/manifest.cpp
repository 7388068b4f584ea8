// The checkpoint manifest (manifest.json): parsing and validation of the text, and
// CheckpointManifest's accessors. Pure string code, no MPI (fuzz/fuzz_manifest.cpp).

#include "io/manifest.hpp"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cstdint>
#include <string>

#include "io/json.hpp"
#include "shard/core/dtype.hpp"
#include "shard/error.hpp"
#include "shard/sharding/partition_spec.hpp"

namespace shard {

using JsonValue = detail::json::Value;
namespace json = detail::json;

bool detail::is_plain_name(const std::string& s, std::size_t max_size) {
  if (s.empty() || s[0] == '.' || s.size() > max_size) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.';
  });
}

namespace {

class ManifestReader {
 public:
  explicit ManifestReader(std::string what) : what_(std::move(what)) {}

  const JsonValue& field(const JsonValue& obj, const char* key, JsonValue::Kind kind,
                         const std::string& where) const {
    const JsonValue* v = obj.find(key);
    if (!v) raise<ValueError>(what_, ": ", where, " lacks the field '", key, "'");
    if (v->kind != kind)
      raise<ValueError>(what_, ": field '", key, "' of ", where, " has the wrong JSON type");
    return *v;
  }
  std::int64_t integer(const JsonValue& v, const std::string& where) const {
    std::int64_t x = 0;
    const auto [end, ec] = std::from_chars(v.text.data(), v.text.data() + v.text.size(), x);
    if (v.kind != JsonValue::Kind::kNumber || ec != std::errc() || end != v.text.data() + v.text.size() ||
        x < 0)
      raise<ValueError>(what_, ": ", where, " must be a non-negative integer, not '", v.text, "'");
    return x;
  }
  std::uint64_t hex(const std::string& s, const std::string& where) const {
    std::uint64_t x = 0;
    const char* b = s.data() + (s.rfind("0x", 0) == 0 ? 2 : 0);
    const auto [end, ec] = std::from_chars(b, s.data() + s.size(), x, 16);
    if (ec != std::errc() || end != s.data() + s.size() || b == end)
      raise<ValueError>(what_, ": ", where, " must be a hexadecimal checksum, not '", s, "'");
    return x;
  }

 private:
  std::string what_;
};

CheckpointManifest parse_manifest(const std::string& text, const std::string& what) {
  using K = JsonValue::Kind;
  const JsonValue root = detail::json::parse(text, what);
  const ManifestReader r(what);
  if (root.kind != K::kObject) raise<ValueError>(what, ": the manifest must be a JSON object");
  if (r.field(root, "format", K::kString, "the manifest").text != detail::kManifestFormat)
    raise<ValueError>(what, ": not a Shard checkpoint manifest (format is not '", detail::kManifestFormat,
                      "')");
  if (const auto v = r.integer(r.field(root, "version", K::kNumber, "the manifest"), "'version'"); v != 1)
    raise<ValueError>(what, ": manifest version ", v, " is not supported (this Shard reads version 1)");
  CheckpointManifest m;
  m.step = r.integer(r.field(root, "step", K::kNumber, "the manifest"), "'step'");
  for (const auto& [k, v] : r.field(root, "metadata", K::kObject, "the manifest").members) {
    if (v.kind != K::kString)
      raise<ValueError>(what, ": metadata '", json::printable(k), "' must be a string");
    if (k.empty() || json::printable(k) != k)
      raise<ValueError>(what, ": metadata key '", json::printable(k),
                        "' is empty or holds control characters");
    m.metadata[k] = v.text;
  }
  for (const JsonValue& a : r.field(root, "arrays", K::kArray, "the manifest").items) {
    const std::string where = "array " + std::to_string(m.arrays.size());
    if (a.kind != K::kObject) raise<ValueError>(what, ": ", where, " must be a JSON object");
    CheckpointEntry e;
    e.name = r.field(a, "name", K::kString, where).text;
    e.file = r.field(a, "file", K::kString, where).text;
    if (!detail::is_plain_name(e.file))
      raise<ValueError>(what, ": manifest names a path outside its directory: file '",
                        json::printable(e.file), "' of array '", json::printable(e.name),
                        "' (files must be plain names such as 'w1.npy')");
    if (!detail::is_plain_name(e.name))
      raise<ValueError>(what, ": array name '", json::printable(e.name), "' is not a plain name");
    for (const auto& other : m.arrays)
      if (other.name == e.name || other.file == e.file)
        raise<ValueError>(what, ": arrays '", other.name, "' and '", e.name, "' share a name or a file");
    e.dtype = r.field(a, "dtype", K::kString, where).text;
    if (!visit_dtype<NumericDtypes>(e.dtype, [](auto) {}))  // the dtypes checkpoints hold
      raise<ValueError>(what, ": array '", e.name, "' has unknown dtype '", json::printable(e.dtype), "'");
    std::int64_t elements = 1;  // at most 2^60 elements: the bytes of any dtype fit an int64
    for (const auto& d : r.field(a, "shape", K::kArray, where).items) {
      e.shape.push_back(r.integer(d, "the shape of array '" + e.name + "'"));
      if (e.shape.back() > 0 && elements > (std::int64_t{1} << 60) / e.shape.back())
        raise<ValueError>(what, ": the shape of array '", e.name, "' holds more than 2^60 elements");
      elements *= e.shape.back();
    }
    e.spec = r.field(a, "spec", K::kString, where).text;
    PartitionSpec spec;
    try {
      spec = PartitionSpec::parse(e.spec);
    } catch (const Error& err) {
      raise<ValueError>(what, ": the spec '", json::printable(e.spec), "' of array '", e.name,
                        "': ", err.message());
    }
    if (static_cast<std::size_t>(spec.size()) > e.shape.size())
      raise<ValueError>(what, ": the spec ", e.spec, " of array '", e.name, "' has more entries than its ",
                        e.shape.size(), " dims");
    std::int64_t devices = 1;  // a mesh of at most INT_MAX devices (MPI's ranks are ints), none empty
    for (const auto& d : r.field(a, "mesh_shape", K::kArray, where).items) {
      const std::int64_t size = r.integer(d, "the mesh shape of array '" + e.name + "'");
      if (size < 1 || size > INT_MAX || (devices *= size) > INT_MAX)
        raise<ValueError>(what, ": the mesh shape of array '", e.name, "' must hold 1 to ", INT_MAX,
                          " devices, each axis at least 1, not a ", d.text, " axis");
      e.mesh_shape.push_back(static_cast<int>(size));
    }
    if (const JsonValue* axes = a.find("mesh_axes"); axes && axes->kind == K::kArray) {
      for (const auto& n : axes->items) {
        if (n.kind != K::kString || n.text.empty() || json::printable(n.text) != n.text ||
            std::find(e.mesh_axes.begin(), e.mesh_axes.end(), n.text) != e.mesh_axes.end())
          raise<ValueError>(what, ": the mesh axes of array '", e.name,
                            "' must be distinct non-empty names, not '", json::printable(n.text), "'");
        e.mesh_axes.push_back(n.text);
      }
      if (e.mesh_axes.size() != e.mesh_shape.size())
        raise<ValueError>(what, ": array '", e.name, "' has ", e.mesh_axes.size(),
                          " mesh axes but a mesh shape of ", e.mesh_shape.size());
      for (const SpecEntry& entry : spec.entries())
        for (const std::string& axis : entry.axes())
          if (std::find(e.mesh_axes.begin(), e.mesh_axes.end(), axis) == e.mesh_axes.end())
            raise<ValueError>(what, ": the spec ", e.spec, " of array '", e.name, "' names axis '", axis,
                              "', which its mesh does not have");
    }
    if (e.mesh_shape.empty()) raise<ValueError>(what, ": array '", e.name, "' has an empty mesh shape");
    e.checksum =
        r.hex(r.field(a, "checksum", K::kString, where).text, "the checksum of array '" + e.name + "'");
    m.arrays.push_back(std::move(e));
  }
  return m;
}

}  // namespace

CheckpointManifest detail::parse_manifest_text(const std::string& text, const std::string& what) {
  return parse_manifest(text, what);
}

const CheckpointEntry& CheckpointManifest::entry(const std::string& name) const {
  std::string names;
  for (const auto& e : arrays) {
    if (e.name == name) return e;
    names += (names.empty() ? "'" : ", '") + e.name + "'";
  }
  raise<ValueError>("checkpoint of step ", step, " has no array '", name, "' (it has ",
                    names.empty() ? "none" : names, ")");
}

std::int64_t CheckpointManifest::integer(const std::string& key) const {
  const auto it = metadata.find(key);
  if (it == metadata.end())
    raise<ValueError>("checkpoint of step ", step, ": its manifest has no metadata '", key, "'");
  const std::string& text = it->second;
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size())
    raise<ValueError>("checkpoint of step ", step, ": metadata '", key, "' is '", text,
                      "', not an integer (the manifest was edited or damaged)");
  return v;
}

CheckpointWriter::CheckpointWriter(std::string directory, int keep)
    : directory_(std::move(directory)), keep_(keep) {
  if (keep < 1) raise<ValueError>("CheckpointWriter: keep must be at least 1, got ", keep);
  if (directory_.empty()) raise<ValueError>("CheckpointWriter: the directory is empty");
}

}  // namespace shard
