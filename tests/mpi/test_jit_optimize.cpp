// jit's program passes (jit/optimize.hpp): elementwise fusion and dead code. A fused chain gives
// bit for bit what the unfused program and eager give (on uneven shapes, blocks shorter and longer
// than a tile, replicated axes, bool and cast intermediates), reads each input once and writes
// only what the rest of the program uses; a broadcasting op or a reshard ends a chain; the
// passes switch off; grad and vmap around a fused program replay it op by op. An all_gather
// reshard starts where its operand is ready and is waited for before its first use (a layer's
// weights, read by its shard_map, one layer ahead). A program's buffers
// are reused from call to call: after the first call, no Tensor buffer comes from the system
// (device threads of a shard_map, reshards' transfers and results too), unless switched off.

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "mpi_test.hpp"
#include "shard/shard.hpp"
#include "test_util.hpp"

namespace {

using namespace shard;
using shard::testing::host_double;
using shard::testing::random_tensor;

void expect_same(const Tensor<double>& got, const Tensor<double>& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  for (std::int64_t i = 0; i < got.size(); ++i) {
    const double g = got.flat(i), w = want.flat(i);
    if (std::isnan(w)) {
      ASSERT_TRUE(std::isnan(g)) << what << " at flat index " << i;
    } else {
      ASSERT_EQ(g, w) << what << " at flat index " << i;
    }
  }
}

int count(const std::vector<std::string>& ops, const std::string& op) {
  int c = 0;
  for (const auto& o : ops) c += o == op;
  return c;
}

/// The chain: ((x * a + b) - c) * d, then maximum(., 0) and a cast; besides the cast it
/// returns x * a + b (an intermediate the caller reads: written out) and a count of the positive
/// elements through a comparison and where (a bool intermediate).
struct Chain {
  auto operator()(const ShardedArray<float>& x, const ShardedArray<float>& a, const ShardedArray<float>& b,
                  const ShardedArray<float>& c, const ShardedArray<float>& d) const {
    const auto t = x * a + b;
    const auto r = maximum((t - c) * d, 0.f);
    const auto low = astype<bfloat16>(r);
    const auto picked = where(r > 0.5f, r, -x);
    return std::make_tuple(low, t, sum(picked));
  }
};

SHARD_MPI_TEST(JitOptimize, FusedChainsEqualUnfusedAndEager) {
  const int n = shard::testing::runtime().device_count();
  std::vector<Mesh> meshes{make_mesh({n}, {"a"})};
  if (n % 2 == 0) meshes.push_back(make_mesh({2, n / 2}, {"a", "b"}));
  // Rows of 1 to 3000 elements per block: shorter than a tile, several tiles and a partial one.
  const std::vector<Shape> shapes{{7, 5}, {n * 3 + 1, 2}, {2 * n + 1, 1013}};
  std::uint64_t seed = 7;
  for (const Mesh& mesh : meshes) {
    std::vector<PartitionSpec> specs{P(), P("a"), P(None, "a")};
    if (mesh.axis_names().size() == 2) specs.push_back(P("b", "a"));  // and 'b' alone replicates
    for (const Shape& shape : shapes)
      for (const PartitionSpec& spec : specs) {
        const NamedSharding sh(mesh, spec);
        std::vector<ShardedArray<float>> in;
        for (int k = 0; k < 5; ++k) in.push_back(device_put(random_tensor<float>(shape, seed++), sh));
        const std::string what = "shape " + to_string(shape) + " " + sh.to_string();
        const Chain f;
        const auto [e0, e1, e2] = f(in[0], in[1], in[2], in[3], in[4]);
        auto fused = jit(f);
        auto unfused = jit(f, JitOptions{.dead_code = false, .fuse = false});
        for (int call = 0; call < 2; ++call) {
          const auto [f0, f1, f2] = fused(in[0], in[1], in[2], in[3], in[4]);
          const auto [u0, u1, u2] = unfused(in[0], in[1], in[2], in[3], in[4]);
          expect_same(host_double(f0), host_double(e0), what + " cast, fused vs eager");
          expect_same(host_double(u0), host_double(e0), what + " cast, unfused vs eager");
          expect_same(host_double(f1), host_double(e1), what + " intermediate, fused vs eager");
          expect_same(host_double(f2), host_double(u2), what + " sum, fused vs unfused");
          EXPECT_NEAR(f2.item(), e2.item(), 1e-4 * (1 + std::abs(e2.item()))) << what;
          EXPECT_EQ(f0.sharding(), e0.sharding()) << what;
          EXPECT_EQ(f1.sharding(), e1.sharding()) << what;
        }
        // Traced: multiply, add, subtract, multiply, maximum, astype, negative, compare, where, then the sum:
        // the ten elementwise ops are one pass over memory.
        const auto traced = fused.lower(in[0], in[1], in[2], in[3], in[4]);
        const auto ops = traced.ops();
        const auto opt = traced.optimized().ops();
        EXPECT_EQ(count(opt, "fused"), 1) << what << "\n" << traced.optimized().to_string();
        EXPECT_EQ(opt.size(), ops.size() - count(ops, "multiply") - count(ops, "add") -
                                  count(ops, "subtract") - count(ops, "maximum") - count(ops, "astype") -
                                  count(ops, "compare") - count(ops, "negative") - count(ops, "where") + 1)
            << what << "\n"
            << traced.optimized().to_string();
        EXPECT_EQ(unfused.lower(in[0], in[1], in[2], in[3], in[4]).optimized().ops(), ops) << what;
      }
  }
}

SHARD_MPI_TEST(JitOptimize, FusedChainsWriteOnlyWhatIsRead) {
  // The printed fused equation names its ops; its results are the values read after it: the
  // chain's last value and t (returned), not the four in between.
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const auto x = device_put(random_tensor<float>({4 * n, 3}, 11), NamedSharding(mesh, P("a")));
  auto f = jit([](const ShardedArray<float>& v) {
    const auto t = exp(v) * 2.f;
    return std::make_pair(sqrt(abs(t - 1.f)) + t, t);
  });
  const auto prog = f.lower(x).optimized();
  ASSERT_EQ(prog.num_ops(), 1u) << prog.to_string();
  const auto& eqn = prog.program().eqns[0];
  EXPECT_EQ(eqn.op, "fused");
  EXPECT_EQ(eqn.params, "exp, multiply, subtract, abs, sqrt, add") << prog.to_string();
  EXPECT_EQ(eqn.in.size(), 1u);
  EXPECT_EQ(eqn.out.size(), 2u);
  const auto [r, t] = f(x);
  const auto te = exp(x) * 2.f;
  expect_same(host_double(r), host_double(sqrt(abs(te - 1.f)) + te), "fused result");
  expect_same(host_double(t), host_double(te), "fused intermediate");
}

SHARD_MPI_TEST(JitOptimize, BroadcastsAndReshardsEndAChain) {
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const auto x = device_put(random_tensor<float>({2 * n, 6}, 21), NamedSharding(mesh, P("a")));
  const auto row = device_put(random_tensor<float>({1, 6}, 22), NamedSharding(mesh, P()));
  auto body = [&](const ShardedArray<float>& v, const ShardedArray<float>& w) {
    const auto a = tanh(v) * 3.f;  // fused: tanh, multiply
    const auto b = a + w;          // broadcasts w: its own op
    const auto c = with_sharding_constraint(b, NamedSharding(mesh, P()));
    return (c - 1.f) * c;  // fused on the new layout: subtract, multiply
  };
  auto f = jit(body);
  const auto opt = f.lower(x, row).optimized().ops();
  EXPECT_EQ(count(opt, "fused"), 2) << f.lower(x, row).optimized().to_string();
  EXPECT_EQ(count(opt, "add"), 1);
  expect_same(host_double(f(x, row)), host_double(body(x, row)), "broadcast chain");
}

SHARD_MPI_TEST(JitOptimize, DeadCodeIsDroppedUnlessSwitchedOff) {
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const auto x = device_put(random_tensor<float>({3 * n, 4}, 31), NamedSharding(mesh, P("a")));
  auto body = [](const ShardedArray<float>& v) {
    const auto unused = matmul(v, transpose(v));  // nothing reads it
    (void)unused;
    return sum(v * v, {1});
  };
  const auto kept = jit(body, JitOptions{.dead_code = false, .fuse = false}).lower(x).optimized().ops();
  const auto dropped = jit(body, JitOptions{.fuse = false}).lower(x).optimized().ops();
  EXPECT_EQ(count(kept, "matmul"), 1);
  EXPECT_EQ(count(dropped, "matmul"), 0);
  EXPECT_EQ(count(dropped, "transpose"), 0);
  EXPECT_EQ(dropped.size() + 2, kept.size());
  expect_same(host_double(jit(body)(x)), host_double(body(x)), "dead code dropped");
}

SHARD_MPI_TEST(JitOptimize, CommonSubexpressionsAreMergedUnlessSwitchedOff) {
  // The same op on the same operands twice is one op (its readers, a shard_map's and the outputs
  // included, read the first); ops that differ only in a parameter the printed program does not
  // show (x > 0 and x < 0 are both "compare"; x * 2 and x * 3 both "mul") stay apart, and so do
  // products that communicate. Results equal eager's and the unmerged program's bit for bit.
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const auto x = device_put(random_tensor<float>({2 * n, 6}, 51), NamedSharding(mesh, P("a")));
  const auto y = device_put(random_tensor<float>({6, 3}, 52), NamedSharding(mesh, P()));
  auto body = [&](const ShardedArray<float>& v, const ShardedArray<float>& w) {
    const auto e1 = exp(v), e2 = exp(v);
    const auto t1 = e1 * 2.f, t2 = e2 * 2.f, t3 = e1 * 3.f;  // t2 = t1 once e2 is e1
    const auto pos = where(v > 0.f, t1, t3), neg = where(v < 0.f, t2, t3);
    const auto p1 = matmul(transpose(v), v), p2 = matmul(transpose(v), v);
    const auto inside =
        shard_map(mesh, {P("a"), P("a")}, P("a"),
                  [](const Tensor<float>& a, const Tensor<float>& b) { return a - b; })(t1, t2);
    // Reductions along the unsplit dim: sum(e2) is sum(e1); the max stays apart, and so do the
    // sums along the split dim (they psum).
    const auto rows = sum(e1, {1}) + sum(e2, {1}) - max(e2, {1}) + sum(sum(e1, {0}) + sum(e2, {0}));
    return std::make_tuple(pos + neg + inside, sum(p1 - p2 * 0.5f), t2, matmul(e2, w) + matmul(e1, w) * 0.5f,
                           rows);
  };
  const auto eager = body(x, y);
  auto merged = jit(body, JitOptions{.fuse = false});
  auto kept = jit(body, JitOptions{.cse = false, .fuse = false});
  const auto m_ops = merged.lower(x, y).optimized().ops(), k_ops = kept.lower(x, y).optimized().ops();
  EXPECT_EQ(count(k_ops, "exp"), 2);
  EXPECT_EQ(count(m_ops, "exp"), 1) << merged.lower(x, y).optimized().to_string();
  EXPECT_EQ(count(k_ops, "multiply"), 5);
  EXPECT_EQ(count(m_ops, "multiply"), 4);  // e * 2 once, e * 3 and the two * 0.5 apart
  EXPECT_EQ(count(m_ops, "compare"), 2);
  EXPECT_EQ(count(m_ops, "where"), 2);
  EXPECT_EQ(count(m_ops, "shard_map"), 1);
  EXPECT_EQ(count(k_ops, "transpose"), 2);
  EXPECT_EQ(count(m_ops, "transpose"), 1);
  // matmul(e2, w) is matmul(e1, w); the products over 'a' that psum their partial blocks stay two
  // (a merged collective could differ between ranks).
  EXPECT_EQ(count(k_ops, "matmul"), 4);
  EXPECT_EQ(count(m_ops, "matmul"), 3) << merged.lower(x, y).optimized().to_string();
  EXPECT_EQ(count(k_ops, "sum"), 6);
  EXPECT_EQ(count(m_ops, "sum"), 5) << merged.lower(x, y).optimized().to_string();
  EXPECT_EQ(count(m_ops, "max"), 1);
  for (auto* f : {&merged, &kept})
    for (int call = 0; call < 2; ++call) {
      const auto got = (*f)(x, y);
      const std::string what =
          std::string(f == &merged ? "merged" : "kept") + " call " + std::to_string(call);
      expect_same(host_double(std::get<0>(got)), host_double(std::get<0>(eager)), what + " where");
      expect_same(host_double(std::get<1>(got)), host_double(std::get<1>(eager)), what + " products");
      expect_same(host_double(std::get<2>(got)), host_double(std::get<2>(eager)), what + " output");
      expect_same(host_double(std::get<3>(got)), host_double(std::get<3>(eager)), what + " matmul");
      expect_same(host_double(std::get<4>(got)), host_double(std::get<4>(eager)), what + " reductions");
    }
  // The backward pass's products: the two matmuls merged, their cotangents (the same product of
  // the seed and the other factor) merged, then their matmul_t.
  auto twice = [](const ShardedArray<float>& v, const ShardedArray<float>& w) {
    return sum(matmul(v, w) * matmul(v, w));
  };
  const auto want_twice = host_double(grad(twice)(x, y));
  auto jg_merged = jit(grad(twice)), jg_kept = jit(grad(twice), JitOptions{.cse = false});
  EXPECT_EQ(count(jg_kept.lower(x, y).optimized().ops(), "matmul_t"), 2)
      << jg_kept.lower(x, y).optimized().to_string();
  EXPECT_EQ(count(jg_merged.lower(x, y).optimized().ops(), "matmul_t"), 1)
      << jg_merged.lower(x, y).optimized().to_string();
  for (int call = 0; call < 2; ++call) {
    expect_same(host_double(jg_merged(x, y)), want_twice, "jit(grad) merged matmul_t");
    expect_same(host_double(jg_kept(x, y)), want_twice, "jit(grad) kept matmul_t");
  }
  // Inside jit(value_and_grad): the backward pass reads merged values; its gradient equals eager's.
  auto loss = [](const ShardedArray<float>& v, const ShardedArray<float>& w) {
    return sum(square(matmul(tanh(v), w)) + square(matmul(tanh(v), w)) * 0.5f);
  };
  const auto [want_l, want_g] = value_and_grad(loss)(x, y);
  auto jvg = jit(value_and_grad(loss));
  EXPECT_LT(count(jvg.lower(x, y).optimized().ops(), "tanh"),
            count(jit(value_and_grad(loss), JitOptions{.cse = false}).lower(x, y).optimized().ops(), "tanh"));
  for (int call = 0; call < 2; ++call) {
    const auto [l, g] = jvg(x, y);
    ASSERT_NEAR(l.item(), want_l.item(), 1e-4 * std::abs(want_l.item()));
    const Tensor<double> gh = host_double(g), wh = host_double(want_g);
    ASSERT_EQ(gh.shape(), wh.shape());
    for (std::int64_t i = 0; i < gh.size(); ++i)
      ASSERT_NEAR(gh.flat(i), wh.flat(i), 1e-4 * (1 + std::abs(wh.flat(i)))) << i;
  }
}

/// Two layers whose weights are laid out split (FSDP) and gathered where they are used, each
/// after some elementwise work: the schedulable all_gathers.
struct TwoLayers {
  NamedSharding whole1, whole2;
  auto operator()(const ShardedArray<float>& x, const ShardedArray<float>& w1,
                  const ShardedArray<float>& w2) const {
    const auto a = tanh(x) * 3.f - 1.f;
    const auto h = matmul(a, reshard(w1, whole1));
    const auto h2 = h * 2.f + 1.f;
    return matmul(h2, reshard(w2, whole2));
  }
};

int index_of(const std::vector<std::string>& ops, const std::string& op, int nth = 0) {
  for (int i = 0; i < static_cast<int>(ops.size()); ++i)
    if (ops[static_cast<std::size_t>(i)] == op && nth-- == 0) return i;
  return -1;
}

SHARD_MPI_TEST(JitOptimize, AllGathersStartEarlyAndAreWaitedAtFirstUse) {
  // Each all_gather starts where its operand is ready, one gather ahead (the second layer's
  // weights while the first layer computes), and is waited for just before the op that reads it:
  // started before the op that precedes its first use. Same values as the unscheduled program
  // and eager, bit for bit, over two calls; switched off, the reshards stay where they were.
  const int n = shard::testing::runtime().device_count();
  std::vector<Mesh> meshes{make_mesh({n}, {"a"})};
  if (n % 2 == 0) meshes.push_back(make_mesh({2, n / 2}, {"a", "b"}));
  std::uint64_t seed = 41;
  for (const Mesh& mesh : meshes) {
    const bool two = mesh.axis_names().size() == 2;
    // The weights are split over 'a' (and, on two axes, their columns over 'b', which stays).
    const PartitionSpec split = two ? P("a", "b") : P("a", None);
    const PartitionSpec gathered = two ? P(None, "b") : P();
    const std::int64_t k = 4 * n, m = 2 * n;  // even blocks: an uneven split reshards by the general exchange
    const auto x = device_put(random_tensor<float>({3 * n + 1, k}, seed++), NamedSharding(mesh, P()));
    const auto w1 = device_put(random_tensor<float>({k, m}, seed++), NamedSharding(mesh, split));
    const auto w2 = device_put(random_tensor<float>({m, m}, seed++), NamedSharding(mesh, split));
    const TwoLayers body{NamedSharding(mesh, gathered), NamedSharding(mesh, gathered)};
    auto on = jit(body);
    auto off = jit(body, JitOptions{.schedule = false});
    // One device: nothing moves (the reshards are no-ops), nothing to schedule.
    if (n > 1 || two) {
      const auto prog = on.lower(x, w1, w2).optimized();
      const auto ops = prog.ops();
      const std::string text = prog.to_string();
      ASSERT_EQ(count(ops, "all_gather_start"), 2) << text;
      ASSERT_EQ(count(ops, "all_gather_done"), 2) << text;
      EXPECT_EQ(count(ops, "reshard"), 0) << text;
      const int start1 = index_of(ops, "all_gather_start"), start2 = index_of(ops, "all_gather_start", 1);
      const int done1 = index_of(ops, "all_gather_done"), done2 = index_of(ops, "all_gather_done", 1);
      const int matmul1 = index_of(ops, "matmul"), matmul2 = index_of(ops, "matmul", 1);
      // Each wait is just before the product that reads the gathered weights (the second gather's
      // start between the first wait and its product: one gather ahead, w2's transfer runs while
      // the first product computes); each start comes before the op that precedes its wait (the
      // elementwise work before each product).
      EXPECT_EQ(start1, 0) << text;  // w1 is an argument: ready when the call starts
      EXPECT_EQ(start2, done1 + 1) << text;
      EXPECT_EQ(matmul1, start2 + 1) << text;
      EXPECT_EQ(matmul2, done2 + 1) << text;
      EXPECT_LT(start1, done1 - 1) << text;
      EXPECT_LT(start2, done2 - 1) << text;
      EXPECT_NE(text.find("all_gather_start[over 'a' along dim 0"), std::string::npos) << text;
      const auto plain = off.lower(x, w1, w2).optimized().ops();
      EXPECT_EQ(count(plain, "all_gather_start"), 0);
      EXPECT_EQ(count(plain, "reshard"), 2);
    }
    const Tensor<double> want = host_double(body(x, w1, w2));
    for (int call = 0; call < 2; ++call) {
      expect_same(host_double(on(x, w1, w2)), want, "scheduled, call " + std::to_string(call));
      expect_same(host_double(off(x, w1, w2)), want, "unscheduled, call " + std::to_string(call));
    }
    // Gathered where an op wants its operand (no explicit reshard): whatever propagation chose,
    // each scheduled gather is waited for right before a reader and started earlier.
    auto implicit = [](const ShardedArray<float>& v, const ShardedArray<float>& w) {
      return matmul(tanh(v) * 3.f - 1.f, w);
    };
    auto jitted = jit(implicit);
    const auto iops = jitted.lower(x, w1).optimized().ops();
    for (int g = 0; g < count(iops, "all_gather_done"); ++g) {
      EXPECT_LT(index_of(iops, "all_gather_start", g), index_of(iops, "all_gather_done", g) - 1);
    }
    auto unscheduled = jit(implicit, JitOptions{.schedule = false});
    const Tensor<double> eager = host_double(implicit(x, w1));
    for (int call = 0; call < 2; ++call) {
      const Tensor<double> got = host_double(jitted(x, w1));
      expect_same(got, host_double(unscheduled(x, w1)), "implicit gather");
      for (std::int64_t i = 0; i < got.size(); ++i)  // propagation may sum in another order
        ASSERT_NEAR(got.flat(i), eager.flat(i), 1e-4 * (1 + std::abs(eager.flat(i))));
    }
  }
}

SHARD_MPI_TEST(JitOptimize, ScheduledGathersOfLargeBlocksOverManyCalls) {
  // Blocks of 64 KiB and more go through group-shared memory when the ranks of the axis share a
  // node with one device each (a rank writes its block when the gather starts, reads the others'
  // when it waits), along dim 0 and dim 1; a smaller one goes through MPI. More calls than the
  // ring of windows those gathers take turns in: every call equals eager's, bit for bit.
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const NamedSharding whole(mesh, P());
  const std::int64_t k = 128 * n;
  const auto x = device_put(random_tensor<float>({17, k}, 71), whole);
  const auto w1 = device_put(random_tensor<float>({k, k}, 72), NamedSharding(mesh, P("a", None)));
  const auto w2 = device_put(random_tensor<float>({k, k}, 73), NamedSharding(mesh, P(None, "a")));
  const auto w3 = device_put(random_tensor<float>({k, 96}, 74), NamedSharding(mesh, P("a", None)));
  auto body = [whole](const ShardedArray<float>& v, const ShardedArray<float>& a,
                      const ShardedArray<float>& b, const ShardedArray<float>& c) {
    const auto h1 = tanh(matmul(v * 0.5f, reshard(a, whole)));
    const auto h2 = tanh(matmul(h1 * 0.5f, reshard(b, whole)));
    return matmul(h2 - 0.25f, reshard(c, whole));
  };
  auto f = jit(body);
  if (n > 1) {
    EXPECT_EQ(count(f.lower(x, w1, w2, w3).optimized().ops(), "all_gather_start"), 3);
  }
  const Tensor<double> want = host_double(body(x, w1, w2, w3));
  for (int call = 0; call < 5; ++call)
    expect_same(host_double(f(x, w1, w2, w3)), want, "call " + std::to_string(call));
}

SHARD_MPI_TEST(JitOptimize, ShardMapLayersPrefetchTheirWeightsAsAGroup) {
  // FSDP over shard_map layers: each layer's weights are split over 'data' and replicated in its
  // body (in_spec P()). Under jit each argument's layout is an equation of its own before the
  // shard_map's, so the scheduler starts a layer's all_gathers together, during the layer before
  // (one layer ahead), and waits for them just before the layer (the first layer's stay reshards:
  // nothing runs before it). A layer of 5 weights of one size
  // has more gathers in flight than the group-shared windows' ring (the rest go through MPI).
  // Values and gradients equal eager's and the unscheduled program's over several calls.
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"data"});
  const std::int64_t k = 96 * n;  // blocks of 96 x 96n floats: >= 64 KiB on 2+ devices
  const std::vector<int> widths{2, 5, 2};
  std::vector<std::vector<ShardedArray<float>>> ws;
  std::uint64_t seed = 501;
  for (const int w : widths) {
    std::vector<ShardedArray<float>> layer;
    for (int i = 0; i < w; ++i)
      layer.push_back(
          device_put(random_tensor<float>({k, k}, seed++) * 0.05f, NamedSharding(mesh, P("data", None))));
    ws.push_back(std::move(layer));
  }
  const auto x = device_put(random_tensor<float>({4 * n, k}, seed++), NamedSharding(mesh, P("data", None)));
  auto net = [&mesh](const std::vector<std::vector<ShardedArray<float>>>& layers,
                     const ShardedArray<float>& in) {
    ShardedArray<float> h = in;
    for (const auto& layer : layers)
      h = shard_map(mesh, {P("data", None), P()}, P("data", None),
                    [](const Tensor<float>& hb, const std::vector<Tensor<float>>& w) {
                      Tensor<float> acc = hb;
                      for (const auto& wi : w) acc = acc + tanh(matmul(hb, wi));
                      return acc * 0.5f;
                    })(h, layer);
    return h;
  };
  auto loss = [&](const std::vector<std::vector<ShardedArray<float>>>& layers,
                  const ShardedArray<float>& in) { return sum(square(net(layers, in))); };
  auto on = jit(net);
  auto off = jit(net, JitOptions{.schedule = false});
  auto grad_on = jit(value_and_grad(loss));
  auto grad_off = jit(value_and_grad(loss), JitOptions{.schedule = false});
  if (n > 1) {
    const auto prog = on.lower(ws, x).optimized();
    const auto ops = prog.ops();
    const std::string text = prog.to_string();
    std::vector<int> layer_at;  // the shard_map equations
    for (std::size_t i = 0; i < ops.size(); ++i)
      if (ops[i] == "shard_map") layer_at.push_back(static_cast<int>(i));
    ASSERT_EQ(layer_at.size(), widths.size()) << text;
    ASSERT_EQ(count(ops, "reshard"), widths[0]) << text;
    ASSERT_EQ(count(ops, "all_gather_start"), 7) << text;
    ASSERT_EQ(count(ops, "all_gather_done"), 7) << text;
    int g = 0;
    for (std::size_t l = 1; l < widths.size(); ++l)
      for (int i = 0; i < widths[l]; ++i, ++g) {
        const int start = index_of(ops, "all_gather_start", g), done = index_of(ops, "all_gather_done", g);
        // The layer's gathers start before the previous layer runs and wait just before it.
        EXPECT_LT(start, layer_at[l - 1]) << "layer " << l << "\n" << text;
        EXPECT_GT(done, layer_at[l - 1]) << "layer " << l << "\n" << text;
        EXPECT_LT(done, layer_at[l]) << "layer " << l << "\n" << text;
      }
    EXPECT_EQ(count(off.lower(ws, x).optimized().ops(), "reshard"), 9);
    // Under value_and_grad too: the forward's gathers scheduled the same way.
    EXPECT_EQ(count(grad_on.lower(ws, x).optimized().ops(), "all_gather_start"), 7);
  }
  const Tensor<double> want = host_double(net(ws, x));
  const auto [want_v, want_g] = value_and_grad(loss)(ws, x);
  for (int call = 0; call < 3; ++call) {
    expect_same(host_double(on(ws, x)), want, "scheduled, call " + std::to_string(call));
    expect_same(host_double(off(ws, x)), want, "unscheduled, call " + std::to_string(call));
    const auto [v_on, g_on] = grad_on(ws, x);
    const auto [v_off, g_off] = grad_off(ws, x);
    expect_same(host_double(v_on), host_double(v_off), "value, scheduled vs not");
    EXPECT_NEAR(host_double(v_on).flat(0), host_double(want_v).flat(0),
                1e-5 * (1 + std::abs(host_double(want_v).flat(0))));
    for (std::size_t l = 0; l < ws.size(); ++l)
      for (std::size_t i = 0; i < ws[l].size(); ++i) {
        EXPECT_EQ(g_on[l][i].sharding(), ws[l][i].sharding());
        expect_same(host_double(g_on[l][i]), host_double(g_off[l][i]), "gradient, scheduled vs not");
        const Tensor<double> got = host_double(g_on[l][i]), eager = host_double(want_g[l][i]);
        for (std::int64_t e = 0; e < got.size(); ++e)
          ASSERT_NEAR(got.flat(e), eager.flat(e), 1e-5 * (1 + std::abs(eager.flat(e)))) << l << "," << i;
      }
  }
}

