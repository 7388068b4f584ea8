// The sharded op set against its serial reference: every op on ShardedArrays (1-D, 2-D and
// 3-D meshes, uneven and empty shards, mixed dtypes) gives, on every rank and in every local
// shard, what the same Tensor op gives on the whole host array (the Tensor ops themselves are
// checked against naive loops in tests/unit/test_tensor_ops.cpp). CommStats checks that ops
// whose layouts line up send nothing, and that shardings over the same devices combine.

#include <cmath>
#include <numeric>

#include "mpi_test.hpp"
#include "test_util.hpp"

namespace shard::testing {
namespace {

std::vector<Mesh> meshes() { return abc_meshes(runtime().device_count()); }

/// Named axes of a mesh: a; b (None on a 1-D mesh); ab = (a, b).
struct Names {
  SpecEntry a, b, ab;
  explicit Names(const Mesh& m) : a(m.axis_names()[0]) {
    if (m.ndim() > 1) {
      b = SpecEntry(m.axis_names()[1]);
      ab = SpecEntry(std::vector<std::string>{m.axis_names()[0], m.axis_names()[1]});
    } else {
      ab = a;
    }
  }
};

/// r's shape, dtype, to_host() and every local shard (against the box its spec gives) equal
/// `want` to `tol` (relative, or absolute below 1). Collective (to_host).
template <typename T, typename U>
void expect_matches(const ShardedArray<T>& r, const Tensor<U>& want, double tol, const std::string& what,
                    const PartitionSpec* spec = nullptr) {
  static_assert(std::is_same_v<T, U>, "the sharded op and its reference must have the same dtype");
  const Tensor<T> host = r.to_host();
  ASSERT_EQ(r.shape(), want.shape()) << what;
  if (spec) {
    EXPECT_EQ(r.spec(), *spec) << what << ": spec " << r.spec().to_string();
  }
  auto close = [&](T g, T w) {
    const double a = static_cast<double>(g), b = static_cast<double>(w);
    return (std::isnan(a) && std::isnan(b)) || a == b || std::abs(a - b) <= tol * std::max(1.0, std::abs(b));
  };
  std::int64_t bad = 0;
  for (std::int64_t i = 0; i < want.size(); ++i) bad += !close(host.flat(i), want.flat(i));
  EXPECT_EQ(bad, 0) << what << ": to_host differs in " << bad << " elements";
  for (const auto& s : r.addressable_shards()) {
    const Box ref = reference_box(r.mesh(), r.spec(), r.shape(), s.device);
    ASSERT_EQ(s.box, ref) << what;
    const Tensor<T> w = reference_block(want, ref);
    std::int64_t sb = 0;
    for (std::int64_t i = 0; i < w.size(); ++i) sb += !close(s.data.flat(i), w.flat(i));
    EXPECT_EQ(sb, 0) << what << ": device " << s.device << " box " << to_string(s.box);
  }
}

std::int64_t bytes_sent() { return comm_stats().total().bytes; }

// ---------------------------------------------------------------- elementwise, mixed dtypes

SHARD_MPI_TEST(ArrayOps, RowIndexingMeansTheSameInBothViews) {
  // numpy's x[i] is row i (the first dim dropped) on a Tensor as on a ShardedArray; the flat
  // element is t.flat(i).
  const Mesh mesh = make_mesh({runtime().device_count()}, {"a"});
  const std::int64_t n = runtime().device_count();
  const Tensor<double> h = random_tensor<double>({2 * n, 3, 2}, 61);
  const auto x = device_put(h, NamedSharding(mesh, P("a")));
  for (std::int64_t i : {std::int64_t{0}, std::int64_t{1}, 2 * n - 1, std::int64_t{-1}, -2 * n}) {
    const Tensor<double> row = h[i];
    EXPECT_EQ(row.shape(), (Shape{3, 2}));
    const std::int64_t r = i < 0 ? i + 2 * n : i;
    for (std::int64_t k = 0; k < 6; ++k) EXPECT_EQ(row.flat(k), h.flat(r * 6 + k)) << i;
    EXPECT_EQ(x[i].to_host(), row) << i;
    EXPECT_EQ(h[{i}], row);
    EXPECT_EQ(h[i][1], (Tensor<double>(Shape{2}, {h.flat(r * 6 + 2), h.flat(r * 6 + 3)})));
  }
  EXPECT_EQ(h.flat(7), h(1, 0, 1));
  expect_error<Error>([&] { (void)h[2 * n]; }, {"out of"});
  expect_error<Error>([&] { (void)x[2 * n]; }, {"out of"});
}

SHARD_MPI_TEST(ArrayOps, MixedDtypesPromoteAsInJax) {
  std::uint64_t seed = 1;
  for (const auto& mesh : meshes()) {
    const Names X(mesh);
    const Tensor<std::int32_t> hi = random_tensor<std::int32_t>({13, 6}, seed++);
    const Tensor<float> hf = random_tensor<float>({13, 6}, seed++);
    const Tensor<double> hrow = random_tensor<double>({6}, seed++);
    const auto i = device_put(hi, NamedSharding(mesh, P(X.a, X.b)));
    const auto f = device_put(hf, NamedSharding(mesh, P(None, X.ab)));
    const auto row = device_put(hrow, NamedSharding(mesh, P(X.a)));
    const std::string m = mesh.to_string();
    const auto s1 = i + f;  // int32 + float32 -> float32, i's sharding (the first full-shape operand)
    static_assert(std::is_same_v<decltype(s1), const ShardedArray<float>>);
    const PartitionSpec si = P(X.a, X.b);
    expect_matches(s1, hi + hf, 0, m + " int32 + float32", &si);
    expect_matches(f * row, hf * hrow, 1e-15, m + " float32 * float64 row");
    expect_matches(i / 4, hi / 4, 0, m + " int32 / 4 (float32)");
    expect_matches(i > f, hi > hf, 0, m + " int32 > float32 (bool)");
    expect_matches((i > 0) & (f < 0.f), (hi > 0) & (hf < 0.f), 0, m + " bool &");
    expect_matches(where(i > 0, f, 0.5), where(hi > 0, hf, 0.5), 0, m + " where(bool, float32, 0.5)");
    expect_matches(clip(f, -2.f, 3.f), clip(hf, -2.f, 3.f), 0, m + " clip");
    expect_matches(sigmoid(i), sigmoid(hi), 1e-6, m + " sigmoid(int32)");
    expect_matches(log1p(abs(f)), log1p(abs(hf)), 1e-6, m + " log1p");
    expect_matches(power(f, 2), power(hf, 2), 1e-6, m + " power");
    expect_matches(astype<bool>(i), astype<bool>(hi), 0, m + " astype<bool>");
    // A Tensor meets a ShardedArray: JAX's uncommitted array, never decides the sharding.
    const Tensor<float> htable = random_tensor<float>({13, 6}, seed++);
    comm_stats().reset();
    const auto u = htable + i;
    EXPECT_EQ(bytes_sent(), 0) << m << " an uncommitted operand moved\n" << comm_stats().to_string();
    expect_matches(u, htable + hi, 0, m + " Tensor + ShardedArray follows the sharded one", &si);
  }
}

SHARD_MPI_TEST(ArrayOps, ReductionsOfEveryKind) {
  std::uint64_t seed = 100;
  for (const auto& mesh : meshes()) {
    const Names X(mesh);
    for (const auto& spec : {P(X.a, X.b), P(X.ab), P(None, X.a), P()}) {
      const Tensor<std::int32_t> hi = random_tensor<std::int32_t>({7, 5}, seed++);
      const Tensor<double> hd = random_tensor<double>({7, 5}, seed++);
      const auto xi = device_put(hi, NamedSharding(mesh, spec));
      const auto xd = device_put(hd, NamedSharding(mesh, spec));
      const std::string w = mesh.to_string() + " " + spec.to_string();
      for (const Dims& d : {Dims(), Dims(0), Dims(-1), Dims{0, 1}})
        for (bool keep : {false, true}) {
          const std::string what = w + (keep ? " keepdims" : "");
          expect_matches(sum(xi, d, keep), sum(hi, d, keep), 0, what + " sum int32");
          expect_matches(mean(xi, d, keep), mean(hi, d, keep), 1e-6, what + " mean int32 -> float32");
          expect_matches(prod(xd / 50.0, d, keep), prod(hd / 50.0, d, keep), 1e-12, what + " prod");
          expect_matches(max(xd, d, keep), max(hd, d, keep), 0, what + " max");
          expect_matches(any(xi > 900, d, keep), any(hi > 900, d, keep), 0, what + " any");
          expect_matches(all(xi > -900, d, keep), all(hi > -900, d, keep), 0, what + " all");
          expect_matches(logsumexp(xd / 10.0, d, keep), logsumexp(hd / 10.0, d, keep), 1e-12, what + " logsumexp");
        }
      expect_matches(argmin(xi, 1), argmin(hi, 1), 0, w + " argmin");
      expect_matches(argmax(xd), argmax(hd), 0, w + " argmax of the flattened array");
      expect_matches(argmax(xd, 0, true), argmax(hd, 0, true), 0, w + " argmax keepdims");
      expect_matches(softmax(xd / 30.0, 0), softmax(hd / 30.0, 0), 1e-13, w + " softmax dim 0");
      expect_matches(log_softmax(xd / 30.0), log_softmax(hd / 30.0), 1e-13, w + " log_softmax");
      expect_matches(gelu(xd / 300.0), gelu(hd / 300.0), 1e-13, w + " gelu");
      expect_matches(gelu(xd / 300.0, false), gelu(hd / 300.0, false), 1e-13, w + " gelu exact");
      expect_matches(standardize(xd, 0), standardize(hd, 0), 1e-12, w + " standardize dim 0");
      expect_matches(standardize(xd), standardize(hd), 1e-12, w + " standardize");
    }
  }
}

SHARD_MPI_TEST(ArrayOps, Float32SumsAreAccurateOnEveryMesh) {
  // 3M values in [0, 1): within 1e-6 of the float64 sum on 1 device and on every mesh (a
  // sequential float32 loop is ~3e-3 off; per-device float32 partials would depend on the mesh).
  const std::int64_t n = 3'000'000;
  Tensor<float> h = random_tensor<float>({n}, 7);
  for (auto& v : h) v = std::abs(v) / 100.f;
  double ref = 0;
  for (auto v : h) ref += static_cast<double>(v);
  for (const auto& mesh : meshes()) {
    const Names X(mesh);
    for (const auto& spec : {P(X.a), P(X.ab), P()}) {
      const auto x = device_put(h, NamedSharding(mesh, spec));
      const double got = sum(x).to_host().flat(0);
      EXPECT_LT(std::abs(got - ref) / ref, 1e-6) << mesh.to_string() << " " << spec.to_string();
      const double m = mean(x).to_host().flat(0);
      EXPECT_LT(std::abs(m - ref / n) / (ref / n), 1e-6) << mesh.to_string() << " mean";
    }
  }
}

// ---------------------------------------------------------------- products

SHARD_MPI_TEST(ArrayOps, MatmulWithVectorsDotAndVdot) {
  std::uint64_t seed = 200;
  for (const auto& mesh : meshes()) {
    const Names X(mesh);
    const Tensor<double> ha = random_tensor<double>({9, 6}, seed++), hv = random_tensor<double>({6}, seed++);
    const Tensor<double> hw = random_tensor<double>({9}, seed++);
    const auto a = device_put(ha, NamedSharding(mesh, P(X.a, X.b)));
    const auto v = device_put(hv, NamedSharding(mesh, P(X.ab)));
    const auto w = device_put(hw, NamedSharding(mesh, P(X.a)));
    const std::string m = mesh.to_string();
    expect_matches(matmul(a, v), matmul(ha, hv), 1e-12, m + " matrix @ vector");
    expect_matches(matmul(w, a), matmul(hw, ha), 1e-12, m + " vector @ matrix");
    expect_matches(matmul(v, v), matmul(hv, hv), 1e-12, m + " vector @ vector");
    expect_matches(dot(a, v), dot(ha, hv), 1e-12, m + " dot");
    expect_matches(vdot(a, a), vdot(ha, ha), 1e-12, m + " vdot");
    const Tensor<std::int32_t> hi = random_tensor<std::int32_t>({6, 4}, seed++);
    const auto i = device_put(hi, NamedSharding(mesh, P(None, X.a)));
    expect_matches(matmul(a, i), matmul(ha, hi), 1e-12, m + " float64 @ int32");
  }
}

// ---------------------------------------------------------------- shape ops

SHARD_MPI_TEST(ArrayOps, ReshapeKeepsSplitsWhereBlocksStayWhole) {
  const int n = runtime().device_count();
  std::uint64_t seed = 300;
  for (const auto& mesh : meshes()) {
    const Names X(mesh);
    struct Case {
      Shape from;
      PartitionSpec spec;
      Shape to;
      bool local;
    };
    const std::int64_t N = n;
    const std::vector<Case> cases = {
        {{4 * N, 6}, P(X.a), {4 * N * 6}, true},          // merge: the major dim keeps its axes
        {{4 * N, 6}, P(X.a), {2 * N, 12}, true},
        {{24 * N}, P(X.ab), {4 * N, 6}, true},            // split: shards of whole rows
        {{4 * N, 6}, P(None, X.a), {6, 4 * N}, false},    // a split minor dim moves
        {{3, 5, 7}, P(X.a, None, X.b), {15, 7}, false},   // uneven: gathered
        {{2, 3, 4}, P(None, X.a), {2, 12}, false},
        {{6, 1, 4}, P(X.a), {6, 4}, 6 % mesh.shape()[0] == 0},
        {{6, 4}, P(X.a, X.b), {6, 1, 4, 1}, 6 % mesh.shape()[0] == 0 && (mesh.ndim() < 2 || 4 % mesh.shape()[1] == 0)},
        {{5, 4}, P(X.ab), {-1}, n == 1 || 5 % n == 0},
    };
    for (const auto& c : cases) {
      const Tensor<float> h = random_tensor<float>(c.from, seed++);
      const auto x = device_put(h, NamedSharding(mesh, c.spec));
      comm_stats().reset();
      const auto y = reshape(x, c.to);
      const std::string what = mesh.to_string() + " reshape " + to_string(c.from) + " " + c.spec.to_string() +
                               " -> " + to_string(c.to) + " gives " + y.spec().to_string();
      if (c.local) {
        EXPECT_EQ(comm_stats().total().calls, 0) << what << "\n" << comm_stats().to_string();
      }
      expect_matches(y, reshape(h, c.to), 0, what);
    }
    const auto x = device_put(random_tensor<float>({4, 1, 3}, seed++), NamedSharding(mesh, P(X.a, X.b)));
    EXPECT_EQ(squeeze(x).shape(), (Shape{4, 3}));
    expect_matches(squeeze(x, {1}), squeeze(x.to_host(), {1}), 0, mesh.to_string() + " squeeze of a split size-1 dim");
    const PartitionSpec want = P(None, X.a, X.b);
    expect_matches(expand_dims(x, 0), expand_dims(x.to_host(), 0), 0, mesh.to_string() + " expand_dims", &want);
    expect_matches(swapaxes(x, 0, 2), swapaxes(x.to_host(), 0, 2), 0, mesh.to_string() + " swapaxes");
    expect_matches(moveaxis(x, 0, -1), moveaxis(x.to_host(), 0, -1), 0, mesh.to_string() + " moveaxis");
  }
}

SHARD_MPI_TEST(ArrayOps, SlicingAndIndexing) {
  std::uint64_t seed = 400;
  const std::vector<std::vector<Index>> indexes = {
      {2},           {-1},          {Slice(1, 6)},           {Slice(None, None, 2)}, {Slice(None, None, -1)},
      {1, Slice(2, 5)}, {Slice(), 3}, {Slice(-4, None), Slice(None, None, -2)}, {Slice(3, 1)}, {Slice(2, 3), 0}};
  for (const auto& mesh : meshes()) {
    const Names X(mesh);
    for (const auto& spec : specs_or_all(mesh, 2, {P(X.a, X.b), P(None, X.ab), P()})) {
      const Tensor<std::int64_t> h = random_tensor<std::int64_t>({9, 7}, seed++);
      const auto x = device_put(h, NamedSharding(mesh, spec));
      for (const auto& idx : indexes) {
        const std::string what = mesh.to_string() + " " + spec.to_string() + " slice with " +
                                 std::to_string(idx.size()) + " entries";
        expect_matches(slice(x, idx), slice(h, idx), 0, what);
      }
      expect_matches(x[3], slice(h, {3}), 0, mesh.to_string() + " x[3]");
      expect_matches((x[{Slice(1, None), -2}]), slice(h, {Slice(1, None), -2}), 0, mesh.to_string() + " x[1:, -2]");
    }
    // Slicing a dim that is not split moves nothing.
    const auto y = device_put(random_tensor<float>({8, 10}, seed++), NamedSharding(mesh, P(X.ab)));
    comm_stats().reset();
    const auto z = slice(y, {Slice(), Slice(2, 7)});
    EXPECT_EQ(comm_stats().total().calls, 0) << comm_stats().to_string();
    EXPECT_EQ(z.spec(), P(X.ab));
  }
}

SHARD_MPI_TEST(ArrayOps, ConcatenateAndStack) {
  std::uint64_t seed = 500;
  for (const auto& mesh : meshes()) {
    const Names X(mesh);
    const Tensor<double> ha = random_tensor<double>({5, 4}, seed++), hb = random_tensor<double>({3, 4}, seed++);
    const auto a = device_put(ha, NamedSharding(mesh, P(X.a, X.b)));
    const auto b = device_put(hb, NamedSharding(mesh, P(None, X.ab)));
    const PartitionSpec sa = P(X.a, X.b);
    expect_matches(concatenate<double>({a, b}, 0), concatenate<double>({ha, hb}, 0), 0,
                   mesh.to_string() + " concatenate dim 0", &sa);
    const auto c = device_put(random_tensor<double>({5, 2}, seed++), NamedSharding(mesh, P(X.b)));
    expect_matches(concatenate<double>({a, c, a}, -1), concatenate<double>({ha, c.to_host(), ha}, -1), 0,
                   mesh.to_string() + " concatenate dim -1");
    expect_matches(stack<double>({a, a * 2.0}, 1), stack<double>({ha, ha * 2.0}, 1), 0, mesh.to_string() + " stack");
  }
}

SHARD_MPI_TEST(ArrayOps, TakeEmbeddingsAndLabels) {
  // Embedding lookup: a (V, D) table (replicated, split along D, or vocabulary-parallel along
  // V: masked local rows and one psum) with (B, T) int32 tokens split along the batch.
  std::uint64_t seed = 600;
  for (const auto& mesh : meshes()) {
    const Names X(mesh);
    const std::int64_t V = 11, D = 6;
    const Tensor<float> htable = random_tensor<float>({V, D}, seed++);
    Tensor<std::int32_t> htok = random_tensor<std::int32_t>({4, 5}, seed++);
    for (auto& t : htok) t = static_cast<std::int32_t>(((t % V) + V) % V) - (t % 3 == 0 ? static_cast<std::int32_t>(V) : 0);
    const auto tok = device_put(htok, NamedSharding(mesh, P(X.a)));
    for (const auto& tspec : {P(), P(None, X.b), P(X.b), P(X.ab)}) {
      const auto table = device_put(htable, NamedSharding(mesh, tspec));
      expect_matches(take(table, tok, 0), take(htable, htok, 0), 0,
                     mesh.to_string() + " take rows of a " + tspec.to_string() + " table");
    }
    // Labels: the logit of each row's label, logits split along classes.
    const Tensor<double> hlogits = random_tensor<double>({8, 10}, seed++);
    Tensor<std::int64_t> hlab({8, 1});
    for (std::int64_t r = 0; r < 8; ++r) hlab.flat(r) = (r * 7 + 3) % 10;
    for (const auto& lspec : {P(X.a, X.b), P(None, X.ab), P(X.ab)}) {
      const auto logits = device_put(hlogits, NamedSharding(mesh, lspec));
      const auto lab = device_put(hlab, NamedSharding(mesh, P(X.a)));
      expect_matches(take_along_axis(logits, lab, 1), take_along_axis(hlogits, hlab, 1), 0,
                     mesh.to_string() + " take_along_axis of " + lspec.to_string() + " logits");
    }
    const auto lab1 = device_put(squeeze(hlab, {1}), NamedSharding(mesh, P(X.ab)));
    expect_matches(one_hot(lab1, 10), one_hot(squeeze(hlab, {1}), 10), 0, mesh.to_string() + " one_hot");
  }
}

SHARD_MPI_TEST(ArrayOps, CreationKeepsShardings) {
  for (const auto& mesh : meshes()) {
    const Names X(mesh);
    const NamedSharding s(mesh, P(X.a, X.b));
    const auto x = ones<float>({5, 3}, s);
    EXPECT_EQ(x.sharding(), s);
    expect_matches(x, ones<float>({5, 3}), 0, "ones");
    expect_matches(zeros_like(x), zeros<float>({5, 3}), 0, "zeros_like");
    expect_matches(full_like(x, 2.5f), full<float>({5, 3}, 2.5f), 0, "full_like");
    EXPECT_EQ(ones_like(x).sharding(), s);
    expect_matches(arange<std::int32_t>(7, NamedSharding(mesh, P(X.ab))), arange<std::int32_t>(7), 0, "arange(7)");
  }
}

// ---------------------------------------------------------------- shardings over the same devices

SHARD_MPI_TEST(ArrayOps, PositionalShardingsOfOneDeviceSetCombine) {
  // Seed 001: y on sharding.reshape(4, 2), z on sharding.reshape(2, 4) (here p x q and q x p
  // over all devices): dot(y, z) works, and sends exactly the bytes its plan says.
  const int n = runtime().device_count();
  const int me = runtime().process_index();
  std::vector<int> f{n, 1};  // a p x q grid with p != q when n allows it (4 x 2 for 8 devices)
  for (const auto& g : factorisations(n, 2))
    if (g[0] > g[1] && g[1] > f[1]) f = g;
  const PositionalSharding sharding(make_mesh({n}, {"a"}).device_ids());
  const Tensor<double> hx = random_tensor<double>({8, 8}, 700);
  const auto y = device_put(hx, sharding.reshape({f[0], f[1]}));
  const auto z = device_put(hx, sharding.reshape({f[1], f[0]}));
  const MatmulPlan plan = plan_matmul(y.shape(), y.sharding(), z.shape(), z.sharding(), sizeof(double));
  const ReshardPlan zplan = reshard_plan(z, NamedSharding(y.mesh(), plan.b));
  const ReshardPlan yplan = reshard_plan(y, NamedSharding(y.mesh(), plan.a));
  comm_stats().reset();
  const auto w = dot(y, z);
  const std::int64_t moved = comm_stats().get("reshard").bytes + comm_stats().get("all_gather").bytes +
                             comm_stats().get("all_to_all").bytes;
  EXPECT_EQ(moved, zplan.bytes_sent[me] + yplan.bytes_sent[me]) << plan.to_string() << "\n" << comm_stats().to_string();
  expect_matches(w, dot(hx, hx), 1e-12, "dot(y on reshape(p, q), z on reshape(q, p))");
  // replicate(1) and replicate(0) of one reshape spell layouts of one mesh: nothing moves.
  const auto y1 = device_put(hx, sharding.reshape({f[0], f[1]}).replicate(1));
  const auto z0 = device_put(hx, sharding.reshape({f[0], f[1]}).replicate(0));
  comm_stats().reset();
  const auto w2 = dot(y1, z0);
  EXPECT_EQ(comm_stats().total().bytes, 0) << comm_stats().to_string();
  expect_matches(w2, dot(hx, hx), 1e-12, "dot(y replicate(1), z replicate(0))");
  // with_sharding_constraint to another reshape of the same devices.
  const auto c = with_sharding_constraint(y + 1.0, sharding.reshape({f[1], f[0]}));
  EXPECT_TRUE(c.mesh() == z.mesh());
  expect_matches(c, hx + 1.0, 0, "with_sharding_constraint onto reshape(q, p)");
  // The bias of seed 001's MLP: a replicated 1-D array meets a batch on another mesh.
  const auto b = device_put(random_tensor<double>({8}, 701), sharding.replicate());
  expect_matches(w + b, dot(hx, hx) + b.to_host(), 1e-12, "batch + replicated bias");
}

SHARD_MPI_TEST(ArrayOps, PrintingSendsOnlyTheShownElements) {
  const int me = runtime().process_index();
  for (const auto& mesh : meshes()) {
    const Names X(mesh);
    for (const auto& spec : {P(X.a, X.b), P(None, X.ab), P()}) {
      const Tensor<float> small = random_tensor<float>({5, 7}, 950);
      const std::string s = to_string(device_put(small, NamedSharding(mesh, spec)));
      EXPECT_EQ(s, me == 0 ? to_string(small) : "") << mesh.to_string() << " " << spec.to_string();
      // 300 x 400: summarised, so at most 6 x 6 elements reach rank 0.
      const Tensor<std::int64_t> big = random_tensor<std::int64_t>({300, 400}, 951);
      const auto x = device_put(big, NamedSharding(mesh, spec));
      comm_stats().reset();
      const std::string t = to_string(x);
      EXPECT_LE(comm_stats().get("print").bytes, 36 * 8);
      EXPECT_EQ(t, me == 0 ? to_string(big) : "") << mesh.to_string() << " " << spec.to_string();
    }
  }
}

// ---------------------------------------------------------------- typed shard_map and pmap

SHARD_MPI_TEST(ShardMapTyped, MixedDtypesListsTuplesAndScalars) {
  // A data-parallel loss: float32 inputs, int32 labels, a list of parameters with one spec
  // each, results as a tuple of a replicated scalar and the per-device gradient blocks.
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"data"});
  const Tensor<float> hx = random_tensor<float>({4 * n, 3}, 800);
  Tensor<std::int32_t> hy({4 * n});
  for (std::int64_t i = 0; i < hy.size(); ++i) hy.flat(i) = static_cast<std::int32_t>(i % 3);
  const Tensor<float> hw = random_tensor<float>({3, 3}, 801), hb = random_tensor<float>({3}, 802);
  const auto x = device_put(hx, NamedSharding(mesh, P("data")));
  const auto y = device_put(hy, NamedSharding(mesh, P("data")));
  const std::vector<ShardedArray<float>> params{device_put(hw, NamedSharding(mesh, P())),
                                                device_put(hb, NamedSharding(mesh, P()))};
  auto step = shard_map(mesh, {P("data"), P("data"), std::vector<PartitionSpec>{P(), P()}}, {P(), P("data")},
                        [](const Tensor<float>& xb, const Tensor<std::int32_t>& yb, const std::vector<Tensor<float>>& p) {
                          const auto logp = log_softmax(matmul(xb, p[0]) + p[1]);
                          const auto picked = take_along_axis(logp, expand_dims(yb, 1), 1);
                          const float loss = -psum(sum(picked), "data").item();  // a scalar output
                          return std::make_tuple(loss, argmax(logp, 1));
                        });
  const auto [loss, pred] = step(x, y, params);
  static_assert(std::is_same_v<decltype(loss), const ShardedArray<float>>);
  static_assert(std::is_same_v<decltype(pred), const ShardedArray<std::int64_t>>);
  const auto hlogp = log_softmax(matmul(hx, hw) + hb);
  const float want = -sum(take_along_axis(hlogp, expand_dims(hy, 1), 1)).item();
  EXPECT_NEAR(loss.to_host().item(), want, 1e-4 * std::abs(want));
  expect_matches(pred, argmax(hlogp, 1), 0, "argmax per device");
  // A list result with one spec per element.
  const auto twice = shard_map(mesh, {std::vector<PartitionSpec>{P(), P()}}, {std::vector<PartitionSpec>{P(), P()}},
                               [](const std::vector<Tensor<float>>& p) {
                                 std::vector<Tensor<float>> out;
                                 for (const auto& t : p) out.push_back(t * 2.f);
                                 return out;
                               })(params);
  ASSERT_EQ(twice.size(), 2u);
  expect_matches(twice[0], hw * 2.f, 0, "list result 0");
  expect_matches(twice[1], hb * 2.f, 0, "list result 1");
}

