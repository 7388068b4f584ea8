// reshard between every pair of a list of specs covering each plan rule (none, local,
// all_gather, all_to_all, general) on 1-D, 2-D and 3-D meshes, for even, uneven and 0-d
// shapes: every local shard is checked against the TARGET layout computed independently, the
// bytes CommStats saw against the plan and against an independent count of what must move,
// plus the four dtypes, mesh mismatch errors and peak memory.

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "mpi_test.hpp"
#include "test_util.hpp"

namespace shard::testing {
namespace {

using Kind = ReshardPlan::Kind;

const char* kind_name(Kind k) {
  static const char* kNames[] = {"none", "local", "all_gather", "all_to_all", "general"};
  return kNames[static_cast<int>(k)];
}

/// Entries up to the last non-None one (P('a', None) has 1).
int effective_size(const PartitionSpec& s) {
  int n = 0;
  for (int d = 0; d < s.size(); ++d)
    if (!s[d].is_none()) n = d + 1;
  return n;
}

int owner_of(int device) { return device / runtime().devices_per_rank(); }

std::int64_t sum_over_ranks(std::int64_t v) { return runtime().world().allreduce<std::int64_t>(v, MPI_SUM); }

/// 1-D, every 2-D factorisation, and one 3-D mesh with the fewest size-1 axes when n allows.
std::vector<Mesh> test_meshes() {
  const int n = runtime().device_count();
  std::vector<Mesh> out{make_mesh({n}, {"a"})};
  for (const auto& f : factorisations(n, 2)) out.push_back(make_mesh(f, axis_names(2)));
  std::vector<int> best;
  int best_ones = 2;
  for (const auto& f : factorisations(n, 3)) {
    const int ones = static_cast<int>(std::count(f.begin(), f.end(), 1));
    if (ones < best_ones) {
      best = f;
      best_ones = ones;
    }
  }
  if (!best.empty()) out.push_back(make_mesh(best, axis_names(3)));
  return out;
}

/// A spec list per mesh rank covering every rule (see the file comment), ~10 per mesh.
std::vector<PartitionSpec> test_specs(int mesh_ndim) {
  using E = SpecEntry;
  if (mesh_ndim == 1) return {P(), P("a"), P(None, "a"), P(None, None, "a")};
  if (mesh_ndim == 2)
    return {P(),         P("a"),         P("b"),          P(E{"a", "b"}),       P(E{"b", "a"}),  P("a", "b"),
            P("b", "a"), P(None, "a"),   P(None, "b"),    P(None, E{"a", "b"}), P("a", None, "b"),
            P(None, "a", "b")};
  return {P(),           P("a"),          P(E{"a", "b"}),      P(E{"a", "b", "c"}),       P("a", "b"),
          P("b", "a"),   P(None, "a"),    P(E{"a", "b"}, "c"), P("c", E{"b", "a"}),       P("a", "b", "c"),
          P(None, None, E{"c", "a"})};
}

const std::vector<Shape> kShapes = {{}, {3}, {19, 7}, {8, 6}, {4, 3}, {5, 3, 2}, {4, 6, 3}};

bool contains(const Box& b, const Shape& idx) {
  for (std::size_t d = 0; d < idx.size(); ++d)
    if (idx[d] < b.offset[d] || idx[d] >= b.offset[d] + b.extent[d]) return false;
  return true;
}

/// Elements of `box` held by none of `held` (element by element).
std::int64_t missing_elements(const Box& box, const std::vector<Box>& held) {
  std::int64_t missing = 0;
  Shape idx(box.offset);
  for (std::int64_t i = 0; i < box.size(); ++i) {
    if (std::none_of(held.begin(), held.end(), [&](const Box& h) { return contains(h, idx); })) ++missing;
    for (int d = static_cast<int>(idx.size()) - 1; d >= 0; --d) {
      if (++idx[d] < box.offset[d] + box.extent[d]) break;
      idx[d] = box.offset[d];
    }
  }
  return missing;
}

/// Bytes rank `r` must receive: for each distinct new box of its devices, the elements that
/// no device of rank r held in the old layout.
std::int64_t must_receive_bytes(const Mesh& mesh, const PartitionSpec& from, const PartitionSpec& to,
                                const Shape& shape, std::size_t elem, int r) {
  std::vector<Box> held;
  std::set<Box> wanted;
  for (int d : mesh.device_ids())
    if (owner_of(d) == r) {
      held.push_back(reference_box(mesh, from, shape, d));
      wanted.insert(reference_box(mesh, to, shape, d));
    }
  std::int64_t n = 0;
  for (const Box& b : wanted) n += missing_elements(b, held);
  return n * static_cast<std::int64_t>(elem);
}

/// True if every device's new box lies in its old one (no communication needed).
bool local_is_enough(const Mesh& mesh, const PartitionSpec& from, const PartitionSpec& to, const Shape& shape) {
  for (int d : mesh.device_ids()) {
    const Box b = reference_box(mesh, to, shape, d);
    if (b.size() > 0 && missing_elements(b, {reference_box(mesh, from, shape, d)}) > 0) return false;
  }
  return true;
}

/// What an all_gather over `axis` sends from this rank: each of its devices in a group over
/// `axis` that spans more than one rank hands its block to MPI once.
std::int64_t all_gather_bytes(const Mesh& mesh, const PartitionSpec& from, const Shape& shape,
                              const std::string& axis, std::size_t elem) {
  const int a = mesh.axis_position(axis);
  std::map<std::vector<int>, std::set<int>> ranks_of_group;
  for (int d : mesh.device_ids()) {
    auto c = mesh.coords(d);
    c[a] = 0;
    ranks_of_group[c].insert(owner_of(d));
  }
  std::int64_t bytes = 0;
  for (int d : mesh.device_ids()) {
    auto c = mesh.coords(d);
    c[a] = 0;
    if (owner_of(d) == runtime().process_index() && ranks_of_group[c].size() > 1)
      bytes += reference_box(mesh, from, shape, d).size() * static_cast<std::int64_t>(elem);
  }
  return bytes;
}

/// Every local shard of `y` against the target layout `to` of the host array.
template <typename T>
void check_layout(const ShardedArray<T>& y, const Tensor<T>& host, const PartitionSpec& to, std::ostream& err) {
  const Mesh& mesh = y.mesh();
  const auto local = mesh.local_device_ids();
  if (y.addressable_shards().size() != local.size()) {
    err << " [" << y.addressable_shards().size() << " shards for " << local.size() << " local devices]";
    return;
  }
  for (std::size_t i = 0; i < local.size(); ++i) {
    const auto& s = y.addressable_shards()[i];
    const Box ref = reference_box(mesh, to, host.shape(), local[i]);
    const auto v = reference_slice(host, ref);
    if (s.device != local[i] || s.box != ref || s.data.shape() != ref.extent ||
        !std::equal(v.begin(), v.end(), s.data.begin(), s.data.end()))
      err << " [device " << local[i] << " shard " << to_string(s.box) << " wrong, want " << to_string(ref) << "]";
  }
}

struct Outcome {
  std::string problems;  ///< empty when everything holds
  Kind kind = Kind::kNone;
};

/// device_put(host, from), reshard to `to`, then check data, plan and CommStats. Collective;
/// every rank makes the same MPI calls whatever fails.
template <typename T>
Outcome check_reshard(const Mesh& mesh, const PartitionSpec& from, const PartitionSpec& to, const Shape& shape,
                      std::uint64_t seed) {
  std::ostringstream err;
  const int me = runtime().process_index();
  const Tensor<T> host = random_tensor<T>(shape, seed);
  const NamedSharding src(mesh, from), dst(mesh, to);
  const auto x = device_put(host, src);
  const ReshardPlan plan = reshard_plan(x, dst);
  Outcome out;
  out.kind = plan.kind;

  comm_stats().reset();
  std::optional<ShardedArray<T>> y;
  std::string thrown;
  try {
    y.emplace(reshard(x, dst));
  } catch (const std::exception& e) {
    thrown = e.what();
  }
  const CommRecord sent = comm_stats().total();
  if (runtime().world().any(!thrown.empty())) {  // keep every rank's collectives in step
    out.problems = "reshard threw" + (thrown.empty() ? std::string(" on another rank") : ": " + thrown);
    return out;
  }
  check_layout(*y, host, to, err);
  if (!(y->sharding() == dst)) err << " [sharding " << y->sharding().to_string() << "]";
  if (!(y->to_host() == host)) err << " [to_host differs from the host array]";

  // CommStats against the plan, and the plan's own accounting.
  if (sent.bytes != plan.bytes_sent[me]) err << " [CommStats " << sent.bytes << " B, plan " << plan.bytes_sent[me] << " B]";
  static const char* kWords[] = {"copy", "local", "all_gather", "all_to_all", "Alltoallv"};
  if (plan.to_string().find(kWords[static_cast<int>(plan.kind)]) == std::string::npos)
    err << " [to_string lacks '" << kWords[static_cast<int>(plan.kind)] << "']";

  const bool same = from == to;
  const bool local = local_is_enough(mesh, from, to, shape);
  if (same != (plan.kind == Kind::kNone)) err << " [same spec " << same << " but plan " << kind_name(plan.kind) << "]";
  if (!same && local != (plan.kind == Kind::kLocal))
    err << " [local slices suffice: " << local << ", plan " << kind_name(plan.kind) << "]";
  if ((plan.kind == Kind::kNone || plan.kind == Kind::kLocal) && (sent.bytes != 0 || sent.calls != 0))
    err << " [" << sent.calls << " MPI calls, " << sent.bytes << " B without communication]";
  if (plan.kind == Kind::kAllGather) {
    const auto& leaving = from[plan.dim].axes();
    if (leaving.empty() || leaving.back() != plan.axis) err << " [all_gather axis '" << plan.axis << "']";
    const std::int64_t want = all_gather_bytes(mesh, from, shape, plan.axis, sizeof(T));
    if (sent.bytes != want) err << " [all_gather sent " << sent.bytes << " B, must send " << want << " B]";
  }
  // Every rule: the measured bytes of all ranks add up to the plan's total.
  const std::int64_t total_sent = sum_over_ranks(sent.bytes);
  if (total_sent != plan.total_bytes()) err << " [all ranks sent " << total_sent << " B, plan " << plan.total_bytes() << "]";
  if (plan.kind == Kind::kGeneral) {  // nothing a destination rank already holds is sent
    std::int64_t must = 0;
    for (int r = 0; r < runtime().process_count(); ++r) must += must_receive_bytes(mesh, from, to, shape, sizeof(T), r);
    if (total_sent != must) err << " [general: ranks sent " << total_sent << " B, " << must << " B must move]";
  }
  out.problems = err.str();
  return out;
}

std::string describe(const Mesh& mesh, const PartitionSpec& from, const PartitionSpec& to, const Shape& shape) {
  return mesh.to_string() + " " + to_string(shape) + " " + from.to_string() + " -> " + to.to_string();
}

SHARD_MPI_TEST(Reshard, AllPairsEveryMesh) {
  const double t0 = MPI_Wtime();
  std::uint64_t seed = 1;
  int cases = 0, bad = 0;
  std::map<Kind, int> by_kind;
  for (const auto& mesh : test_meshes()) {
    const auto specs = test_specs(mesh.ndim());
    for (const auto& shape : kShapes)
      for (const auto& from : specs)
        for (const auto& to : specs) {
          if (effective_size(from) > static_cast<int>(shape.size()) ||
              effective_size(to) > static_cast<int>(shape.size()))
            continue;
          const Outcome o = check_reshard<double>(mesh, from, to, shape, seed++);
          ++cases;
          ++by_kind[o.kind];
          if (!o.problems.empty() && ++bad <= 25) ADD_FAILURE() << describe(mesh, from, to, shape) << ":" << o.problems;
        }
  }
  EXPECT_EQ(bad, 0) << "of " << cases << " reshards (the first 25 are listed)";
  // The spec list reaches every rule wherever the mesh has an axis of size > 1.
  if (runtime().device_count() > 1) {
    for (Kind k : {Kind::kNone, Kind::kLocal, Kind::kAllGather, Kind::kAllToAll, Kind::kGeneral}) {
      EXPECT_GT(by_kind[k], 0) << kind_name(k);
    }
  }
  if (runtime().process_index() == 0) {
    std::printf("[ shard    ] %d reshards in %.1f s:", cases, MPI_Wtime() - t0);
    for (const auto& [k, c] : by_kind) std::printf(" %s %d", kind_name(k), c);
    std::printf("\n");
  }
}

// The all_gather / all_to_all rules with a dim they do not touch split unevenly: blocks
// differ between groups ((4, 2) and (4, 1) below), so one block shape for all is wrong.
SHARD_MPI_TEST(Reshard, CollectiveRulesWithUnevenUntouchedDim) {
  const int n = runtime().device_count();
  if (n % 2 != 0 || n < 4) GTEST_SKIP() << "needs a (2, n/2) mesh with n/2 > 1";
  const Mesh mesh = make_mesh({2, n / 2}, {"a", "b"});
  const std::int64_t odd = n - 1;  // split n/2 ways: chunks of 2, the last one of 1, none empty
  struct Case {
    PartitionSpec from, to;
    Shape shape;
  };
  for (const Case& c : {Case{P("a", "b"), P(None, "b"), {4, odd}},                  // all_gather over 'a'
                        Case{P("a", None, "b"), P(None, "a", "b"), {4, 4, odd}}}) {  // all_to_all over 'a'
    const Outcome o = check_reshard<double>(mesh, c.from, c.to, c.shape, 77);
    EXPECT_EQ(o.problems, "") << describe(mesh, c.from, c.to, c.shape) << " (plan " << kind_name(o.kind) << ")";
  }
}

// Chunks of >= 64 KiB between ranks of one node take the direct-read route (collective_cma.cpp:
// each rank reads its chunks out of the peers' blocks, strided on both sides); the same cases
// with SHARD_SHARED_REDUCE=0 (test_reshard.mpi) take MPI's.
SHARD_MPI_TEST(Reshard, LargeAllToAllEveryLayout) {
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  struct Case {
    PartitionSpec from, to;
    Shape shape;
  };
  for (const Case& c : {Case{P("a", None), P(None, "a"), {64 * n, 128 * n}},        // rows -> columns
                        Case{P(None, "a"), P("a", None), {64 * n, 128 * n}},        // columns -> rows
                        Case{P("a", None, None), P(None, None, "a"), {8 * n, 32, 64 * n}},
                        Case{P(None, "a", None), P(None, None, "a"), {3, 32 * n, 96 * n}}}) {
    const Outcome o = check_reshard<double>(mesh, c.from, c.to, c.shape, 91);
    EXPECT_EQ(o.problems, "") << describe(mesh, c.from, c.to, c.shape) << " (plan " << kind_name(o.kind) << ")";
    const Outcome f = check_reshard<float>(mesh, c.from, c.to, c.shape, 92);
    EXPECT_EQ(f.problems, "") << describe(mesh, c.from, c.to, c.shape) << " float32";
  }
}

template <typename T>
class ReshardTyped : public MpiTest {};
using Types = ::testing::Types<float, double, std::int32_t, std::int64_t, bfloat16>;
TYPED_TEST_SUITE(ReshardTyped, Types);

TYPED_TEST(ReshardTyped, RepresentativePairs) {
  const int n = runtime().device_count();
  const int k = runtime().devices_per_rank();
  const int p = runtime().process_count();
  using E = SpecEntry;
  struct Case {
    Mesh mesh;
    PartitionSpec from, to;
    Shape shape;
  };
  const Mesh m1 = make_mesh({n}, {"a"});
  const Mesh m2 = make_mesh({p, k}, {"a", "b"});  // 'a' across ranks, 'b' within a rank
  const Shape even{static_cast<std::int64_t>(4 * n), static_cast<std::int64_t>(2 * n)};
  const std::vector<Case> cases = {
      {m1, P(), P("a"), even},
      {m1, P("a"), P(), even},
      {m1, P("a", None), P(None, "a"), even},
      {m1, P("a"), P(None, "a"), {19, 7}},
      {m1, P("a"), P("a"), {3}},
      {m1, P(), P(), {}},
      {m2, P(E{"a", "b"}), P("a"), even},
      {m2, P(E{"a", "b"}, None), P("a", "b"), even},
      {m2, P("a", "b"), P("b", "a"), even},
      {m2, P(E{"a", "b"}), P(E{"b", "a"}), {5, 3, 2}},
      {m2, P("a"), P("b"), {19, 7}},
  };
  std::uint64_t seed = 100;
  for (const auto& c : cases) {
    const Outcome o = check_reshard<TypeParam>(c.mesh, c.from, c.to, c.shape, seed++);
    EXPECT_EQ(o.problems, "") << dtype_name<TypeParam>() << " " << describe(c.mesh, c.from, c.to, c.shape);
  }
  // with_sharding_constraint is reshard under JAX's name.
  const Tensor<TypeParam> host = random_tensor<TypeParam>(even, 7);
  const auto x = device_put(host, NamedSharding(m1, P("a")));
  const auto y = with_sharding_constraint(x, NamedSharding(m1, P(None, "a")));
  EXPECT_TRUE(y.to_host() == host);
}

/// reshard(x, to) with CommStats reset just before; returns what this rank sent.
template <typename T>
CommRecord measured(const ShardedArray<T>& x, const NamedSharding& to, const Tensor<T>& host) {
  comm_stats().reset();
  const auto y = reshard(x, to);
  const CommRecord r = comm_stats().total();
  EXPECT_TRUE(y.to_host() == host) << x.sharding().to_string() << " -> " << to.to_string();
  return r;
}

SHARD_MPI_TEST(Reshard, CommStatsPerRule) {
  const int p = runtime().process_count();
  const int k = runtime().devices_per_rank();
  const int n = runtime().device_count();
  const int me = runtime().process_index();
  const Mesh m1 = make_mesh({n}, {"a"});
  const Mesh m2 = make_mesh({p, k}, {"a", "b"});
  const Shape shape{static_cast<std::int64_t>(6 * n), static_cast<std::int64_t>(4 * n)};
  const Tensor<double> host = random_tensor<double>(shape, 55);
  const std::int64_t block = num_elements(shape) / n * 8;  // bytes of one device's P('a') block on m1

  {  // replicated -> sharded: local slices, nothing sent, no MPI call
    const auto x = device_put(host, NamedSharding(m1, P()));
    const NamedSharding to(m1, P("a"));
    EXPECT_EQ(reshard_plan(x, to).kind, Kind::kLocal);
    EXPECT_NE(reshard_plan(x, to).to_string().find("local"), std::string::npos) << reshard_plan(x, to).to_string();
    const CommRecord r = measured(x, to, host);
    EXPECT_EQ(r.bytes, 0);
    EXPECT_EQ(r.calls, 0);
  }
  {  // same spec: nothing
    const auto x = device_put(host, NamedSharding(m2, P("a", "b")));
    const NamedSharding to(m2, P("a", "b"));
    EXPECT_EQ(reshard_plan(x, to).kind, Kind::kNone);
    const CommRecord r = measured(x, to, host);
    EXPECT_EQ(r.bytes, 0);
    EXPECT_EQ(r.calls, 0);
  }
  {  // sharded -> replicated over ranks: each rank sends its k blocks once (one group, all ranks)
    const auto x = device_put(host, NamedSharding(m1, P("a")));
    const NamedSharding to(m1, P());
    const auto plan = reshard_plan(x, to);
    EXPECT_EQ(plan.kind, n > 1 ? Kind::kAllGather : Kind::kLocal);
    if (n > 1) {
      EXPECT_NE(plan.to_string().find("all_gather"), std::string::npos) << plan.to_string();
    }
    const CommRecord r = measured(x, to, host);
    EXPECT_EQ(r.bytes, p > 1 ? k * block : 0);
    EXPECT_EQ(r.bytes, plan.bytes_sent[me]);
  }
  {  // P(('a','b')) -> P('a'): gathering over 'b' stays within each rank: 0 bytes
    const auto x = device_put(host, NamedSharding(m2, P(SpecEntry{"a", "b"})));
    const NamedSharding to(m2, P("a"));
    const auto plan = reshard_plan(x, to);
    if (k > 1) {
      EXPECT_EQ(plan.kind, Kind::kAllGather);
      EXPECT_EQ(plan.axis, "b");
    }
    const CommRecord r = measured(x, to, host);
    EXPECT_EQ(r.bytes, 0);
    EXPECT_EQ(r.calls, 0);
  }
  {  // P('a') -> P() on m2: groups over 'a' have one device per rank, k groups per rank
    const auto x = device_put(host, NamedSharding(m2, P("a")));
    const NamedSharding to(m2, P());
    const auto plan = reshard_plan(x, to);
    if (p > 1) {
      EXPECT_EQ(plan.kind, Kind::kAllGather);
    }
    const CommRecord r = measured(x, to, host);
    EXPECT_EQ(r.bytes, p > 1 ? k * (num_elements(shape) / p * 8) : 0);
    EXPECT_EQ(r.bytes, plan.bytes_sent[me]);
  }
  {  // an axis moving between dims: all_to_all
    const auto x = device_put(host, NamedSharding(m1, P("a", None)));
    const NamedSharding to(m1, P(None, "a"));
    const auto plan = reshard_plan(x, to);
    if (n > 1) {
      EXPECT_EQ(plan.kind, Kind::kAllToAll);
      EXPECT_EQ(plan.axis, "a");
      EXPECT_NE(plan.to_string().find("all_to_all"), std::string::npos) << plan.to_string();
    }
    const CommRecord r = measured(x, to, host);
    EXPECT_EQ(r.bytes, plan.bytes_sent[me]);
    // Each device keeps 1/n of its block per device of its own rank and sends the rest.
    EXPECT_EQ(r.bytes, k * block / n * (n - k));
  }
  {  // P(('a','b'), None) -> P('a', 'b'): all_to_all over 'b'
    const auto x = device_put(host, NamedSharding(m2, P(SpecEntry{"a", "b"}, None)));
    const NamedSharding to(m2, P("a", "b"));
    if (k > 1) {
      EXPECT_EQ(reshard_plan(x, to).kind, Kind::kAllToAll);
    }
    EXPECT_EQ(measured(x, to, host).bytes, 0);  // 'b' lies within a rank
  }
  {  // general: P('a', 'b') -> P('b', 'a'); exactly the missing bytes move
    const auto x = device_put(host, NamedSharding(m2, P("a", "b")));
    const NamedSharding to(m2, P("b", "a"));
    const auto plan = reshard_plan(x, to);
    if (p > 1 && k > 1) {
      EXPECT_EQ(plan.kind, Kind::kGeneral);
      EXPECT_NE(plan.to_string().find("Alltoallv"), std::string::npos) << plan.to_string();
    }
    const CommRecord r = measured(x, to, host);
    EXPECT_EQ(r.bytes, plan.bytes_sent[me]);
    EXPECT_LE(r.calls, 1);
    std::int64_t must = 0;
    for (int q = 0; q < p; ++q) must += must_receive_bytes(m2, P("a", "b"), P("b", "a"), shape, 8, q);
    EXPECT_EQ(sum_over_ranks(r.bytes), must);
  }
}

std::string device_list(const std::vector<int>& ids) {
  std::string s = "[";
  for (std::size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]";
}

SHARD_MPI_TEST(Reshard, AcrossMeshesOverTheSameDevices) {
  // Every layout of a 2-D array on every 2-D mesh shape to every layout on another shape (or
  // the reversed device order) over the same devices: the data lands where the target layout
  // says, CommStats equals the plan's bytes, and a layout the target mesh can spell moves nothing.
  const int n = runtime().device_count();
  const int me = runtime().process_index();
  const auto shapes = factorisations(n, 2);
  std::vector<int> rev = make_mesh({n}, {"a"}).device_ids();
  std::reverse(rev.begin(), rev.end());
  std::vector<Mesh> meshes;
  for (const auto& f : shapes) meshes.push_back(make_mesh(f, {"a", "b"}));
  meshes.emplace_back(std::vector<int>{n}, std::vector<std::string>{"r"}, rev);
  const Shape shape{static_cast<std::int64_t>(3 * n + 1), static_cast<std::int64_t>(2 * n)};
  const Tensor<float> host = random_tensor<float>(shape, 71);
  std::uint64_t checked = 0, free_moves = 0;
  for (std::size_t i = 0; i < meshes.size(); ++i)
    for (std::size_t j = 0; j < meshes.size(); ++j) {
      if (i == j) continue;
      for (const auto& from : all_specs(meshes[i].axis_names(), 2))
        for (const auto& to : all_specs(meshes[j].axis_names(), 2)) {
          const auto x = device_put(host, NamedSharding(meshes[i], from));
          const NamedSharding dst(meshes[j], to);
          const ReshardPlan plan = reshard_plan(x, dst);
          comm_stats().reset();
          const auto y = reshard(x, dst);
          const CommRecord r = comm_stats().total();
          std::ostringstream err;
          check_layout(y, host, to, err);
          const std::string what = from.to_string() + " on " + meshes[i].to_string() + " -> " + to.to_string() +
                                   " on " + meshes[j].to_string() + ": " + plan.to_string();
          EXPECT_TRUE(err.str().empty()) << what << err.str();
          EXPECT_TRUE(y.mesh() == meshes[j]) << what;
          EXPECT_EQ(r.bytes, plan.bytes_sent[me]) << what;
          if (const auto eq = equivalent_sharding(x.sharding(), shape, meshes[j]); eq && eq->spec() == to) {
            EXPECT_EQ(plan.total_bytes(), 0) << what;
            ++free_moves;
          }
          ++checked;
        }
    }
  EXPECT_GT(checked, 0u);
  if (n > 1) {
    EXPECT_GT(free_moves, 0u);
  }
}

SHARD_MPI_TEST(Reshard, OtherDeviceSetsThrowEverywhere) {
  const int n = runtime().device_count();
  if (n < 2) GTEST_SKIP() << "needs two devices";
  const Mesh mesh = make_mesh({n}, {"a"});
  const Mesh one({1}, {"a"}, {mesh.device_ids()[0]});
  const Tensor<float> host = random_tensor<float>({8, 3}, 3);
  const auto x = device_put(host, NamedSharding(mesh, P("a")));
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      if (attempt == 0) (void)reshard(x, NamedSharding(one, P()));
      else (void)reshard_plan(x, NamedSharding(one, P()));
      ADD_FAILURE() << "no MeshMismatchError (attempt " << attempt << ")";
    } catch (const MeshMismatchError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(device_list(mesh.device_ids())), std::string::npos) << msg;
      EXPECT_NE(msg.find("[" + std::to_string(mesh.device_ids()[0]) + "]"), std::string::npos) << msg;
      EXPECT_NE(msg.find("[rank " + std::to_string(runtime().process_index()) + "]"), std::string::npos) << msg;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "wrong exception: " << e.what();
    }
  }
  // Nothing was left half-done: the next collective works on every rank.
  EXPECT_TRUE(reshard(x, NamedSharding(mesh, P())).to_host() == host);
}

