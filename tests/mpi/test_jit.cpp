// shard::jit (jit/jit.hpp): random op programs on random meshes and specs (uneven shapes)
// against eager, bit for bit without propagation and to float tolerance with it; grad of jit,
// jit of grad, jit of vmap and vmap of jit against the untransformed; replay without tracing
// again (trace_count); the propagation cases (seed 004's pjit matmul, a 2-layer Megatron MLP,
// a program where eager reshards back and forth); make_jaxpr's text; the errors.

#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "mpi_test.hpp"
#include "shard/shard.hpp"
#include "test_util.hpp"

namespace {

using namespace shard;
using shard::testing::host_double;
using shard::testing::random_tensor;

void expect_equal(const Tensor<double>& got, const Tensor<double>& want, double tol,
                  const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  for (std::int64_t i = 0; i < got.size(); ++i) {
    if (tol == 0) {
      ASSERT_EQ(got.flat(i), want.flat(i)) << what << " at flat index " << i;
    } else {
      ASSERT_NEAR(got.flat(i), want.flat(i), tol * (1 + std::abs(want.flat(i)))) << what << " at " << i;
    }
  }
}

/// A random program of elementwise ops, products, reductions, cumsum, argmax, concatenate, slices,
/// shape ops and reshards on (x, w).
struct RandomProgram {
  std::uint64_t seed;
  Mesh mesh;
  std::vector<PartitionSpec> specs;  // reshard targets
  ShardedArray<float> operator()(const ShardedArray<float>& x, const ShardedArray<float>& w) const {
    std::mt19937_64 rng(seed);
    ShardedArray<float> h = x;
    for (int step = 0; step < 6; ++step) {
      switch (rng() % 11) {
        case 0:  // tanh(h) twice: one op after jit's common subexpressions
          h = tanh(h) * 0.5f + h - tanh(h) * 0.25f;
          break;
        case 1:
          h = matmul(h, w) * 0.1f;
          break;  // w is (k, k)
        case 2:
          h = h - mean(h, {1}, true);
          break;
        case 3:
          h = softmax(h, -1) + h;
          break;
        case 7:
          h = cumsum(h, 0) * 0.1f;
          break;
        case 8:  // argmax's index as a value (ties: the first)
          h = h + astype<float>(expand_dims(argmax(h, 1), 1)) * 0.01f;
          break;
        case 9: {  // concatenate, then the first columns back
          const std::int64_t cols = h.shape()[1];
          h = concatenate(std::vector<ShardedArray<float>>{h * 0.5f, h}, 1)[{Slice(), Slice(0, cols)}] + h;
          break;
        }
        case 10:
          h = squeeze(expand_dims(h, 0), {0}) - h * 0.25f;
          break;
        case 4:
          h = with_sharding_constraint(h, NamedSharding(mesh, specs[rng() % specs.size()]));
          break;
        case 5:
          h = transpose(transpose(h, {1, 0}) * 2.f, {1, 0});
          break;
        default:
          h = maximum(h, w[{Slice(0, 1)}]);
          break;
      }
    }
    return h;
  }
};

SHARD_MPI_TEST(Jit, RandomProgramsMatchEager) {
  const int n = shard::testing::runtime().device_count();
  std::vector<Mesh> meshes{make_mesh({n}, {"a"})};
  if (n % 2 == 0) meshes.push_back(make_mesh({2, n / 2}, {"a", "b"}));
  if (n % 4 == 0) meshes.push_back(make_mesh({2, 2, n / 4}, {"a", "b", "c"}));
  if (n % 2 == 1) meshes.push_back(make_mesh({1, n}, {"a", "b"}));  // an axis of one device
  const int programs = shard::testing::full_matrix() ? 40 : 8;
  for (const Mesh& mesh : meshes) {
    const auto specs = shard::testing::all_specs(mesh.axis_names(), 2);
    for (int s = 0; s < programs; ++s) {
      std::mt19937_64 rng(1000 + s);
      const std::int64_t rows = 3 + static_cast<std::int64_t>(rng() % 9),
                         k = 2 + static_cast<std::int64_t>(rng() % 7);
      auto x = device_put(random_tensor<float>({rows, k}, rng()) * 0.01f,
                          NamedSharding(mesh, specs[rng() % specs.size()]));
      auto w = device_put(random_tensor<float>({k, k}, rng()) * 0.01f,
                          NamedSharding(mesh, specs[rng() % specs.size()]));
      const RandomProgram f{static_cast<std::uint64_t>(s), mesh, specs};
      const std::string what = "program " + std::to_string(s) + " on " + mesh.to_string();
      const Tensor<double> eager = host_double(f(x, w));
      auto plain = jit(f, JitOptions{.propagate = false});
      expect_equal(host_double(plain(x, w)), eager, 0, what + " (no propagation, first call)");
      expect_equal(host_double(plain(x, w)), eager, 0, what + " (no propagation, replay)");
      EXPECT_EQ(plain.trace_count(), 1) << what;
      // Every pass of jit/optimize.hpp off: the program op by op as traced.
      auto unoptimized =
          jit(f, JitOptions{.propagate = false, .dead_code = false, .cse = false, .fuse = false});
      expect_equal(host_double(unoptimized(x, w)), eager, 0, what + " (no propagation, no passes)");
      auto propagated = jit(f);
      expect_equal(host_double(propagated(x, w)), eager, 1e-5, what + " (propagated)");
      // grad of jit and jit of grad against grad.
      auto loss = [&](const ShardedArray<float>& a, const ShardedArray<float>& b) {
        return sum(square(f(a, b)));
      };
      const Tensor<double> g = host_double(grad(loss)(x, w));
      expect_equal(host_double(grad(jit(loss, JitOptions{.propagate = false}))(x, w)), g, 0,
                   what + " grad(jit)");
      // Under jit the backward pass runs on traced values, so the VJPs take their general form (a
      // transpose then a product, where eager fuses the transpose into the gemm): sums reorder.
      expect_equal(host_double(jit(grad(loss), JitOptions{.propagate = false})(x, w)), g, 1e-6,
                   what + " jit(grad)");
      expect_equal(host_double(jit(grad(loss))(x, w)), g, 1e-4, what + " jit(grad) propagated");
      // jit of vmap against vmap: the program on a batch of 2 examples of x.
      const auto xs = device_put(random_tensor<float>({2, rows, k}, rng()) * 0.01f, NamedSharding(mesh, P()));
      const auto vf = vmap(f, {0, None});
      const Tensor<double> vw = host_double(vf(xs, w));
      expect_equal(host_double(jit(vf, JitOptions{.propagate = false})(xs, w)), vw, 0, what + " jit(vmap)");
      expect_equal(host_double(jit(vf)(xs, w)), vw, 1e-5, what + " jit(vmap) propagated");
    }
  }
}

SHARD_MPI_TEST(Jit, VmapComposes) {
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  auto convolve = [](const Tensor<float>& x, const Tensor<float>& w) {
    std::vector<Tensor<float>> out;
    for (std::int64_t i = 1; i + 1 < x.shape()[0]; ++i) out.push_back(dot(x[{Slice(i - 1, i + 2)}], w));
    return stack(out);
  };
  const auto xs = random_tensor<float>({4, 7}, 1), ws = random_tensor<float>({4, 3}, 2);
  const Tensor<double> want = host_double(vmap(convolve)(xs, ws));
  expect_equal(host_double(jit(vmap(convolve))(xs, ws)), want, 0, "jit(vmap)");
  expect_equal(host_double(vmap(jit(convolve))(xs, ws)), want, 0, "vmap(jit)");
  auto f = [](const ShardedArray<float>& x) { return sum(exp(x * 0.01f), {0}); };
  const auto xa = device_put(random_tensor<float>({5, 6}, 3), NamedSharding(mesh, P(None, "a")));
  const Tensor<double> vw = host_double(vmap(f)(xa));
  expect_equal(host_double(jit(vmap(f))(xa)), vw, 1e-6, "jit(vmap) sharded");
  expect_equal(host_double(vmap(jit(f))(xa)), vw, 1e-6, "vmap(jit) sharded");
}

SHARD_MPI_TEST(Jit, ReplaysWithoutTracingAgain) {
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  int calls = 0;
  auto f = jit([&calls](const ShardedArray<float>& x, float scale) {
    ++calls;
    return x * scale + 1.f;
  });
  const auto x = device_put(random_tensor<float>({6, 5}, 4), NamedSharding(mesh, P("a")));
  const auto y = device_put(random_tensor<float>({6, 5}, 5), NamedSharding(mesh, P("a")));
  for (int i = 0; i < 3; ++i)
    expect_equal(host_double(f(i % 2 ? x : y, 2.f)), host_double((i % 2 ? x : y) * 2.f + 1.f), 0, "replay");
  EXPECT_EQ(f.trace_count(), 1);
  EXPECT_EQ(calls, 1);  // the Python-level function ran once
  (void)f(x, 3.f);      // a new static value traces again
  EXPECT_EQ(f.trace_count(), 2);
  (void)f(device_put(random_tensor<float>({7, 5}, 6), NamedSharding(mesh, P("a"))), 2.f);  // a new shape
  EXPECT_EQ(f.trace_count(), 3);
  (void)f(device_put(random_tensor<float>({6, 5}, 6), NamedSharding(mesh, P(None, "a"))),
          2.f);  // a new sharding
  EXPECT_EQ(f.trace_count(), 4);
  (void)f(x, 2.f);
  EXPECT_EQ(f.trace_count(), 4);
}

/// Seed 004's pjit matmul: in_shardings rows x columns, out_shardings replicated. The product of
/// a row block by a column block is one block of C: C is computed sharded, then gathered once.
/// Theory (1 device per rank): the cheapest plan gathers one operand (each rank's block once) and
/// the result (each rank's block of C once); no psum.
SHARD_MPI_TEST(Jit, PjitMatmulPropagation) {
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"devices"});
  const std::int64_t m = 8 * n;
  const auto a_host = random_tensor<float>({m, m}, 7), b_host = random_tensor<float>({m, m}, 8);
  const auto a = device_put(a_host, NamedSharding(mesh, P()));
  const auto b = device_put(b_host, NamedSharding(mesh, P()));
  auto f = jit([](const ShardedArray<float>& x, const ShardedArray<float>& y) { return matmul(x, y); },
               JitOptions{.in_shardings = {NamedSharding(mesh, P("devices", None)),
                                           NamedSharding(mesh, P(None, "devices"))},
                          .out_shardings = {NamedSharding(mesh, P())}});
  const JitProgram prog = f.lower(a, b);
  const std::string text = prog.to_string();
  EXPECT_EQ(prog.ops(), std::vector<std::string>{"matmul"}) << text;
  EXPECT_EQ(text.find("psum"), std::string::npos) << text;
  const auto x = device_put(a_host, NamedSharding(mesh, P("devices", None)));
  const auto y = device_put(b_host, NamedSharding(mesh, P(None, "devices")));
  comm_stats().reset();
  const auto c = f(x, y);
  const CommRecord moved = comm_stats().total();
  EXPECT_TRUE(c.sharding() == NamedSharding(mesh, P()));
  expect_equal(host_double(c), host_double(matmul(a_host, b_host)), 1e-5, "pjit matmul");
  EXPECT_EQ(comm_stats().get("psum").calls, 0);
  if (shard::testing::runtime().devices_per_rank() == 1 && n > 1) {
    const std::int64_t block = (m / n) * m * 4;  // one rank's block of an operand, or of C
    EXPECT_EQ(moved.bytes, 2 * block) << comm_stats().to_string() << text;
  }
}

