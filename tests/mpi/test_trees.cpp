// Parameter trees (shard/core/tree.hpp, JAX's pytrees) through every call that takes
// "the parameters": tree_map / paths / leaves on nested vectors, maps, tuples and SHARD_TREE
// structs with static data; grad and value_and_grad of a struct of layers against the Tensor
// view's gradients of the same program on the host (the serial reference); grad's argnums
// against hand-derived host gradients, each keeping its argument's sharding; the optimizers'
// init / update on a struct tree against the same update on a flat vector of its leaves;
// checkpoints of a tree (and the optimizer state) resumed on another mesh; device_put of a
// tree; and structure mismatches raising ValueError naming the path, on every rank.

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "mpi_test.hpp"
#include "test_util.hpp"
#include "two_meshes.hpp"

namespace model {

using shard::ShardedArray;
using shard::Tensor;

/// A struct of layers, as a user writes a model: registered in one line each.
template <typename A>
struct Layer {
  A w, b;
};
using SLayer = Layer<ShardedArray<double>>;
using HLayer = Layer<Tensor<double>>;
SHARD_TREE(SLayer, w, b)
SHARD_TREE(HLayer, w, b)

template <typename A>
struct Model {
  std::vector<Layer<A>> layers;
  std::map<std::string, A> head;  // {"out"}
  int hidden;                     // static data: copied, never a leaf
};
using SModel = Model<ShardedArray<double>>;
using HModel = Model<Tensor<double>>;
SHARD_TREE(SModel, layers, head, hidden)
SHARD_TREE(HModel, layers, head, hidden)

/// The model's loss on a batch x (rows): tanh layers, then a linear head, mean square.
template <typename A>
auto loss(const Model<A>& m, const A& x) {
  A h = x;
  for (const auto& l : m.layers) h = tanh(matmul(h, l.w) + l.b);
  const A out = matmul(h, m.head.at("out"));
  return mean(out * out);
}

}  // namespace model

