#include "shard/sharding/mesh.hpp"

#include <algorithm>
#include <numeric>
#include <set>
#include <sstream>
#include <tuple>

#include "sharding/mesh_state.hpp"
#include "shard/error.hpp"
#include "shard/runtime/runtime.hpp"

namespace shard {

namespace {

std::string shape_text(const std::vector<int>& shape) {
  std::ostringstream os;
  for (std::size_t i = 0; i < shape.size(); ++i) os << (i ? "x" : "") << shape[i];
  return shape.empty() ? "()" : os.str();
}

std::string names_text(const std::vector<std::string>& names) {
  std::ostringstream os;
  os << '(';
  for (std::size_t i = 0; i < names.size(); ++i) os << (i ? ", " : "") << '\'' << names[i] << '\'';
  os << ')';
  return os.str();
}

}  // namespace

Mesh::Mesh(std::vector<int> shape, std::vector<std::string> axis_names, std::vector<int> device_ids)
    : Mesh(std::move(shape), std::move(axis_names), std::move(device_ids), Runtime::current().topology()) {}

Mesh::Mesh(std::vector<int> shape, std::vector<std::string> axis_names, std::vector<int> device_ids,
           Topology topology)
    : state_(std::make_shared<State>()) {
  if (shape.size() != axis_names.size())
    raise<ShardingError>("Mesh: shape ", shape_text(shape), " has ", shape.size(), " axes but ",
                         axis_names.size(), " axis names ", names_text(axis_names),
                         " were given; give one name per mesh axis");
  if (shape.size() > 32) raise<ShardingError>("Mesh: at most 32 axes are supported, got ", shape.size());
  std::set<std::string> seen;
  for (const auto& n : axis_names) {
    if (n.empty()) raise<ShardingError>("Mesh: axis names must be non-empty, got ", names_text(axis_names));
    if (!seen.insert(n).second)
      raise<ShardingError>("Mesh: axis name '", n, "' appears twice in ", names_text(axis_names),
                           "; axis names must be unique");
  }
  long total = 1;
  for (int s : shape) {
    if (s < 1) raise<ShardingError>("Mesh: every axis needs size >= 1, got shape ", shape_text(shape));
    total *= s;
  }
  if (total != static_cast<long>(device_ids.size()))
    raise<ShardingError>("Mesh: shape ", shape_text(shape), " holds ", total, " devices but the device list has ",
                         device_ids.size(), "; reshape the device list or change the mesh shape");
  state_->flat_of.assign(static_cast<std::size_t>(topology.device_count()), -1);
  for (std::size_t i = 0; i < device_ids.size(); ++i) {
    const int d = device_ids[i];
    if (d < 0 || d >= topology.device_count())
      raise<ShardingError>("Mesh: device id ", d, " does not exist; the runtime has ", topology.device_count(),
                           " devices (", topology.process_count, " ranks x ", topology.devices_per_rank,
                           " devices per rank)");
    if (state_->flat_of[d] >= 0) raise<ShardingError>("Mesh: device ", d, " appears twice in the device list");
    state_->flat_of[d] = static_cast<int>(i);
  }
  state_->shape = std::move(shape);
  state_->names = std::move(axis_names);
  state_->devices = std::move(device_ids);
  state_->topology = std::move(topology);
  state_ = intern(std::move(state_));
}

std::shared_ptr<Mesh::State> Mesh::intern(std::shared_ptr<State> s) {
  // Meshes alive in this process: PositionalSharding's conversions and pmap build the same
  // mesh again and again, and each state would otherwise create its own communicators.
  static auto* mutex = new std::mutex;  // never destroyed: meshes may die during exit
  static auto* states = new std::vector<std::weak_ptr<State>>;
  std::lock_guard lock(*mutex);
  std::shared_ptr<State> found;
  std::erase_if(*states, [&](const std::weak_ptr<State>& w) {
    auto p = w.lock();
    if (!p) return true;
    if (!found && p->shape == s->shape && p->names == s->names && p->devices == s->devices &&
        p->topology == s->topology)
      found = std::move(p);
    return false;
  });
  if (found) return found;
  states->push_back(s);
  return s;
}

const Mesh::State& Mesh::st() const {
  if (!state_)
    raise<ValueError>("an empty array or mesh was used: a default-constructed ShardedArray (or NamedSharding, or Mesh) "
                      "holds nothing until an array is assigned to it; assign one before using it");
  return *state_;
}

int Mesh::ndim() const { return static_cast<int>(st().shape.size()); }
const std::vector<int>& Mesh::shape() const { return st().shape; }
const std::vector<std::string>& Mesh::axis_names() const { return st().names; }
const std::vector<int>& Mesh::device_ids() const { return st().devices; }
int Mesh::size() const { return static_cast<int>(st().devices.size()); }
const Topology& Mesh::topology() const { return st().topology; }

int Mesh::axis_position(const std::string& name) const {
  const auto& n = st().names;
  const auto it = std::find(n.begin(), n.end(), name);
  if (it == n.end())
    raise<ShardingError>("unknown mesh axis '", name, "': the mesh has axes ", names_text(n), " (", to_string(),
                         ")");
  return static_cast<int>(it - n.begin());
}

bool Mesh::has_axis(const std::string& name) const {
  return std::find(st().names.begin(), st().names.end(), name) != st().names.end();
}

int Mesh::axis_size(const std::string& name) const { return st().shape[axis_position(name)]; }

int Mesh::axes_size(AxisMask axes) const {
  int n = 1;
  for (int i = 0; i < ndim(); ++i)
    if (axes & (AxisMask{1} << i)) n *= st().shape[i];
  return n;
}

AxisMask Mesh::mask_of(const std::vector<std::string>& names) const {
  AxisMask m = 0;
  for (const auto& n : names) m |= AxisMask{1} << axis_position(n);
  return m;
}

int Mesh::flat_index(int device_id) const {
  if (device_id < 0 || device_id >= static_cast<int>(st().flat_of.size())) return -1;
  return st().flat_of[device_id];
}

std::vector<int> Mesh::coords(int device_id) const {
  int f = flat_index(device_id);
  if (f < 0) raise<ShardingError>("device ", device_id, " is not in ", to_string(), " with devices ", devices_string());
  std::vector<int> c(st().shape.size());
  for (int i = ndim() - 1; i >= 0; --i) {
    c[i] = f % st().shape[i];
    f /= st().shape[i];
  }
  return c;
}

int Mesh::device_at(const std::vector<int>& coords) const {
  if (static_cast<int>(coords.size()) != ndim())
    raise<ShardingError>("Mesh::device_at: ", coords.size(), " coordinates for a ", ndim(), "-D mesh");
  int f = 0;
  for (int i = 0; i < ndim(); ++i) {
    if (coords[i] < 0 || coords[i] >= st().shape[i])
      raise<ShardingError>("Mesh::device_at: coordinate ", coords[i], " out of range for axis '", st().names[i],
                           "' of size ", st().shape[i]);
    f = f * st().shape[i] + coords[i];
  }
  return st().devices[f];
}

std::vector<int> Mesh::local_device_ids() const {
  std::vector<int> out;
  for (int d : st().devices)
    if (st().topology.is_local(d)) out.push_back(d);
  return out;
}

std::string Mesh::to_string() const {
  if (!state_) return "Mesh(empty)";
  std::ostringstream os;
  os << "Mesh(";
  for (int i = 0; i < ndim(); ++i) os << (i ? ", " : "") << '\'' << st().names[i] << "': " << st().shape[i];
  os << ')';
  return os.str();
}

std::string Mesh::devices_string() const {
  if (!state_) return "[]";
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < st().devices.size(); ++i) os << (i ? ", " : "") << st().devices[i];
  os << ']';
  return os.str();
}

