#include "shard/sharding/positional_sharding.hpp"

#include <algorithm>
#include <numeric>
#include <set>
#include <sstream>

#include "shard/error.hpp"
#include "shard/runtime/runtime.hpp"

namespace shard {

namespace {

std::string dims_text(const std::vector<int>& s) {
  std::ostringstream os;
  os << '(';
  for (std::size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  if (s.size() == 1) os << ',';
  os << ')';
  return os.str();
}

std::vector<int> row_major_strides(const std::vector<int>& shape) {
  std::vector<int> st(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) st[i] = st[i + 1] * shape[i + 1];
  return st;
}

}  // namespace

PositionalSharding::PositionalSharding(std::vector<int> device_ids)
    : PositionalSharding(std::move(device_ids), Runtime::current().topology()) {}

PositionalSharding::PositionalSharding(std::vector<int> device_ids, Topology topology)
    : shape_{static_cast<int>(device_ids.size())}, topology_(std::move(topology)) {
  std::set<int> seen;
  for (int d : device_ids) {
    if (d < 0 || d >= topology_.device_count())
      raise<ShardingError>("PositionalSharding: device id ", d, " does not exist (", topology_.device_count(),
                           " devices)");
    if (!seen.insert(d).second) raise<ShardingError>("PositionalSharding: device ", d, " is listed twice");
    sets_.push_back({d});
  }
  if (sets_.empty()) raise<ShardingError>("PositionalSharding: the device list is empty");
}

PositionalSharding::PositionalSharding(std::vector<int> shape, std::vector<std::vector<int>> sets,
                                       Topology topology)
    : shape_(std::move(shape)), sets_(std::move(sets)), topology_(std::move(topology)) {}

PositionalSharding PositionalSharding::from_mesh(const Mesh& mesh) {
  PositionalSharding p(mesh.device_ids(), mesh.topology());
  return p.reshape(mesh.shape());
}

PositionalSharding PositionalSharding::reshape(std::vector<int> shape) const {
  const int total = static_cast<int>(sets_.size());
  int known = 1;
  int wild = -1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1 && wild < 0) wild = static_cast<int>(i);
    else if (shape[i] < 1)
      raise<ShardingError>("PositionalSharding.reshape: bad shape ", dims_text(shape));
    else known *= shape[i];
  }
  if (wild >= 0 && known > 0 && total % known == 0) shape[wild] = total / known;
  int n = 1;
  for (int s : shape) n *= s;
  if (n != total)
    raise<ShardingError>("PositionalSharding.reshape: cannot reshape ", dims_text(shape_), " (", total,
                         " device sets) into ", dims_text(shape));
  return PositionalSharding(std::move(shape), sets_, topology_);
}

PositionalSharding PositionalSharding::replicate(int axis, bool keepdims) const {
  const int nd = ndim();
  std::vector<bool> reduce(nd, axis == kAllAxes);
  if (axis != kAllAxes) {
    const int a = axis < 0 ? axis + nd : axis;
    if (a < 0 || a >= nd)
      raise<ShardingError>("PositionalSharding.replicate: axis ", axis, " out of range for shape ", dims_text(shape_));
    reduce[a] = true;
  }
  std::vector<int> out_shape;
  for (int i = 0; i < nd; ++i) out_shape.push_back(reduce[i] ? 1 : shape_[i]);
  const auto in_st = row_major_strides(shape_);
  const auto out_st = row_major_strides(out_shape);
  std::vector<std::vector<int>> out(static_cast<std::size_t>(std::accumulate(out_shape.begin(), out_shape.end(), 1,
                                                                              std::multiplies<>())));
  for (std::size_t f = 0; f < sets_.size(); ++f) {
    int o = 0;
    for (int i = 0; i < nd; ++i) {
      const int c = static_cast<int>(f) / in_st[i] % shape_[i];
      o += (reduce[i] ? 0 : c) * out_st[i];
    }
    out[o].insert(out[o].end(), sets_[f].begin(), sets_[f].end());
  }
  for (auto& s : out) std::sort(s.begin(), s.end());
  if (!keepdims) {
    std::vector<int> squeezed;
    for (int i = 0; i < nd; ++i)
      if (!reduce[i]) squeezed.push_back(out_shape[i]);
    out_shape = squeezed;
  }
  return PositionalSharding(std::move(out_shape), std::move(out), topology_);
}

