// shard::vmap (vmap/vmap.hpp): every primitive of the op table batched by its rule, checked
// against the loop over the examples (the same function on each example, the results stacked)
// on random data, for in_axes 0, 1, -1 and None and out_axes 0 and -1, on Tensors and on
// ShardedArrays of random specs (uneven batch dims included) on every rank; the kernel calls of
// a vmapped program at batch 1 and 256; vmap(grad) against per-example gradients by loop and
// grad(vmap) against the gradient of the loop; collectives over axis_name against their
// definitions; nested vmaps; vmap inside shard_map; the errors.

#include <cmath>
#include <cstdint>
#include <functional>
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

/// Example b of x along `axis` (x itself for None).
template <typename X>
X example(const X& x, const BatchAxis& axis, std::int64_t b) {
  if (axis.is_none()) return x;
  const int d = resolve_dim(axis.dim(), x.ndim(), "test");
  std::vector<Index> index(static_cast<std::size_t>(d), Slice());
  index.push_back(b);
  return slice(x, index);
}

/// The loop over the examples: f on each, the results stacked along `out`.
template <typename F, typename... A>
auto loop_reference(const F& f, const std::vector<BatchAxis>& in, const BatchAxis& out, std::int64_t size,
                    const A&... args) {
  using R = decltype(f(args...));
  std::vector<R> outs;
  for (std::int64_t b = 0; b < size; ++b) {
    std::size_t i = 0;
    auto one = [&](const auto& a) { return example(a, in[i++], b); };
    outs.push_back([&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::apply([&](const auto&... e) { return f(e...); }, std::tuple<A...>{one(args)...});
    }(std::index_sequence_for<A...>{}));
  }
  const int rank = outs.front().ndim();
  return stack(outs, resolve_dim(out.dim(), rank + 1, "test"));
}

void expect_close(const Tensor<double>& got, const Tensor<double>& want, double tol,
                  const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  for (std::int64_t i = 0; i < got.size(); ++i) {
    const double g = got.flat(i), w = want.flat(i);
    if (std::isnan(w)) {
      EXPECT_TRUE(std::isnan(g)) << what << " at " << i;
      continue;
    }
    ASSERT_NEAR(g, w, tol * (1.0 + std::abs(w))) << what << " at flat index " << i;
  }
}

/// vmap(f, in, out)(args...) against the loop, on every rank.
template <typename F, typename... A>
void check_vmap(const std::string& name, const F& f, const std::vector<BatchAxis>& in, const BatchAxis& out,
                std::int64_t size, double tol, const A&... args) {
  std::string what = name + " in_axes (";
  for (const auto& a : in) what += a.to_string() + ",";
  what += ") out_axes " + out.to_string();
  try {
    const auto got = vmap(f, VmapAxes(in), out)(args...);
    const auto want = loop_reference(f, in, out, size, args...);
    expect_close(host_double(got), host_double(want), tol, what);
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": " << e.what();
  }
}

/// The physical array of a random batch: example shape `s`, the batch of `size` at `axis`.
Shape batched_shape(Shape s, const BatchAxis& axis, std::int64_t size) {
  if (axis.is_none()) return s;
  s.insert(s.begin() + resolve_dim(axis.dim(), static_cast<int>(s.size()) + 1, "test"), size);
  return s;
}

/// A program: its name, the example shapes of its float operands, and the function (written
/// once for both views; `tensor_only`: uses an op only Tensors have).
struct Program {
  std::string name;
  std::vector<Shape> shapes;
  bool tensor_only = false;
};

