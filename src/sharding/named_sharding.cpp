#include "shard/sharding/named_sharding.hpp"

#include <algorithm>

#include "shard/error.hpp"

namespace shard {

NamedSharding::NamedSharding(Mesh mesh, PartitionSpec spec, shard::source_location where)
    : mesh_(std::move(mesh)), spec_(std::move(spec)) {
  const detail::CallScope scope("NamedSharding", where);
  for (int dim = 0; dim < spec_.size(); ++dim) {
    std::vector<int> axes;
    for (const auto& name : spec_[dim].axes()) {
      if (!mesh_.has_axis(name)) {
        std::string names;
        for (const auto& n : mesh_.axis_names()) names += (names.empty() ? "'" : ", '") + n + "'";
        raise<ShardingError>("NamedSharding: ", spec_.to_string(), " names mesh axis '", name,
                             "' (dim ", dim, ") but ", mesh_.to_string(), " has only axes ", names,
                             "; use one of those names");
      }
      const int pos = mesh_.axis_position(name);
      if (used_ & (AxisMask{1} << pos))
        raise<ShardingError>("NamedSharding: ", spec_.to_string(), " uses mesh axis '", name,
                             "' more than once (again at dim ", dim,
                             "); a mesh axis may split at most one array dim, once");
      used_ |= AxisMask{1} << pos;
      axes.push_back(pos);
    }
    dim_axes_.push_back(std::move(axes));
  }
}

void NamedSharding::check_shape(const Shape& shape) const {
  if (spec_.size() > static_cast<int>(shape.size()))
    raise<ShardingError>("NamedSharding: ", spec_.to_string(), " has ", spec_.size(), " entries but the array of shape ",
                         shard::to_string(shape), " has only ", shape.size(),
                         " dims; drop entries so the spec is no longer than the array rank");
}

int NamedSharding::num_parts(int dim) const {
  if (dim < 0 || dim >= static_cast<int>(dim_axes_.size())) return 1;
  int n = 1;
  for (int a : dim_axes_[dim]) n *= mesh_.shape()[a];
  return n;
}

int NamedSharding::part_index(int device_id, int dim) const {
  if (dim < 0 || dim >= static_cast<int>(dim_axes_.size())) return 0;
  const auto c = mesh_.coords(device_id);
  int idx = 0;
  for (int a : dim_axes_[dim]) idx = idx * mesh_.shape()[a] + c[a];
  return idx;
}

Shape NamedSharding::shard_shape(const Shape& global) const {
  check_shape(global);
  Shape s(global.size());
  for (std::size_t d = 0; d < global.size(); ++d) {
    const int parts = num_parts(static_cast<int>(d));
    s[d] = (global[d] + parts - 1) / parts;
  }
  return s;
}

Box NamedSharding::box(int device_id, const Shape& global) const {
  check_shape(global);
  Box b{Shape(global.size()), Shape(global.size())};
  const auto c = mesh_.coords(device_id);
  for (std::size_t d = 0; d < global.size(); ++d) {
    int idx = 0;
    int parts = 1;
    if (d < dim_axes_.size())
      for (int a : dim_axes_[d]) {
        idx = idx * mesh_.shape()[a] + c[a];
        parts *= mesh_.shape()[a];
      }
    const Chunk ch = chunk_of(global[d], parts, idx);
    b.offset[d] = ch.offset;
    b.extent[d] = ch.extent;
  }
  return b;
}

AxisMask NamedSharding::replica_axes() const {
  const AxisMask all = mesh_.ndim() >= 32 ? ~AxisMask{0} : (AxisMask{1} << mesh_.ndim()) - 1;
  return all & ~used_;
}

std::vector<int> NamedSharding::replicas(int device_id) const {
  const auto c = mesh_.coords(device_id);
  std::vector<int> out;
  for (int d : mesh_.device_ids()) {
    const auto o = mesh_.coords(d);
    bool same = true;
    for (int a = 0; a < mesh_.ndim() && same; ++a)
      if ((used_ & (AxisMask{1} << a)) && o[a] != c[a]) same = false;
    if (same) out.push_back(d);
  }
  return out;
}

int NamedSharding::replica_index(int device_id) const {
  const auto c = mesh_.coords(device_id);
  int idx = 0;
  for (int a = 0; a < mesh_.ndim(); ++a)
    if (!(used_ & (AxisMask{1} << a))) idx = idx * mesh_.shape()[a] + c[a];
  return idx;
}

std::vector<int> NamedSharding::primary_devices() const {
  std::vector<int> out;
  for (int d : mesh_.device_ids())
    if (replica_index(d) == 0) out.push_back(d);
  return out;
}

std::string NamedSharding::to_string() const {
  return "NamedSharding(" + mesh_.to_string() + ", " + spec_.to_string() + ")";
}

bool NamedSharding::operator==(const NamedSharding& other) const {
  return mesh_ == other.mesh_ && spec_ == other.spec_;
}

std::optional<NamedSharding> equivalent_sharding(const NamedSharding& s, const Shape& shape, const Mesh& mesh) {
  const Mesh& from = s.mesh();
  if (from == mesh) return s;
  std::vector<int> a = from.device_ids(), b = mesh.device_ids();
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  if (a != b) return std::nullopt;
  s.check_shape(shape);
  const auto& ids = mesh.device_ids();
  std::vector<std::vector<int>> coords;
  for (int d : ids) coords.push_back(mesh.coords(d));
  std::vector<SpecEntry> entries;
  std::vector<bool> used(static_cast<std::size_t>(mesh.ndim()), false);
  for (int dim = 0; dim < static_cast<int>(shape.size()); ++dim) {
    const int parts = s.num_parts(dim);
    if (parts == 1) {
      entries.emplace_back();
      continue;
    }
    std::vector<int> part(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) part[i] = s.part_index(ids[i], dim);
    // The mesh axes along which the part index changes: the candidates for this dim.
    std::vector<int> axes;
    int size = 1;
    for (int ax = 0; ax < mesh.ndim(); ++ax) {
      if (mesh.shape()[ax] == 1) continue;
      bool varies = false;
      for (std::size_t i = 0; i < ids.size() && !varies; ++i) {
        auto c = coords[i];
        c[ax] = (c[ax] + 1) % mesh.shape()[ax];
        varies = part[i] != part[static_cast<std::size_t>(mesh.flat_index(mesh.device_at(c)))];
      }
      if (varies) {
        if (used[ax]) return std::nullopt;
        axes.push_back(ax);
        size *= mesh.shape()[ax];
      }
    }
    if (size != parts) return std::nullopt;
    bool found = false;
    do {  // the order of the axes (major to minor) that reproduces the part index
      bool ok = true;
      for (std::size_t i = 0; i < ids.size() && ok; ++i) {
        int idx = 0;
        for (int ax : axes) idx = idx * mesh.shape()[ax] + coords[i][ax];
        ok = idx == part[i];
      }
      found = ok;
    } while (!found && std::next_permutation(axes.begin(), axes.end()));
    if (!found) return std::nullopt;
    std::vector<std::string> names;
    for (int ax : axes) {
      used[ax] = true;
      names.push_back(mesh.axis_names()[ax]);
    }
    entries.emplace_back(names);
  }
  return NamedSharding(mesh, PartitionSpec(std::move(entries)));
}

}  // namespace shard
