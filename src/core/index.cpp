#include "shard/core/index.hpp"

#include <algorithm>

#include "shard/error.hpp"

namespace shard {

SliceRange resolve_slice(const Slice& s, std::int64_t n) {
  if (s.step == 0) raise<ValueError>("slice step cannot be zero");
  SliceRange r;
  r.step = s.step;
  auto bound = [&](const SliceBound& b, std::int64_t none_value, std::int64_t lo, std::int64_t hi) {
    if (b.is_none()) return none_value;
    std::int64_t v = b.value();
    if (v < 0) v += n;
    return std::clamp(v, lo, hi);
  };
  if (s.step > 0) {
    const std::int64_t start = bound(s.start, 0, 0, n);
    const std::int64_t stop = bound(s.stop, n, 0, n);
    r.start = start;
    r.count = stop > start ? (stop - start + s.step - 1) / s.step : 0;
  } else {
    const std::int64_t start = bound(s.start, n - 1, -1, n - 1);
    const std::int64_t stop = bound(s.stop, -1, -1, n - 1);
    r.start = start;
    r.count = start > stop ? (start - stop + (-s.step) - 1) / (-s.step) : 0;
  }
  if (r.count == 0) r.start = 0;
  return r;
}

std::int64_t resolve_index(std::int64_t i, std::int64_t n, int dim, const Shape& shape) {
  const std::int64_t j = i < 0 ? i + n : i;
  if (j < 0 || j >= n)
    raise<ShapeError>("index ", i, " is out of bounds for dim ", dim, " with size ", n, " (array of shape ",
                      to_string(shape), ")");
  return j;
}

bool IndexPlan::is_box() const {
  return std::all_of(ranges.begin(), ranges.end(), [](const SliceRange& r) { return r.step == 1 || r.count <= 1; });
}

Box IndexPlan::box() const {
  Box b;
  for (const auto& r : ranges) {
    b.offset.push_back(r.start);
    b.extent.push_back(r.count);
  }
  return b;
}

IndexPlan plan_index(const Shape& shape, const std::vector<Index>& index) {
  if (index.size() > shape.size())
    raise<ShapeError>("too many indices: ", index.size(), " for an array of shape ", to_string(shape), " (",
                      shape.size(), " dims)");
  IndexPlan p;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    const int dim = static_cast<int>(d);
    if (d < index.size() && std::holds_alternative<std::int64_t>(index[d])) {
      p.ranges.push_back({resolve_index(std::get<std::int64_t>(index[d]), shape[d], dim, shape), 1, 1});
      p.dropped.push_back(true);
      continue;
    }
    const Slice s = d < index.size() ? std::get<Slice>(index[d]) : Slice();
    p.ranges.push_back(resolve_slice(s, shape[d]));
    p.dropped.push_back(false);
    p.out_shape.push_back(p.ranges.back().count);
  }
  return p;
}

std::vector<int> Dims::resolve(int rank, const char* what) const {
  std::vector<int> out;
  if (dims_.empty()) {
    for (int d = 0; d < rank; ++d) out.push_back(d);
    return out;
  }
  for (int d : dims_) out.push_back(resolve_dim(d, rank, what));
  std::sort(out.begin(), out.end());
  if (std::adjacent_find(out.begin(), out.end()) != out.end())
    raise<ShapeError>(what, ": a dim is listed twice");
  return out;
}

int resolve_dim(int dim, int rank, const char* what) {
  if (dim < -rank || dim >= rank)
    raise<ShapeError>(what, ": dim ", dim, " is out of range for an array of rank ", rank);
  return dim < 0 ? dim + rank : dim;
}

}  // namespace shard
