#pragma once
/// \file Shapes and boxes: the index math every layout is built from. No MPI.

#include <cstdint>
#include <string>
#include <vector>

namespace shard {

/// A global or local array shape, major dim first (row-major).
using Shape = std::vector<std::int64_t>;

/// Number of elements of a shape (1 for a 0-d shape).
std::int64_t num_elements(const Shape& shape);
/// The same, validated where a shape enters: ValueError naming `what` and the shape if a dim
/// is negative or the element count, or its bytes at `elem_size` bytes per element, does not
/// fit in int64.
std::int64_t checked_num_elements(const Shape& shape, std::size_t elem_size, const char* what);
/// "(19, 10)" — Python tuple notation, "()" for 0-d, "(7,)" for 1-d.
std::string to_string(const Shape& shape);

/// A hyper-rectangle of a global array: [offset, offset + extent) in every dim.
struct Box {
  Shape offset;
  Shape extent;

  int rank() const { return static_cast<int>(offset.size()); }
  std::int64_t size() const { return num_elements(extent); }
  bool empty() const { return size() == 0; }
  bool operator==(const Box&) const = default;
  /// Lexicographic order on (offset, extent): a stable order for plans and printing.
  bool operator<(const Box& other) const;
};

/// "[0:5, 0:10]" — numpy slice notation.
std::string to_string(const Box& box);
/// The whole array as one box.
Box full_box(const Shape& shape);
/// The intersection of two boxes of the same rank (empty extents where they do not meet).
Box intersect(const Box& a, const Box& b);

/// JAX's uneven-shard rule: dim of size n split m ways gives chunks of ceil(n/m);
/// chunk i covers [min(i*c, n), min((i+1)*c, n)), so the last chunks are short or empty.
struct Chunk {
  std::int64_t offset;
  std::int64_t extent;
};
Chunk chunk_of(std::int64_t n, std::int64_t parts, std::int64_t index);

/// Row-major strides of a shape, in elements.
Shape strides_of(const Shape& shape);

/// Copies the elements of `box` (global coordinates) from the dense row-major array `src`
/// of shape `src_shape` whose origin sits at global offset `src_origin`, into the dense
/// row-major array `dst` of shape `dst_shape` at global offset `dst_origin`. Both arrays
/// must contain the box. Works for any element size.
void copy_box(const void* src, const Shape& src_shape, const Shape& src_origin, void* dst,
              const Shape& dst_shape, const Shape& dst_origin, const Box& box,
              std::size_t elem_size);

}  // namespace shard