/// Calls v(program, f) for each program of the op table's sample (every primitive appears);
/// the programs of ops only Tensors have when `tensors`, of ops only ShardedArrays have otherwise.
template <bool tensors, typename V>
void for_each_program(V&& v) {
  // elementwise family
  v(Program{"binary_add_broadcast", {{3, 5}, {5}}}, [](const auto& x, const auto& y) { return x + y; });
  v(Program{"binary_mul_rank_lift", {{5}, {3, 5}}}, [](const auto& x, const auto& y) { return x * y; });
  v(Program{"binary_scalar", {{4, 3}}}, [](const auto& x) { return 1.5f - x * 2.0f; });
  v(Program{"compare", {{4, 3}, {4, 3}}},
    [](const auto& x, const auto& y) { return astype<float>(greater(x, y)); });
  v(Program{"compare_scalar", {{6}}}, [](const auto& x) { return astype<float>(x > 0.25f); });
  v(Program{"unary", {{2, 3, 4}}}, [](const auto& x) { return tanh(exp(x) - 1.0f); });
  v(Program{"where", {{4, 3}, {3}}}, [](const auto& x, const auto& y) { return where(x > 0.5f, x, y); });
  v(Program{"astype", {{3, 4}}}, [](const auto& x) { return astype<double>(x) * 3.0; });
  if constexpr (!tensors) {  // ShardedArray ops: axpy, reshard, to_host, a Tensor joining a ShardedArray
    v(Program{"axpy", {{3, 4}, {3, 4}}}, [](const auto& x, const auto& y) { return axpy(2.5f, x, y); });
    v(Program{"reshard", {{4, 6}}}, [](const auto& x) {
      return with_sharding_constraint(x * 2.0f,
                                      NamedSharding(x.mesh(), P(None, x.mesh().axis_names().back())));
    });
    v(Program{"to_host", {{4, 3}}}, [](const auto& x) { return (x + 1.0f).to_host(); });
    v(Program{"uncommitted", {{4, 3}}}, [](const auto& x) { return x + x.to_host() * 0.5f; });
  }
  // reductions and scans
  v(Program{"sum_axis", {{4, 5}}}, [](const auto& x) { return sum(x, 1); });
  v(Program{"mean_keepdims", {{4, 5}}}, [](const auto& x) { return mean(x, 0, true); });
  v(Program{"max_all", {{4, 5}}}, [](const auto& x) { return max(x); });
  v(Program{"min_neg_axis", {{3, 4, 2}}}, [](const auto& x) { return min(x, -2); });
  v(Program{"prod_two_dims", {{3, 2, 2}}}, [](const auto& x) { return prod(x, Dims{0, 2}); });
  v(Program{"cumsum", {{4, 5}}}, [](const auto& x) { return cumsum(x, 1); });
  v(Program{"argmax", {{4, 5}}}, [](const auto& x) { return astype<float>(argmax(x, 1)); });
  v(Program{"argmin_keepdims", {{4, 5}}}, [](const auto& x) { return astype<float>(argmin(x, 0, true)); });
  // shape and indexing
  v(Program{"reshape", {{4, 6}}}, [](const auto& x) { return reshape(x, Shape{3, -1}); });
  v(Program{"expand_squeeze", {{4, 6}}}, [](const auto& x) { return squeeze(expand_dims(x, -1) * 2.0f); });
  v(Program{"squeeze_dim", {{4, 1, 3}}}, [](const auto& x) { return squeeze(x, 1); });
  v(Program{"transpose", {{2, 3, 4}}}, [](const auto& x) { return transpose(x); });
  v(Program{"transpose_perm", {{2, 3, 4}}}, [](const auto& x) { return transpose(x, {2, 0, 1}); });
  if constexpr (tensors)
    v(Program{"broadcast_to", {{1, 4}}, true}, [](const auto& x) { return broadcast_to(x, Shape{3, 4}); });
  v(Program{"slice", {{5, 6}}}, [](const auto& x) { return x[{Slice(1, 4), Slice(None, None, 2)}]; });
  v(Program{"slice_int", {{5, 6}}}, [](const auto& x) { return x[{2, Slice(1, -1)}]; });
  v(Program{"row", {{5, 6}}}, [](const auto& x) { return x[3]; });
  v(Program{"concatenate", {{3, 4}, {3, 2}}}, [](const auto& x, const auto& y) {
    return concatenate(std::vector{x, y}, 1);
  });
  v(Program{"stack", {{3, 4}, {3, 4}}}, [](const auto& x, const auto& y) {
    return stack(std::vector{x, y, x}, -1);
  });
  // products
  v(Program{"matmul", {{3, 4}, {4, 5}}}, [](const auto& x, const auto& y) { return matmul(x, y); });
  v(Program{"matmul_vec_mat", {{4}, {4, 5}}}, [](const auto& x, const auto& y) { return matmul(x, y); });
  v(Program{"matmul_mat_vec", {{3, 4}, {4}}}, [](const auto& x, const auto& y) { return matmul(x, y); });
  v(Program{"matmul_batched", {{2, 3, 4}, {4, 5}}},
    [](const auto& x, const auto& y) { return matmul(x, y); });
  // matmul's VJP under jit: the transposes in the gemm (prim::MatmulT), each combination.
  for (const bool ta : {false, true})
    for (const bool tb : {false, true})
      v(Program{std::string("matmul_t_") + (ta ? "t" : "n") + (tb ? "t" : "n"),
                {ta ? Shape{4, 3} : Shape{3, 4}, tb ? Shape{5, 4} : Shape{4, 5}}},
        [ta, tb](const auto& x, const auto& y) {
          return detail::bind_at(prim::MatmulT{{}, ta, tb, nullptr}, shard::source_location{}, x, y);
        });
  v(Program{"dot_vec", {{4}, {4}}}, [](const auto& x, const auto& y) { return dot(x, y); });
  v(Program{"vdot", {{3, 4}, {3, 4}}}, [](const auto& x, const auto& y) { return vdot(x, y); });
  // nn
  v(Program{"softmax", {{3, 5}}}, [](const auto& x) { return softmax(x, -1); });
  v(Program{"layer_norm", {{3, 6}}}, [](const auto& x) { return standardize(x, -1); });
  v(Program{"logsumexp_gelu", {{3, 6}}}, [](const auto& x) { return gelu(logsumexp(x, Dims{1}, true) + x); });
  v(Program{"attention_3d", {{4, 2, 3}, {4, 2, 3}}},
    [](const auto& q, const auto& k) { return dot_product_attention(q, k, k * 0.5f); });
  v(Program{"attention", {{1, 4, 2, 3}, {1, 4, 2, 3}}},
    [](const auto& q, const auto& k) { return dot_product_attention(q, k, k * 0.5f, true); });
}

