// Shapes, boxes, JAX's uneven chunk rule and copy_box, checked against naive references.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <ostream>
#include <random>
#include <vector>

#include "shard/core/box.hpp"

namespace shard {

// Readable failure messages for boxes ("[0:5, 0:10]" instead of raw bytes).
inline void PrintTo(const Box& box, std::ostream* os) { *os << to_string(box); }

namespace {

TEST(Box, NumElements) {
  EXPECT_EQ(num_elements({}), 1);
  EXPECT_EQ(num_elements({7}), 7);
  EXPECT_EQ(num_elements({19, 10}), 190);
  EXPECT_EQ(num_elements({4, 0, 3}), 0);
  EXPECT_EQ(num_elements({3, 2, 5, 2}), 60);
}

TEST(Box, ShapeToString) {
  EXPECT_EQ(to_string(Shape{19, 10}), "(19, 10)");
  EXPECT_EQ(to_string(Shape{7}), "(7,)");
  EXPECT_EQ(to_string(Shape{}), "()");
  EXPECT_EQ(to_string(Shape{1, 2, 3}), "(1, 2, 3)");
}

TEST(Box, BoxToString) {
  EXPECT_EQ(to_string(Box{{0, 0}, {5, 10}}), "[0:5, 0:10]");
  EXPECT_EQ(to_string(Box{{15}, {4}}), "[15:19]");
  EXPECT_EQ(to_string(Box{{3, 2}, {0, 1}}), "[3:3, 2:3]");
  EXPECT_EQ(to_string(Box{}), "[]");
}

TEST(Box, BoxBasics) {
  const Box b{{1, 2, 3}, {4, 5, 6}};
  EXPECT_EQ(b.rank(), 3);
  EXPECT_EQ(b.size(), 120);
  EXPECT_FALSE(b.empty());
  EXPECT_TRUE((Box{{0, 0}, {3, 0}}).empty());
  const Box scalar{};
  EXPECT_EQ(scalar.rank(), 0);
  EXPECT_EQ(scalar.size(), 1);
  EXPECT_FALSE(scalar.empty());
  EXPECT_EQ(full_box({19, 10}), (Box{{0, 0}, {19, 10}}));
  EXPECT_EQ(full_box({}), Box{});
  EXPECT_TRUE((Box{{0}, {5}}) < (Box{{1}, {1}}));
  EXPECT_TRUE((Box{{1}, {1}}) < (Box{{1}, {2}}));
  EXPECT_FALSE((Box{{1}, {2}}) < (Box{{1}, {2}}));
}

TEST(Box, StridesOf) {
  EXPECT_EQ(strides_of({}), Shape{});
  EXPECT_EQ(strides_of({7}), Shape{1});
  EXPECT_EQ(strides_of({4, 3, 5}), (Shape{15, 5, 1}));
  EXPECT_EQ(strides_of({3, 2, 5, 2}), (Shape{20, 10, 2, 1}));
}

struct ChunkCase {
  std::int64_t n;
  std::int64_t parts;
  std::vector<std::int64_t> offsets;
  std::vector<std::int64_t> extents;
};

TEST(Box, ChunkOfTable) {
  const std::vector<ChunkCase> cases = {
      {8, 4, {0, 2, 4, 6}, {2, 2, 2, 2}},     // even
      {19, 4, {0, 5, 10, 15}, {5, 5, 5, 4}},  // uneven: ceil(19/4) = 5
      {3, 4, {0, 1, 2, 3}, {1, 1, 1, 0}},     // one empty chunk at offset 3
      {0, 3, {0, 0, 0}, {0, 0, 0}},           // empty dim
      {5, 4, {0, 2, 4, 5}, {2, 2, 1, 0}},     // short then empty, offset clamped to n
      {10, 1, {0}, {10}},                     // one part
      {1, 8, {0, 1, 1, 1, 1, 1, 1, 1}, {1, 0, 0, 0, 0, 0, 0, 0}},
  };
  for (const auto& c : cases) {
    for (std::int64_t i = 0; i < c.parts; ++i) {
      const Chunk ch = chunk_of(c.n, c.parts, i);
      EXPECT_EQ(ch.offset, c.offsets[i]) << "n=" << c.n << " parts=" << c.parts << " i=" << i;
      EXPECT_EQ(ch.extent, c.extents[i]) << "n=" << c.n << " parts=" << c.parts << " i=" << i;
    }
  }
}

// Every (n, parts): the chunks tile [0, n) in order, each has ceil(n/parts) elements or is the
// clamped tail, and a chunk starts at min(i*c, n).
TEST(Box, ChunkOfTilesEveryDim) {
  for (std::int64_t n = 0; n <= 40; ++n) {
    for (std::int64_t parts = 1; parts <= 12; ++parts) {
      std::int64_t c = 0;
      while (c * parts < n) ++c;  // ceil without the formula under test
      std::int64_t next = 0;
      for (std::int64_t i = 0; i < parts; ++i) {
        const Chunk ch = chunk_of(n, parts, i);
        const std::int64_t lo = std::min(i * c, n);
        const std::int64_t hi = std::min((i + 1) * c, n);
        ASSERT_EQ(ch.offset, lo) << n << "/" << parts << " #" << i;
        ASSERT_EQ(ch.extent, hi - lo) << n << "/" << parts << " #" << i;
        ASSERT_EQ(ch.offset, next);
        next += ch.extent;
      }
      ASSERT_EQ(next, n);
    }
  }
}

TEST(Box, Intersect) {
  const Box a{{0, 0}, {5, 10}};
  const Box b{{3, 4}, {10, 2}};
  EXPECT_EQ(intersect(a, b), (Box{{3, 4}, {2, 2}}));
  EXPECT_EQ(intersect(b, a), (Box{{3, 4}, {2, 2}}));
  EXPECT_EQ(intersect(a, a), a);
  // Disjoint along dim 0: empty extent there.
  const Box c{{6, 0}, {2, 10}};
  const Box ac = intersect(a, c);
  EXPECT_TRUE(ac.empty());
  EXPECT_EQ(ac.extent[0], 0);
  EXPECT_EQ(ac.extent[1], 10);
  // Touching boxes do not overlap.
  EXPECT_TRUE(intersect(Box{{0}, {5}}, Box{{5}, {5}}).empty());
  // Containment.
  EXPECT_EQ(intersect(Box{{0, 0, 0}, {4, 3, 5}}, Box{{1, 1, 1}, {2, 1, 3}}), (Box{{1, 1, 1}, {2, 1, 3}}));
  // 0-d boxes always meet.
  EXPECT_EQ(intersect(Box{}, Box{}), Box{});
}

TEST(Box, IntersectMatchesElementwise) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> off(0, 8);
  std::uniform_int_distribution<int> ext(0, 6);
  for (int t = 0; t < 300; ++t) {
    const int rank = 1 + t % 3;
    Box a{Shape(rank), Shape(rank)};
    Box b{Shape(rank), Shape(rank)};
    for (int d = 0; d < rank; ++d) {
      a.offset[d] = off(rng);
      a.extent[d] = ext(rng);
      b.offset[d] = off(rng);
      b.extent[d] = ext(rng);
    }
    const Box r = intersect(a, b);
    // Count the points in both boxes over a grid that covers them.
    std::int64_t both = 0;
    const int span = 16;
    std::int64_t total = 1;
    for (int d = 0; d < rank; ++d) total *= span;
    for (std::int64_t f = 0; f < total; ++f) {
      std::int64_t g = f;
      bool in_a = true;
      bool in_b = true;
      for (int d = rank - 1; d >= 0; --d) {
        const std::int64_t x = g % span;
        g /= span;
        in_a = in_a && x >= a.offset[d] && x < a.offset[d] + a.extent[d];
        in_b = in_b && x >= b.offset[d] && x < b.offset[d] + b.extent[d];
      }
      both += in_a && in_b;
    }
    ASSERT_EQ(r.size(), both) << to_string(a) << " & " << to_string(b);
  }
}

// Naive reference: element by element over the box.
void naive_copy(const std::vector<std::int32_t>& src, const Shape& src_shape, const Shape& src_origin,
                std::vector<std::int32_t>& dst, const Shape& dst_shape, const Shape& dst_origin,
                const Box& box) {
  const int rank = box.rank();
  const std::int64_t n = box.size();
  for (std::int64_t f = 0; f < n; ++f) {
    std::int64_t g = f;
    Shape idx(rank);
    for (int d = rank - 1; d >= 0; --d) {
      idx[d] = g % box.extent[d];
      g /= box.extent[d];
    }
    std::int64_t so = 0;
    std::int64_t dof = 0;
    for (int d = 0; d < rank; ++d) {
      so = so * src_shape[d] + (box.offset[d] + idx[d] - src_origin[d]);
      dof = dof * dst_shape[d] + (box.offset[d] + idx[d] - dst_origin[d]);
    }
    dst[dof] = src[so];
  }
}

TEST(Box, CopyBoxMatchesNaiveLoop) {
  std::mt19937 rng(12345);
  for (int rank = 1; rank <= 4; ++rank) {
    for (int trial = 0; trial < 60; ++trial) {
      // A box in global coordinates, and two arrays (at their own origins) that contain it.
      Box box{Shape(rank), Shape(rank)};
      Shape src_shape(rank), src_origin(rank), dst_shape(rank), dst_origin(rank);
      for (int d = 0; d < rank; ++d) {
        box.offset[d] = std::uniform_int_distribution<int>(0, 6)(rng);
        box.extent[d] = std::uniform_int_distribution<int>(trial == 0 ? 0 : 1, 4)(rng);
        src_origin[d] = box.offset[d] - std::uniform_int_distribution<int>(0, box.offset[d])(rng);
        dst_origin[d] = box.offset[d] - std::uniform_int_distribution<int>(0, box.offset[d])(rng);
        src_shape[d] =
            box.offset[d] + box.extent[d] - src_origin[d] + std::uniform_int_distribution<int>(0, 3)(rng);
        dst_shape[d] =
            box.offset[d] + box.extent[d] - dst_origin[d] + std::uniform_int_distribution<int>(0, 3)(rng);
      }
      std::vector<std::int32_t> src(static_cast<std::size_t>(num_elements(src_shape)));
      for (auto& v : src) v = static_cast<std::int32_t>(rng());
      std::vector<std::int32_t> dst(static_cast<std::size_t>(num_elements(dst_shape)));
      for (auto& v : dst) v = static_cast<std::int32_t>(rng());
      std::vector<std::int32_t> expect = dst;
      naive_copy(src, src_shape, src_origin, expect, dst_shape, dst_origin, box);
      copy_box(src.data(), src_shape, src_origin, dst.data(), dst_shape, dst_origin, box,
               sizeof(std::int32_t));
      ASSERT_EQ(dst, expect) << "rank " << rank << " box " << to_string(box) << " src "
                             << to_string(src_shape) << "@" << to_string(src_origin) << " dst "
                             << to_string(dst_shape) << "@" << to_string(dst_origin);
    }
  }
}

TEST(Box, CopyBoxOddElementSizeAndScalar) {
  // 3-byte elements: rows must be copied as whole elements.
  const Shape shape{4, 5};
  std::vector<unsigned char> src(static_cast<std::size_t>(num_elements(shape)) * 3);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7 + 1);
  std::vector<unsigned char> dst(2 * 3 * 3, 0);
  const Box box{{1, 2}, {2, 3}};
  copy_box(src.data(), shape, {0, 0}, dst.data(), {2, 3}, {1, 2}, box, 3);
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 3; ++c)
      for (int b = 0; b < 3; ++b) EXPECT_EQ(dst[(r * 3 + c) * 3 + b], src[((1 + r) * 5 + (2 + c)) * 3 + b]);

  // 0-d: one element.
  const double s = 3.5;
  double d = 0;
  copy_box(&s, {}, {}, &d, {}, {}, Box{}, sizeof(double));
  EXPECT_EQ(d, 3.5);

  // Empty box: destination untouched.
  std::vector<int> a(6, 1), b(6, 9);
  copy_box(a.data(), {2, 3}, {0, 0}, b.data(), {2, 3}, {0, 0}, Box{{0, 1}, {2, 0}}, sizeof(int));
  EXPECT_EQ(b, std::vector<int>(6, 9));
}

}  // namespace
}  // namespace shard