/// A 2-layer Megatron MLP given only the input's and the parameters' shardings and an output
/// replicated over 'model': per layer, x @ W1 splits the hidden dim over 'model' (no move),
/// relu is local, h @ W2 contracts the split dim: one psum over 'model'. Nothing else.
SHARD_MPI_TEST(Jit, MegatronMlpOnePsumPerLayer) {
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"model"});
  const std::int64_t d = 4 * n, hidden = 8 * n;
  auto layer_w1 = [&](std::uint64_t s) {
    return device_put(random_tensor<float>({d, hidden}, s) * 0.01f, NamedSharding(mesh, P(None, "model")));
  };
  auto layer_w2 = [&](std::uint64_t s) {
    return device_put(random_tensor<float>({hidden, d}, s) * 0.01f, NamedSharding(mesh, P("model", None)));
  };
  const std::vector<ShardedArray<float>> params{layer_w1(1), layer_w2(2), layer_w1(3), layer_w2(4)};
  const auto x = device_put(random_tensor<float>({6, d}, 5) * 0.1f, NamedSharding(mesh, P()));
  auto mlp = [](const std::vector<ShardedArray<float>>& p, const ShardedArray<float>& in) {
    ShardedArray<float> h = in;
    for (std::size_t l = 0; l < p.size(); l += 2) h = matmul(relu(matmul(h, p[l])), p[l + 1]);
    return h;
  };
  auto f = jit(mlp, JitOptions{.out_shardings = {NamedSharding(mesh, P())}});
  const std::string text = f.lower(params, x).to_string();
  comm_stats().reset();
  const auto y = f(params, x);
  const auto psum = comm_stats().get("psum");
  const auto all = comm_stats().total();
  const std::string stats = comm_stats().to_string();
  expect_equal(host_double(y), host_double(mlp(params, x)), 1e-5, "megatron");
  if (n > 1) {
    EXPECT_EQ(psum.calls + psum.in_process_calls, 2) << stats << text;
    EXPECT_EQ(all.calls + all.in_process_calls, 2) << stats << text;
  }
}