/// The in_axes combinations of a program with n operands: a fixed sample in the default tier,
/// every combination of 0, 1, -1 and None (not all None) in the slow tier (SHARD_FULL_MATRIX=1).
std::vector<std::vector<BatchAxis>> in_axes_for(std::size_t n) {
  if (shard::testing::full_matrix()) {
    const std::vector<BatchAxis> each{0, 1, -1, None};
    std::vector<std::vector<BatchAxis>> all;
    if (n == 1) {
      for (const auto& a : each)
        if (!a.is_none()) all.push_back({a});
      return all;
    }
    for (const auto& a : each)
      for (const auto& b : each)
        if (!a.is_none() || !b.is_none()) all.push_back({a, b});
    return all;
  }
  if (n == 1) return {{0}, {1}, {-1}};
  return {{0, 0}, {1, -1}, {None, 0}, {0, None}, {-1, 1}};
}

template <typename F, std::size_t... I>
void run_program_tensors(const Program& p, const F& f, std::index_sequence<I...>) {
  const std::int64_t size = 5;
  for (const auto& in : in_axes_for(p.shapes.size())) {
    // an axis past a 1-D example's dims is fine (0..rank); -1 is the last
    std::vector<Tensor<float>> args;
    for (std::size_t i = 0; i < p.shapes.size(); ++i)
      args.push_back(random_tensor<float>(batched_shape(p.shapes[i], in[i], size), 17 + 31 * i));
    for (const BatchAxis out : {BatchAxis(0), BatchAxis(-1)})
      check_vmap(p.name, f, in, out, size, 2e-5, args[I]...);
    // the slow tier: out_axes 1 too, where the result has a dim 1
    if (shard::testing::full_matrix() && vmap(f, VmapAxes(in))(args[I]...).ndim() >= 2)
      check_vmap(p.name, f, in, 1, size, 2e-5, args[I]...);
  }
}

SHARD_MPI_TEST(Vmap, EveryPrimitiveMatchesTheLoopOnTensors) {
  for_each_program<true>([](const Program& p, const auto& f) {
    using Fn = std::decay_t<decltype(f)>;
    if constexpr (std::is_invocable_v<const Fn&, const Tensor<float>&>)
      run_program_tensors(p, f, std::make_index_sequence<1>{});
    else
      run_program_tensors(p, f, std::make_index_sequence<2>{});
  });
}

template <typename F, std::size_t... I>
void run_program_sharded(const Program& p, const F& f, const Mesh& mesh, std::mt19937_64& rng,
                         std::index_sequence<I...>) {
  const std::int64_t size = 5;  // uneven over 2 and 4 devices
  for (const auto& in : in_axes_for(p.shapes.size())) {
    std::vector<ShardedArray<float>> args;
    for (std::size_t i = 0; i < p.shapes.size(); ++i) {
      const Tensor<float> host = random_tensor<float>(batched_shape(p.shapes[i], in[i], size), 5 + 13 * i);
      args.push_back(
          device_put(host, NamedSharding(mesh, shard::testing::random_spec(mesh, host.ndim(), rng))));
    }
    check_vmap(p.name, f, in, BatchAxis(0), size, 2e-5, args[I]...);
    if (shard::testing::full_matrix()) check_vmap(p.name, f, in, BatchAxis(-1), size, 2e-5, args[I]...);
  }
}