SHARD_MPI_TEST(ShardMapTyped, CollectivesOutsideABodyAreAnError) {
  expect_error<RuntimeError>([] { (void)psum(Tensor<float>({2}, 1.f), "a"); }, {"outside a shard_map or pmap body"});
}

SHARD_MPI_TEST(PmapTyped, InAxesBroadcastAndChaining) {
  const int n = runtime().device_count();
  // Seed 003: pmap(convolve)(xs, ws) with two mapped arguments.
  const Tensor<float> xs = random_tensor<float>({n, 5}, 900), ws = random_tensor<float>({n, 3}, 901);
  auto convolve = [](const Tensor<float>& x, const Tensor<float>& w) {
    std::vector<Tensor<float>> out;
    for (std::int64_t i = 1; i < x.shape()[0] - 1; ++i) out.push_back(dot(slice(x, {Slice(i - 1, i + 2)}), w));
    return stack(out);
  };
  const auto got = pmap(convolve)(xs, ws);
  std::vector<Tensor<float>> rows;
  for (int d = 0; d < n; ++d) rows.push_back(convolve(slice(xs, {d}), slice(ws, {d})));
  expect_matches(got, stack(rows), 1e-6, "pmap(convolve)(xs, ws)");
  // in_axes: the second argument broadcast (None), the first mapped along dim 1.
  const Tensor<double> a = random_tensor<double>({3, n}, 902), b = random_tensor<double>({3}, 903);
  const auto r = pmap([](const Tensor<double>& col, const Tensor<double>& v) { return vdot(col, v); }, "i",
                      {1, None})(a, b);
  Tensor<double> want({n});
  for (int d = 0; d < n; ++d) want.flat(d) = vdot(slice(a, {Slice(), d}), b).item();
  expect_matches(r, want, 1e-12, "pmap in_axes {1, None}");
  // Seed 000: the output of one pmap feeds the next (pmap(jnp.matmul)(xd, xd)).
  const auto xd = pmap([](const Tensor<std::int32_t>&) { return ones<float>({4, 4}); })(arange<std::int32_t>(n));
  const auto yd = pmap([](const Tensor<float>& p, const Tensor<float>& q) { return matmul(p, q); })(xd, xd);
  EXPECT_EQ(yd.shape(), (Shape{n, 4, 4}));
  expect_matches(yd[0], full<float>({4, 4}, 4.f), 0, "yd[0]");
}