/// Eager reshards an intermediate that a later op reshards back: u = a + b follows a (the first
/// committed operand, split on dim 1), so b is moved; v = u * b follows u, so b is moved again;
/// the output is wanted as b is, so v is moved back. jit keeps u and v as b is: one move of a.
SHARD_MPI_TEST(Jit, PropagationMovesFewerBytesThanEager) {
  const int n = shard::testing::runtime().device_count();
  if (n == 1) GTEST_SKIP() << "one device: nothing moves";
  const Mesh mesh = make_mesh({n}, {"d"});
  const std::int64_t m = 4 * n;
  const auto a = device_put(random_tensor<float>({m, m}, 9), NamedSharding(mesh, P(None, "d")));
  const auto b = device_put(random_tensor<float>({m, m}, 10), NamedSharding(mesh, P("d", None)));
  auto f = [&](const ShardedArray<float>& x, const ShardedArray<float>& y) {
    const auto u = x + y;
    return reshard(u * y, NamedSharding(mesh, P("d", None)));
  };
  comm_stats().reset();
  const auto eager = f(a, b);
  const CommRecord eager_moved = comm_stats().total();
  auto jf = jit(f);
  const JitProgram prog = jf.lower(a, b);
  comm_stats().reset();
  const auto jitted = jf(a, b);
  const CommRecord jit_moved = comm_stats().total();
  expect_equal(host_double(jitted), host_double(eager), 0, "values");
  EXPECT_LT(jit_moved.bytes + jit_moved.in_process_bytes, eager_moved.bytes + eager_moved.in_process_bytes)
      << "eager:\n"
      << "jit:\n"
      << prog.to_string();
  EXPECT_TRUE(*prog.result_sharding("add") == NamedSharding(mesh, P("d", None))) << prog.to_string();
  EXPECT_LT(prog.program().planned_bytes, prog.program().eager_bytes) << prog.to_string();
  if (shard::testing::runtime().process_index() == 0)
    std::printf("eager moved %lld bytes, jit %lld\n",
                static_cast<long long>(eager_moved.bytes + eager_moved.in_process_bytes),
                static_cast<long long>(jit_moved.bytes + jit_moved.in_process_bytes));
}

SHARD_MPI_TEST(Jit, MakeJaxprPrintsShardingsAndMoves) {
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const auto x = device_put(random_tensor<float>({4 * n, 3}, 11), NamedSharding(mesh, P("a")));
  const std::string text =
      make_jaxpr([](const ShardedArray<float>& v) { return sum(exp(v)); })(x).to_string();
  EXPECT_NE(text.find("exp a"), std::string::npos) << text;
  EXPECT_NE(text.find("float32[" + std::to_string(4 * n) + ",3]P('a')"), std::string::npos) << text;
  EXPECT_NE(text.find("= sum[dims:"), std::string::npos) << text;
  if (n > 1) {
    EXPECT_NE(text.find("psum over"), std::string::npos) << text;
  }
}

SHARD_MPI_TEST(Jit, ErrorsNameTheConstruct) {
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const auto x = device_put(random_tensor<float>({2 * n, 3}, 12), NamedSharding(mesh, P("a")));
  shard::testing::expect_error<ValueError>(
      [&] { (void)jit([](const ShardedArray<float>& v) { return v * sum(v).item(); })(x); },
      {"jit", "traced array", "ConcretizationTypeError"});
  ShardedArray<float> leaked;
  (void)jit([&](const ShardedArray<float>& v) {
    leaked = v * 2.f;
    return v;
  })(x);
  shard::testing::expect_error<ValueError>([&] { (void)(leaked + 1.f); }, {"escaped the jitted function"});
  // Shardings that do not fit the arrays, and an empty argument.
  auto add_one = [](const ShardedArray<float>& v) { return v + 1.f; };
  shard::testing::expect_error<ShardingError>(
      [&] { (void)jit(add_one, JitOptions{.in_shardings = {NamedSharding(mesh, P("a", None, None))}})(x); },
      {"P('a', None, None) has 3 entries", "only 2 dims"});
  shard::testing::expect_error<ShardingError>(
      [&] { (void)jit(add_one, JitOptions{.out_shardings = {NamedSharding(mesh, P(None, None, "a"))}})(x); },
      {"has 3 entries", "only 2 dims"});
  auto add = [](const ShardedArray<float>& v, const ShardedArray<float>& w) { return v + w; };
  shard::testing::expect_error<ValueError>(
      [&] {
        (void)jit([](const Tensor<float>& h) { return h * 2.f; },
                  JitOptions{.in_shardings = {NamedSharding(mesh, P("a"))}})(x.to_host());
      },
      {"in_shardings gives argument 0", "host Tensors only"});
  shard::testing::expect_error<ValueError>([&] { (void)jit(add)(x, ShardedArray<float>()); },
                                           {"argument 1 is an empty ShardedArray"});
  // A function that throws while it traces: the exception reaches the caller, nothing is kept,
  // and the next call traces again.
  int traced = 0;
  auto fragile = jit([&](const ShardedArray<float>& v, bool fail) {
    ++traced;
    if (fail) throw std::runtime_error("the user's own error");
    return v * 2.f;
  });
  auto throws = [&] {
    try {
      (void)fragile(x, true);
    } catch (const std::runtime_error& e) {
      return std::string(e.what()) == "the user's own error";
    }
    return false;
  };
  EXPECT_TRUE(throws());
  expect_equal(host_double(fragile(x, false)), host_double(x * 2.f), 0, "after a throw");
  EXPECT_TRUE(throws());
  EXPECT_EQ(traced, 3);
  EXPECT_EQ(fragile.trace_count(), 1);
  shard::testing::expect_error<ValueError>(
      [&] {
        (void)grad([&](const ShardedArray<float>& w) {
          return sum(jit([&](const ShardedArray<float>& v) { return v * w; })(x));
        })(x);
      },
      {"jit", "enclosing grad", "as an argument"});
  shard::testing::expect_error<ValueError>(
      [&] {
        (void)jit([](const ShardedArray<float>& v) { return v; },
                  JitOptions{.in_shardings = {None, None}})(x);
      },
      {"in_shardings has 2 entries"});
  shard::testing::expect_error<ValueError>(
      [&] {
        (void)vmap([](const ShardedArray<float>& v) {
          const auto opt = optim::sgd(0.1);
          std::vector<ShardedArray<float>> p{v};
          auto state = opt.init(p);
          opt.update(p, std::vector<ShardedArray<float>>{v}, state);
          return p[0];
        })(x);
      },
      {"Optimizer::update", "inside vmap", "update outside"});
}

