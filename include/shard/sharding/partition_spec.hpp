#pragma once
/// \file PartitionSpec (alias P): for each array dim, None, one mesh axis, or a tuple of mesh
/// axes (major to minor, their product splits the dim). Trailing Nones are implied.

#include <initializer_list>
#include <string>
#include <vector>

#include "shard/core/none.hpp"

namespace shard {

/// One entry of a PartitionSpec: the mesh axes (major to minor) that split one array dim;
/// empty means None.
class SpecEntry {
 public:
  SpecEntry() = default;
  SpecEntry(NoneType) {}
  SpecEntry(const char* axis) : axes_{axis} {}
  SpecEntry(std::string axis) : axes_{std::move(axis)} {}
  SpecEntry(std::initializer_list<std::string> axes) : axes_(axes) {}
  explicit SpecEntry(std::vector<std::string> axes) : axes_(std::move(axes)) {}

  const std::vector<std::string>& axes() const { return axes_; }
  bool is_none() const { return axes_.empty(); }
  bool operator==(const SpecEntry&) const = default;
  /// "None", "'a'" or "('a','b')".
  std::string to_string() const;

 private:
  std::vector<std::string> axes_;
};

/// Written like JAX: `P("a", None, {"b", "c"})`. A spec whose only entry is a tuple is
/// `P(SpecEntry{"a", "b"})` (`P({"a", "b"})` would be ambiguous with `P("a", "b")`).
class PartitionSpec {
 public:
  PartitionSpec() = default;
  PartitionSpec(SpecEntry e0) : entries_{std::move(e0)} {}
  PartitionSpec(SpecEntry e0, SpecEntry e1) : entries_{std::move(e0), std::move(e1)} {}
  PartitionSpec(SpecEntry e0, SpecEntry e1, SpecEntry e2) : entries_{std::move(e0), std::move(e1), std::move(e2)} {}
  PartitionSpec(SpecEntry e0, SpecEntry e1, SpecEntry e2, SpecEntry e3)
      : entries_{std::move(e0), std::move(e1), std::move(e2), std::move(e3)} {}
  PartitionSpec(SpecEntry e0, SpecEntry e1, SpecEntry e2, SpecEntry e3, SpecEntry e4)
      : entries_{std::move(e0), std::move(e1), std::move(e2), std::move(e3), std::move(e4)} {}
  explicit PartitionSpec(std::vector<SpecEntry> entries) : entries_(std::move(entries)) {}

  /// Parses the printed form: "P('a', None, ('b','c'))", "PartitionSpec('a')", "('a', None)",
  /// or bare "a,None,(b,c)" (a bare list must not start with a tuple: wrap it in P(...)).
  /// Quoted 'None' is an axis name, unquoted None an unsharded dim. Throws ValueError with
  /// the position of the problem.
  static PartitionSpec parse(const std::string& text);

  /// Number of explicit entries (the array may have more dims: they are None).
  int size() const { return static_cast<int>(entries_.size()); }
  /// The entry for `dim`, None past the end.
  const SpecEntry& operator[](int dim) const;
  const std::vector<SpecEntry>& entries() const { return entries_; }
  /// Every mesh axis named, in order of appearance.
  std::vector<std::string> axes() const;
  /// Same entries after dropping trailing Nones (P('a') == P('a', None)).
  bool operator==(const PartitionSpec& other) const;
  /// "P('a', None, ('b','c'))".
  std::string to_string() const;

 private:
  std::vector<SpecEntry> entries_;
};

using P = PartitionSpec;

}  // namespace shard