PositionalSharding PositionalSharding::transpose(std::vector<int> perm) const {
  const int nd = ndim();
  if (perm.empty())
    for (int i = nd - 1; i >= 0; --i) perm.push_back(i);
  std::vector<int> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < std::max(nd, static_cast<int>(sorted.size())); ++i)
    if (static_cast<int>(sorted.size()) != nd || sorted[i] != i)
      raise<ShardingError>("PositionalSharding.transpose: ", dims_text(perm), " is not a permutation of the ", nd,
                           " axes");
  std::vector<int> out_shape;
  for (int p : perm) out_shape.push_back(shape_[p]);
  const auto in_st = row_major_strides(shape_);
  const auto out_st = row_major_strides(out_shape);
  std::vector<std::vector<int>> out(sets_.size());
  for (std::size_t f = 0; f < sets_.size(); ++f) {
    int o = 0;
    for (int j = 0; j < nd; ++j) o += (static_cast<int>(f) / in_st[perm[j]] % shape_[perm[j]]) * out_st[j];
    out[o] = sets_[f];
  }
  return PositionalSharding(std::move(out_shape), std::move(out), topology_);
}

NamedSharding PositionalSharding::to_named() const { return to_named(ndim()); }

NamedSharding PositionalSharding::to_named(int rank) const {
  const std::size_t r = sets_.front().size();
  std::set<int> all;
  for (const auto& s : sets_) {
    if (s.size() != r)
      raise<ShardingError>("PositionalSharding: device sets of different sizes (", r, " and ", s.size(),
                           ") cannot be expressed as a NamedSharding");
    for (int d : s)
      if (!all.insert(d).second)
        raise<ShardingError>("PositionalSharding: device ", d, " appears in two sets");
  }
  std::vector<int> mesh_shape = shape_;
  std::vector<std::string> names;
  std::vector<SpecEntry> spec;
  const int skip = std::max(0, ndim() - rank);  // leading dims an array of lower rank does not have
  for (int i = 0; i < ndim(); ++i) {
    names.push_back("p" + std::to_string(i));
    if (i >= skip) spec.push_back(shape_[i] > 1 ? SpecEntry(names.back()) : SpecEntry());
  }
  while (!spec.empty() && spec.back().is_none()) spec.pop_back();
  std::vector<int> ids;
  for (const auto& s : sets_) ids.insert(ids.end(), s.begin(), s.end());
  if (r > 1) {
    mesh_shape.push_back(static_cast<int>(r));
    names.emplace_back("replica");
  }
  return NamedSharding(Mesh(mesh_shape, names, ids, topology_), PartitionSpec(std::move(spec)));
}

std::string PositionalSharding::to_string() const {
  const auto st = row_major_strides(shape_);
  std::ostringstream os;
  os << "PositionalSharding(";
  for (std::size_t f = 0; f < sets_.size(); ++f) {
    for (int i = ndim() - 1; i >= 0; --i)  // open brackets at the start of each row/block
      if (static_cast<int>(f) % (st[i] * shape_[i]) == 0) os << '[';
    os << "{CPU ";
    for (std::size_t j = 0; j < sets_[f].size(); ++j) os << (j ? ", " : "") << sets_[f][j];
    os << '}';
    int closed = 0;
    for (int i = ndim() - 1; i >= 0; --i)
      if ((static_cast<int>(f) + 1) % (st[i] * shape_[i]) == 0) {
        os << ']';
        ++closed;
      }
    if (f + 1 == sets_.size()) continue;
    if (closed) {
      os << '\n';
      os << std::string(static_cast<std::size_t>(19 + ndim() - closed), ' ');  // under the '['
    } else {
      os << ' ';
    }
  }
  os << ')';
  return os.str();
}

}  // namespace shard