// ---------------------------------------------------------------- log-space activations

/// f(a, b) elementwise over the numpy broadcast of a and b, by loops over global indices.
template <typename F>
Tensor<double> host_zip(const Tensor<double>& a, const Tensor<double>& b, F f) {
  const Shape out = host_broadcast(a.shape(), b.shape());
  Tensor<double> r(out);
  Shape idx(out.size(), 0);
  for (std::int64_t i = 0; i < r.size(); ++i, next_index(idx, out))
    r.flat(i) = f(a.flat(broadcast_offset(a.shape(), idx)), b.flat(broadcast_offset(b.shape(), idx)));
  return r;
}

double host_logaddexp(double a, double b) {
  return static_cast<double>(std::log(std::exp(static_cast<long double>(a)) + std::exp(static_cast<long double>(b))));
}

SHARD_MPI_TEST(ArrayOps, Logaddexp) {
  // Dims of 7 and 5 split 1-4 ways (uneven and empty shards), a broadcast row and column,
  // a Tensor operand (uncommitted), a scalar, and the extremes, on every mesh.
  std::uint64_t seed = 1100;
  const double inf = std::numeric_limits<double>::infinity();
  for (const auto& mesh : meshes()) {
    const Names X(mesh);
    for (const auto& spec : specs_or_all(mesh, 2, {P(X.a, X.b), P(X.ab), P(None, X.ab), P()})) {
      const std::string w = mesh.to_string() + " " + spec.to_string();
      const Tensor<double> ha = random_tensor<double>({7, 5}, seed++), hrow = random_tensor<double>({5}, seed++);
      const Tensor<double> hcol = random_tensor<double>({7, 1}, seed++);
      const auto a = device_put(ha, NamedSharding(mesh, spec));
      const auto row = device_put(hrow, NamedSharding(mesh, P(X.b)));
      const auto col = device_put(hcol, NamedSharding(mesh, P(X.a)));
      expect_matches(logaddexp(a, row), host_zip(ha, hrow, host_logaddexp), 1e-15, w + " logaddexp(a, row)", &spec);
      expect_matches(logaddexp(col, a), host_zip(hcol, ha, host_logaddexp), 1e-15, w + " logaddexp(col, a)");
      expect_matches(logaddexp(hrow, a), host_zip(hrow, ha, host_logaddexp), 1e-15, w + " logaddexp(Tensor, a)", &spec);
      expect_matches(logaddexp(a, -3.5), host_zip(ha, Tensor<double>(Shape{}, -3.5), host_logaddexp), 1e-15,
                     w + " logaddexp(a, -3.5)", &spec);
      // float32 from int32 and float32 operands.
      const Tensor<std::int32_t> hi = random_tensor<std::int32_t>({7, 5}, seed++);
      const auto af = logaddexp(device_put(hi, NamedSharding(mesh, spec)), astype<float>(a));
      static_assert(std::is_same_v<decltype(af), const ShardedArray<float>>);
      const Tensor<double> ha32 = astype<double>(astype<float>(ha));
      expect_matches(af, astype<float>(host_zip(astype<double>(hi), ha32, host_logaddexp)), 3e-7, w + " int32, float32");
      // Extremes: the same values however they are split.
      Tensor<double> ex({7, 5}), ey({7, 5});
      const double vx[] = {1000, -inf, -inf, inf, inf, -1000, 0.25};
      const double vy[] = {1000, -inf, 2, -inf, inf, -1000, 700};
      for (int i = 0; i < 7; ++i)
        for (int j = 0; j < 5; ++j) {
          ex(i, j) = vx[i];
          ey(i, j) = vy[i] - j;
        }
      Tensor<double> want({7, 5});
      for (int i = 0; i < 7; ++i)
        for (int j = 0; j < 5; ++j) {
          const double x = ex(i, j), y = ey(i, j), m = std::max(x, y);
          want(i, j) = x == y ? x + (std::isinf(x) ? 0.0 : std::log(2.0)) : m + std::log1p(std::exp(-std::abs(x - y)));
        }
      expect_matches(logaddexp(device_put(ex, NamedSharding(mesh, spec)), device_put(ey, NamedSharding(mesh, P(X.b)))),
                     want, 1e-15, w + " extremes");
    }
  }
}

