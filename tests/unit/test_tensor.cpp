// Tensor<T>: shapes, value semantics, indexing, slicing, equality and the memory counter.

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "shard/error.hpp"
#include "shard/runtime/runtime.hpp"
#include "shard/core/tensor.hpp"

namespace shard {
namespace {

std::vector<int> iota_values(std::int64_t n, int start = 0) {
  std::vector<int> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(Tensor, ShapeAndSize) {
  const Tensor<float> t({3, 4, 5});
  EXPECT_EQ(t.shape(), (Shape{3, 4, 5}));
  EXPECT_EQ(t.rank(), 3);
  EXPECT_EQ(t.size(), 60);
  EXPECT_EQ(t.bytes(), 60 * sizeof(float));
  EXPECT_FALSE(t.empty());
  EXPECT_NE(t.data(), nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data()) % 16, 0u);  // operator new: 16-byte aligned
  EXPECT_EQ(t.end() - t.begin(), 60);

  const Tensor<double> empty;
  EXPECT_EQ(empty.shape(), Shape{0});
  EXPECT_EQ(empty.size(), 0);
  EXPECT_TRUE(empty.empty());
  EXPECT_EQ(empty.data(), nullptr);

  const Tensor<int> zero_dim_size({4, 0, 2});
  EXPECT_EQ(zero_dim_size.size(), 0);
  EXPECT_TRUE(zero_dim_size.empty());
  EXPECT_EQ(zero_dim_size.rank(), 3);
}

TEST(Tensor, ZeroDimensional) {
  Tensor<double> s(Shape{}, 2.5);
  EXPECT_EQ(s.rank(), 0);
  EXPECT_EQ(s.size(), 1);
  EXPECT_FALSE(s.empty());
  EXPECT_EQ(s(), 2.5);
  s() = -1.0;
  EXPECT_EQ(s.flat(0), -1.0);
  EXPECT_THROW(s(0), ShapeError);
}

TEST(Tensor, FillAndValues) {
  const Tensor<std::int64_t> f({2, 3}, std::int64_t{7});
  for (auto v : f) EXPECT_EQ(v, 7);
  const Tensor<int> v({2, 3}, iota_values(6, 10));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(v.flat(i), 10 + i);
  EXPECT_THROW(Tensor<int>({2, 3}, iota_values(5)), ShapeError);
  EXPECT_THROW(Tensor<int>({2, 3}, iota_values(7)), ShapeError);
}

TEST(Tensor, MultiIndexIsRowMajor) {
  Tensor<int> t({3, 4, 5}, iota_values(60));
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j)
      for (int k = 0; k < 5; ++k) EXPECT_EQ(t(i, j, k), (i * 4 + j) * 5 + k);
  t(2, 1, 3) = -5;
  EXPECT_EQ(t.flat((2 * 4 + 1) * 5 + 3), -5);
  const Tensor<int>& ct = t;
  EXPECT_EQ(ct(2, 1, 3), -5);
  EXPECT_THROW(t(1, 2), ShapeError);
  EXPECT_THROW(t(1, 2, 3, 4), ShapeError);
}

TEST(Tensor, CopyIsDeep) {
  Tensor<int> a({4, 3}, iota_values(12));
  Tensor<int> b = a;
  EXPECT_EQ(b.shape(), a.shape());
  EXPECT_NE(b.data(), a.data());
  EXPECT_TRUE(b == a);
  b(1, 1) = 100;
  EXPECT_EQ(a(1, 1), 4);
  EXPECT_FALSE(b == a);

  Tensor<int> c({1}, 0);
  c = a;  // copy assignment
  EXPECT_EQ(c.shape(), (Shape{4, 3}));
  EXPECT_NE(c.data(), a.data());
  c.flat(0) = 55;
  EXPECT_EQ(a.flat(0), 0);
  const Tensor<int>& self = c;
  c = self;  // self-assignment keeps the contents
  EXPECT_EQ(c.flat(0), 55);
  EXPECT_EQ(c.size(), 12);
}

TEST(Tensor, MoveLeavesSourceEmpty) {
  Tensor<float> a({5, 6}, 1.5f);
  const float* p = a.data();
  Tensor<float> b = std::move(a);
  EXPECT_EQ(b.data(), p);  // the buffer moved, not copied
  EXPECT_EQ(b.shape(), (Shape{5, 6}));
  EXPECT_EQ(b(4, 5), 1.5f);
  // NOLINTBEGIN(bugprone-use-after-move): the moved-from state is specified.
  EXPECT_EQ(a.shape(), Shape{0});
  EXPECT_EQ(a.size(), 0);
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(a.data(), nullptr);

  Tensor<float> c({2}, 0.0f);
  c = std::move(b);
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(c.shape(), (Shape{5, 6}));
  EXPECT_EQ(b.shape(), Shape{0});
  EXPECT_EQ(b.size(), 0);
  EXPECT_EQ(b.data(), nullptr);
  // NOLINTEND(bugprone-use-after-move)
}

TEST(Tensor, SliceMatchesLoop) {
  const Tensor<int> t({4, 5, 6}, iota_values(120));
  const Box box{{1, 2, 3}, {2, 3, 2}};
  const Tensor<int> s = t.slice(box);
  ASSERT_EQ(s.shape(), (Shape{2, 3, 2}));
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 2; ++k) EXPECT_EQ(s(i, j, k), t(1 + i, 2 + j, 3 + k));
  // The whole tensor, a single element and an empty box.
  EXPECT_TRUE(t.slice(full_box(t.shape())) == t);
  const Tensor<int> one = t.slice(Box{{3, 4, 5}, {1, 1, 1}});
  EXPECT_EQ(one.size(), 1);
  EXPECT_EQ(one.flat(0), 119);
  const Tensor<int> none = t.slice(Box{{2, 0, 0}, {0, 5, 6}});
  EXPECT_EQ(none.shape(), (Shape{0, 5, 6}));
  EXPECT_TRUE(none.empty());
  // 1-D.
  const Tensor<double> v({7}, std::vector<double>{0, 1, 2, 3, 4, 5, 6});
  const Tensor<double> mid = v.slice(Box{{2}, {3}});
  EXPECT_EQ(mid, Tensor<double>({3}, std::vector<double>{2, 3, 4}));
}