enum class Act { kScale, kRelu };

/// What decides a replay (an independent check's findings): a static float's every bit, its C++
/// type (1, 1L and an enum of 1 differ), strings with quotes in them, the argument's type (a tuple
/// and a vector of one array), a vector's length and a map's keys where they hold no array, the
/// devices of the mesh; values returned twice are two arrays; a captured array is its value when
/// traced; a host Tensor argument meeting intermediates replays.
SHARD_MPI_TEST(Jit, SignatureAndValuesAsJax) {
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const auto x = device_put(random_tensor<float>({2 * n, 3}, 51), NamedSharding(mesh, P("a")));
  auto scale = jit([](const ShardedArray<float>& a, float eps) { return a * eps; });
  expect_equal(host_double(scale(x, 1e-7f)), host_double(x * 1e-7f), 0, "eps 1e-7");
  expect_equal(host_double(scale(x, 3e-7f)), host_double(x * 3e-7f), 0, "eps 3e-7");
  EXPECT_EQ(scale.trace_count(), 2);
  auto by_type = jit([](const ShardedArray<float>& a, auto mode) {
    if constexpr (std::is_same_v<decltype(mode), Act>)
      return mode == Act::kRelu ? relu(a) : a;
    else
      return a * static_cast<float>(mode);
  });
  expect_equal(host_double(by_type(x, 1)), host_double(x), 0, "int 1");
  expect_equal(host_double(by_type(x, Act::kRelu)), host_double(relu(x)), 0, "enum of 1");
  expect_equal(host_double(by_type(x, 1L)), host_double(x), 0, "long 1");
  EXPECT_EQ(by_type.trace_count(), 3);
  auto strings = jit([](const ShardedArray<float>& a, const std::string& s1, const std::string& s2) {
    return a * static_cast<float>(s1.size()) + static_cast<float>(s2.size());
  });
  expect_equal(host_double(strings(x, "a';#2='bb", "c")), host_double(x * 9.f + 1.f), 0, "string 1");
  expect_equal(host_double(strings(x, "a", "bb';#2='c")), host_double(x * 1.f + 9.f), 0, "string 2");
  // A tuple of one array and a vector of one array; a map whose keys hold no array.
  auto first = jit([](const auto& t) {
    if constexpr (requires { t.size(); })
      return t[0] * 2.f;
    else
      return std::get<0>(t) * 3.f;
  });
  expect_equal(host_double(first(std::vector<ShardedArray<float>>{x})), host_double(x * 2.f), 0, "vector");
  expect_equal(host_double(first(std::tuple<ShardedArray<float>>{x})), host_double(x * 3.f), 0, "tuple");
  using Tree = std::map<std::string, std::vector<ShardedArray<float>>>;
  auto keys = jit([](Tree t, const ShardedArray<float>& a) {
    t["out"] = {a + 1.f};
    return t;
  });
  (void)keys(Tree{{"a", {}}}, x);
  const Tree got = keys(Tree{{"b", {}}}, x);
  EXPECT_EQ(got.count("b"), 1u);
  EXPECT_EQ(got.count("a"), 0u);
  // Returned twice: two arrays.
  auto twice = jit([](const ShardedArray<float>& a) {
    auto y = a * 2.f;
    return std::tuple{y, y};
  });
  auto [p, q] = twice(x);
  for (auto& s : p.addressable_shards()) s.data.flat(0) = 7.f;
  expect_equal(host_double(q), host_double(x * 2.f), 0, "the second of a value returned twice");
  // A captured array: its value when traced.
  auto c = device_put(random_tensor<float>({2 * n, 3}, 52), NamedSharding(mesh, P("a")));
  const Tensor<double> c0 = host_double(c);
  auto add_c = jit([&](const ShardedArray<float>& a) { return a + c + c; });
  (void)add_c(x);
  for (auto& s : c.addressable_shards()) s.data.flat(0) = 100.f;
  const auto want = device_put(c0, NamedSharding(mesh, P("a")));
  expect_equal(host_double(add_c(x)), host_double(astype<double>(x) + want + want), 1e-6,
               "a captured constant");
  EXPECT_EQ(add_c.lower(x).program().constants.size(), 1u);  // used twice, one constant
  // A host Tensor meeting an intermediate, on two calls (the second replays).
  const Tensor<float> t = random_tensor<float>({2 * n, 3}, 53);
  auto with_tensor = jit([](const ShardedArray<float>& a, const Tensor<float>& h) { return exp(a) * h + h; });
  for (int i = 0; i < 2; ++i)
    expect_equal(host_double(with_tensor(x, t)), host_double(exp(x) * t + t), 0, "a Tensor argument");
  // The same mesh shape on other devices traces again.
  if (n > 1) {
    const Mesh first_device({1}, {"d"}, {0}), last_device({1}, {"d"}, {n - 1});
    const Tensor<float> h = random_tensor<float>({4, 3}, 54);
    auto g = jit([](const ShardedArray<float>& a) { return cumsum(a, 0) * 2.f; });
    for (const Mesh& m : {first_device, last_device}) {
      const auto a = device_put(h, NamedSharding(m, P("d")));
      const auto y = g(a);
      EXPECT_EQ(y.mesh().devices_string(), m.devices_string());
      expect_equal(host_double(y), host_double(cumsum(a, 0) * 2.f), 0, "on " + m.devices_string());
    }
    EXPECT_EQ(g.trace_count(), 2);
  }
  // grad of grad: refused (it was silently 0).
  auto inner = [](const ShardedArray<float>& a) { return sum(a * a * a); };
  shard::testing::expect_error<ValueError>(
      [&] { (void)grad([&](const ShardedArray<float>& a) { return sum(grad(inner)(a)); })(x); },
      {"higher-order derivatives are not supported"});
}

