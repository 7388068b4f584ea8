#include "shard/core/box.hpp"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <limits>
#include <tuple>

#include "shard/error.hpp"

namespace shard {

std::int64_t num_elements(const Shape& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::int64_t checked_num_elements(const Shape& shape, std::size_t elem_size, const char* what) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  std::int64_t n = 1;
  bool overflow = false;
  for (auto d : shape) {
    if (d < 0)
      raise<ValueError>(what, ": shape ", to_string(shape), " has a negative dimension; every dim must be >= 0");
    if (d != 0 && n > kMax / d) overflow = true;
    else n *= d;
  }
  for (auto d : shape)
    if (d == 0) return 0;  // an empty array is valid however large its other dims
  const auto es = static_cast<std::int64_t>(elem_size);
  if (overflow || (es > 0 && n > kMax / es))
    raise<ValueError>(what, ": shape ", to_string(shape), overflow ? " has more elements than int64 can count" : "",
                      overflow ? "" : " needs more bytes than int64 can count", " (", es,
                      " bytes per element); no array of this shape can exist");
  return n;
}

std::string to_string(const Shape& shape) {
  std::ostringstream os;
  os << '(';
  for (std::size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  if (shape.size() == 1) os << ',';
  os << ')';
  return os.str();
}

bool Box::operator<(const Box& other) const {
  return std::tie(offset, extent) < std::tie(other.offset, other.extent);
}

std::string to_string(const Box& box) {
  std::ostringstream os;
  os << '[';
  for (int i = 0; i < box.rank(); ++i)
    os << (i ? ", " : "") << box.offset[i] << ':' << box.offset[i] + box.extent[i];
  os << ']';
  return os.str();
}

Box full_box(const Shape& shape) { return Box{Shape(shape.size(), 0), shape}; }

Box intersect(const Box& a, const Box& b) {
  Box r{Shape(a.offset.size()), Shape(a.offset.size())};
  for (int i = 0; i < a.rank(); ++i) {
    const auto lo = std::max(a.offset[i], b.offset[i]);
    const auto hi = std::min(a.offset[i] + a.extent[i], b.offset[i] + b.extent[i]);
    r.offset[i] = lo;
    r.extent[i] = std::max<std::int64_t>(0, hi - lo);
  }
  return r;
}

Chunk chunk_of(std::int64_t n, std::int64_t parts, std::int64_t index) {
  const std::int64_t c = parts > 0 ? (n + parts - 1) / parts : n;
  const std::int64_t lo = std::min(index * c, n);
  const std::int64_t hi = std::min((index + 1) * c, n);
  return {lo, hi - lo};
}

Shape strides_of(const Shape& shape) {
  Shape s(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * shape[i + 1];
  return s;
}

void copy_box(const void* src, const Shape& src_shape, const Shape& src_origin, void* dst,
              const Shape& dst_shape, const Shape& dst_origin, const Box& box,
              std::size_t elem_size) {
  if (box.empty()) return;
  const int rank = box.rank();
  auto* out = static_cast<char*>(dst);
  const auto* in = static_cast<const char*>(src);
  if (rank == 0) {
    std::memcpy(out, in, elem_size);
    return;
  }
  const Shape ss = strides_of(src_shape);
  const Shape ds = strides_of(dst_shape);
  // Walk every row (all dims but the last) of the box; each row is one contiguous memcpy.
  const std::size_t row_bytes = static_cast<std::size_t>(box.extent[rank - 1]) * elem_size;
  Shape idx(rank, 0);
  const std::int64_t rows = num_elements(box.extent) / box.extent[rank - 1];
  for (std::int64_t r = 0; r < rows; ++r) {
    std::int64_t so = 0;
    std::int64_t doff = 0;
    for (int d = 0; d < rank; ++d) {
      const std::int64_t g = box.offset[d] + idx[d];
      so += (g - src_origin[d]) * ss[d];
      doff += (g - dst_origin[d]) * ds[d];
    }
    std::memcpy(out + doff * static_cast<std::int64_t>(elem_size),
                in + so * static_cast<std::int64_t>(elem_size), row_bytes);
    for (int d = rank - 2; d >= 0; --d) {  // odometer over the leading dims
      if (++idx[d] < box.extent[d]) break;
      idx[d] = 0;
    }
  }
}

}  // namespace shard
