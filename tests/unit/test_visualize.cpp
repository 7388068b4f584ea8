// format_sharding: the box-drawn grid for 1-D and 2-D arrays, the per-dim summary for N-D
// arrays and the list of empty shards. Structure is checked, not exact spacing.

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "shard/error.hpp"
#include "shard/sharding/mesh.hpp"
#include "shard/sharding/named_sharding.hpp"
#include "shard/array/visualize.hpp"

namespace shard {
namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::istringstream is(text);
  std::vector<std::string> out;
  for (std::string line; std::getline(is, line);) out.push_back(line);
  return out;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(' ');
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(' ') - b + 1);
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (auto p = s.find(what); p != std::string::npos; p = s.find(what, p + what.size())) ++n;
  return n;
}

// The parsed grid: the labels of each cell row (lines with a label), and the rule counts.
struct Grid {
  std::vector<std::vector<std::string>> rows;  // non-blank cell rows, cells trimmed
  int cell_lines = 0;                          // lines starting with '│'
  int columns = -1;                            // cells per '│' line (-1: none, -2: ragged)
  int top = 0, mid = 0, bottom = 0;            // ┌ ├ └ rule lines
  int top_tees = 0, bottom_tees = 0;           // ┬ and ┴ on the top and bottom rules
};

Grid parse_grid(const std::string& text) {
  Grid g;
  const std::string bar = "│";
  for (const auto& line : lines_of(text)) {
    if (line.rfind("┌", 0) == 0) {
      ++g.top;
      g.top_tees += count(line, "┬");
      EXPECT_EQ(line.substr(line.size() - std::string("┐").size()), "┐") << line;
    } else if (line.rfind("├", 0) == 0) {
      ++g.mid;
      EXPECT_EQ(line.substr(line.size() - std::string("┤").size()), "┤") << line;
    } else if (line.rfind("└", 0) == 0) {
      ++g.bottom;
      g.bottom_tees += count(line, "┴");
      EXPECT_EQ(line.substr(line.size() - std::string("┘").size()), "┘") << line;
    } else if (line.rfind(bar, 0) == 0) {
      ++g.cell_lines;
      std::vector<std::string> cells;
      std::size_t pos = bar.size();
      for (auto next = line.find(bar, pos); next != std::string::npos; next = line.find(bar, pos)) {
        cells.push_back(trim(line.substr(pos, next - pos)));
        pos = next + bar.size();
      }
      const int n = static_cast<int>(cells.size());
      g.columns = g.columns == -1 || g.columns == n ? n : -2;
      bool blank = true;
      for (const auto& c : cells) blank = blank && c.empty();
      if (!blank) g.rows.push_back(cells);
    }
  }
  return g;
}

std::string cpu(int d) { return "CPU " + std::to_string(d); }

Mesh mesh_4x2() { return make_mesh({4, 2}, {"a", "b"}, Topology::simulated(4, 2, 0)); }

TEST(Visualize, Grid4x2FullySplit) {
  const std::string text = format_sharding({8, 8}, NamedSharding(mesh_4x2(), P("a", "b")), "float32");
  SCOPED_TRACE(text);
  const auto lines = lines_of(text);
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines[0].find("float32(8, 8)"), std::string::npos);
  EXPECT_NE(lines[0].find("NamedSharding(Mesh('a': 4, 'b': 2), P('a', 'b'))"), std::string::npos);
  const Grid g = parse_grid(text);
  EXPECT_EQ(g.top, 1);
  EXPECT_EQ(g.mid, 3);
  EXPECT_EQ(g.bottom, 1);
  EXPECT_EQ(g.top_tees, 1);
  EXPECT_EQ(g.bottom_tees, 1);
  EXPECT_EQ(g.cell_lines, 4);
  EXPECT_EQ(g.columns, 2);
  ASSERT_EQ(g.rows.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(g.rows[i], (std::vector<std::string>{cpu(2 * i), cpu(2 * i + 1)}));
  for (const char* glyph : {"┌", "┬", "┐", "│", "├", "┼", "┤", "└", "┴", "┘"})
    EXPECT_NE(text.find(glyph), std::string::npos) << glyph;
  EXPECT_EQ(count(text, "┼"), 3);
  EXPECT_EQ(text.find("empty shards"), std::string::npos);
}

