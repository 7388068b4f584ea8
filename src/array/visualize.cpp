#include "shard/array/visualize.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

namespace shard {

namespace {

/// "CPU 0,2,4,6" for a sorted list of device ids.
std::string label(const std::vector<int>& devices) {
  std::string s = "CPU ";
  for (std::size_t i = 0; i < devices.size(); ++i) s += (i ? "," : "") + std::to_string(devices[i]);
  return s;
}

std::string repeat(const std::string& s, std::size_t n) {
  std::string out;
  for (std::size_t i = 0; i < n; ++i) out += s;
  return out;
}

std::string centered(const std::string& text, std::size_t width) {
  const std::size_t pad = width > text.size() ? width - text.size() : 0;
  return std::string(pad / 2, ' ') + text + std::string(pad - pad / 2, ' ');
}

/// Distinct non-empty (offset, extent) ranges of one dim over all devices, in order.
std::vector<std::pair<std::int64_t, std::int64_t>> parts_of(const std::vector<Box>& boxes, int dim) {
  std::set<std::pair<std::int64_t, std::int64_t>> s;
  for (const auto& b : boxes)
    if (!b.empty()) s.emplace(b.offset[dim], b.extent[dim]);
  return {s.begin(), s.end()};
}

/// A grid of rows x cols cells, each with its device label.
std::string draw_grid(const std::vector<std::vector<std::string>>& cells, int cell_height) {
  std::size_t width = 0;
  for (const auto& row : cells)
    for (const auto& c : row) width = std::max(width, c.size());
  width += 4;
  const std::size_t cols = cells.empty() ? 0 : cells[0].size();
  const std::string bar = repeat("─", width);
  auto rule = [&](const char* l, const char* m, const char* r) {
    std::string s = l;
    for (std::size_t j = 0; j < cols; ++j) s += bar + (j + 1 < cols ? m : r);
    return s + "\n";
  };
  std::string out = rule("┌", "┬", "┐");
  for (std::size_t i = 0; i < cells.size(); ++i) {
    for (int line = 0; line < cell_height; ++line) {
      out += "│";
      for (const auto& c : cells[i]) out += (line == cell_height / 2 ? centered(c, width) : std::string(width, ' ')) + "│";
      out += "\n";
    }
    out += i + 1 < cells.size() ? rule("├", "┼", "┤") : rule("└", "┴", "┘");
  }
  return out;
}

}  // namespace

std::string format_sharding(const Shape& shape, const NamedSharding& sharding, const std::string& dtype) {
  sharding.check_shape(shape);
  const Mesh& mesh = sharding.mesh();
  std::ostringstream os;
  os << (dtype.empty() ? "array" : dtype) << to_string(shape) << " on " << sharding.to_string() << "\n";

  std::vector<int> ids = mesh.device_ids();
  std::vector<Box> boxes;
  for (int d : ids) boxes.push_back(sharding.box(d, shape));
  std::map<Box, std::vector<int>> holders;  // box -> sorted device ids
  for (std::size_t i = 0; i < ids.size(); ++i) holders[boxes[i]].push_back(ids[i]);
  for (auto& [b, v] : holders) std::sort(v.begin(), v.end());

  std::vector<int> empty_devices;
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (boxes[i].empty() && num_elements(shape) > 0) empty_devices.push_back(ids[i]);
  std::sort(empty_devices.begin(), empty_devices.end());

  const int nd = static_cast<int>(shape.size());
  if (nd <= 2 && num_elements(shape) > 0) {
    const auto rows = nd == 2 ? parts_of(boxes, 0) : std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 1}};
    const auto cols = nd >= 1 ? parts_of(boxes, nd - 1) : std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 1}};
    std::vector<std::vector<std::string>> cells(rows.size(), std::vector<std::string>(cols.size()));
    for (const auto& [b, devs] : holders) {
      if (b.empty()) continue;
      const auto ri = nd == 2 ? std::find(rows.begin(), rows.end(), std::make_pair(b.offset[0], b.extent[0])) - rows.begin() : 0;
      const auto ci = nd >= 1 ? std::find(cols.begin(), cols.end(), std::make_pair(b.offset[nd - 1], b.extent[nd - 1])) - cols.begin() : 0;
      cells[ri][ci] = label(devs);
    }
    os << draw_grid(cells, rows.size() <= 2 && nd == 2 ? 3 : 1);
  } else {
    // N-D (or zero-size): how each dim is split, then every distinct box and its holders.
    for (int d = 0; d < nd; ++d) {
      os << "  dim " << d << " (" << shape[d] << "): ";
      const auto& e = sharding.spec()[d];
      if (e.is_none()) {
        os << "not split\n";
        continue;
      }
      os << "split " << sharding.num_parts(d) << " ways over " << e.to_string() << ":";
      for (const auto& [off, ext] : parts_of(boxes, d)) os << " [" << off << ":" << off + ext << "]";
      os << "\n";
    }
    for (const auto& [b, devs] : holders)
      if (!b.empty() || num_elements(shape) == 0) os << "  " << to_string(b) << "  " << label(devs) << "\n";
  }
  if (!empty_devices.empty()) os << "  empty shards: " << label(empty_devices) << "\n";
  return os.str();
}

}  // namespace shard