SHARD_MPI_TEST(ArrayOps, Softplus) {
  std::uint64_t seed = 1200;
  auto host_softplus = [](double v) {
    return static_cast<double>(std::log1p(std::exp(static_cast<long double>(v))));
  };
  for (const auto& mesh : meshes()) {
    const Names X(mesh);
    for (const auto& spec : specs_or_all(mesh, 2, {P(X.a, X.b), P(None, X.ab), P()})) {
      const std::string w = mesh.to_string() + " " + spec.to_string();
      Tensor<double> h = random_tensor<double>({7, 5}, seed++);  // [-100, 100)
      h(0, 0) = 100;
      h(6, 4) = -100;
      h(3, 2) = 0;
      Tensor<double> want(h.shape());
      for (std::int64_t i = 0; i < h.size(); ++i) want.flat(i) = host_softplus(h.flat(i));
      const auto x = device_put(h, NamedSharding(mesh, spec));
      expect_matches(softplus(x), want, 1e-15, w + " softplus", &spec);
      const Tensor<std::int32_t> hi = random_tensor<std::int32_t>({7, 5}, seed++);
      Tensor<float> wi(hi.shape());
      for (std::int64_t i = 0; i < hi.size(); ++i) wi.flat(i) = static_cast<float>(host_softplus(hi.flat(i) / 10.0));
      const auto si = softplus(device_put(hi, NamedSharding(mesh, spec)) / 10);  // int32 / 10 is float32
      expect_matches(si, wi, 3e-7, w + " softplus float32", &spec);
    }
  }
}