SHARD_MPI_TEST(Vmap, EveryPrimitiveMatchesTheLoopOnShardedArrays) {
  std::mt19937_64 rng(2026);
  const int n = shard::testing::runtime().device_count();
  for (const Mesh& mesh : {make_mesh({n}, {"a"}), make_mesh({1, n}, {"a", "b"})}) {
    for_each_program<false>([&](const Program& p, const auto& f) {
      using Fn = std::decay_t<decltype(f)>;
      if constexpr (std::is_invocable_v<const Fn&, const ShardedArray<float>&>)
        run_program_sharded(p, f, mesh, rng, std::make_index_sequence<1>{});
      else
        run_program_sharded(p, f, mesh, rng, std::make_index_sequence<2>{});
    });
  }
}

SHARD_MPI_TEST(Vmap, TakeWithBatchedTablesAndIndices) {
  const std::int64_t size = 4;
  const Tensor<float> table = random_tensor<float>({size, 6, 3}, 3);
  const Tensor<float> one_table = random_tensor<float>({6, 3}, 4);
  Tensor<std::int32_t> idx({size, 5});
  Tensor<std::int32_t> one_idx({5});
  std::mt19937_64 rng(7);
  for (auto& v : idx) v = static_cast<std::int32_t>(rng() % 12) - 6;  // negative indices count from the end
  for (auto& v : one_idx) v = static_cast<std::int32_t>(rng() % 6);
  Tensor<std::int32_t> idx3({size, 5});
  for (auto& v : idx3) v = static_cast<std::int32_t>(rng() % 3);
  auto take0 = [](const auto& t, const auto& i) { return take(t, i, 0); };
  auto take1 = [](const auto& t, const auto& i) { return take(t, i, 1); };
  for (const BatchAxis out : {BatchAxis(0), BatchAxis(-1)}) {
    check_vmap("take both batched", take0, {0, 0}, out, size, 0, table, idx);
    check_vmap("take table batched", take0, {0, None}, out, size, 0, table, one_idx);
    check_vmap("take indices batched", take0, {None, 0}, out, size, 0, one_table, idx);
    check_vmap("take axis 1 indices batched", take1, {None, 0}, out, size, 0, one_table, idx3);
  }
  // take_along_axis: indices of the example's rank
  Tensor<std::int64_t> along({size, 6, 2});
  for (auto& v : along) v = static_cast<std::int64_t>(rng() % 3);
  auto tal = [](const auto& t, const auto& i) { return take_along_axis(t, i, 1); };
  check_vmap("take_along_axis", tal, {0, 0}, 0, size, 0, table, along);
  check_vmap("take_along_axis table unbatched", tal, {None, 0}, 0, size, 0, one_table, along);
  // on ShardedArrays
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const auto st = device_put(table, NamedSharding(mesh, P("a")));
  const auto si = device_put(idx, NamedSharding(mesh, P("a")));
  check_vmap("sharded take both batched", take0, {0, 0}, 0, size, 0, st, si);
}

SHARD_MPI_TEST(Vmap, KernelCallsDoNotDependOnTheBatchSize) {
  // A per-example MLP forward (784-1024-1024-10 in the benchmark; small here).
  const Tensor<float> w1 = random_tensor<float>({16, 32}, 1), w2 = random_tensor<float>({32, 10}, 2);
  auto forward = [&](const Tensor<float>& x) { return softmax(matmul(tanh(matmul(x, w1)), w2)); };
  std::uint64_t calls[2];
  int k = 0;
  for (const std::int64_t size : {1, 256}) {
    const Tensor<float> xs = random_tensor<float>({size, 16}, 3);
    const std::uint64_t before = detail::bind_calls();
    (void)vmap(forward)(xs);
    calls[k++] = detail::bind_calls() - before;
  }
  EXPECT_EQ(calls[0], calls[1]);
  EXPECT_LE(calls[0], 12u);  // the ops of the body plus their rules' moves, not one per example
}

// A per-example loss: 4 -> 8 -> 3 MLP, softmax cross-entropy with an integer label.
struct Mlp {
  Tensor<float> w1, b1, w2;
};
SHARD_TREE(Mlp, w1, b1, w2)