/// with_sharding_constraint and out_shardings onto another mesh of the same devices (as eager's
/// reshard allows): propagation keeps them, the values are eager's.
SHARD_MPI_TEST(Jit, ConstraintsOnAnotherMeshOfTheSameDevices) {
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const Mesh other = make_mesh({1, n}, {"x", "y"});
  const auto x = device_put(random_tensor<float>({2 * n + 1, 3}, 41), NamedSharding(mesh, P("a")));
  auto f = [&](const ShardedArray<float>& v) {
    return with_sharding_constraint(tanh(v) + 1.f, NamedSharding(other, P(None, "y"))) * 2.f + v;
  };
  const auto want = f(x);
  for (const bool propagate : {false, true}) {
    auto g = jit(f, JitOptions{.out_shardings = {NamedSharding(other, P("y"))}, .propagate = propagate});
    const auto y = g(x);
    EXPECT_TRUE(y.sharding() == NamedSharding(other, P("y"))) << y.sharding().to_string();
    expect_equal(host_double(y), host_double(want), propagate ? 1e-6 : 0, "another mesh");
  }
}

/// The cost model decides between moves of different kinds. x (P(None, 'd')) @ w (P('d', None))
/// wanted replicated: contracting the split k and closing with a psum moves the ring's
/// 2 (n-1)/n of the 8 x 8 result (at 2 devices 256 B per device); gathering both operands first
/// (no psum) moves (n-1)/n of the 8 x 64 and 64 x 8 operands (2 KiB). By the measured model the
/// psum wins; where psums cost a thousand times more per byte, the gathers do.
SHARD_MPI_TEST(Jit, CostModelWeighsEachCollective) {
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"d"});
  const auto x = device_put(random_tensor<float>({8, 64}, 31) * 0.1f, NamedSharding(mesh, P(None, "d")));
  const auto w = device_put(random_tensor<float>({64, 8}, 32) * 0.1f, NamedSharding(mesh, P("d", None)));
  auto f = [](const ShardedArray<float>& a, const ShardedArray<float>& b) { return matmul(a, b); };
  const auto want = host_double(matmul(x, w));
  CostModel costly_psum = default_cost_model();
  costly_psum.psum.us_per_byte *= 1000;
  for (const bool costly : {false, true}) {
    auto g = jit(f, JitOptions{.out_shardings = {NamedSharding(mesh, P())},
                               .cost_model = costly ? std::optional(costly_psum) : std::nullopt});
    const std::string text = g.lower(x, w).to_string();
    comm_stats().reset();
    const auto y = g(x, w);
    const auto psum = comm_stats().get("psum");
    expect_equal(host_double(y), want, 1e-5, costly ? "costly psum" : "measured model");
    EXPECT_TRUE(y.sharding() == NamedSharding(mesh, P()));
    if (n > 1) {
      EXPECT_EQ(psum.calls + psum.in_process_calls > 0, !costly) << text << comm_stats().to_string();
      // (an all_gather where the devices divide 64, a general exchange where they do not)
      EXPECT_EQ(text.find("reshard a") != std::string::npos, costly) << text;
      EXPECT_EQ(text.find("reshard b") != std::string::npos, costly) << text;
    }
  }
  // The text SHARD_COST_MODEL holds, and its errors.
  const CostModel m = CostModel::parse("psum=2+0.5,exchange=1+0.25", default_cost_model());
  EXPECT_EQ(m.psum.latency_us, 2);
  EXPECT_EQ(m.psum.us_per_byte, 0.5);
  EXPECT_EQ(m.exchange.us_per_byte, 0.25);
  EXPECT_EQ(m.all_gather.us_per_byte, default_cost_model().all_gather.us_per_byte);
  const CostModel back = CostModel::parse(m.to_string(), CostModel{});
  EXPECT_EQ(back.psum.us_per_byte, 0.5);
  EXPECT_EQ(back.all_to_all.latency_us, m.all_to_all.latency_us);
  shard::testing::expect_error<ValueError>([] { (void)CostModel::parse("psum=1", CostModel{}); },
                                           {"'psum=1'", "kind=latency_us+us_per_byte"});
  shard::testing::expect_error<ValueError>([] { (void)CostModel::parse("reduce=1+2", CostModel{}); },
                                           {"unknown kind 'reduce'"});
  shard::testing::expect_error<ValueError>([] { (void)CostModel::parse("psum=1+-2", CostModel{}); },
                                           {"'-2' is not a number >= 0"});
}