SHARD_MPI_TEST(ArrayOps, LogSigmoid) {
  std::uint64_t seed = 1300;
  for (const auto& mesh : meshes()) {
    const Names X(mesh);
    for (const auto& spec : specs_or_all(mesh, 2, {P(X.ab, None), P(X.b, X.a), P()})) {
      const std::string w = mesh.to_string() + " " + spec.to_string();
      Tensor<double> h = random_tensor<double>({7, 5}, seed++);
      h(1, 1) = 100;
      h(5, 0) = -100;
      Tensor<double> want(h.shape());
      for (std::int64_t i = 0; i < h.size(); ++i)
        want.flat(i) = static_cast<double>(-std::log1p(std::exp(-static_cast<long double>(h.flat(i)))));
      expect_matches(log_sigmoid(device_put(h, NamedSharding(mesh, spec))), want, 1e-15, w + " log_sigmoid", &spec);
    }
  }
}

// ---------------------------------------------------------------- cumsum

/// Inclusive prefix sums along `dim` (suffix sums when reverse), each element summed afresh.
template <typename T>
Tensor<double> host_cumsum(const Tensor<T>& x, int dim, bool reverse = false) {
  const Shape& sh = x.shape();
  const Shape st = strides_of(sh);
  Tensor<double> r(sh);
  Shape idx(sh.size(), 0);
  for (std::int64_t i = 0; i < x.size(); ++i, next_index(idx, sh)) {
    long double acc = 0;
    const std::int64_t lo = reverse ? idx[dim] : 0, hi = reverse ? sh[dim] : idx[dim] + 1;
    for (std::int64_t j = lo; j < hi; ++j) acc += static_cast<long double>(x.flat(i + (j - idx[dim]) * st[dim]));
    r.flat(i) = static_cast<double>(acc);
  }
  return r;
}