Tensor<float> mlp_loss(const Mlp& p, const Tensor<float>& x, const Tensor<std::int32_t>& label) {
  const auto h = tanh(matmul(x, p.w1) + p.b1);
  return softmax_cross_entropy_with_integer_labels(matmul(h, p.w2), label);
}

Mlp random_mlp() {
  return Mlp{random_tensor<float>({4, 8}, 11), random_tensor<float>({8}, 12),
             random_tensor<float>({8, 3}, 13)};
}

SHARD_MPI_TEST(Vmap, PerExampleGradientsMatchTheLoop) {
  const std::int64_t size = 6;
  const Mlp params = random_mlp();
  const Tensor<float> xs = random_tensor<float>({size, 4}, 14);
  Tensor<std::int32_t> labels({size});
  for (std::int64_t b = 0; b < size; ++b) labels.flat(b) = static_cast<std::int32_t>((b * 7) % 3);
  const Mlp got = vmap(grad(mlp_loss), {None, 0, 0})(params, xs, labels);
  std::vector<Tensor<float>> w1, b1, w2;
  for (std::int64_t b = 0; b < size; ++b) {
    const Mlp g = grad(mlp_loss)(params, xs[b], labels[b]);
    w1.push_back(g.w1);
    b1.push_back(g.b1);
    w2.push_back(g.w2);
  }
  expect_close(astype<double>(got.w1), astype<double>(stack(w1)), 1e-5, "dw1");
  expect_close(astype<double>(got.b1), astype<double>(stack(b1)), 1e-5, "db1");
  expect_close(astype<double>(got.w2), astype<double>(stack(w2)), 1e-5, "dw2");
}

SHARD_MPI_TEST(Vmap, PerExampleGradientsThroughSliceAndTake) {
  const std::int64_t size = 4;
  const Tensor<float> table = random_tensor<float>({6, 3}, 16);
  const Tensor<float> xs = random_tensor<float>({size, 5, 3}, 17);
  Tensor<std::int32_t> idx({size, 4});
  for (std::int64_t i = 0; i < idx.size(); ++i) idx.flat(i) = static_cast<std::int32_t>((i * 5 + 2) % 6) - 2;
  // d/d(table, x) of a loss that slices x and gathers rows of the table with per-example indices
  auto loss = [](const Tensor<float>& t, const Tensor<float>& x, const Tensor<std::int32_t>& i) {
    return sum(take(t, i, 0) * x[{Slice(1, 5)}]) + sum(x[{2}] * x[{0}]);
  };
  const auto got = vmap(grad(loss, argnums<0, 1>), {None, 0, 0})(table, xs, idx);
  std::vector<Tensor<float>> dt, dx;
  for (std::int64_t b = 0; b < size; ++b) {
    const auto g = grad(loss, argnums<0, 1>)(table, xs[b], idx[b]);
    dt.push_back(std::get<0>(g));
    dx.push_back(std::get<1>(g));
  }
  expect_close(astype<double>(std::get<0>(got)), astype<double>(stack(dt)), 1e-5, "d table");
  expect_close(astype<double>(std::get<1>(got)), astype<double>(stack(dx)), 1e-5, "d x");
}

SHARD_MPI_TEST(Vmap, NestedVmapOfGradThroughFusedKernels) {
  // softmax and layer norm on Tensors are fused kernels with their own VJP (forward_vjp)
  const Tensor<float> w = random_tensor<float>({3}, 18), xs = random_tensor<float>({2, 4, 3}, 19);
  auto loss = [](const Tensor<float>& wv, const Tensor<float>& x) {
    return sum(softmax(x * wv) * standardize(x + wv, -1));
  };
  const Tensor<float> got = vmap(vmap(grad(loss), {None, 0}), {None, 0})(w, xs);
  std::vector<Tensor<float>> want;
  for (std::int64_t i = 0; i < 2; ++i)
    for (std::int64_t j = 0; j < 4; ++j) want.push_back(grad(loss)(w, xs[i][j]));
  expect_close(astype<double>(got), reshape(astype<double>(stack(want)), Shape{2, 4, 3}), 1e-5,
               "vmap(vmap(grad))");
}