namespace shard::testing {
namespace {

constexpr int kIn = 6, kHidden = 5, kRows = 8;

std::vector<Mesh> meshes() { return two_meshes(); }

Tensor<double> small(const Shape& s, std::uint64_t seed) { return random_tensor<double>(s, seed) * 0.01; }

model::HModel host_model(std::uint64_t seed) {
  model::HModel m;
  m.layers.push_back({small({kIn, kHidden}, seed + 1), small({kHidden}, seed + 2)});
  m.layers.push_back({small({kHidden, kHidden}, seed + 3), small({kHidden}, seed + 4)});
  m.head.emplace("out", small({kHidden, 2}, seed + 5));
  m.hidden = kHidden;
  return m;
}

/// The host model placed on `mesh` with random specs (uneven shards included).
model::SModel place(const model::HModel& h, const Mesh& mesh, std::mt19937_64& rng) {
  auto put = [&](const Tensor<double>& t) {
    return device_put(t, NamedSharding(mesh, random_spec(mesh, t.ndim(), rng)));
  };
  model::SModel m;
  for (const auto& l : h.layers) m.layers.push_back({put(l.w), put(l.b)});
  m.head.emplace("out", put(h.head.at("out")));
  m.hidden = h.hidden;
  return m;
}

double max_diff(const Tensor<double>& a, const Tensor<double>& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double m = 0;
  for (std::int64_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a.flat(i) - b.flat(i)));
  return m;
}

SHARD_MPI_TEST(Trees, MapPathsLeavesAndStructure) {
  const model::HModel h = host_model(10);
  EXPECT_EQ(tree_num_leaves(h), 5u);
  const std::vector<std::string> want = {".layers[0].w", ".layers[0].b", ".layers[1].w", ".layers[1].b",
                                         ".head['out']"};
  EXPECT_EQ(tree_paths(h), want);
  // tree_map keeps the structure and the static data; several trees at once.
  const model::HModel twice = tree_map([](const auto& x) { return x * 2.0; }, h);
  EXPECT_EQ(twice.hidden, kHidden);
  const model::HModel sum = tree_map([](const auto& a, const auto& b) { return a + b; }, h, twice);
  const auto leaves = tree_leaves<Tensor<double>>(h), sums = tree_leaves<Tensor<double>>(sum);
  ASSERT_EQ(leaves.size(), 5u);
  for (std::size_t i = 0; i < leaves.size(); ++i)
    EXPECT_LT(max_diff(sums[i], leaves[i] * 3.0), 1e-15) << want[i];
  // Containers and tuples may change their leaves' type.
  const auto tup = std::make_tuple(h.layers[0].w, std::pair<Tensor<double>, int>{h.layers[0].b, 4},
                                   std::vector<Tensor<double>>{h.head.at("out")});
  const auto f32 = tree_map([](const auto& x) { return astype<float>(x); }, tup);
  static_assert(std::is_same_v<tree_leaf_t<decltype(f32)>, Tensor<float>>);
  EXPECT_EQ(std::get<1>(f32).second, 4);
  EXPECT_EQ(tree_paths(f32), (std::vector<std::string>{"[0]", "[1][0]", "[2][0]"}));
  // Containers without an array inside (std::vector<bool> and its proxy references, a map of
  // ints, a pair of ints) are static data: copied, never walked.
  const auto mixed = std::make_tuple(h.layers[0].w, std::vector<bool>{true, false, true},
                                     std::map<std::string, int>{{"k", 7}}, std::pair<int, int>{1, 2});
  EXPECT_EQ(tree_num_leaves(mixed), 1u);
  EXPECT_EQ(tree_paths(mixed), (std::vector<std::string>{"[0]"}));
  const auto mixed2 = tree_map([](const auto& x) { return x * 2.0; }, mixed);
  EXPECT_EQ(std::get<1>(mixed2), (std::vector<bool>{true, false, true}));
  EXPECT_EQ(std::get<2>(mixed2).at("k"), 7);
  EXPECT_LT(max_diff(std::get<0>(mixed2), h.layers[0].w * 2.0), 1e-15);
  auto other = mixed;
  std::get<1>(other).push_back(false);  // static data may differ between trees visited together
  tree_check_same_structure(mixed, other);
  // device_put of a tree: a map of host Tensors becomes a map of ShardedArrays.
  const Mesh mesh = meshes().back();
  const std::map<std::string, Tensor<double>> hm = {{"w", h.layers[0].w}, {"b", h.layers[0].b}};
  const auto placed = device_put(hm, NamedSharding(mesh, P("a")));
  EXPECT_EQ(placed.at("w").spec(), P("a"));
  EXPECT_EQ(max_diff(placed.at("w").to_host(), hm.at("w")), 0.0);
  // Structure mismatches name the place, on every rank.
  model::HModel short_model = h;
  short_model.layers.pop_back();
  expect_error<ValueError>([&] { tree_check_same_structure(h, short_model); },
                           {".layers", "2 elements", "1"});
  model::HModel renamed = h;
  renamed.head.clear();
  renamed.head.emplace("logits", h.head.at("out"));
  expect_error<ValueError>([&] { (void)tree_map([](const auto& a, const auto&) { return a; }, h, renamed); },
                           {".head", "'out'"});
}

SHARD_MPI_TEST(Trees, GradOfAStructOfLayersMatchesTheHostView) {
  const model::HModel h = host_model(20);
  const Tensor<double> hx = random_tensor<double>({kRows, kIn}, 29) * 0.02;
  // The serial reference: the Tensor view's gradients of the same program.
  const auto [hv, hg] = value_and_grad([&](const model::HModel& m) { return model::loss(m, hx); })(h);
  EXPECT_EQ(hg.hidden, kHidden);
  std::mt19937_64 rng(21);
  for (const Mesh& mesh : meshes()) {
    const model::SModel m = place(h, mesh, rng);
    const auto x = device_put(hx, NamedSharding(mesh, P("a", None)));
    const auto [v, g] = value_and_grad([&](const model::SModel& p) { return model::loss(p, x); })(m);
    EXPECT_NEAR(v.item(), hv.item(), 1e-14) << mesh.to_string();
    // Each gradient has its parameter's sharding and the host view's values.
    tree_for_each_with_path(
        [&](const TreePath& path, const auto& gs, const auto& ps, const auto& gh) {
          EXPECT_EQ(gs.sharding(), ps.sharding()) << path.to_string();
          EXPECT_LT(max_diff(gs.to_host(), gh), 1e-13) << path.to_string() << " on " << mesh.to_string();
        },
        g, m, hg);
    EXPECT_EQ(g.hidden, kHidden);
    // vjp takes trees too.
    const auto [out, fn] = vjp([&](const model::SModel& p) { return model::loss(p, x); }, m);
    const auto [g2] = fn(device_put(Tensor<double>(Shape{}, 1.0), NamedSharding(mesh, P())));
    EXPECT_LT(max_diff(g2.layers[1].w.to_host(), hg.layers[1].w), 1e-13);
  }
}

SHARD_MPI_TEST(Trees, ArgnumsDifferentiatesSeveralArgumentsEachKeepingItsSharding) {
  // f(W, x, b) = sum((x W + b)^2): dW = x^T r, dx = r W^T, db = sum over rows of r, r = 2 (x W + b).
  const Tensor<double> hw = random_tensor<double>({kIn, 3}, 31) * 0.01,
                       hx = random_tensor<double>({kRows, kIn}, 32) * 0.01,
                       hb = random_tensor<double>({3}, 33) * 0.01;
  Tensor<double> r({kRows, 3}), dw({kIn, 3}, 0.0), dx({kRows, kIn}, 0.0), db({3}, 0.0);
  for (int i = 0; i < kRows; ++i)
    for (int j = 0; j < 3; ++j) {
      double s = hb.flat(j);
      for (int k = 0; k < kIn; ++k) s += hx.flat(i * kIn + k) * hw.flat(k * 3 + j);
      r.flat(i * 3 + j) = 2 * s;
    }
  for (int i = 0; i < kRows; ++i)
    for (int j = 0; j < 3; ++j) {
      db.flat(j) += r.flat(i * 3 + j);
      for (int k = 0; k < kIn; ++k) {
        dw.flat(k * 3 + j) += hx.flat(i * kIn + k) * r.flat(i * 3 + j);
        dx.flat(i * kIn + k) += r.flat(i * 3 + j) * hw.flat(k * 3 + j);
      }
    }
  for (const Mesh& mesh : meshes()) {
    const auto w = device_put(hw, NamedSharding(mesh, P(None, "b")));
    const auto x = device_put(hx, NamedSharding(mesh, P("a", None)));
    const auto b = device_put(hb, NamedSharding(mesh, P()));
    auto f = [](const auto& w_, const auto& x_, const auto& b_) {
      const auto y = matmul(x_, w_) + b_;
      return sum(y * y);
    };
    const auto [gw, gb] = grad(f, argnums<0, 2>)(w, x, b);
    EXPECT_EQ(gw.sharding(), w.sharding());
    EXPECT_EQ(gb.sharding(), b.sharding());
    EXPECT_LT(max_diff(gw.to_host(), dw), 1e-14) << mesh.to_string();
    EXPECT_LT(max_diff(gb.to_host(), db), 1e-14) << mesh.to_string();
    // One index: that argument's gradient alone; with the value.
    const auto [value, gx] = value_and_grad(f, argnums<1>)(w, x, b);
    EXPECT_EQ(gx.sharding(), x.sharding());
    EXPECT_LT(max_diff(gx.to_host(), dx), 1e-14) << mesh.to_string();
    double want = 0;
    for (std::int64_t i = 0; i < r.size(); ++i) want += r.flat(i) * r.flat(i) / 4;
    EXPECT_NEAR(value.item(), want, 1e-14);
    // A tree argument among plain ones, with has_aux.
    const std::map<std::string, ShardedArray<double>> params = {{"w", w}, {"b", b}};
    const auto [gp, aux] = grad(
        [&](const auto& x_, const auto& p) {
          const auto y = f(p.at("w"), x_, p.at("b"));
          return std::make_pair(y, 7);
        },
        has_aux, argnums<1>)(x, params);
    EXPECT_EQ(aux, 7);
    EXPECT_LT(max_diff(gp.at("w").to_host(), dw), 1e-14);
    EXPECT_LT(max_diff(gp.at("b").to_host(), db), 1e-14);
  }
}

SHARD_MPI_TEST(Trees, OptimizersUpdateATreeAsTheFlatListOfItsLeaves) {
  const model::HModel h = host_model(40);
  const Tensor<double> hx = random_tensor<double>({kRows, kIn}, 49) * 0.02;
  std::mt19937_64 rng(41);
  const Mesh mesh = meshes().back();
  model::SModel tree = place(h, mesh, rng);
  std::vector<ShardedArray<double>> flat;
  for (const auto& leaf : tree_leaves<ShardedArray<double>>(tree)) flat.push_back(leaf);  // deep copies
  const auto x = device_put(hx, NamedSharding(mesh, P("a", None)));
  const auto opt = optim::adamw(1e-2).clip_by_global_norm(1.0);
  auto st_tree = opt.init(tree);
  auto st_flat = opt.init(flat);
  for (int step = 0; step < 3; ++step) {
    const auto g_tree = grad([&](const model::SModel& p) { return model::loss(p, x); })(tree);
    // The same gradients as a flat list: the flat parameters equal the tree's leaves.
    const auto g_flat = grad([&](const std::vector<ShardedArray<double>>& p) {
      model::SModel m{{{p[0], p[1]}, {p[2], p[3]}}, {{"out", p[4]}}, kHidden};
      return model::loss(m, x);
    })(flat);
    opt.update(tree, g_tree, st_tree);
    opt.update(flat, g_flat, st_flat);
  }
  const auto leaves = tree_leaves<ShardedArray<double>>(tree);
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    EXPECT_EQ(leaves[i].sharding(), flat[i].sharding());
    EXPECT_LT(max_diff(leaves[i].to_host(), flat[i].to_host()), 1e-15) << tree_paths(tree)[i];
  }
  EXPECT_EQ(tree.hidden, kHidden);
  // A single array is a tree too.
  auto one = device_put(h.layers[0].w, NamedSharding(mesh, P("a")));
  auto st_one = opt.init(one);
  const Tensor<double> before = one.to_host();
  opt.update(one, device_put(Tensor<double>(h.layers[0].w.shape(), 0.5), NamedSharding(mesh, P())), st_one);
  EXPECT_GT(max_diff(one.to_host(), before), 1e-3);
  // Gradients of another structure: ValueError naming the place.
  model::SModel other = tree;
  other.layers.pop_back();
  expect_error<ValueError>([&] { opt.update(tree, other, st_tree); }, {".layers"});
}