/// A training step as JAX users write it: jit(loss, grad, the optimizer's update) taking the
/// parameters and the state and returning the next ones. Three steps equal three eager steps
/// (bit for bit without propagation), the state's count follows, and the step traces once.
SHARD_MPI_TEST(Jit, TrainStepWithOptimizerUpdate) {
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh =
      n % 2 == 0 ? make_mesh({n / 2, 2}, {"data", "model"}) : make_mesh({n, 1}, {"data", "model"});
  using Params = std::map<std::string, ShardedArray<float>>;
  const Params params0{
      {"w1", device_put(random_tensor<float>({5, 6}, 21) * 0.3f, NamedSharding(mesh, P(None, "model")))},
      {"b1", device_put(random_tensor<float>({6}, 22) * 0.1f, NamedSharding(mesh, P("model")))},
      {"w2", device_put(random_tensor<float>({6, 3}, 23) * 0.3f, NamedSharding(mesh, P("model", None)))}};
  const auto x = device_put(random_tensor<float>({7, 5}, 24), NamedSharding(mesh, P("data", None)));
  const auto y = device_put(random_tensor<float>({7, 3}, 25), NamedSharding(mesh, P("data", None)));
  auto loss = [](const Params& p, const ShardedArray<float>& in, const ShardedArray<float>& out) {
    const auto h = tanh(matmul(in, p.at("w1")) + p.at("b1"));
    return mean(square(matmul(h, p.at("w2")) - out));
  };
  const std::vector<optim::Optimizer> optimizers{
      optim::sgd(0.1, 0.9, true),
      optim::adamw(optim::warmup_cosine_decay(0.0, 0.05, 2, 10), 0.01).clip_by_global_norm(0.5),
      optim::adam(0.02).shard_state_over("data")};
  for (std::size_t o = 0; o < optimizers.size(); ++o) {
    const optim::Optimizer& opt = optimizers[o];
    for (const bool propagate : {false, true}) {
      const std::string what = "optimizer " + std::to_string(o) + (propagate ? " propagated" : "");
      Params eager = params0;
      auto eager_state = opt.init(eager);
      std::vector<double> eager_losses;
      for (int i = 0; i < 3; ++i) {
        auto [l, g] = value_and_grad(loss)(eager, x, y);
        eager_losses.push_back(l.item());
        opt.update(eager, g, eager_state);
      }
      int traced = 0;
      auto step = jit(
          [&](Params p, optim::State<float> s, const ShardedArray<float>& in,
              const ShardedArray<float>& out) {
            ++traced;
            auto [l, g] = value_and_grad(loss)(p, in, out);
            const double norm = opt.update(p, g, s);
            EXPECT_TRUE(std::isnan(norm)) << what;  // a value of each run, not of the trace
            return std::tuple{p, s, l};
          },
          JitOptions{.propagate = propagate});
      Params jitted = params0;
      auto state = opt.init(jitted);
      const double tol = propagate ? 1e-5 : 0;
      for (int i = 0; i < 3; ++i) {
        ShardedArray<float> l;
        std::tie(jitted, state, l) = step(jitted, state, x, y);
        EXPECT_NEAR(l.item(), eager_losses[static_cast<std::size_t>(i)],
                    tol * (1 + std::abs(eager_losses[0])))
            << what;
      }
      EXPECT_EQ(traced, 1) << what;
      EXPECT_EQ(step.trace_count(), 1) << what;
      EXPECT_EQ(state.step.item(), 3) << what;
      EXPECT_EQ(eager_state.step.item(), 3) << what;
      for (const auto& [name, w] : eager) {
        EXPECT_TRUE(jitted.at(name).sharding() == w.sharding()) << what << " " << name;
        expect_equal(host_double(jitted.at(name)), host_double(w), tol, what + " " + name);
      }
      for (const auto& [name, a] : eager_state.arrays) {
        EXPECT_TRUE(state.arrays.at(name).sharding() == a.sharding()) << what << " " << name;
        expect_equal(host_double(state.arrays.at(name)), host_double(a), tol, what + " state " + name);
      }
      const std::string text = step.lower(jitted, state, x, y).to_string();
      EXPECT_NE(text.find("optimizer_update"), std::string::npos) << text;
      // The backward products take their transposes in the gemm (one matmul_t each), as eager's
      // do: no transpose is copied.
      EXPECT_NE(text.find("matmul_t"), std::string::npos) << text;
      EXPECT_EQ(text.find("transpose"), std::string::npos) << text;
      // Not donated: the caller's parameters and state are left as they were (the update copies
      // what the caller still shares); donated: updated in place, the same values as eager.
      std::map<std::string, Tensor<double>> before;
      for (const auto& [name, w] : jitted) before.emplace(name, host_double(w));
      const Tensor<double> mu_before = host_double(state.arrays.begin()->second);
      (void)step(jitted, state, x, y);
      for (const auto& [name, w] : jitted)
        expect_equal(host_double(w), before.at(name), 0, what + " kept " + name);
      expect_equal(host_double(state.arrays.begin()->second), mu_before, 0, what + " kept state");
      auto donating = jit(
          [&](Params p, optim::State<float> s, const ShardedArray<float>& in,
              const ShardedArray<float>& out) {
            auto [l, g] = value_and_grad(loss)(p, in, out);
            opt.update(p, g, s);
            return std::tuple{p, s, l};
          },
          JitOptions{.propagate = propagate, .donate_argnums = {0, 1}});
      Params donated = params0;
      auto dstate = opt.init(donated);
      for (int i = 0; i < 3; ++i) {
        ShardedArray<float> l;
        std::tie(donated, dstate, l) = donating(donated, dstate, x, y);
        EXPECT_NEAR(l.item(), eager_losses[static_cast<std::size_t>(i)],
                    tol * (1 + std::abs(eager_losses[0])))
            << what << " donated";
      }
      for (const auto& [name, w] : eager)
        expect_equal(host_double(donated.at(name)), host_double(w), tol, what + " donated " + name);
      for (const auto& [name, a] : eager_state.arrays)
        expect_equal(host_double(dstate.arrays.at(name)), host_double(a), tol,
                     what + " donated state " + name);
    }
  }
}