SHARD_MPI_TEST(Vmap, GradOfVmapMatchesTheGradOfTheLoop) {
  const std::int64_t size = 5;
  const Mlp params = random_mlp();
  const Tensor<float> xs = random_tensor<float>({size, 4}, 15);
  Tensor<std::int32_t> labels({size});
  for (std::int64_t b = 0; b < size; ++b) labels.flat(b) = static_cast<std::int32_t>((b * 5 + 1) % 3);
  const Mlp got = grad([&](const Mlp& p) {
    return sum(vmap(mlp_loss, {None, 0, 0})(p, xs, labels));
  })(params);
  const Mlp want = grad([&](const Mlp& p) {
    Tensor<float> total(Shape{}, 0.f);
    for (std::int64_t b = 0; b < size; ++b) total = total + mlp_loss(p, xs[b], labels[b]);
    return total;
  })(params);
  expect_close(astype<double>(got.w1), astype<double>(want.w1), 1e-5, "dw1");
  expect_close(astype<double>(got.b1), astype<double>(want.b1), 1e-5, "db1");
  expect_close(astype<double>(got.w2), astype<double>(want.w2), 1e-5, "dw2");
}

SHARD_MPI_TEST(Vmap, CollectivesOverTheAxisNameMatchTheirDefinitions) {
  const std::int64_t size = 4;
  const Tensor<float> xs = random_tensor<float>({size, 3}, 21);
  const VmapOptions named{.axis_name = "i"};
  const Tensor<double> h = astype<double>(xs);
  // psum: every example gets the sum over the batch
  auto centered = vmap([](const Tensor<float>& x) { return x - psum(x, "i") / 4.0f; }, 0, 0, named)(xs);
  auto sums = sum(h, 0);
  Tensor<double> want = h - stack<double>({sums, sums, sums, sums}) / 4.0;
  expect_close(astype<double>(centered), want, 1e-5, "psum");
  auto means = vmap([](const Tensor<float>& x) { return pmean(x, "i"); }, 0, 0, named)(xs);
  expect_close(astype<double>(means), stack<double>({sums / 4.0, sums / 4.0, sums / 4.0, sums / 4.0}), 1e-5,
               "pmean");
  auto maxes = vmap([](const Tensor<float>& x) { return pmax(x, "i") - pmin(x, "i"); }, 0, 0, named)(xs);
  const Tensor<double> range = max(h, 0) - min(h, 0);
  expect_close(astype<double>(maxes), stack<double>({range, range, range, range}), 1e-6, "pmax - pmin");
  // all_gather: each example sees the whole batch
  auto gathered = vmap([](const Tensor<float>& x) { return all_gather(x, "i"); }, 0, 0, named)(xs);
  expect_close(astype<double>(gathered), stack<double>({h, h, h, h}), 0, "all_gather");
  auto tiled = vmap([](const Tensor<float>& x) { return all_gather(x, "i", 0, true); }, 0, 0, named)(xs);
  const Tensor<double> flat = reshape(h, Shape{-1});
  expect_close(astype<double>(tiled), stack<double>({flat, flat, flat, flat}), 0, "all_gather tiled");
  // axis_index: each example's position
  auto index = vmap(
      [](const Tensor<float>& x) {
        Tensor<std::int32_t> i = axis_index("i");
        return x * astype<float>(i);
      },
      0, 0, named)(xs);
  expect_close(astype<double>(index), h * reshape(astype<double>(arange<std::int32_t>(4)), Shape{4, 1}), 1e-6,
               "axis_index");
  EXPECT_EQ(
      vmap([](const Tensor<float>& x) { return x * static_cast<float>(axis_size("i")); }, 0, 0, named)(xs),
      xs * 4.0f);
  // psum of a value that does not depend on the example: times the batch size
  auto consts =
      vmap([](const Tensor<float>& x) { return x * 0.0f + psum(Tensor<float>(Shape{}, 2.0f), "i"); }, 0, 0,
           named)(xs);
  expect_close(astype<double>(consts), Tensor<double>({size, 3}, 8.0), 0, "psum of a constant");
}