/// Peak tensor bytes of reshard(x, to) above what was live before, with the result checked.
std::int64_t peak_extra(const ShardedArray<double>& x, const NamedSharding& to, Kind want, const std::string& what) {
  const auto plan = reshard_plan(x, to);
  if (runtime().device_count() > 1) {
    EXPECT_EQ(plan.kind, want) << what << ": " << plan.to_string();
  }
  reset_tensor_memory_peak();
  const std::int64_t before = tensor_memory_stats().live_bytes;
  const auto y = reshard(x, to);
  const std::int64_t extra = tensor_memory_stats().peak_bytes - before;
  const std::int64_t cols = x.shape()[1];
  std::int64_t wrong = 0;
  for (const auto& s : y.addressable_shards()) {
    for (std::int64_t i = 0; i < s.data.size(); ++i) {
      const std::int64_t r = s.box.offset[0] + i / s.box.extent[1], c = s.box.offset[1] + i % s.box.extent[1];
      wrong += s.data.flat(i) != static_cast<double>(r * cols + c);
    }
  }
  EXPECT_EQ(wrong, 0) << what;
  return extra;
}

SHARD_MPI_TEST(Reshard, PeakMemoryStaysNearOwnShards) {
  const int p = runtime().process_count();
  const int k = runtime().devices_per_rank();
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const std::int64_t cols = 840;  // divisible by every device count up to 8
  const std::int64_t rows_per_rank = 1248;  // 1248 * 840 doubles = 8 MiB per rank
  auto value = [cols](const Box& b) {
    Tensor<double> t(b.extent);
    for (std::int64_t i = 0; i < t.size(); ++i)
      t.flat(i) = static_cast<double>((b.offset[0] + i / b.extent[1]) * cols + b.offset[1] + i % b.extent[1]);
    return t;
  };
  // Even rows: all_to_all; one row fewer: uneven blocks, the general path.
  for (const std::int64_t rows : {rows_per_rank * p, rows_per_rank * p - 1}) {
    const Shape shape{rows, cols};
    const bool even = rows % n == 0;
    const std::string what = to_string(shape) + (even ? " all_to_all" : " general");
    const auto x = generate<double>(shape, NamedSharding(mesh, P("a", None)), value);
    std::int64_t own = 0;  // this rank's shard bytes, before and after
    for (const auto& s : x.addressable_shards()) own = std::max<std::int64_t>(own, s.data.bytes());
    own *= k;
    const std::int64_t global = num_elements(shape) * 8;
    const std::int64_t extra =
        peak_extra(x, NamedSharding(mesh, P(None, "a")), even ? Kind::kAllToAll : Kind::kGeneral, what);
    EXPECT_LE(extra, 3 * own + 64 * 1024) << what << ": peak " << extra << " B above live for " << own
                                          << " B of own shards";
    if (p > 3) {  // 3x own shards is the whole array at 3 ranks
      EXPECT_LT(extra, global) << what;
    }
    if (runtime().process_index() == 0)
      std::printf("[ shard    ] %s: peak extra %.2f MiB = %.2fx own shards %.2f MiB (global %.1f MiB)\n",
                  what.c_str(), extra / 1048576.0, static_cast<double>(extra) / static_cast<double>(own),
                  own / 1048576.0, global / 1048576.0);
  }
}

}  // namespace
}  // namespace shard::testing
