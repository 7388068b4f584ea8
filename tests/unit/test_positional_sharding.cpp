// PositionalSharding: the reshape / replicate / transpose algebra of JAX's tutorial, and the
// conversion to NamedSharding checked against the layout the positions imply.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "shard/error.hpp"
#include "shard/sharding/positional_sharding.hpp"

namespace shard {

// Readable failure messages for boxes ("[0:5, 0:10]" instead of raw bytes).
inline void PrintTo(const Box& box, std::ostream* os) { *os << to_string(box); }

namespace {

using Sets = std::vector<std::vector<int>>;

Topology topo8() { return Topology::simulated(4, 2, 0); }

PositionalSharding ps8() { return PositionalSharding({0, 1, 2, 3, 4, 5, 6, 7}, topo8()); }

TEST(PositionalSharding, Construct) {
  const PositionalSharding p = ps8();
  EXPECT_EQ(p.shape(), std::vector<int>{8});
  EXPECT_EQ(p.ndim(), 1);
  EXPECT_EQ(p.device_sets(), (Sets{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  const PositionalSharding q({5, 2, 7}, topo8());
  EXPECT_EQ(q.device_sets(), (Sets{{5}, {2}, {7}}));
  EXPECT_THROW(PositionalSharding({}, topo8()), ShardingError);
  EXPECT_THROW(PositionalSharding({0, 0}, topo8()), ShardingError);
  EXPECT_THROW(PositionalSharding({0, 8}, topo8()), ShardingError);
  EXPECT_THROW(PositionalSharding({-1}, topo8()), ShardingError);
}

TEST(PositionalSharding, FromMesh) {
  const Mesh mesh({2, 4}, {"a", "b"}, {7, 6, 5, 4, 3, 2, 1, 0}, topo8());
  const PositionalSharding p = PositionalSharding::from_mesh(mesh);
  EXPECT_EQ(p.shape(), (std::vector<int>{2, 4}));
  EXPECT_EQ(p.device_sets(), (Sets{{7}, {6}, {5}, {4}, {3}, {2}, {1}, {0}}));
}

TEST(PositionalSharding, TutorialReplicate) {
  const PositionalSharding p = ps8().reshape({4, 2});
  EXPECT_EQ(p.shape(), (std::vector<int>{4, 2}));
  EXPECT_EQ(p.device_sets(), (Sets{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));

  const PositionalSharding r0 = p.replicate(0);
  EXPECT_EQ(r0.shape(), (std::vector<int>{1, 2}));
  EXPECT_EQ(r0.device_sets(), (Sets{{0, 2, 4, 6}, {1, 3, 5, 7}}));

  const PositionalSharding r1 = p.replicate(1);
  EXPECT_EQ(r1.shape(), (std::vector<int>{4, 1}));
  EXPECT_EQ(r1.device_sets(), (Sets{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));

  const PositionalSharding r0_squeezed = p.replicate(0, false);
  EXPECT_EQ(r0_squeezed.shape(), std::vector<int>{2});
  EXPECT_EQ(r0_squeezed.device_sets(), (Sets{{0, 2, 4, 6}, {1, 3, 5, 7}}));

  const PositionalSharding all = p.replicate();
  EXPECT_EQ(all.shape(), (std::vector<int>{1, 1}));
  EXPECT_EQ(all.device_sets(), (Sets{{0, 1, 2, 3, 4, 5, 6, 7}}));
  const PositionalSharding all_squeezed = p.replicate(PositionalSharding::kAllAxes, false);
  EXPECT_TRUE(all_squeezed.shape().empty());
  EXPECT_EQ(all_squeezed.device_sets(), (Sets{{0, 1, 2, 3, 4, 5, 6, 7}}));

  // Negative axes count from the end.
  EXPECT_EQ(p.replicate(-1).device_sets(), r1.device_sets());
  EXPECT_EQ(p.replicate(-2).device_sets(), r0.device_sets());
  EXPECT_THROW(p.replicate(2), ShardingError);
  EXPECT_THROW(p.replicate(-3), ShardingError);
}

TEST(PositionalSharding, Replicate3dAndSortedSets) {
  // Scrambled device order: sets come out sorted.
  const PositionalSharding p = PositionalSharding({7, 3, 5, 1, 6, 2, 4, 0}, topo8()).reshape({2, 2, 2});
  const PositionalSharding r = p.replicate(1);
  EXPECT_EQ(r.shape(), (std::vector<int>{2, 1, 2}));
  // Position (i, 0, k) unites (i, 0, k) and (i, 1, k): flat 4i+k and 4i+2+k.
  EXPECT_EQ(r.device_sets(), (Sets{{5, 7}, {1, 3}, {4, 6}, {0, 2}}));
  const PositionalSharding rr = r.replicate(0, false);
  EXPECT_EQ(rr.shape(), (std::vector<int>{1, 2}));
  EXPECT_EQ(rr.device_sets(), (Sets{{4, 5, 6, 7}, {0, 1, 2, 3}}));
}

TEST(PositionalSharding, Reshape) {
  const PositionalSharding p = ps8();
  EXPECT_EQ(p.reshape({-1, 2}).shape(), (std::vector<int>{4, 2}));
  EXPECT_EQ(p.reshape({2, -1}).shape(), (std::vector<int>{2, 4}));
  EXPECT_EQ(p.reshape({2, -1, 2}).shape(), (std::vector<int>{2, 2, 2}));
  EXPECT_EQ(p.reshape({-1}).shape(), std::vector<int>{8});
  EXPECT_EQ(p.reshape({2, 4}).device_sets(), p.device_sets());  // same row-major elements
  // Replicated sets survive a reshape.
  const PositionalSharding r = p.reshape({4, 2}).replicate(1, false).reshape({2, 2});
  EXPECT_EQ(r.device_sets(), (Sets{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));

  EXPECT_THROW(p.reshape({3, 3}), ShardingError);
  EXPECT_THROW(p.reshape({-1, 3}), ShardingError);
  EXPECT_THROW(p.reshape({-1, -1}), ShardingError);
  EXPECT_THROW(p.reshape({0, 8}), ShardingError);
  EXPECT_THROW(p.reshape({-2, -4}), ShardingError);
  EXPECT_THROW(p.reshape({16}), ShardingError);
  EXPECT_THROW(p.reshape({}), ShardingError);
}

TEST(PositionalSharding, Transpose) {
  const PositionalSharding p = ps8().reshape({4, 2});
  const PositionalSharding t = p.transpose();
  EXPECT_EQ(t.shape(), (std::vector<int>{2, 4}));
  // t[j][i] = p[i][j] = 2i + j.
  for (int j = 0; j < 2; ++j)
    for (int i = 0; i < 4; ++i) EXPECT_EQ(t.device_sets()[j * 4 + i], std::vector<int>{2 * i + j});
  EXPECT_EQ(p.transpose({1, 0}).device_sets(), t.device_sets());
  EXPECT_EQ(p.transpose({0, 1}).device_sets(), p.device_sets());

  // 3-D: out[a][b][c] = in[b][c][a] for perm (2, 0, 1) of shape (2, 3, 4) -> (4, 2, 3).
  std::vector<int> ids(24);
  std::iota(ids.begin(), ids.end(), 0);
  const PositionalSharding q = PositionalSharding(ids, Topology::simulated(6, 4, 0)).reshape({2, 3, 4});
  const PositionalSharding qt = q.transpose({2, 0, 1});
  ASSERT_EQ(qt.shape(), (std::vector<int>{4, 2, 3}));
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 2; ++b)
      for (int c = 0; c < 3; ++c)
        EXPECT_EQ(qt.device_sets()[(a * 2 + b) * 3 + c], std::vector<int>{(b * 3 + c) * 4 + a});
  // Default transpose reverses the axes.
  const PositionalSharding rev = q.transpose();
  ASSERT_EQ(rev.shape(), (std::vector<int>{4, 3, 2}));
  EXPECT_EQ(rev.device_sets()[(1 * 3 + 2) * 2 + 1], std::vector<int>{(1 * 3 + 2) * 4 + 1});

  EXPECT_THROW(p.transpose({0, 0}), ShardingError);
  EXPECT_THROW(p.transpose({0}), ShardingError);
  EXPECT_THROW(p.transpose({0, 1, 2}), ShardingError);
  EXPECT_THROW(p.transpose({1, 2}), ShardingError);
}

// The box a device must hold under a positional layout: position p splits dim k into
// shape[k] chunks of ceil(n / shape[k]) and takes chunk p[k]; dims past ndim are whole.
void expect_named_matches_positions(const PositionalSharding& ps, const Shape& array,
                                    const std::string& what) {
  SCOPED_TRACE(what + " on array " + to_string(array));
  const NamedSharding named = ps.to_named();
  const int nd = ps.ndim();
  std::vector<int> seen;
  for (std::size_t f = 0; f < ps.device_sets().size(); ++f) {
    Box expect{Shape(array.size(), 0), array};
    std::size_t rest = f;
    for (int k = nd - 1; k >= 0; --k) {
      const std::int64_t pos = static_cast<std::int64_t>(rest % ps.shape()[k]);
      rest /= ps.shape()[k];
      const std::int64_t n = array[k];
      const std::int64_t parts = ps.shape()[k];
      std::int64_t c = 0;
      while (c * parts < n) ++c;
      const std::int64_t lo = std::min(pos * c, n);
      expect.offset[k] = lo;
      expect.extent[k] = std::min((pos + 1) * c, n) - lo;
    }
    for (int d : ps.device_sets()[f]) {
      EXPECT_EQ(named.box(d, array), expect) << "device " << d;
      EXPECT_EQ(named.replicas(d), ps.device_sets()[f]) << "device " << d;
      seen.push_back(d);
    }
  }
  // The named sharding covers exactly the devices of the positional one.
  std::vector<int> mesh_ids = named.mesh().device_ids();
  std::sort(mesh_ids.begin(), mesh_ids.end());
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(mesh_ids, seen);
}

TEST(PositionalSharding, ToNamedMatchesPositions) {
  const PositionalSharding p = ps8().reshape({4, 2});
  const PositionalSharding scrambled = PositionalSharding({6, 1, 7, 0, 3, 2, 5, 4}, topo8()).reshape({2, 4});
  const std::vector<std::pair<std::string, PositionalSharding>> cases = {
      {"reshape(4,2)", p},
      {"replicate(0)", p.replicate(0)},
      {"replicate(1)", p.replicate(1)},
      {"replicate()", p.replicate()},
      {"transpose", p.transpose()},
      {"scrambled(2,4)", scrambled},
      {"scrambled.replicate(1)", scrambled.replicate(1)},
      {"reshape(8,1)", ps8().reshape({8, 1})},
      {"reshape(1,8)", ps8().reshape({1, 8})},
  };
  for (const auto& [name, ps] : cases) {
    expect_named_matches_positions(ps, {8, 4}, name);
    expect_named_matches_positions(ps, {19, 10}, name);
  }
}

TEST(PositionalSharding, ToNamedStructure) {
  const PositionalSharding p = ps8().reshape({4, 2}).replicate(0);
  const NamedSharding n = p;  // implicit conversion, like passing a sharding to device_put
  EXPECT_EQ(n.mesh().shape(), (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(n.mesh().axis_names(), (std::vector<std::string>{"p0", "p1", "replica"}));
  EXPECT_EQ(n.spec(), P(None, "p1"));  // a dim of size 1 splits nothing
  EXPECT_EQ(p.to_named(1).spec(), P("p1"));  // a 1-D array takes the trailing dim
  EXPECT_EQ(n.replica_index(0), 0);
  EXPECT_EQ(n.replica_index(6), 3);
  const NamedSharding plain = ps8().reshape({4, 2}).to_named();
  EXPECT_EQ(plain.mesh().shape(), (std::vector<int>{4, 2}));
  EXPECT_EQ(plain.mesh().device_ids(), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_FALSE(plain.is_fully_replicated());
}

TEST(PositionalSharding, ToString1d) {
  EXPECT_EQ(ps8().to_string(),
            "PositionalSharding([{CPU 0} {CPU 1} {CPU 2} {CPU 3} {CPU 4} {CPU 5} {CPU 6} {CPU 7}])");
  EXPECT_EQ(ps8().reshape({4, 2}).replicate(0).to_string(),
            "PositionalSharding([[{CPU 0, 2, 4, 6} {CPU 1, 3, 5, 7}]])");
}

// Like numpy's array2string (which JAX's repr uses), each continuation line starts right
// under the '[' it continues: after "PositionalSharding(" (19 columns) plus one column per
// bracket still open.
std::vector<std::size_t> indents(const std::string& text) {
  std::istringstream is(text);
  std::vector<std::size_t> out;
  for (std::string line; std::getline(is, line);) out.push_back(line.find_first_not_of(' '));
  return out;
}

TEST(PositionalSharding, ToStringRowsAlign) {
  const std::string two_d = ps8().reshape({4, 2}).to_string();
  EXPECT_EQ(two_d.substr(0, two_d.find('\n')), "PositionalSharding([[{CPU 0} {CPU 1}]");
  EXPECT_EQ(indents(two_d), (std::vector<std::size_t>{0, 20, 20, 20})) << two_d;
  const std::string three_d = ps8().reshape({2, 2, 2}).to_string();
  EXPECT_EQ(indents(three_d), (std::vector<std::size_t>{0, 21, 20, 21})) << three_d;
}

}  // namespace
}  // namespace shard