SHARD_MPI_TEST(JitOptimize, GradAndVmapAroundAFusedProgram) {
  // Around jit, grad and vmap replay the program op by op (each op bound through the driver);
  // inside jit, grad's backward chains fuse too.
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const auto x = device_put(random_tensor<float>({2 * n, 5}, 41), NamedSharding(mesh, P("a")));
  const auto w = device_put(random_tensor<float>({2 * n, 5}, 42), NamedSharding(mesh, P("a")));
  auto loss = [](const ShardedArray<float>& v, const ShardedArray<float>& u) {
    return sum(square(tanh(v * u + 0.5f) - u) * 0.5f);
  };
  const Tensor<double> g = host_double(grad(loss)(x, w));
  expect_same(host_double(grad(jit(loss))(x, w)), g, "grad(jit)");
  auto jg = jit(grad(loss));
  const Tensor<double> got = host_double(jg(x, w));
  ASSERT_EQ(got.shape(), g.shape());
  for (std::int64_t i = 0; i < g.size(); ++i) ASSERT_NEAR(got.flat(i), g.flat(i), 1e-6) << i;
  // The forward chain and the backward's elementwise VJPs meet in one fused equation (the loss
  // itself is dead: grad returns only the gradient).
  const auto opt = jg.lower(x, w).optimized();
  EXPECT_EQ(count(opt.ops(), "fused"), 1) << opt.to_string();
  EXPECT_LT(opt.num_ops(), jg.lower(x, w).num_ops() - 6) << opt.to_string();
  const auto xs = device_put(random_tensor<float>({3, 2 * n, 5}, 43), NamedSharding(mesh, P(None, "a")));
  const auto vl = vmap(jit(loss), {0, None});
  const auto want = vmap(loss, {0, None})(xs, w);
  expect_same(host_double(vl(xs, w)), host_double(want), "vmap(jit)");
}