SHARD_MPI_TEST(Vmap, NestedVmapsAndOutAxesNone) {
  const Tensor<float> xs = random_tensor<float>({3, 4, 5}, 31);
  auto f = [](const Tensor<float>& row) { return sum(row * row); };
  const Tensor<float> got = vmap(vmap(f))(xs);
  const Tensor<double> want = sum(astype<double>(xs) * astype<double>(xs), 2);
  expect_close(astype<double>(got), want, 1e-5, "vmap(vmap)");
  // inner over axis 1 of each example, outer over axis 2 of the batch; out_axes -1
  // the outer vmap maps dim 1 (size 4), the inner one dim 0 of each (3, 5) example; out_axes -1
  const Tensor<float> g2 = vmap(vmap(f, 0), 1, -1)(xs);
  expect_close(astype<double>(g2), want, 1e-5, "vmap(vmap) axes");
  const Tensor<float> g3 = vmap(vmap(f, 0), 1, 0)(xs);
  expect_close(astype<double>(g3), transpose(want), 1e-5, "vmap(vmap) out_axes 0");
  // an output that does not depend on the batch, with out_axes None, comes back as it is
  const Tensor<float> w = random_tensor<float>({5}, 32);
  auto [mapped, same] = vmap(
      [&](const Tensor<float>& x) {
        return std::pair{x * w, w * 2.0f};
      },
      0, {0, None})(xs[0]);
  expect_close(astype<double>(same), astype<double>(w * 2.0f), 0, "out_axes None");
  expect_close(astype<double>(mapped), astype<double>(xs[0] * w), 0, "pair output");
  // an unbatched output with out_axes 0 is repeated along the batch
  const Tensor<float> rep = vmap([&](const Tensor<float>&) { return w; })(xs);
  EXPECT_EQ(rep.shape(), (Shape{3, 5}));
  expect_close(astype<double>(rep[2]), astype<double>(w), 0, "repeated output");
}

SHARD_MPI_TEST(Vmap, InsideShardMapWithMeshCollectives) {
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const Tensor<float> host = random_tensor<float>({2 * n, 3, 4}, 41);
  const auto x = device_put(host, NamedSharding(mesh, P("a")));
  // Each device vmaps over its rows; psum over 'a' of every example, minus the example's psum over 'i'.
  auto body = [](const Tensor<float>& block) {
    return vmap([](const Tensor<float>& ex) { return psum(ex, "a") - psum(sum(ex, 0), "i"); }, 0, 0,
                VmapOptions{.axis_name = "i"})(block);
  };
  const auto out = shard_map(mesh, P("a"), P("a"), body)(x);
  // Reference: rows r and r + 2k... block b holds rows [2b, 2b+2); psum over 'a' sums example j of every
  // block.
  const Tensor<double> h = astype<double>(host);
  Tensor<double> want({2 * n, 3, 4});
  for (int b = 0; b < n; ++b)
    for (int j = 0; j < 2; ++j) {
      Tensor<double> across(Shape{3, 4}, 0.0);
      for (int c = 0; c < n; ++c) across = across + h[2 * c + j];
      const Tensor<double> inner = sum(h[2 * b], 0) + sum(h[2 * b + 1], 0);
      const Tensor<double> row = across - inner;
      for (std::int64_t e = 0; e < 12; ++e) want.flat((2 * b + j) * 12 + e) = row.flat(e);
    }
  expect_close(host_double(out), want, 1e-5, "vmap inside shard_map");
}

SHARD_MPI_TEST(Vmap, OutputsDoNotShareTheInputsMemory) {
  Tensor<float> xs = random_tensor<float>({4, 6}, 51);
  const Tensor<float> same = vmap([](const Tensor<float>& x) { return x; })(xs);
  const Tensor<float> reshaped = vmap([](const Tensor<float>& x) { return reshape(x, Shape{2, 3}); })(xs);
  const Tensor<float> before = Tensor<float>(xs);
  xs.flat(0) = 100.f;  // a write through the input's elements
  EXPECT_EQ(same, before);
  EXPECT_EQ(reshaped.flat(0), before.flat(0));
}

SHARD_MPI_TEST(Vmap, PerExampleGradientsOfShardedArrays) {
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const std::int64_t size = 2 * n + 1;  // uneven over the mesh
  const Tensor<float> w = random_tensor<float>({3, 4}, 52), xs = random_tensor<float>({size, 3}, 53);
  const auto ws = device_put(w, NamedSharding(mesh, P()));
  const auto xd = device_put(xs, NamedSharding(mesh, P("a")));
  // x is used twice: the cotangents of w accumulate across two products
  auto loss = [](const auto& wv, const auto& x) { return sum(tanh(matmul(x, wv)) * matmul(x * 2.0f, wv)); };
  const auto got = vmap(grad(loss), {None, 0})(ws, xd);
  std::vector<Tensor<float>> want;
  for (std::int64_t b = 0; b < size; ++b) want.push_back(grad(loss)(w, xs[b]));
  expect_close(host_double(got), astype<double>(stack(want)), 1e-5, "sharded per-example gradients");
}