// Cells follow the mesh position of each device, not its id.
TEST(Visualize, GridFollowsMeshOrder) {
  const Mesh mesh = make_mesh({4, 2}, {"a", "b"}, Topology::simulated(4, 2, 0, {0, 1, 0, 1}));
  const std::string text = format_sharding({8, 8}, NamedSharding(mesh, P("a", "b")));
  SCOPED_TRACE(text);
  const Grid g = parse_grid(text);
  ASSERT_EQ(g.rows.size(), 4u);
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(g.rows[i],
              (std::vector<std::string>{cpu(mesh.device_at({i, 0})), cpu(mesh.device_at({i, 1}))}));
  EXPECT_NE(mesh.device_at({1, 0}), 2);  // the layout really differs from id order
}

TEST(Visualize, RowsReplicatedAlongB) {
  const std::string text = format_sharding({8, 8}, NamedSharding(mesh_4x2(), P("a", None)));
  SCOPED_TRACE(text);
  const Grid g = parse_grid(text);
  EXPECT_EQ(g.columns, 1);
  EXPECT_EQ(g.cell_lines, 4);
  EXPECT_EQ(g.mid, 3);
  EXPECT_EQ(g.top_tees, 0);
  EXPECT_EQ(g.rows,
            (std::vector<std::vector<std::string>>{{"CPU 0,1"}, {"CPU 2,3"}, {"CPU 4,5"}, {"CPU 6,7"}}));
}

TEST(Visualize, ColumnsReplicatedAlongA) {
  const std::string text = format_sharding({8, 8}, NamedSharding(mesh_4x2(), P(None, "b")));
  SCOPED_TRACE(text);
  const Grid g = parse_grid(text);
  EXPECT_EQ(g.columns, 2);
  EXPECT_EQ(g.mid, 0);
  EXPECT_EQ(g.top, 1);
  EXPECT_EQ(g.bottom, 1);
  EXPECT_GE(g.cell_lines, 1);
  EXPECT_EQ(g.rows, (std::vector<std::vector<std::string>>{{"CPU 0,2,4,6", "CPU 1,3,5,7"}}));
}

TEST(Visualize, FullyReplicatedAndScalar) {
  const Grid all = parse_grid(format_sharding({8, 8}, NamedSharding(mesh_4x2(), P())));
  EXPECT_EQ(all.rows, (std::vector<std::vector<std::string>>{{"CPU 0,1,2,3,4,5,6,7"}}));
  const Grid scalar = parse_grid(format_sharding({}, NamedSharding(mesh_4x2(), P())));
  EXPECT_EQ(scalar.rows, (std::vector<std::vector<std::string>>{{"CPU 0,1,2,3,4,5,6,7"}}));
}

TEST(Visualize, OneDimensionalIsOneRow) {
  const std::string text = format_sharding({16}, NamedSharding(mesh_4x2(), P(SpecEntry{"a", "b"})));
  SCOPED_TRACE(text);
  const Grid g = parse_grid(text);
  EXPECT_EQ(g.cell_lines, 1);
  EXPECT_EQ(g.mid, 0);
  EXPECT_EQ(g.columns, 8);
  EXPECT_EQ(g.top_tees, 7);
  ASSERT_EQ(g.rows.size(), 1u);
  for (int d = 0; d < 8; ++d) EXPECT_EQ(g.rows[0][d], cpu(d));

  // 'b' major: mesh position (i, j) holds part j*4 + i, so device 2i+j sits in column 4j+i.
  const Grid ba = parse_grid(format_sharding({16}, NamedSharding(mesh_4x2(), P(SpecEntry{"b", "a"}))));
  ASSERT_EQ(ba.rows.size(), 1u);
  ASSERT_EQ(ba.rows[0].size(), 8u);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 2; ++j) EXPECT_EQ(ba.rows[0][4 * j + i], cpu(2 * i + j));
}