SHARD_MPI_TEST(Jit, GradOfAShardMapInsideJitEqualsEager) {
  // jit(grad(f)) with f calling shard_map: a forward equation that keeps the body's pullback and a
  // backward equation that applies it; equal to eager's gradient and to grad(jit(f))'s, at every
  // call (the pullback of each call is its own), with several outputs, a list argument, an integer
  // argument, an output the loss ignores, and an argument the outputs do not depend on.
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"data"});
  auto w = device_put(random_tensor<float>({3, 2}, 92), NamedSharding(mesh, P()));
  auto loss = [&](const ShardedArray<float>& wt, const ShardedArray<float>& xs) {
    return shard_map(mesh, {P(), P("data", None)}, P(),
                     [](DeviceContext& ctx, const Tensor<float>& wb, const Tensor<float>& xb) {
                       return ctx.psum(sum(square(matmul(xb, wb))), "data");
                     })(wt, xs);
  };
  auto jg = jit(grad(loss));
  auto jvg = jit(value_and_grad(loss));
  for (int call = 0; call < 3; ++call) {
    const auto x =
        device_put(random_tensor<float>({4 * n, 3}, 91 + call), NamedSharding(mesh, P("data", None)));
    const Tensor<double> want = host_double(grad(loss)(w, x));
    expect_equal(host_double(jg(w, x)), want, 1e-6, "jit(grad(shard_map))");
    auto [v, g] = jvg(w, x);
    expect_equal(host_double(v), host_double(loss(w, x)), 1e-6, "jit(value_and_grad) value");
    expect_equal(host_double(g), want, 1e-6, "jit(value_and_grad) gradient");
    expect_equal(host_double(grad(jit(loss))(w, x)), want, 1e-6, "grad(jit(shard_map))");
    // Not differentiated with respect to the shard_map's operands: the opaque equation.
    auto other = [&](const ShardedArray<float>& u) { return sum(u * u) + loss(w, x); };
    expect_equal(host_double(jit(grad(other))(w)), host_double(grad(other)(w)), 1e-6,
                 "grad past a shard_map");
  }
  // Two outputs (one unused by the loss), a list of parameters, integer labels, an unused parameter.
  Tensor<std::int32_t> lab = random_tensor<std::int32_t>({4 * n}, 93);
  for (auto& v : lab) v = (v % 2 + 2) % 2;
  const auto labels = device_put(lab, NamedSharding(mesh, P("data")));
  std::vector<ShardedArray<float>> ps{w, device_put(random_tensor<float>({2}, 94), NamedSharding(mesh, P())),
                                      device_put(random_tensor<float>({5}, 95), NamedSharding(mesh, P()))};
  auto two = [&](const std::vector<ShardedArray<float>>& p, const ShardedArray<float>& xs,
                 const ShardedArray<std::int32_t>& ys) {
    auto [l, h] = shard_map(mesh, {P(), P("data", None), P("data")}, {P(), P("data", None)},
                            [](DeviceContext& ctx, const std::vector<Tensor<float>>& pb,
                               const Tensor<float>& xb, const Tensor<std::int32_t>& yb) {
                              const Tensor<float> z = tanh(matmul(xb, pb[0]) + pb[1]);
                              const Tensor<float> picked = take_along_axis(z, reshape(yb, {-1, 1}), 1);
                              return std::make_tuple(ctx.psum(sum(picked), "data"), z);
                            })(p, xs, ys);
    return l + 0.0f * sum(h);
  };
  auto jtwo = jit(grad(two));
  for (int call = 0; call < 2; ++call) {
    const auto x = device_put(random_tensor<float>({4 * n, 3}, 96 + call) * 0.0003f,
                              NamedSharding(mesh, P("data", None)));
    const auto want = grad(two)(ps, x, labels);
    const auto got = jtwo(ps, x, labels);
    ASSERT_EQ(got.size(), 3u);
    for (std::size_t k = 0; k < 3; ++k)
      expect_equal(host_double(got[k]), host_double(want[k]), 1e-6, "list parameter gradient");
  }
  // The program: one forward and one backward equation for the shard_map.
  const std::string text = make_jaxpr(grad(loss))(
      w, device_put(random_tensor<float>({4 * n, 3}, 99), NamedSharding(mesh, P("data", None))));
  EXPECT_NE(text.find("shard_map_forward_vjp"), std::string::npos) << text;
  EXPECT_NE(text.find("shard_map_vjp"), std::string::npos) << text;
}

SHARD_MPI_TEST(Jit, JitInsideAShardMapBody) {
  // A jit called inside a shard_map body: its named-axis collectives are equations of the program
  // (traced on the shadows, replayed by the body's context), one program per device (axis_index is
  // a constant of it), equal to the body without jit at every call; grad around the jitted function
  // (replayed op by op for the tape: all_gather's transpose) and jit(grad) inside the body (the
  // transposes traced) equal the un-jitted gradients.
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"data"});
  const std::int64_t local = static_cast<std::int64_t>(mesh.local_device_ids().size());
  auto block_fn = [n](const Tensor<float>& b, const Tensor<float>& w) {
    const Tensor<float> h = tanh(matmul(b, w)) + static_cast<float>(static_cast<int>(axis_index("data")));
    const Tensor<float> s = psum(sum(h, {0}), "data");
    const Tensor<float> g = all_gather(h, "data", 0, true);
    const Tensor<float> r = psum_scatter(g * 2.0f, "data", 0, true);
    std::vector<std::pair<int, int>> ring;
    for (int i = 0; i < n; ++i) ring.emplace_back(i, (i + 1) % n);
    const Tensor<float> p = ppermute(h, "data", ring);
    const Tensor<float> m = pmax(h, "data") - pmin(h, "data") + pmean(h, "data");
    // An integer pmean: the exact sum, then a true division (a float result).
    const Tensor<float> mi = astype<float>(pmean(astype<std::int32_t>(h * 10.0f), "data"));
    return std::make_tuple(r + p + m + mi, s);
  };
  auto jitted = jit(block_fn);
  auto run = [&](bool use_jit, const ShardedArray<float>& x, const ShardedArray<float>& w) {
    return shard_map(mesh, {P("data", None), P()}, {P("data", None), P()},
                     [&](const Tensor<float>& b, const Tensor<float>& wb) {
                       return use_jit ? jitted(b, wb) : block_fn(b, wb);
                     })(x, w);
  };
  const auto w = device_put(random_tensor<float>({3, 4}, 101), NamedSharding(mesh, P()));
  for (int call = 0; call < 3; ++call) {
    const auto x =
        device_put(random_tensor<float>({2 * n, 3}, 102 + call), NamedSharding(mesh, P("data", None)));
    const auto [want_y, want_s] = run(false, x, w);
    const auto [got_y, got_s] = run(true, x, w);
    expect_equal(host_double(got_y), host_double(want_y), 1e-6, "jit in a body: the collectives' result");
    expect_equal(host_double(got_s), host_double(want_s), 1e-6, "jit in a body: psum");
  }
  EXPECT_EQ(jitted.trace_count(), local);  // one program per device of this rank, then replays

  // grad of a function whose shard_map body calls the jitted function: the body's device tapes see
  // its replay op by op (all_gather's transpose, a psum_scatter; all_gather_invariant's, the own
  // chunk), eagerly and under jit(grad).
  auto block_fn2 = [](const Tensor<float>& wb, const Tensor<float>& b) {
    return all_gather(tanh(matmul(b, wb)), "data", 0, true) * 0.5f;
  };
  auto jitted2 = jit(block_fn2);
  // all_gather_invariant: invariant over 'data' (returned under P()), its transpose the own chunk.
  auto block_fn3 = [](const Tensor<float>& wb, const Tensor<float>& b) {
    return all_gather_invariant(tanh(matmul(b, wb)), "data", 0, true);
  };
  auto jitted3 = jit(block_fn3);
  auto loss = [&](bool use_jit) {
    return [&, use_jit](const ShardedArray<float>& wt, const ShardedArray<float>& xs) {
      return shard_map(
          mesh, {P(), P("data", None)}, P(), [&](const Tensor<float>& wb, const Tensor<float>& b) {
            const Tensor<float> g = use_jit ? jitted2(wb, b) : block_fn2(wb, b);
            const Tensor<float> inv = use_jit ? jitted3(wb, b) : block_fn3(wb, b);
            return psum(sum(square(g) * (1.0f + static_cast<float>(static_cast<int>(axis_index("data"))))),
                        "data") +
                   sum(square(inv));
          })(wt, xs);
    };
  };
  auto jit_grad = jit(grad(loss(true)));
  for (int call = 0; call < 2; ++call) {
    const auto x =
        device_put(random_tensor<float>({2 * n, 3}, 110 + call), NamedSharding(mesh, P("data", None)));
    const Tensor<double> want = host_double(grad(loss(false))(w, x));
    expect_equal(host_double(grad(loss(true))(w, x)), want, 1e-5, "grad through a body calling a jit");
    expect_equal(host_double(jit_grad(w, x)), want, 1e-5, "jit(grad) through a body calling a jit");
  }
}