SHARD_MPI_TEST(JitOptimize, ReplayHoldsOnlyLiveValues) {
  // 24 ops, each a new array of x's size: a replay frees each value after its last reader, so its
  // peak is a few arrays (as eager's), not 24 (with fusion off; with it, one pass and one array).
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const std::int64_t rows = 64 * n, cols = 512;
  const auto x = device_put(random_tensor<float>({rows, cols}, 61), NamedSharding(mesh, P("a")));
  auto body = [](const ShardedArray<float>& v) {
    ShardedArray<float> h = v;
    for (int k = 0; k < 24; ++k) h = k % 2 ? h * 0.5f : h + v;
    return h;
  };
  const std::int64_t array_bytes = rows * cols * 4 / n * shard::testing::runtime().devices_per_rank();
  for (const bool fuse : {false, true}) {
    auto f = jit(body, JitOptions{.fuse = fuse});
    (void)f(x);  // traced (the trace itself holds its shadows)
    const std::int64_t before = tensor_memory_stats().live_bytes;
    reset_tensor_memory_peak();
    const auto r = f(x);
    const std::int64_t peak = tensor_memory_stats().peak_bytes - before;
    EXPECT_LE(peak, (fuse ? 1 : 3) * array_bytes)
        << "fuse " << fuse << ": peak " << peak << " bytes, an array is " << array_bytes;
    expect_same(host_double(r), host_double(body(x)), "chain");
  }
}