SHARD_MPI_TEST(ArrayOps, CumsumAlongSplitAxes) {
  // Every axis of (7, 5) and (7, 3, 2) arrays split 1-8 ways on 1-3-D meshes (uneven and empty
  // blocks), tuples in mesh order and reversed; float64, float32, int32, bool; reverse scans.
  std::uint64_t seed = 1400;
  for (const auto& mesh : meshes()) {
    const Names X(mesh);
    std::vector<PartitionSpec> specs{P(X.a, X.b), P(X.b, X.a), P(X.ab), P(None, X.ab), P()};
    if (mesh.ndim() > 1) specs.push_back(P(SpecEntry(std::vector<std::string>{mesh.axis_names()[1], mesh.axis_names()[0]})));
    specs = specs_or_all(mesh, 2, specs);
    for (const auto& spec : specs) {
      const std::string w = mesh.to_string() + " " + spec.to_string();
      const Tensor<double> hd = random_tensor<double>({7, 5}, seed++);
      const Tensor<std::int32_t> hi = random_tensor<std::int32_t>({7, 5}, seed++);
      Tensor<bool> hb({7, 5});
      for (std::int64_t i = 0; i < hb.size(); ++i) hb.flat(i) = hi.flat(i) % 3 == 0;
      const auto xd = device_put(hd, NamedSharding(mesh, spec));
      const auto xf = astype<float>(xd);
      const auto xi = device_put(hi, NamedSharding(mesh, spec));
      const auto xb = device_put(hb, NamedSharding(mesh, spec));
      for (int axis : {0, 1, -1, -2}) {
        const int d = axis < 0 ? axis + 2 : axis;
        const std::string what = w + " axis " + std::to_string(axis);
        expect_matches(cumsum(xd, axis), host_cumsum(hd, d), 1e-12, what + " float64", &spec);
        expect_matches(prefix_sum(xd, axis, true), host_cumsum(hd, d, true), 1e-12, what + " reverse", &spec);
        expect_matches(cumsum(xf, axis), astype<float>(host_cumsum(astype<float>(hd), d)), 1e-7, what + " float32", &spec);
        const auto ci = cumsum(xi, axis);
        static_assert(std::is_same_v<decltype(ci), const ShardedArray<std::int32_t>>);
        expect_matches(ci, astype<std::int32_t>(host_cumsum(hi, d)), 0, what + " int32", &spec);
        const auto cb = cumsum(xb, axis);
        static_assert(std::is_same_v<decltype(cb), const ShardedArray<std::int32_t>>);
        expect_matches(cb, astype<std::int32_t>(host_cumsum(hb, d)), 0, what + " bool", &spec);
      }
      // (Tolerances: the blocks' totals are added in another order than the host's loop. A
      // float64 running sum of 7 values up to 100 is off by up to 7 ulp(700) ~ 8e-13 from it,
      // which near a zero crossing, where the check is absolute, is that much absolutely.)
      expect_matches(cumsum(xd), host_cumsum(hd.reshaped({35}), 0), 1e-12, w + " flattened");
    }
    // 3-D arrays with random specs (every dim may be split, also by several axes).
    std::mt19937_64 rng(seed);
    std::vector<PartitionSpec> specs3;
    for (int r = 0; r < 6; ++r) specs3.push_back(random_spec(mesh, 3, rng));
    for (const auto& spec : specs_or_all(mesh, 3, specs3)) {
      const Tensor<double> h = random_tensor<double>({7, 3, 2}, seed++);
      const auto x = device_put(h, NamedSharding(mesh, spec));
      for (int axis : {0, 1, 2})
        expect_matches(cumsum(x, axis), host_cumsum(h, axis), 1e-12,
                       mesh.to_string() + " " + spec.to_string() + " 3-D axis " + std::to_string(axis), &spec);
    }
  }
}