SHARD_MPI_TEST(Jit, GradThroughAShardMapTracksOnlyTheDifferentiatedArguments) {
  // jit(grad(f)) differentiates only what the grad does: a body may apply an op without a VJP
  // (pmax) to data that is not differentiated, and the data's cotangents are neither computed nor
  // summed (the jitted step sends what the eager one sends). Nested jits around the shard_map
  // give eager's values too. A jitted update of parameters over borrowed memory, not donated,
  // leaves the caller's memory as it was.
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"data"});
  const NamedSharding rep(mesh, P()), rows(mesh, P("data", None));
  const auto w = device_put(random_tensor<float>({3, 2}, 31), rep);
  const auto c = device_put(random_tensor<float>({64, 64}, 32), rep);
  const auto x = device_put(random_tensor<float>({4 * n, 3}, 33), rows);
  auto f = [&](const ShardedArray<float>& wt, const ShardedArray<float>& ct, const ShardedArray<float>& xs) {
    return shard_map(
        mesh, {P(), P(), P("data", None)}, P(),
        [](DeviceContext& ctx, const Tensor<float>& wb, const Tensor<float>& cb, const Tensor<float>& xb) {
          const Tensor<float> m = ctx.pmax(max(abs(xb)), "data");
          return ctx.psum(sum(square(matmul(xb / m, wb))) + 0.001f * sum(cb), "data");
        })(wt, ct, xs);
  };
  const Tensor<double> want = host_double(grad(f)(w, c, x));
  auto jg = jit(grad(f));
  expect_equal(host_double(jg(w, c, x)), want, 1e-6, "jit(grad) with pmax on data");
  comm_stats().reset();
  (void)grad(f)(w, c, x);
  const std::int64_t eager_bytes = comm_stats().total().bytes;
  comm_stats().reset();
  const Tensor<double> got = host_double(jg(w, c, x));
  comm_stats().reset();
  (void)jg(w, c, x);
  EXPECT_EQ(comm_stats().total().bytes, eager_bytes) << comm_stats().to_string();
  expect_equal(got, want, 1e-6, "jit(grad) again");
  // Nested jits.
  auto g = [&](const ShardedArray<float>& wt) { return f(wt, c, x); };
  const double value = f(w, c, x).item();
  EXPECT_NEAR(jit(jit(g))(w).item(), value, 1e-6 * (1 + std::abs(value)));
  expect_equal(host_double(jit(grad(jit(g)))(w)), want, 1e-6, "jit(grad(jit))");
  expect_equal(host_double(jit(jit(grad(g)))(w)), want, 1e-6, "jit(jit(grad))");
  // Borrowed parameters, a jitted sgd step without donation.
  const auto local = mesh.local_device_ids();
  const Tensor<float> init = random_tensor<float>({3, 2}, 34);
  std::vector<std::vector<float>> memory(local.size(),
                                         std::vector<float>(init.data(), init.data() + init.size()));
  std::vector<Shard<float>> shards;
  for (std::size_t i = 0; i < local.size(); ++i)
    shards.push_back(Shard<float>{local[i], rep.box(local[i], Shape{3, 2}),
                                  Tensor<float>::borrow(memory[i].data(), Shape{3, 2})});
  std::vector<ShardedArray<float>> borrowed{ShardedArray<float>(Shape{3, 2}, rep, std::move(shards))};
  const auto opt = optim::sgd(0.1);
  auto state = opt.init(borrowed);
  auto step = jit([&](std::vector<ShardedArray<float>> p, optim::State<float> s) {
    auto gr = grad([&](const std::vector<ShardedArray<float>>& q) { return f(q[0], c, x); })(p);
    opt.update(p, gr, s);
    return std::tuple{p, s};
  });
  auto [next, next_state] = step(borrowed, state);
  for (std::size_t i = 0; i < local.size(); ++i)
    for (std::size_t e = 0; e < memory[i].size(); ++e)
      EXPECT_EQ(memory[i][e], init.flat(static_cast<std::int64_t>(e)));
  const Tensor<double> at_init = host_double(grad(f)(device_put(init, rep), c, x));
  expect_equal(host_double(next[0]), host_double(init) - 0.1 * at_init, 1e-5, "the jitted sgd step");
}

}  // namespace