SHARD_MPI_TEST(JitOptimize, HostTensorChainsFuse) {
  // A jitted function of host Tensors: one block per rank.
  auto f = jit([](const Tensor<double>& v) { return astype<float>(exp(-v * v) + 1.0); });
  const Tensor<double> x = random_tensor<double>({37, 3}, 51);
  const auto prog = f.lower(x).optimized();
  EXPECT_EQ(prog.num_ops(), 1u) << prog.to_string();
  expect_same(host_double(f(x)), host_double(astype<float>(exp(-x * x) + 1.0)), "host chain");
}

/// A program of every kind of op: a fused chain, a reduction, a product, a reshard's transfers and
/// a shard_map whose body runs on each device thread with a psum.
struct Mixed {
  Mesh mesh;
  auto operator()(const ShardedArray<float>& x, const ShardedArray<float>& w) const {
    const auto h = maximum(x * 1.5f - 0.25f, 0.f);
    const auto p = matmul(h, w);
    const auto moved = reshard(p, NamedSharding(mesh, P(None, "a")));
    const auto s = shard_map(
        mesh, P(None, "a"), P(None, "a"),
        [](DeviceContext& ctx, const Tensor<float>& b) { return b * 2.f + ctx.psum(b, "a"); })(moved);
    return std::make_tuple(s, sum(h, {1}));
  }
};