bool Mesh::operator==(const Mesh& other) const {
  if (state_ == other.state_) return true;
  if (!state_ || !other.state_) return false;
  return state_->shape == other.state_->shape && state_->names == other.state_->names &&
         state_->devices == other.state_->devices && state_->topology == other.state_->topology;
}

Mesh make_mesh(const std::vector<int>& shape, const std::vector<std::string>& axis_names, shard::source_location where) {
  const detail::CallScope scope("make_mesh", where);
  return make_mesh(shape, axis_names, Runtime::current().topology());
}

Mesh make_mesh(const std::vector<int>& shape, const std::vector<std::string>& axis_names,
               const Topology& topology) {
  long total = 1;
  for (int s : shape) total *= s;
  if (total != topology.device_count())
    raise<ShardingError>("make_mesh: shape ", shape_text(shape), " needs ", total, " devices but the runtime has ",
                         topology.device_count(), " (", topology.process_count, " ranks x ",
                         topology.devices_per_rank,
                         " devices per rank); change the mesh shape or the rank count / --devices-per-rank");
  // Row-major order over (node, rank, local device): a rank's devices, then a host's ranks,
  // are contiguous, so they vary along the minor axes and heavy inner-axis traffic stays local.
  std::vector<int> ids(static_cast<std::size_t>(total));
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) {
    const int pa = topology.owner(a);
    const int pb = topology.owner(b);
    return std::tie(topology.node_of_process[pa], pa, a) < std::tie(topology.node_of_process[pb], pb, b);
  });
  return Mesh(shape, axis_names, std::move(ids), topology);
}

}  // namespace shard