TEST(Visualize, UnevenListsEmptyShards) {
  const Mesh mesh({4}, {"x"}, {0, 1, 2, 3}, Topology::simulated(4, 1, 0));
  const std::string text = format_sharding({3, 4}, NamedSharding(mesh, P("x")));
  SCOPED_TRACE(text);
  const Grid g = parse_grid(text);
  EXPECT_EQ(g.rows, (std::vector<std::vector<std::string>>{{"CPU 0"}, {"CPU 1"}, {"CPU 2"}}));
  EXPECT_EQ(text.find("CPU 3"), text.find("empty shards: CPU 3") + std::string("empty shards: ").size());
  EXPECT_EQ(count(text, "empty shards"), 1);

  const std::string one_d = format_sharding({3}, NamedSharding(mesh, P("x")));
  EXPECT_NE(one_d.find("empty shards: CPU 3"), std::string::npos) << one_d;
  EXPECT_EQ(parse_grid(one_d).rows, (std::vector<std::vector<std::string>>{{"CPU 0", "CPU 1", "CPU 2"}}));

  // 1 row over 4 devices: three empty shards, listed together.
  const std::string single = format_sharding({1, 2}, NamedSharding(mesh, P("x")));
  EXPECT_NE(single.find("empty shards: CPU 1,2,3"), std::string::npos) << single;
}

TEST(Visualize, ThreeDimensionalSummary) {
  const Mesh mesh = mesh_4x2();
  const NamedSharding s(mesh, P("a", None, "b"));
  const Shape shape{4, 6, 8};
  const std::string text = format_sharding(shape, s);
  SCOPED_TRACE(text);
  EXPECT_EQ(text.find("┌"), std::string::npos);  // no grid
  const auto lines = lines_of(text);
  auto line_with = [&](const std::string& what) -> std::string {
    for (const auto& l : lines)
      if (l.find(what) != std::string::npos) return l;
    return "";
  };
  const std::string d0 = line_with("dim 0");
  EXPECT_NE(d0.find("split 4 ways"), std::string::npos) << d0;
  EXPECT_NE(d0.find("'a'"), std::string::npos) << d0;
  EXPECT_NE(d0.find("[0:1] [1:2] [2:3] [3:4]"), std::string::npos) << d0;
  const std::string d1 = line_with("dim 1");
  EXPECT_NE(d1.find("not split"), std::string::npos) << d1;
  const std::string d2 = line_with("dim 2");
  EXPECT_NE(d2.find("split 2 ways"), std::string::npos) << d2;
  EXPECT_NE(d2.find("[0:4] [4:8]"), std::string::npos) << d2;
  // Every device's box, with its label, in mesh order.
  std::size_t last = 0;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 2; ++j) {
      const std::string box = "[" + std::to_string(i) + ":" + std::to_string(i + 1) + ", 0:6, " +
                              std::to_string(4 * j) + ":" + std::to_string(4 * j + 4) + "]";
      const std::string l = line_with(box);
      ASSERT_FALSE(l.empty()) << box;
      EXPECT_EQ(trim(l.substr(l.find(']') + 1)), cpu(2 * i + j)) << l;
      const std::size_t at = text.find(box);
      EXPECT_GT(at, last) << box;
      last = at;
    }

  // Replicated boxes list all their holders on one line.
  const std::string rep = format_sharding({2, 3, 4}, NamedSharding(mesh, P(None, None, "b")));
  EXPECT_NE(rep.find("[0:2, 0:3, 0:2]  CPU 0,2,4,6"), std::string::npos) << rep;
  EXPECT_NE(rep.find("[0:2, 0:3, 2:4]  CPU 1,3,5,7"), std::string::npos) << rep;
}

TEST(Visualize, SpecLongerThanRankThrows) {
  EXPECT_THROW(format_sharding({8}, NamedSharding(mesh_4x2(), P("a", "b"))), ShardingError);
}

}  // namespace
}  // namespace shard