SHARD_MPI_TEST(JitOptimize, NoAllocationPerCallAfterTheFirst) {
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  std::vector<ShardedArray<float>> xs;  // a new input each call, the same signature
  for (int k = 0; k < 6; ++k)
    xs.push_back(device_put(random_tensor<float>({4 * n, 6}, 70 + k), NamedSharding(mesh, P("a", None))));
  const auto w = device_put(random_tensor<float>({6, 2 * n}, 80), NamedSharding(mesh, P()));
  const Mixed g{mesh};
  for (const bool reuse : {true, false}) {
    auto f = jit(g, JitOptions{.reuse_buffers = reuse});
    auto out = f(xs[0], w);  // traced and run once
    std::int64_t later = 0;  // system allocations of calls 2.. (the last call's results held meanwhile)
    for (std::size_t k = 1; k < xs.size(); ++k) {
      const std::int64_t before = tensor_memory_stats().system_allocations;
      out = f(xs[k], w);
      const std::int64_t made = tensor_memory_stats().system_allocations - before;
      later += made;
      const auto want = g(xs[k], w);
      expect_same(host_double(std::get<0>(out)), host_double(std::get<0>(want)), "shard_map result");
      expect_same(host_double(std::get<1>(out)), host_double(std::get<1>(want)), "row sums");
    }
    if (reuse) {
      EXPECT_EQ(later, 0) << "Tensor buffers taken from the system by calls 2-6";
    } else {
      EXPECT_GT(later, 0) << "without the pool small buffers come from the system each call";
    }
  }
}