SHARD_MPI_TEST(ArrayOps, CumsumSendsOnlyTheBlockTotals) {
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const Tensor<double> h = random_tensor<double>({700, 10}, 1450);
  const auto rows = device_put(h, NamedSharding(mesh, P("a")));
  const auto cols = device_put(h, NamedSharding(mesh, P(None, "a")));
  comm_stats().reset();
  expect_matches(cumsum(cols, 0), host_cumsum(h, 0), 1e-11, "cumsum along an unsplit dim");
  const std::int64_t before = bytes_sent();  // to_host's gather
  EXPECT_EQ(comm_stats().entries().count({"all_gather", "'a'"}), 0u) << comm_stats().to_string();
  const auto c = cumsum(rows, 0);
  const std::int64_t scan = bytes_sent() - before;
  // One all_gather of each device's 10 totals (float64); a block is 700 / n rows of 10.
  const std::int64_t local = static_cast<std::int64_t>(runtime().devices_per_rank());
  if (runtime().process_count() > 1) {
    EXPECT_GT(scan, 0);
  }
  EXPECT_LE(scan, local * 10 * 8) << comm_stats().to_string();
  expect_matches(c, host_cumsum(h, 0), 1e-11, "cumsum along a split dim");
}

// ---------------------------------------------------------------- layer_norm

