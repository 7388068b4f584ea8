// Random numbers are a pure function of (key, global element index): the same key gives
// bit-identical arrays on every mesh, spec, rank count and devices per rank, generation
// communicates nothing, and split keys give different arrays. Checked on every rank against
// a serial reference built without MPI (a one-device, single-process mesh, and the per-box
// generators over the full box, and a naive element-by-element Threefry loop).

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "mpi_test.hpp"
#include "shard/array/random.hpp"
#include "test_util.hpp"

namespace shard::testing {
namespace {

namespace rnd = shard::random;

/// 8 devices: the meshes 8, 4x2 and 2x2x2. Otherwise the 1-D mesh and the most balanced
/// 2-D and 3-D factorisations of the device count.
std::vector<Mesh> random_meshes() {
  const int n = runtime().device_count();
  if (n == 8)
    return {make_mesh({8}, {"a"}), make_mesh({4, 2}, axis_names(2)), make_mesh({2, 2, 2}, axis_names(3))};
  auto balanced = [](const std::vector<std::vector<int>>& fs) {
    std::vector<int> best = fs.front();
    for (const auto& f : fs)
      if (*std::max_element(f.begin(), f.end()) < *std::max_element(best.begin(), best.end())) best = f;
    return best;
  };
  return {make_mesh({n}, {"a"}), make_mesh(balanced(factorisations(n, 2)), axis_names(2)),
          make_mesh(balanced(factorisations(n, 3)), axis_names(3))};
}

/// Specs for an array of rank `rank` on a mesh with these axes: replicated, every axis on
/// its own, all axes on dim 0 (a tuple), axes reversed over the dims, and for 2-D meshes
/// with 2-D arrays every spec there is.
std::vector<PartitionSpec> random_specs(const std::vector<std::string>& axes, int rank) {
  if (rank == 0) return {P()};
  if (axes.size() <= 2 && rank == 2) return all_specs(axes, rank);
  std::vector<PartitionSpec> out{P()};
  for (const auto& a : axes) {
    out.push_back(P(a));
    if (rank > 1) out.push_back(P(None, a));
  }
  out.push_back(P(SpecEntry(std::vector<std::string>(axes.begin(), axes.end()))));
  out.push_back(P(SpecEntry(std::vector<std::string>(axes.rbegin(), axes.rend()))));
  std::vector<SpecEntry> spread;
  for (int d = 0; d < rank; ++d)
    spread.emplace_back(d < static_cast<int>(axes.size()) ? SpecEntry(axes[axes.size() - 1 - d])
                                                          : SpecEntry(None));
  out.emplace_back(spread);
  std::vector<PartitionSpec> unique;
  for (const auto& p : out)
    if (std::none_of(unique.begin(), unique.end(), [&](const PartitionSpec& q) { return q == p; }))
      unique.push_back(p);
  return unique;
}

const std::vector<Shape> kShapes = {{19, 7}, {6, 5, 4}, {37}, {}, {0, 5}, {3, 2, 5, 2}};

/// The one-device, single-process mesh: every array is one shard holding the whole array,
/// built locally whatever the job's rank count (no MPI).
NamedSharding serial_sharding() {
  const Mesh one({1}, {"s"}, {0}, Topology::single(1));
  return NamedSharding(one, P());
}

template <typename T>
const Tensor<T>& only_shard(const ShardedArray<T>& a) {
  return a.addressable_shards().at(0).data;
}

/// The naive reference: word = y0 ^ y1 of threefry(k, (hi32(i), lo32(i))), i row-major.
Tensor<std::int64_t> naive_bits(rnd::Key k, const Shape& shape) {
  Tensor<std::int64_t> t(shape);
  for (std::int64_t i = 0; i < t.size(); ++i) {
    std::uint32_t y0 = 0, y1 = 0;
    rnd::threefry2x32(k, static_cast<std::uint32_t>(static_cast<std::uint64_t>(i) >> 32),
                      static_cast<std::uint32_t>(i), y0, y1);
    t.flat(i) = y0 ^ y1;
  }
  return t;
}

/// Every local shard holds exactly its box of `ref`.
template <typename T>
void expect_local_shards(const ShardedArray<T>& a, const Tensor<T>& ref, const std::string& what) {
  const auto local = a.mesh().local_device_ids();
  ASSERT_EQ(a.addressable_shards().size(), local.size()) << what;
  for (std::size_t i = 0; i < local.size(); ++i) {
    const auto& s = a.addressable_shards()[i];
    const Box box = reference_box(a.mesh(), a.spec(), ref.shape(), local[i]);
    EXPECT_EQ(s.box, box) << what;
    const auto expected = reference_slice(ref, box);
    EXPECT_TRUE(std::equal(expected.begin(), expected.end(), s.data.begin(), s.data.end()))
        << what << " device " << local[i] << " box " << to_string(box);
  }
}

template <typename T>
void expect_same(const ShardedArray<T>& a, const Tensor<T>& ref, const std::string& what) {
  expect_local_shards(a, ref, what);
  EXPECT_TRUE(a.to_host() == ref) << what << " to_host";
}

SHARD_MPI_TEST(Random, SameArrayOnEveryMeshSpecAndRankCount) {
  const rnd::Key k = rnd::fold_in(rnd::key(2024), 7);
  int layouts = 0;
  for (const auto& shape : kShapes) {
    // The serial references: the one-device mesh, the full-box generators, a naive loop.
    const auto serial = serial_sharding();
    const Tensor<float> uf = only_shard(rnd::uniform<float>(k, shape, serial));
    const Tensor<double> ud = only_shard(rnd::uniform<double>(k, shape, serial, -2.0, 3.0));
    const Tensor<float> nf = only_shard(rnd::normal<float>(k, shape, serial));
    const Tensor<double> nd = only_shard(rnd::normal<double>(k, shape, serial));
    const Tensor<std::int32_t> bern = only_shard(rnd::bernoulli(k, 0.3, shape, serial));
    const Tensor<std::int64_t> bits = only_shard(rnd::bits(k, shape, serial));
    EXPECT_TRUE(uf == rnd::uniform_box<float>(k, shape, full_box(shape))) << to_string(shape);
    EXPECT_TRUE(ud == rnd::uniform_box<double>(k, shape, full_box(shape), -2.0, 3.0)) << to_string(shape);
    EXPECT_TRUE(nd == rnd::normal_box<double>(k, shape, full_box(shape))) << to_string(shape);
    EXPECT_TRUE(bits == naive_bits(k, shape)) << to_string(shape);

    for (const auto& mesh : random_meshes())
      for (const auto& spec : random_specs(mesh.axis_names(), static_cast<int>(shape.size()))) {
        const NamedSharding s(mesh, spec);
        const std::string what = s.to_string() + " " + to_string(shape);
        expect_same(rnd::uniform<float>(k, shape, s), uf, what + " uniform<float>");
        expect_same(rnd::uniform<double>(k, shape, s, -2.0, 3.0), ud, what + " uniform<double>");
        expect_same(rnd::normal<float>(k, shape, s), nf, what + " normal<float>");
        expect_same(rnd::normal<double>(k, shape, s), nd, what + " normal<double>");
        expect_same(rnd::bernoulli(k, 0.3, shape, s), bern, what + " bernoulli");
        expect_same(rnd::bits(k, shape, s), bits, what + " bits");
        ++layouts;
      }
  }
  EXPECT_GT(layouts, 60);
  if (runtime().process_index() == 0)
    std::printf("[ shard    ] %d (mesh, spec, shape) layouts x 6 generators\n", layouts);
}

SHARD_MPI_TEST(Random, GenerationCommunicatesNothing) {
  const rnd::Key k = rnd::key(5);
  std::vector<NamedSharding> shardings;
  for (const auto& mesh : random_meshes())
    for (const auto& spec : random_specs(mesh.axis_names(), 2)) shardings.emplace_back(mesh, spec);
  const Shape shape{19, 7};
  std::vector<ShardedArray<float>> fs;
  std::vector<ShardedArray<double>> ds;
  comm_stats().reset();
  for (const auto& s : shardings) {
    fs.push_back(rnd::uniform<float>(k, shape, s));
    fs.push_back(rnd::normal<float>(k, shape, s));
    ds.push_back(rnd::uniform<double>(k, shape, s, 1.0, 2.0));
    ds.push_back(rnd::normal<double>(k, shape, s));
    (void)rnd::bernoulli(k, 0.5, shape, s);
    (void)rnd::bits(k, shape, s);
  }
  (void)rnd::split(k, 4);
  (void)rnd::fold_in(k, 3);
  (void)rnd::permutation(k, 1000);
  const CommRecord total = comm_stats().total();
  EXPECT_EQ(total.calls, 0) << comm_stats().to_string();
  EXPECT_EQ(total.bytes, 0);
  // Gathering afterwards is fine (and communicates): every layout is the same array.
  const Tensor<float> ref = fs.front().to_host();
  for (std::size_t i = 0; i < fs.size(); i += 2)
    EXPECT_TRUE(fs[i].to_host() == ref) << shardings[i / 2].to_string();
  EXPECT_GT(comm_stats().total().calls, 0);
}

SHARD_MPI_TEST(Random, SplitKeysGiveDifferentArrays) {
  const rnd::Key parent = rnd::key(42);
  const auto keys = rnd::split(parent, 3);
  const Shape shape{19, 7};
  const Mesh mesh = random_meshes()[1];
  const NamedSharding s(mesh, P(mesh.axis_names()[0]));
  const Tensor<double> p = rnd::uniform<double>(parent, shape, s).to_host();
  std::vector<Tensor<double>> children;
  for (const auto& key : keys) children.push_back(rnd::uniform<double>(key, shape, s).to_host());
  children.push_back(rnd::uniform<double>(rnd::fold_in(parent, 1000), shape, s).to_host());
  for (std::size_t i = 0; i < children.size(); ++i) {
    EXPECT_FALSE(children[i] == p) << i;
    for (std::size_t j = i + 1; j < children.size(); ++j)
      EXPECT_FALSE(children[i] == children[j]) << i << " " << j;
    std::int64_t equal = 0;
    for (std::int64_t e = 0; e < p.size(); ++e) equal += children[i].flat(e) == p.flat(e);
    EXPECT_EQ(equal, 0) << i;  // 133 independent 52-bit draws: no coincidences
  }
  // split(k)[i] is fold_in(k, i) (JAX's partitionable split), so the arrays agree too.
  EXPECT_TRUE(children[1] == rnd::uniform<double>(rnd::fold_in(parent, 1), shape, s).to_host());
  // The same key on another layout is still the parent's array.
  EXPECT_TRUE(rnd::uniform<double>(parent, shape, NamedSharding(mesh, P())).to_host() == p);
}

SHARD_MPI_TEST(Random, PermutationIsTheSameOnEveryRank) {
  const rnd::Key k = rnd::key(9);
  const auto perm = rnd::permutation(k, 1001);
  std::uint64_t h = 1469598103934665603ull;
  for (std::int64_t v : perm) h = (h ^ static_cast<std::uint64_t>(v)) * 1099511628211ull;
  std::uint64_t lo = 0;
  std::uint64_t hi = 0;
  MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, runtime().world().get());
  MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, runtime().world().get());
  EXPECT_EQ(lo, h);
  EXPECT_EQ(hi, h);
  std::vector<std::int64_t> sorted(perm.begin(), perm.end());
  std::sort(sorted.begin(), sorted.end());
  for (std::int64_t i = 0; i < 1001; ++i) EXPECT_EQ(sorted[i], i);
}

}  // namespace
}  // namespace shard::testing