SHARD_MPI_TEST(JitOptimize, DonatedArgumentsAreDeletedAndTheirMemoryReused) {
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const NamedSharding rows(mesh, P("a", None));
  // x's last use comes before the result is made (a reduction between): with x donated, its
  // memory holds t or the result; without, x, t and the result are all alive at once.
  auto step = [](const ShardedArray<float>& x, const ShardedArray<float>& w) {
    const auto t = x * 0.5f + w;
    return t - mean(t, {1}, true);
  };
  const std::int64_t rows_n = 64 * n, cols = 512;  // 128 KiB per device: buffers of their own
  const Tensor<float> host = random_tensor<float>({rows_n, cols}, 95);
  const auto w = device_put(random_tensor<float>({rows_n, cols}, 96), rows);
  std::int64_t peaks[2] = {0, 0};
  for (const bool donate : {false, true}) {
    auto f = jit(
        step, JitOptions{.fuse = false, .donate_argnums = donate ? std::vector<int>{0} : std::vector<int>{}});
    auto x = device_put(host, rows);
    auto want = device_put(host, rows);
    for (int k = 0; k < 5; ++k) {
      const ShardedArray<float>& caller = x;  // the caller's handle: deleted by a donating call
      reset_tensor_memory_peak();
      const std::int64_t live = tensor_memory_stats().live_bytes;
      const std::int64_t allocations = tensor_memory_stats().system_allocations;
      auto next = f(caller, w);
      if (k >= 2) peaks[donate] = std::max(peaks[donate], tensor_memory_stats().peak_bytes - live);
      if (k >= 1 && donate) {
        EXPECT_EQ(tensor_memory_stats().system_allocations - allocations, 0) << "call " << k;
      }
      EXPECT_EQ(x.is_deleted(), donate) << "call " << k;
      if (donate) {
        EXPECT_THROW((void)sum(x), ValueError);
        EXPECT_THROW((void)x.to_host(), ValueError);
        EXPECT_THROW((void)x.addressable_shards(), ValueError);
        EXPECT_THROW((void)(x[{0, 0}]), ValueError);  // on every rank (one holds no part of it): no hang
        EXPECT_THROW((void)f(x, w), ValueError);      // a deleted argument
      }
      want = step(want, w);
      expect_same(host_double(next), host_double(want), "call " + std::to_string(k));
      x = std::move(next);
    }
  }
  // One array is 128 KiB per device (x2 devices per rank at dpr 2): the donated call holds one less.
  const std::int64_t array_bytes = rows_n * cols * 4 / n * shard::testing::runtime().devices_per_rank();
  EXPECT_LE(peaks[1], peaks[0] - array_bytes / 2) << "peak bytes of a call: donated " << peaks[1] << ", not "
                                                  << peaks[0] << " (an array is " << array_bytes << ")";
  // A position past the arguments.
  auto bad = jit(step, JitOptions{.donate_argnums = {2}});
  const auto y = device_put(host, rows);
  EXPECT_THROW((void)bad(y, w), ValueError);
  EXPECT_FALSE(y.is_deleted());
}

}  // namespace