/// standardize(x, dim) * g + b of a 2-D x by loops, g and b indexed along `dim`.
Tensor<double> host_layer_norm(const Tensor<double>& x, const Tensor<double>& g, const Tensor<double>& b, int dim,
                               double eps) {
  const std::int64_t rows = x.shape()[0], cols = x.shape()[1];
  const std::int64_t lines = dim == 1 ? rows : cols, n = dim == 1 ? cols : rows;
  Tensor<double> out(x.shape());
  auto at = [&](std::int64_t line, std::int64_t k) -> std::int64_t { return dim == 1 ? line * cols + k : k * cols + line; };
  for (std::int64_t l = 0; l < lines; ++l) {
    double m = 0, var = 0;
    for (std::int64_t k = 0; k < n; ++k) m += x.flat(at(l, k)) / static_cast<double>(n);
    for (std::int64_t k = 0; k < n; ++k) var += (x.flat(at(l, k)) - m) * (x.flat(at(l, k)) - m) / static_cast<double>(n);
    for (std::int64_t k = 0; k < n; ++k) out.flat(at(l, k)) = (x.flat(at(l, k)) - m) / std::sqrt(var + eps) * g.flat(k) + b.flat(k);
  }
  return out;
}

SHARD_MPI_TEST(ArrayOps, LayerNorm) {
  // (7, 6) normalised along either dim, that dim split or not (uneven blocks); gain and bias
  // sharded, replicated or Tensors.
  std::uint64_t seed = 1500;
  for (const auto& mesh : meshes()) {
    const Names X(mesh);
    for (const auto& spec : specs_or_all(mesh, 2, {P(X.a, X.b), P(None, X.ab), P(X.ab), P()})) {
      const std::string w = mesh.to_string() + " " + spec.to_string();
      const Tensor<double> hx = random_tensor<double>({7, 6}, seed++);
      const Tensor<double> hg6 = random_tensor<double>({6}, seed++) / 50.0, hb6 = random_tensor<double>({6}, seed++);
      const Tensor<double> hg7 = random_tensor<double>({7}, seed++) / 50.0, hb7 = random_tensor<double>({7}, seed++);
      const auto x = device_put(hx, NamedSharding(mesh, spec));
      const auto g6 = device_put(hg6, NamedSharding(mesh, P(X.b))), b6 = device_put(hb6, NamedSharding(mesh, P()));
      const auto g7 = device_put(hg7, NamedSharding(mesh, P(X.ab))), b7 = device_put(hb7, NamedSharding(mesh, P(X.a)));
      expect_matches(layer_norm(x, g6, b6), host_layer_norm(hx, hg6, hb6, 1, 1e-5), 1e-12, w + " axis -1", &spec);
      expect_matches(layer_norm(x, hg6, hb6, 1, 1e-2), host_layer_norm(hx, hg6, hb6, 1, 1e-2), 1e-12,
                     w + " axis 1, Tensor gain and bias", &spec);
      expect_matches(layer_norm(x, g7, b7, 0), host_layer_norm(hx, hg7, hb7, 0, 1e-5), 1e-12, w + " axis 0", &spec);
      const auto y32 = layer_norm(astype<float>(x), astype<float>(g7), astype<float>(b7), -2);
      static_assert(std::is_same_v<decltype(y32), const ShardedArray<float>>);
      expect_matches(y32, astype<float>(host_layer_norm(hx, hg7, hb7, 0, 1e-5)), 2e-5, w + " float32");
    }
  }
}

// ---------------------------------------------------------------- cross entropy

/// -log(softmax(logits)[label]) along the last dim by loops in long double.
template <typename T, typename I>
Tensor<double> host_cross_entropy(const Tensor<T>& logits, const Tensor<I>& labels) {
  const std::int64_t c = logits.shape().back(), rows = logits.size() / c;
  Tensor<double> out(labels.shape());
  for (std::int64_t r = 0; r < rows; ++r) {
    long double m = -INFINITY, s = 0;
    for (std::int64_t j = 0; j < c; ++j) m = std::max(m, static_cast<long double>(logits.flat(r * c + j)));
    for (std::int64_t j = 0; j < c; ++j) s += std::exp(static_cast<long double>(logits.flat(r * c + j)) - m);
    out.flat(r) = static_cast<double>(std::log(s) - (static_cast<long double>(logits.flat(r * c + labels.flat(r))) - m));
  }
  return out;
}

SHARD_MPI_TEST(ArrayOps, SoftmaxCrossEntropyWithIntegerLabels) {
  // (7, 5) logits with the batch, the classes (vocabulary-parallel) or both split, uneven;
  // labels sharded like the batch, otherwise, or a Tensor; large float32 logits.
  std::uint64_t seed = 1600;
  for (const auto& mesh : meshes()) {
    const Names X(mesh);
    for (const auto& spec : specs_or_all(mesh, 2, {P(X.a, X.b), P(None, X.ab), P(X.ab), P(X.b, X.a), P()})) {
      const std::string w = mesh.to_string() + " " + spec.to_string();
      const Tensor<double> hl = random_tensor<double>({7, 5}, seed++) / 10.0;
      Tensor<std::int32_t> hy({7});
      for (std::int64_t i = 0; i < 7; ++i) hy.flat(i) = static_cast<std::int32_t>((i * 3 + seed) % 5);
      const auto logits = device_put(hl, NamedSharding(mesh, spec));
      const auto want = host_cross_entropy(hl, hy);
      const auto loss = softmax_cross_entropy_with_integer_labels(logits, device_put(hy, NamedSharding(mesh, P(X.a))));
      static_assert(std::is_same_v<decltype(loss), const ShardedArray<double>>);
      expect_matches(loss, want, 1e-13, w + " labels P(a)");
      expect_matches(softmax_cross_entropy_with_integer_labels(logits, device_put(hy, NamedSharding(mesh, P(X.b)))), want,
                     1e-13, w + " labels P(b)");
      expect_matches(softmax_cross_entropy_with_integer_labels(logits, hy), want, 1e-13, w + " Tensor labels");
      expect_matches(softmax_cross_entropy_with_integer_labels(transpose(logits), astype<std::int64_t>(hy), 0), want,
                     1e-13, w + " classes on axis 0, int64 labels");
      Tensor<float> big = astype<float>(random_tensor<double>({7, 5}, seed++)) + 2e4f;  // around 2e4
      const auto lb = softmax_cross_entropy_with_integer_labels(device_put(big, NamedSharding(mesh, spec)), hy);
      static_assert(std::is_same_v<decltype(lb), const ShardedArray<float>>);
      expect_matches(lb, astype<float>(host_cross_entropy(big, hy)), 1e-5, w + " logits around 2e4 (float32)");
    }
  }
}

}  // namespace
}  // namespace shard::testing
