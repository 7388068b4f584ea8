// NamedSharding: validation, and box/replica math over every spec of several meshes and
// shapes, checked against a reference computed here from mesh coordinates.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <numeric>
#include <ostream>
#include <string>
#include <vector>

#include "shard/error.hpp"
#include "shard/sharding/mesh.hpp"
#include "shard/sharding/named_sharding.hpp"
#include "unit_util.hpp"

namespace shard {

// Readable failure messages for boxes ("[0:5, 0:10]" instead of raw bytes).
inline void PrintTo(const Box& box, std::ostream* os) { *os << to_string(box); }

namespace {

using unit::iota_ids;

Mesh mesh_4x2() { return Mesh({4, 2}, {"a", "b"}, iota_ids(8), Topology::simulated(4, 2, 0)); }

template <typename F>
std::string sharding_error_text(F&& f) {
  return unit::thrown_message<ShardingError>(std::forward<F>(f));
}

TEST(NamedSharding, UnknownAxisNamesTheAxis) {
  const std::string msg = sharding_error_text([] { NamedSharding(mesh_4x2(), P("a", "nope")); });
  EXPECT_NE(msg.find("'nope'"), std::string::npos) << msg;
  const std::string in_tuple = sharding_error_text([] {
    NamedSharding(mesh_4x2(), P(SpecEntry{"b", "zz"}));
  });
  EXPECT_NE(in_tuple.find("'zz'"), std::string::npos) << in_tuple;
}

TEST(NamedSharding, AxisUsedTwiceNamesTheAxis) {
  const std::string across = sharding_error_text([] { NamedSharding(mesh_4x2(), P("b", "b")); });
  EXPECT_NE(across.find("'b'"), std::string::npos) << across;
  const std::string within = sharding_error_text([] { NamedSharding(mesh_4x2(), P(SpecEntry{"a", "a"})); });
  EXPECT_NE(within.find("'a'"), std::string::npos) << within;
  const std::string mixed = sharding_error_text([] {
    NamedSharding(mesh_4x2(), P(SpecEntry{"a", "b"}, "a"));
  });
  EXPECT_NE(mixed.find("'a'"), std::string::npos) << mixed;
}

TEST(NamedSharding, SpecLongerThanRankThrows) {
  const NamedSharding s(mesh_4x2(), P("a", None));
  EXPECT_THROW(s.box(0, {19}), ShardingError);
  EXPECT_THROW(s.shard_shape({19}), ShardingError);
  EXPECT_THROW(s.check_shape({}), ShardingError);
  EXPECT_NO_THROW(s.check_shape({19, 10}));
  EXPECT_NO_THROW(s.box(0, {19, 10, 3}));
  const NamedSharding r(mesh_4x2(), P("a"));
  EXPECT_THROW(r.box(0, {}), ShardingError);
}

TEST(NamedSharding, HandWorkedExamples) {
  const Mesh mesh = mesh_4x2();
  // P('a', 'b') on (19, 10): rows ceil(19/4)=5, columns 5.
  const NamedSharding ab(mesh, P("a", "b"));
  EXPECT_EQ(ab.box(0, {19, 10}), (Box{{0, 0}, {5, 5}}));
  EXPECT_EQ(ab.box(3, {19, 10}), (Box{{5, 5}, {5, 5}}));
  EXPECT_EQ(ab.box(7, {19, 10}), (Box{{15, 5}, {4, 5}}));
  EXPECT_EQ(ab.shard_shape({19, 10}), (Shape{5, 5}));
  // P(('b','a')) on (19,): 'b' is major, so device at (i, j) holds part j*4 + i of 8, chunk 3.
  const NamedSharding ba(mesh, P(SpecEntry{"b", "a"}));
  const std::vector<std::int64_t> starts = {0, 3, 6, 9, 12, 15, 18, 19};
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 2; ++j) {
      const int part = j * 4 + i;
      const int dev = i * 2 + j;
      EXPECT_EQ(ba.part_index(dev, 0), part);
      EXPECT_EQ(ba.box(dev, {19}).offset[0], starts[part]) << "device " << dev;
      EXPECT_EQ(ba.box(dev, {19}).extent[0], part == 7 ? 0 : part == 6 ? 1 : 3) << "device " << dev;
    }
  // P(('a','b')): 'a' major, device order = part order.
  const NamedSharding ab1(mesh, P(SpecEntry{"a", "b"}));
  for (int d = 0; d < 8; ++d) EXPECT_EQ(ab1.part_index(d, 0), d);
  // P(None, 'b'): devices 0,2,4,6 hold the left half, replicas in mesh order.
  const NamedSharding nb(mesh, P(None, "b"));
  EXPECT_EQ(nb.replicas(4), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(nb.replica_index(4), 2);
  EXPECT_EQ(nb.primary_devices(), (std::vector<int>{0, 1}));
  EXPECT_EQ(nb.replica_axes(), 0b01u);
  EXPECT_EQ(nb.num_parts(0), 1);
  EXPECT_EQ(nb.num_parts(1), 2);
  EXPECT_EQ(nb.num_parts(5), 1);
  EXPECT_EQ(nb.box(5, {8, 4}), (Box{{0, 2}, {8, 2}}));
  EXPECT_EQ(nb.to_string(), "NamedSharding(Mesh('a': 4, 'b': 2), P(None, 'b'))");
}

TEST(NamedSharding, Equality) {
  const Mesh mesh = mesh_4x2();
  EXPECT_TRUE(NamedSharding(mesh, P("a")) == NamedSharding(mesh, P("a", None)));
  EXPECT_FALSE(NamedSharding(mesh, P("a")) == NamedSharding(mesh, P("b")));
  const Mesh other({4, 2}, {"a", "b"}, {1, 0, 2, 3, 4, 5, 6, 7}, Topology::simulated(4, 2, 0));
  EXPECT_FALSE(NamedSharding(mesh, P("a")) == NamedSharding(other, P("a")));
}

// JAX: a sharding is fully replicated when it splits the array into one partition, which is
// also the case when every named mesh axis has size 1.
TEST(NamedSharding, IsFullyReplicatedFollowsPartitionCount) {
  const Mesh m31({3, 1}, {"a", "b"}, iota_ids(3), Topology::simulated(3, 1, 0));
  EXPECT_TRUE(NamedSharding(m31, P()).is_fully_replicated());
  EXPECT_FALSE(NamedSharding(m31, P("a")).is_fully_replicated());
  const NamedSharding b_only(m31, P("b"));
  for (int d = 0; d < 3; ++d) EXPECT_EQ(b_only.box(d, {6}), full_box({6}));  // every device: all
  EXPECT_TRUE(b_only.is_fully_replicated())
      << "P('b') over an axis of size 1 holds the whole array on every device";
}

// ---- Exhaustive comparison against a reference ------------------------------------------

struct MeshCase {
  std::string label;
  Mesh mesh;
};

std::vector<MeshCase> meshes() {
  std::vector<MeshCase> out;
  // 8 devices in make_mesh order over two nodes (not the identity order).
  out.push_back({"8", make_mesh({8}, {"a"}, Topology::simulated(4, 2, 0, {0, 1, 0, 1}))});
  out.push_back({"4x2", Mesh({4, 2}, {"a", "b"}, iota_ids(8), Topology::simulated(4, 2, 1))});
  out.push_back({"2x4", Mesh({2, 4}, {"x", "y"}, {3, 6, 0, 5, 7, 1, 4, 2}, Topology::simulated(8, 1, 0))});
  out.push_back({"2x2x2", make_mesh({2, 2, 2}, {"p", "q", "r"}, Topology::simulated(2, 4, 1, {1, 0}))});
  out.push_back({"3x1", Mesh({3, 1}, {"a", "b"}, {2, 0, 1}, Topology::simulated(3, 1, 0))});
  return out;
}

const std::vector<Shape>& shapes() {
  static const std::vector<Shape> s = {{}, {19}, {3}, {0}, {19, 10}, {5, 7}, {4, 3, 5}, {3, 2, 5, 2}};
  return s;
}

// Every spec: each mesh axis on no dim or on one dim, every order inside each tuple; both the
// shortest spec and the spec padded with Nones to the full rank. Returns per-dim axis positions.
std::vector<std::vector<std::vector<int>>> all_specs(int mesh_ndim, int rank) {
  std::vector<std::vector<std::vector<int>>> out;
  std::vector<int> assign(mesh_ndim, -1);  // -1: unused
  std::function<void(int)> rec = [&](int axis) {
    if (axis == mesh_ndim) {
      std::vector<std::vector<int>> dims(rank);
      for (int a = 0; a < mesh_ndim; ++a)
        if (assign[a] >= 0) dims[assign[a]].push_back(a);
      // Every combination of orders inside the tuples.
      std::function<void(int)> perm = [&](int d) {
        if (d == rank) {
          out.push_back(dims);
          return;
        }
        std::sort(dims[d].begin(), dims[d].end());
        do perm(d + 1);
        while (std::next_permutation(dims[d].begin(), dims[d].end()));
      };
      perm(0);
      return;
    }
    for (int d = -1; d < rank; ++d) {
      assign[axis] = d;
      rec(axis + 1);
    }
  };
  rec(0);
  return out;
}

PartitionSpec to_spec(const Mesh& mesh, const std::vector<std::vector<int>>& dims, bool pad) {
  int len = 0;
  for (int d = 0; d < static_cast<int>(dims.size()); ++d)
    if (!dims[d].empty()) len = d + 1;
  if (pad) len = static_cast<int>(dims.size());
  std::vector<SpecEntry> entries;
  for (int d = 0; d < len; ++d) {
    std::vector<std::string> names;
    for (int a : dims[d]) names.push_back(mesh.axis_names()[a]);
    if (names.size() == 1)
      entries.emplace_back(names[0]);
    else
      entries.emplace_back(std::move(names));
  }
  return PartitionSpec(std::move(entries));
}

struct Ref {
  std::vector<int> part;  // part index per dim
  Box box;
};

Ref reference(const Mesh& mesh, const std::vector<std::vector<int>>& dims, int device, const Shape& shape) {
  const std::vector<int> c = mesh.coords(device);
  Ref r{{}, Box{Shape(shape.size()), Shape(shape.size())}};
  for (std::size_t d = 0; d < shape.size(); ++d) {
    std::int64_t idx = 0;
    std::int64_t parts = 1;
    for (int a : dims[d]) {  // first axis major
      idx = idx * mesh.shape()[a] + c[a];
      parts *= mesh.shape()[a];
    }
    const std::int64_t n = shape[d];
    const std::int64_t chunk = n / parts + (n % parts != 0);
    const std::int64_t lo = std::min(idx * chunk, n);
    const std::int64_t hi = std::min((idx + 1) * chunk, n);
    r.part.push_back(static_cast<int>(idx));
    r.box.offset[d] = lo;
    r.box.extent[d] = hi - lo;
  }
  return r;
}

// Records `where` in `replicated_mismatch` (without failing) if is_fully_replicated()
// disagrees with the reference; the caller reports those mismatches once.
void check_one(const Mesh& mesh, const std::vector<std::vector<int>>& dims, const PartitionSpec& spec,
               const Shape& shape, const std::string& where, std::vector<std::string>* replicated_mismatch) {
  SCOPED_TRACE(where);
  const NamedSharding s(mesh, spec);
  const auto& ids = mesh.device_ids();
  std::vector<Ref> refs;
  for (int dev : ids) refs.push_back(reference(mesh, dims, dev, shape));

  // Axes named by the spec, and the reference replica index (row-major over unused axes).
  std::vector<bool> used(mesh.ndim(), false);
  for (const auto& d : dims)
    for (int a : d) used[a] = true;
  std::int64_t partitions = 1;
  for (int a = 0; a < mesh.ndim(); ++a)
    if (used[a]) partitions *= mesh.shape()[a];

  Shape expect_shard(shape.size());
  for (std::size_t d = 0; d < shape.size(); ++d) {
    std::int64_t parts = 1;
    for (int a : dims[d]) parts *= mesh.shape()[a];
    std::int64_t c = 0;
    while (c * parts < shape[d]) ++c;
    expect_shard[d] = c;
    ASSERT_EQ(s.num_parts(static_cast<int>(d)), parts);
  }
  EXPECT_EQ(s.shard_shape(shape), expect_shard);

  std::vector<int> expect_primary;
  std::vector<int> cover(static_cast<std::size_t>(num_elements(shape)), 0);
  const Shape strides = strides_of(shape);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const int dev = ids[i];
    const Ref& r = refs[i];
    ASSERT_EQ(s.box(dev, shape), r.box) << "device " << dev;
    for (std::size_t d = 0; d < shape.size(); ++d)
      ASSERT_EQ(s.part_index(dev, static_cast<int>(d)), r.part[d]);

    // Replicas: the devices with the same part indices (for non-empty boxes: the same box).
    std::vector<int> expect_replicas;
    int expect_rindex = 0;
    for (std::size_t j = 0; j < ids.size(); ++j) {
      if (refs[j].part != r.part) continue;
      if (!r.box.empty()) {
        ASSERT_EQ(refs[j].box, r.box);
      }
      if (j < i) ++expect_rindex;  // replicas before it in mesh order
      expect_replicas.push_back(ids[j]);
    }
    for (std::size_t j = 0; j < ids.size() && !r.box.empty(); ++j) {
      if (refs[j].box == r.box) {
        ASSERT_EQ(refs[j].part, r.part);
      }
    }
    ASSERT_EQ(s.replicas(dev), expect_replicas) << "device " << dev;
    ASSERT_EQ(s.replica_index(dev), expect_rindex) << "device " << dev;
    ASSERT_EQ(static_cast<std::int64_t>(expect_replicas.size()) * partitions, mesh.size());
    if (expect_rindex != 0) continue;
    expect_primary.push_back(dev);
    // Mark the elements of the primary box.
    for (std::int64_t f = 0; f < r.box.size(); ++f) {
      std::int64_t g = f;
      std::int64_t flat = 0;
      for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
        flat += (r.box.offset[d] + g % r.box.extent[d]) * strides[d];
        g /= r.box.extent[d];
      }
      ++cover[flat];
    }
  }
  ASSERT_EQ(s.primary_devices(), expect_primary);
  ASSERT_EQ(static_cast<std::int64_t>(expect_primary.size()), partitions);
  for (std::size_t f = 0; f < cover.size(); ++f) EXPECT_EQ(cover[f], 1) << "element " << f;
  if (s.is_fully_replicated() != (partitions == 1)) replicated_mismatch->push_back(where);
}

TEST(NamedSharding, EverySpecMatchesReference) {
  int checked = 0;
  std::vector<std::string> replicated_mismatch;
  for (const auto& mc : meshes()) {
    for (const auto& shape : shapes()) {
      const int rank = static_cast<int>(shape.size());
      for (const auto& dims : all_specs(mc.mesh.ndim(), rank)) {
        for (bool pad : {false, true}) {
          const PartitionSpec spec = to_spec(mc.mesh, dims, pad);
          const std::string where =
              "mesh " + mc.label + " shape " + to_string(shape) + " spec " + spec.to_string();
          check_one(mc.mesh, dims, spec, shape, where, &replicated_mismatch);
          if (::testing::Test::HasFailure()) return;
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 1000);
  EXPECT_TRUE(replicated_mismatch.empty())
      << "is_fully_replicated() differs from (number of partitions == 1) for " << replicated_mismatch.size()
      << " cases, e.g. " << replicated_mismatch.front();
}

}  // namespace
}  // namespace shard