TEST(Tensor, Equality) {
  const Tensor<int> a({2, 3}, iota_values(6));
  EXPECT_TRUE(a == Tensor<int>({2, 3}, iota_values(6)));
  EXPECT_FALSE(a == Tensor<int>({3, 2}, iota_values(6)));  // same data, other shape
  EXPECT_FALSE(a == Tensor<int>({6}, iota_values(6)));
  std::vector<int> other = iota_values(6);
  other[5] = 0;
  EXPECT_FALSE(a == Tensor<int>({2, 3}, other));
  EXPECT_TRUE(Tensor<int>() == Tensor<int>());
  EXPECT_TRUE(Tensor<int>({0, 3}) == Tensor<int>({0, 3}));
  EXPECT_FALSE(Tensor<int>({0, 3}) == Tensor<int>({3, 0}));
}

TEST(Tensor, MemoryStatsFollowLiveBuffers) {
  const std::int64_t base = tensor_memory_stats().live_bytes;
  {
    Tensor<double> a({100, 10});
    EXPECT_EQ(tensor_memory_stats().live_bytes, base + 8000);
    {
      Tensor<double> b = a;  // a deep copy allocates
      EXPECT_EQ(tensor_memory_stats().live_bytes, base + 16000);
      Tensor<double> c = std::move(b);  // a move does not
      EXPECT_EQ(tensor_memory_stats().live_bytes, base + 16000);
    }
    EXPECT_EQ(tensor_memory_stats().live_bytes, base + 8000);
    Tensor<int> empty({0, 5});
    EXPECT_EQ(tensor_memory_stats().live_bytes, base + 8000);
    a = Tensor<double>({10});  // the old buffer is released
    EXPECT_EQ(tensor_memory_stats().live_bytes, base + 80);
  }
  EXPECT_EQ(tensor_memory_stats().live_bytes, base);
}

