// Validation of collectives: every rule is checked from shapes and names alone, so all
// ranks raise the same error before any communication.

#include <algorithm>
#include <set>

#include "shard/comm/detail/collective.hpp"
#include "shard/error.hpp"

namespace shard::detail {

namespace {

/// numpy's canonicalize_axis: dims in [-rank, rank) map to [0, rank).
int canonical_dim(const CollectiveSpec& s, int dim, int rank, const char* what) {
  if (dim < -rank || dim >= rank)
    raise<ShapeError>(s.name, " over ", s.axes_text, " of a block of shape ", to_string(s.in_shape), ": ", what,
                      " ", dim, " is out of range; valid values are ", -rank, " to ", rank - 1);
  return dim < 0 ? dim + rank : dim;
}

CollectiveSpec base(const Mesh& mesh, const char* name, CollectiveKind kind, const SpecEntry& axes,
                    const Shape& shape) {
  CollectiveSpec s;
  s.kind = kind;
  s.name = name;
  s.in_shape = shape;
  s.out_shape = shape;
  resolve_axes(mesh, axes, s);
  return s;
}

}  // namespace

void resolve_axes(const Mesh& mesh, const SpecEntry& axes, CollectiveSpec& spec) {
  std::set<std::string> seen;
  spec.axes.clear();
  spec.group_size = 1;
  for (const auto& a : axes.axes()) {
    if (!seen.insert(a).second)
      raise<ShardingError>(spec.name, ": mesh axis '", a, "' is named twice in ", axes.to_string());
    if (!mesh.has_axis(a)) {
      std::string names;
      for (const auto& n : mesh.axis_names()) names += (names.empty() ? "'" : ", '") + n + "'";
      raise<ShardingError>(spec.name, ": unknown mesh axis '", a, "'; ", mesh.to_string(), " has axes ", names);
    }
    spec.axes.push_back(mesh.axis_position(a));
    spec.group_size *= mesh.axis_size(a);
  }
  spec.axes_text = axes.is_none() ? "()" : axes.to_string();
}

CollectiveSpec reduce_spec(const Mesh& mesh, ReduceKind op, const SpecEntry& axes, const Shape& shape) {
  static const char* kNames[] = {"psum", "pmean", "pmax", "pmin", "pprod"};
  CollectiveSpec s = base(mesh, kNames[static_cast<int>(op)], CollectiveKind::kReduce, axes, shape);
  s.op = op;
  return s;
}

CollectiveSpec all_gather_spec(const Mesh& mesh, const SpecEntry& axes, const Shape& shape, int dim, bool tiled) {
  CollectiveSpec s = base(mesh, "all_gather", CollectiveKind::kAllGather, axes, shape);
  const int rank = static_cast<int>(shape.size());
  s.tiled = tiled;
  if (tiled && rank == 0) raise<ShapeError>("all_gather over ", s.axes_text, ": tiled=true needs a block of rank >= 1, got a 0-d block");
  s.dim = canonical_dim(s, dim, tiled ? rank : rank + 1, "dim");
  if (tiled) {
    s.out_shape[s.dim] *= s.group_size;
  } else {
    s.out_shape.insert(s.out_shape.begin() + s.dim, s.group_size);
  }
  return s;
}

CollectiveSpec psum_scatter_spec(const Mesh& mesh, const SpecEntry& axes, const Shape& shape, int dim, bool tiled) {
  CollectiveSpec s = base(mesh, "psum_scatter", CollectiveKind::kPsumScatter, axes, shape);
  const int rank = static_cast<int>(shape.size());
  s.tiled = tiled;
  if (rank == 0) raise<ShapeError>("psum_scatter over ", s.axes_text, " needs a block of rank >= 1, got a 0-d block");
  s.dim = canonical_dim(s, dim, rank, "dim");
  const auto n = shape[s.dim];
  if (tiled) {
    if (n % s.group_size != 0)
      raise<ShapeError>("psum_scatter(tiled=true) over ", s.axes_text, " (size ", s.group_size, "): dim ", s.dim,
                        " of the block ", to_string(shape), " has size ", n, ", which ", s.group_size,
                        " does not evenly divide");
    s.out_shape[s.dim] = n / s.group_size;
  } else {
    if (n != s.group_size)
      raise<ShapeError>("psum_scatter(tiled=false) over ", s.axes_text, " (size ", s.group_size, "): dim ", s.dim,
                        " of the block ", to_string(shape), " must have size ", s.group_size, " but has ", n,
                        "; use tiled=true to scatter chunks of a longer dim");
    s.out_shape.erase(s.out_shape.begin() + s.dim);
  }
  return s;
}

CollectiveSpec all_to_all_spec(const Mesh& mesh, const SpecEntry& axes, const Shape& shape, int split_dim,
                               int concat_dim, bool tiled) {
  CollectiveSpec s = base(mesh, "all_to_all", CollectiveKind::kAllToAll, axes, shape);
  const int rank = static_cast<int>(shape.size());
  s.tiled = tiled;
  if (rank == 0) raise<ShapeError>("all_to_all over ", s.axes_text, " needs a block of rank >= 1, got a 0-d block");
  s.dim = canonical_dim(s, split_dim, rank, "split_dim");
  s.concat_dim = canonical_dim(s, concat_dim, rank, "concat_dim");
  const auto n = shape[s.dim];
  if (tiled) {
    if (n % s.group_size != 0)
      raise<ShapeError>("all_to_all(tiled=true) over ", s.axes_text, " (size ", s.group_size, "): split_dim ", s.dim,
                        " of the block ", to_string(shape), " has size ", n, ", which ", s.group_size,
                        " does not evenly divide");
    s.out_shape[s.dim] /= s.group_size;
    s.out_shape[s.concat_dim] *= s.group_size;
  } else {
    if (n != s.group_size)
      raise<ShapeError>("all_to_all(tiled=false) over ", s.axes_text, " (size ", s.group_size, "): split_dim ", s.dim,
                        " of the block ", to_string(shape), " must have size ", s.group_size, " but has ", n,
                        "; use tiled=true to split a longer dim");
    s.out_shape.erase(s.out_shape.begin() + s.dim);
    s.out_shape.insert(s.out_shape.begin() + s.concat_dim, s.group_size);
  }
  return s;
}

CollectiveSpec ppermute_spec(const Mesh& mesh, const SpecEntry& axes, const Shape& shape,
                             std::vector<std::pair<int, int>> perm) {
  CollectiveSpec s = base(mesh, "ppermute", CollectiveKind::kPpermute, axes, shape);
  std::set<int> srcs, dsts;
  for (const auto& [src, dst] : perm) {
    if (src < 0 || src >= s.group_size || dst < 0 || dst >= s.group_size)
      raise<ValueError>("ppermute over ", s.axes_text, " (size ", s.group_size, "): pair (", src, ", ", dst,
                        ") is out of range; indices must be in [0, ", s.group_size, ")");
    if (!srcs.insert(src).second)
      raise<ValueError>("ppermute over ", s.axes_text, ": source ", src,
                        " appears twice in perm; perm must be a partial permutation (no repeated source)");
    if (!dsts.insert(dst).second)
      raise<ValueError>("ppermute over ", s.axes_text, ": destination ", dst,
                        " appears twice in perm; perm must be a partial permutation (no repeated destination)");
  }
  std::sort(perm.begin(), perm.end());
  s.perm = std::move(perm);
  return s;
}

}  // namespace shard::detail