SHARD_MPI_TEST(Trees, CheckpointsOfATreeResumeOnAnotherMesh) {
  TempDir dir("shard-test-trees-", true);
  const model::HModel h = host_model(60);
  std::mt19937_64 rng(61);
  const auto ms = meshes();
  const model::SModel saved = place(h, ms.front(), rng);
  const auto opt = optim::adam(1e-3);
  auto state = opt.init(saved);
  model::SModel stepped = saved;
  const auto x = device_put(random_tensor<double>({kRows, kIn}, 69) * 0.02, NamedSharding(ms.front(), P()));
  opt.update(stepped, grad([&](const model::SModel& p) { return model::loss(p, x); })(stepped), state);
  std::string path;
  {
    CheckpointWriter w((dir.path() / "ckpt").string(), 1);
    w.add_tree("params", stepped);
    state.save(w);
    path = w.commit(1);
  }
  const CheckpointManifest man = read_manifest(path);
  EXPECT_NO_THROW((void)man.entry("params.layers.1.w"));
  EXPECT_NO_THROW((void)man.entry("params.head.out"));
  // Resume on the other mesh with other specs: `like` is the model initialised there.
  const model::SModel like = place(host_model(70), ms.back(), rng);
  const model::SModel loaded = load_checkpoint_tree(path, man, "params", like);
  EXPECT_EQ(loaded.hidden, kHidden);
  tree_for_each_with_path(
      [&](const TreePath& p, const auto& got, const auto& want, const auto& l) {
        EXPECT_EQ(got.sharding(), l.sharding()) << p.to_string();
        EXPECT_EQ(max_diff(got.to_host(), want.to_host()), 0.0) << p.to_string();
      },
      loaded, stepped, like);
  auto resumed = opt.init(like);
  resumed.load(path, man);
  EXPECT_EQ(resumed.step.item(), 1);
  // A tree whose shapes differ from the checkpoint's: ShapeError naming the array.
  model::SModel wrong = like;
  wrong.layers[0].b = device_put(Tensor<double>(Shape{kHidden + 1}, 0.0), NamedSharding(ms.back(), P()));
  expect_error<ShapeError>([&] { (void)load_checkpoint_tree(path, man, "params", wrong); },
                           {"params.layers.0.b"});
}

}  // namespace
}  // namespace shard::testing