TEST(Tensor, MemoryPeak) {
  const std::int64_t base = tensor_memory_stats().live_bytes;
  reset_tensor_memory_peak();
  EXPECT_EQ(tensor_memory_stats().peak_bytes, base);
  {
    Tensor<float> big({1000});
    { Tensor<float> bigger({3000}); }
    EXPECT_EQ(tensor_memory_stats().peak_bytes, base + 16000);
    EXPECT_EQ(tensor_memory_stats().live_bytes, base + 4000);
    reset_tensor_memory_peak();
    EXPECT_EQ(tensor_memory_stats().peak_bytes, base + 4000);
  }
  EXPECT_EQ(tensor_memory_stats().peak_bytes, base + 4000);  // the peak stays until reset
  EXPECT_EQ(tensor_memory_stats().live_bytes, base);
}

TEST(Tensor, LargeBuffersStartOnACacheLine) {
  // From 16 KiB on (sizes the buffer cache keeps), every buffer starts on a 64-byte line,
  // whether fresh, reused from the cache or allocated with the cache off; contents survive.
  const bool was = keep_freed_memory();
  for (bool keep : {true, false}) {
    set_keep_freed_memory(keep);
    for (std::int64_t n : {2048, 2049, 4099, 131075, 1 << 20}) {
      for (int round = 0; round < 3; ++round) {
        std::vector<Tensor<double>> ts;
        for (int k = 0; k < 3; ++k) {
          ts.emplace_back(Shape{n});
          EXPECT_EQ(reinterpret_cast<std::uintptr_t>(ts.back().data()) % 64, 0u) << n << " doubles";
          for (std::int64_t i = 0; i < n; ++i) ts.back().flat(i) = static_cast<double>(i * (k + 3) % 1009) - 500.5;
        }
        for (int k = 0; k < 3; ++k)
          for (std::int64_t i = 0; i < n; i += 97)
            ASSERT_EQ(ts[static_cast<std::size_t>(k)].flat(i), static_cast<double>(i * (k + 3) % 1009) - 500.5);
      }
    }
    release_cached_tensor_memory();
  }
  set_keep_freed_memory(was);
}

TEST(Tensor, BorrowViewsMemoryItDoesNotOwn) {
  std::vector<int> memory = iota_values(12, 5);
  const std::int64_t base = tensor_memory_stats().live_bytes;
  {
    Tensor<int> v = Tensor<int>::borrow(memory.data(), {3, 4});
    EXPECT_FALSE(v.owns_memory());
    EXPECT_EQ(v.data(), memory.data());
    EXPECT_EQ(v.shape(), (Shape{3, 4}));
    EXPECT_EQ(v(2, 1), 14);
    EXPECT_EQ(tensor_memory_stats().live_bytes, base);  // nothing allocated
    v(0, 0) = -1;  // writes go to the borrowed memory
    EXPECT_EQ(memory[0], -1);

    Tensor<int> copy = v;  // an owning deep copy
    EXPECT_TRUE(copy.owns_memory());
    EXPECT_NE(copy.data(), memory.data());
    EXPECT_EQ(copy, v);
    EXPECT_EQ(tensor_memory_stats().live_bytes, base + 48);
    copy(0, 1) = 99;
    EXPECT_EQ(memory[1], 6);

    Tensor<int> moved = std::move(v);  // the borrow moves; the source is an empty owning tensor
    EXPECT_FALSE(moved.owns_memory());
    EXPECT_EQ(moved.data(), memory.data());
    EXPECT_TRUE(v.owns_memory());  // NOLINT(bugprone-use-after-move): documented moved-from state
    EXPECT_EQ(v.size(), 0);

    Tensor<int> target({2});
    target = std::move(moved);  // move-assign releases target's own buffer, keeps the borrow
    EXPECT_FALSE(target.owns_memory());
    EXPECT_EQ(tensor_memory_stats().live_bytes, base + 48);
    target = Tensor<int>({1});  // replacing a borrow frees nothing it did not own
    EXPECT_TRUE(target.owns_memory());
  }
  EXPECT_EQ(tensor_memory_stats().live_bytes, base);
  EXPECT_EQ(memory[0], -1);  // the memory outlives its views, untouched by their destructors
  EXPECT_EQ(memory[11], 16);
}

}  // namespace
}  // namespace shard