SHARD_MPI_TEST(Vmap, RandomKeysSplitPerExample) {
  const std::int64_t size = 5;
  const random::Key key = random::key(2026);
  const Tensor<std::int64_t> keys = random::split_keys(key, size);
  const std::vector<random::Key> split = random::split(key, static_cast<int>(size));
  for (std::int64_t j = 0; j < size; ++j) EXPECT_EQ(keys[j], random::key_data(split[j]));
  auto draw = [](const Tensor<std::int64_t>& k) {
    return random::normal<float>(k, Shape{3, 2}) + random::uniform<float>(k, Shape{2}, -1.f, 1.f);
  };
  const Tensor<float> got = vmap(draw)(keys);
  ASSERT_EQ(got.shape(), (Shape{size, 3, 2}));
  for (std::int64_t j = 0; j < size; ++j) {
    const Tensor<float> want = random::normal_box<float>(split[j], {3, 2}, full_box({3, 2})) +
                               random::uniform_box<float>(split[j], {2}, full_box({2}), -1.f, 1.f);
    EXPECT_EQ(got[j], want) << "example " << j;
  }
  check_vmap("random draws", draw, {0}, -1, size, 0, keys);
  // the same key for every example (in_axes None) draws the same values, repeated
  const Tensor<float> same =
      vmap([&](const Tensor<float>& x, const Tensor<std::int64_t>& k) { return x + draw(k); }, {0, None})(
          random_tensor<float>({size, 3, 2}, 9) * 0.f, keys[0]);
  EXPECT_EQ(same[3], same[0]);
  shard::testing::expect_error<ShapeError>(
      [&] { (void)random::normal<float>(Tensor<std::int64_t>({3}, 1), {2}); }, {"key data", "test_vmap.cpp"});
}

SHARD_MPI_TEST(Vmap, SpmdAxisNameSplitsTheBatchOverAMeshAxis) {
  const int n = shard::testing::runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"a"});
  const std::int64_t size = 2 * n + 1;  // uneven over the mesh axis
  const Tensor<float> host = random_tensor<float>({size, 4}, 61);
  const auto xs = device_put(host, NamedSharding(mesh, P()));  // replicated on entry
  auto f = [](const ShardedArray<float>& x) { return x * 2.0f + sum(x); };
  const auto got = vmap(f, 0, 0, VmapOptions{.spmd_axis_name = "a"})(xs);
  EXPECT_EQ(got.spec(), P("a")) << got.spec().to_string();  // the batch dim stays split over 'a'
  expect_close(host_double(got), host_double(loop_reference(f, {0}, 0, size, xs)), 1e-5, "spmd_axis_name");
}

SHARD_MPI_TEST(Vmap, Errors) {
  using shard::testing::expect_error;
  const Tensor<float> a = random_tensor<float>({3, 2}, 1), b = random_tensor<float>({4, 2}, 2);
  auto add = [](const Tensor<float>& x, const Tensor<float>& y) { return x + y; };
  expect_error<ValueError>(
      [&] { (void)vmap(add)(a, b); },
      {"vmap", "different sizes", "argument 0 has size 3", "argument 1 has size 4", "test_vmap.cpp"});
  expect_error<ValueError>([&] { (void)vmap(add, {0})(a, b); },
                           {"in_axes (0,) has 1 entries", "2 arguments"});
  expect_error<ValueError>(
      [&] { (void)vmap([](const Tensor<float>& x) { return Tensor<float>(Shape{}, x.flat(0)); })(a); },
      {"batched value", "cannot be read"});
  expect_error<ValueError>([&] { (void)vmap([](const Tensor<float>& x) { return x; }, 0, None)(a); },
                           {"out_axes is None", "depends on the batch"});
  Tensor<float> escaped;
  (void)vmap([&](const Tensor<float>& x) {
    escaped = x * 2.0f;
    return x;
  })(a);
  expect_error<ValueError>([&] { (void)(escaped + 1.0f); }, {"escaped the vmapped function"});
  expect_error<ValueError>([&] { (void)vmap(add, {None, None})(a, b); }, {"no argument is mapped"});
  expect_error<ValueError>(
      [&] { (void)vmap([](const Tensor<float>& x) { return x; })(Tensor<float>(Shape{}, 1.f)); }, {"0-d"});
}

}  // namespace
