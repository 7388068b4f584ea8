// bfloat16 as an element type of both views, against float32/float64 host references computed
// from the same bfloat16 inputs: JAX's promotion, astype and printing, ops that compute in
// float32 and round once (elementwise, reductions accumulating in float32, softmax, standardize,
// gelu, products, attention), collectives that sum in float32, random draws, .npy and
// checkpoint round trips onto another mesh (float32 <-> bfloat16 on load), and gradients of a
// mixed-precision program (float32 master weights cast to bfloat16) against float64 finite
// differences. Registered twice: as built, and with SHARD_BF16_PRODUCTS=convert (the widen +
// sgemm path), where the same checks must hold.

#include <cmath>
#include <cstdlib>
#include <string>

#include "mpi_test.hpp"
#include "test_util.hpp"
#include "two_meshes.hpp"

namespace shard::testing {
namespace {

using B = bfloat16;

std::vector<Mesh> meshes() { return two_meshes(); }

/// Random bfloat16 values in [-scale, scale) (never all zeros or ones).
Tensor<B> random_bf16(const Shape& shape, std::uint64_t seed, double scale = 1.0) {
  const Tensor<double> d = random_tensor<double>(shape, seed);
  Tensor<B> out(shape);
  for (std::int64_t i = 0; i < d.size(); ++i) out.flat(i) = B(static_cast<float>(d.flat(i) * scale / 100.0));
  return out;
}

template <typename T>
Tensor<double> as_double(const Tensor<T>& x) {
  Tensor<double> out(x.shape());
  for (std::int64_t i = 0; i < x.size(); ++i)
    out.flat(i) = static_cast<double>(static_cast<float>(x.flat(i)));
  return out;
}

double max_abs(const Tensor<double>& x) {
  double m = 0;
  for (std::int64_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x.flat(i)));
  return m;
}

/// Largest |got - want| / (atol + |want|) over the elements, against rtol.
void expect_close(const Tensor<double>& got, const Tensor<double>& want, double rtol, double atol,
                  const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  for (std::int64_t i = 0; i < got.size(); ++i)
    if (!(std::abs(got.flat(i) - want.flat(i)) <= rtol * (atol + std::abs(want.flat(i))))) {
      ADD_FAILURE() << what << ": element " << i << " is " << got.flat(i) << ", expected " << want.flat(i);
      return;
    }
}

/// Every local shard of x against the box of the host reference (rtol relative to max(|want|, atol)).
void expect_shards(const ShardedArray<B>& x, const Tensor<double>& want, double rtol, double atol,
                   const std::string& what) {
  ASSERT_EQ(x.shape(), want.shape()) << what;
  for (const auto& s : x.addressable_shards()) {
    const auto ref = reference_slice(want, s.box);
    for (std::size_t i = 0; i < ref.size(); ++i) {
      const double g = static_cast<double>(static_cast<float>(s.data.flat(static_cast<std::int64_t>(i))));
      if (!(std::abs(g - ref[i]) <= rtol * (atol + std::abs(ref[i])))) {
        ADD_FAILURE() << what << ": device " << s.device << " element " << i << " is " << g << ", expected "
                      << ref[i];
        return;
      }
    }
  }
}

SHARD_MPI_TEST(Bfloat16, PromotionFollowsJax) {
  static_assert(std::is_same_v<promote_t<B, float>, float>);
  static_assert(std::is_same_v<promote_t<std::int32_t, B>, B>);
  static_assert(std::is_same_v<promote_t<B, double>, double>);
  static_assert(std::is_same_v<weak_promote_t<B, double>, B>);  // a weak scalar keeps bfloat16
  static_assert(std::is_same_v<weak_promote_t<B, int>, B>);
  static_assert(std::is_same_v<weak_promote_t<std::int32_t, B>, B>);
  static_assert(std::is_same_v<float_of_t<B>, B>);  // a bfloat16 mean is bfloat16
  const Mesh mesh = meshes().back();
  const Tensor<B> h = random_bf16({4, 6}, 1);
  const auto x = device_put(h, NamedSharding(mesh, P("a", "b")));
  const auto f = device_put(random_tensor<float>({4, 6}, 2), NamedSharding(mesh, P("a", "b")));
  static_assert(std::is_same_v<decltype(x + f), ShardedArray<float>>);
  static_assert(std::is_same_v<decltype(x * 2.5), ShardedArray<B>>);
  static_assert(std::is_same_v<decltype(x + 1), ShardedArray<B>>);
  static_assert(std::is_same_v<decltype(h + Tensor<float>({4, 6}, 1.0f)), Tensor<float>>);
  static_assert(std::is_same_v<decltype(mean(x)), ShardedArray<B>>);
  // x * 2.5: the scalar rounds to bfloat16 and each product once.
  const auto y = (x * 2.5).to_host();
  for (std::int64_t i = 0; i < h.size(); ++i) EXPECT_EQ(y.flat(i).bits, B(float(h.flat(i)) * 2.5f).bits) << i;
  const auto z = (x + f).to_host();
  const auto hf = random_tensor<float>({4, 6}, 2);
  for (std::int64_t i = 0; i < h.size(); ++i) EXPECT_EQ(z.flat(i), float(h.flat(i)) + hf.flat(i)) << i;
}

SHARD_MPI_TEST(Bfloat16, AstypeRoundsToNearestEvenAndPrints) {
  const Mesh mesh = meshes().front();
  Tensor<float> h({8});
  // 1 + 2^-8 is a tie (to 1), 1 + 3 * 2^-8 a tie (to 1 + 2^-6), a NaN, infinities, 3.4e38 (past
  // bfloat16's largest finite: rounds to infinity), a subnormal, -0.
  const float v[] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, std::nanf(""), -INFINITY,
                     3.4e38f,        0x1p-130f,          -0.0f,         3.14159f};
  for (int i = 0; i < 8; ++i) h.flat(i) = v[i];
  const auto x = device_put(h, NamedSharding(mesh, P("a")));
  const Tensor<B> b = astype<B>(x).to_host();
  const std::uint16_t want[] = {0x3f80, 0x3f82, 0x7fc0, 0xff80, 0x7f80, 0x0008, 0x8000, 0x4049};
  for (int i = 0; i < 8; ++i) {
    if (i == 2) continue;
    EXPECT_EQ(b.flat(i).bits, want[i]) << i;
  }
  EXPECT_TRUE(isnan(b.flat(2)));
  const Tensor<float> back = astype<float>(astype<B>(x)).to_host();
  EXPECT_EQ(back.flat(7), 3.140625f);
  const std::string s =
      to_string(astype<B>(device_put(Tensor<float>({3}, std::vector<float>{1.5f, -2.0f, 3.14159f}),
                                     NamedSharding(mesh, P())))
                    .to_host());
  EXPECT_NE(s.find("3.14"), std::string::npos) << s;
  EXPECT_NE(s.find("-2."), std::string::npos) << s;
}

SHARD_MPI_TEST(Bfloat16, ElementwiseAndRowOpsComputeInFloat32) {
  std::uint64_t seed = 10;
  for (const auto& mesh : meshes()) {
    const Shape shape{6, 10};  // uneven over 4 devices
    const Tensor<B> h = random_bf16(shape, seed++, 3.0);
    const Tensor<double> d = as_double(h);
    for (const auto& spec : {P("a", None), P(None, "a"), P()}) {
      const auto x = device_put(h, NamedSharding(mesh, spec));
      const std::string where = mesh.to_string() + " " + spec.to_string();
      Tensor<double> want(shape);
      for (std::int64_t i = 0; i < d.size(); ++i) want.flat(i) = std::exp(d.flat(i));
      expect_shards(exp(x), want, 8e-3, 0, "exp " + where);
      for (std::int64_t i = 0; i < d.size(); ++i) want.flat(i) = std::tanh(d.flat(i));
      expect_shards(tanh(x), want, 8e-3, 1e-3, "tanh " + where);
      for (std::int64_t i = 0; i < d.size(); ++i)
        want.flat(i) =
            0.5 * d.flat(i) *
            (1 + std::tanh(0.7978845608028654 * (d.flat(i) + 0.044715 * d.flat(i) * d.flat(i) * d.flat(i))));
      expect_shards(gelu(x), want, 8e-3, 1e-2, "gelu " + where);
      // softmax over the last dim and standardize: rows computed in float32, rounded once.
      Tensor<double> sm(shape), st(shape);
      for (std::int64_t r = 0; r < shape[0]; ++r) {
        double m = -INFINITY, s = 0, mu = 0, var = 0;
        for (std::int64_t c = 0; c < shape[1]; ++c) m = std::max(m, d.flat(r * shape[1] + c));
        for (std::int64_t c = 0; c < shape[1]; ++c) s += std::exp(d.flat(r * shape[1] + c) - m);
        for (std::int64_t c = 0; c < shape[1]; ++c)
          sm.flat(r * shape[1] + c) = std::exp(d.flat(r * shape[1] + c) - m) / s;
        for (std::int64_t c = 0; c < shape[1]; ++c)
          mu += d.flat(r * shape[1] + c) / static_cast<double>(shape[1]);
        for (std::int64_t c = 0; c < shape[1]; ++c)
          var += (d.flat(r * shape[1] + c) - mu) * (d.flat(r * shape[1] + c) - mu) /
                 static_cast<double>(shape[1]);
        for (std::int64_t c = 0; c < shape[1]; ++c)
          st.flat(r * shape[1] + c) = (d.flat(r * shape[1] + c) - mu) / std::sqrt(var + 1e-5);
      }
      // Within a few bfloat16 roundings (the sharded forms compose max, exp, sum and divide).
      expect_shards(softmax(x, -1), sm, 2e-2, 1e-2, "softmax " + where);
      expect_shards(standardize(x, -1), st, 2e-2, 1.0, "standardize " + where);
      // each op rounds once: abs(y) + 1, then the quotient
      const Tensor<B> h2 = random_bf16(shape, seed++, 2.0);
      const auto y = device_put(h2, NamedSharding(mesh, spec));
      const auto q = (x / (abs(y) + 1)).to_host();
      for (std::int64_t i = 0; i < h.size(); ++i)
        EXPECT_EQ(q.flat(i).bits, B(float(h.flat(i)) / float(B(std::abs(float(h2.flat(i))) + 1.0f))).bits)
            << where << " " << i;
    }
  }
}

SHARD_MPI_TEST(Bfloat16, ReductionsAccumulateInFloat32) {
  std::uint64_t seed = 30;
  for (const auto& mesh : meshes()) {
    // 2000 values near 1: a bfloat16 accumulator would stop at 256 (256 + 1 rounds to 256).
    Tensor<B> h({2000});
    const Tensor<double> r = random_tensor<double>({2000}, seed++);
    for (std::int64_t i = 0; i < h.size(); ++i) h.flat(i) = B(static_cast<float>(1.0 + r.flat(i) / 400.0));
    const Tensor<double> d = as_double(h);
    double total = 0, mx = -INFINITY;
    for (std::int64_t i = 0; i < d.size(); ++i) {
      total += d.flat(i);
      mx = std::max(mx, d.flat(i));
    }
    for (const auto& spec : {P("a"), P()}) {
      const auto x = device_put(h, NamedSharding(mesh, spec));
      const std::string where = mesh.to_string() + " " + spec.to_string();
      EXPECT_NEAR(float(sum(x).to_host().item()), total, total * 4e-3) << where;
      EXPECT_NEAR(float(mean(x).to_host().item()), total / 2000, 4e-3) << where;
      EXPECT_EQ(float(max(x).to_host().item()), mx) << where;
    }
    // A 2-D sum over one dim, sharded over the other and over the summed one.
    const Tensor<B> h2 = random_bf16({5, 300}, seed++, 1.0);
    const Tensor<double> d2 = as_double(h2);
    Tensor<double> want({5});
    for (std::int64_t i = 0; i < 5; ++i) {
      want.flat(i) = 0;
      for (std::int64_t j = 0; j < 300; ++j) want.flat(i) += d2.flat(i * 300 + j);
    }
    for (const auto& spec : {P(None, "a"), P("a", None)})
      expect_shards(sum(device_put(h2, NamedSharding(mesh, spec)), {1}), want, 8e-3, 1.0,
                    "sum axis 1 " + mesh.to_string() + " " + spec.to_string());
  }
}

SHARD_MPI_TEST(Bfloat16, ProductsAndAttentionMatchAFloat64Reference) {
  std::uint64_t seed = 50;
  for (const auto& mesh : meshes()) {
    const std::int64_t m = 7, k = 33, n = 9;  // uneven
    const Tensor<B> ha = random_bf16({m, k}, seed++), hb = random_bf16({k, n}, seed++);
    const Tensor<double> da = as_double(ha), db = as_double(hb);
    Tensor<double> want({m, n}), mag({m, n});
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double s = 0, a = 0;
        for (std::int64_t q = 0; q < k; ++q) {
          s += da.flat(i * k + q) * db.flat(q * n + j);
          a += std::abs(da.flat(i * k + q) * db.flat(q * n + j));
        }
        want.flat(i * n + j) = s;
        mag.flat(i * n + j) = a;
      }
    double scale = 0;
    for (std::int64_t i = 0; i < mag.size(); ++i) scale = std::max(scale, mag.flat(i));
    // The Tensor view: float32 accumulation rounded once.
    expect_close(as_double(matmul(ha, hb)), want, 8e-3, scale, "Tensor matmul");
    for (const auto& [pa, pb] : std::vector<std::pair<PartitionSpec, PartitionSpec>>{
             {P("a", None), P()}, {P(None, "a"), P("a", None)}, {P("a", "b"), P("b", None)}}) {
      const auto a = device_put(ha, NamedSharding(mesh, pa));
      const auto b = device_put(hb, NamedSharding(mesh, pb));
      expect_shards(matmul(a, b), want, 8e-3, scale,
                    "matmul " + mesh.to_string() + " " + pa.to_string() + " @ " + pb.to_string());
    }
  }
  // dot_product_attention (B, T, N, H) in bfloat16 against the float32 op on the same values,
  // and its VJP: the products run on bf16 operands (the probabilities and ds rounded to
  // bfloat16, as PyTorch's autocast does), so each result is off by at most ~2^-9 of the
  // largest operand it sums plus its own rounding: 8e-3 relative to (that largest + |want|);
  // the gradients, through ds = p (dp - rowsum(dp p)), within 1.6e-2 (measured: under 4e-3).
  // Operands in [-1, 1]: with a saturated softmax (|scores| in the hundreds) ds cancels to a
  // few ulps of p and no bfloat16 attention (nor autocast's) keeps its gradient.
  // Grouped heads (4 query heads on 2), T != S, and T past one causal block (32 rows).
  struct Case {
    std::int64_t T, S;
  };
  std::uint64_t aseed = 60;
  for (const Case c : {Case{5, 5}, Case{37, 35}})
    for (const bool causal : {false, true}) {
      const Tensor<B> q = random_bf16({2, c.T, 4, 8}, aseed++), kk = random_bf16({2, c.S, 2, 8}, aseed++),
                      v = random_bf16({2, c.S, 2, 8}, aseed++), w = random_bf16({2, c.T, 4, 8}, aseed++);
      const std::string what = std::string(causal ? "causal " : "") + "attention T " + std::to_string(c.T);
      const Tensor<float> ref =
          dot_product_attention(astype<float>(q), astype<float>(kk), astype<float>(v), causal);
      const Tensor<B> got = dot_product_attention(q, kk, v, causal);
      expect_close(as_double(got), as_double(ref), 8e-3, max_abs(as_double(v)), what);
      auto vjp = [&]<typename E>(const std::vector<Tensor<E>>& in, const Tensor<E>& wt) {
        return grad([&](const std::vector<Tensor<E>>& p) {
          return sum(astype<float>(dot_product_attention(p[0], p[1], p[2], causal) * wt));
        })(in);
      };
      const auto gb = vjp(std::vector<Tensor<B>>{q, kk, v}, w);
      const auto gf = vjp(std::vector<Tensor<float>>{astype<float>(q), astype<float>(kk), astype<float>(v)},
                          astype<float>(w));
      for (std::size_t i = 0; i < 3; ++i)
        expect_close(as_double(gb[i]), as_double(gf[i]), 1.6e-2, max_abs(as_double(gf[i])),
                     what + " gradient " + std::to_string(i));
    }
}

SHARD_MPI_TEST(Bfloat16, CollectivesSumInFloat32AndMoveTwoBytes) {
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"x"});
  const Tensor<B> h = random_bf16({n * 3, 8}, 70, 50.0);
  const auto x = device_put(h, NamedSharding(mesh, P("x", None)));
  const Tensor<double> d = as_double(h);
  // psum: each column's sum over the devices' rows, rounded once.
  const auto total =
      shard_map(mesh, P("x", None), P(None, None), [](const Tensor<B>& blk) { return psum(blk, "x"); })(x);
  Tensor<double> want({3, 8});
  for (std::int64_t r = 0; r < 3; ++r)
    for (std::int64_t c = 0; c < 8; ++c) {
      double s = 0;
      for (int dev = 0; dev < n; ++dev) s += d.flat((dev * 3 + r) * 8 + c);
      want.flat(r * 8 + c) = static_cast<double>(float(B(static_cast<float>(s))));
    }
  expect_shards(total, want, 4e-3, 1.0, "psum");
  const auto mx =
      shard_map(mesh, P("x", None), P(None, None), [](const Tensor<B>& blk) { return pmax(blk, "x"); })(x);
  for (std::int64_t r = 0; r < 3; ++r)
    for (std::int64_t c = 0; c < 8; ++c) {
      double m = -INFINITY;
      for (int dev = 0; dev < n; ++dev) m = std::max(m, d.flat((dev * 3 + r) * 8 + c));
      want.flat(r * 8 + c) = m;
    }
  expect_shards(mx, want, 0, 1.0, "pmax");
  // all_gather and ppermute move the bits: exact, 2 bytes per element.
  comm_stats().reset();
  const auto g = shard_map(mesh, P("x", None), P(None, None),
                           [](const Tensor<B>& blk) { return all_gather_invariant(blk, "x", 0, true); })(x);
  const Tensor<B> gh = g.to_host();
  for (std::int64_t i = 0; i < h.size(); ++i) EXPECT_EQ(gh.flat(i).bits, h.flat(i).bits) << i;
  if (runtime().process_count() > 1) {
    EXPECT_LE(comm_stats().get("all_gather").bytes, static_cast<std::int64_t>(h.size() * 2));
  }
  const auto shifted = shard_map(mesh, P("x", None), P("x", None), [n](const Tensor<B>& blk) {
    std::vector<std::pair<int, int>> perm;
    for (int i = 0; i < n; ++i) perm.emplace_back(i, (i + 1) % n);
    return ppermute(blk, "x", perm);
  })(x);
  const Tensor<B> sh = shifted.to_host();
  for (int dev = 0; dev < n; ++dev)
    for (std::int64_t e = 0; e < 24; ++e)
      EXPECT_EQ(sh.flat(((dev + 1) % n) * 24 + e).bits, h.flat(dev * 24 + e).bits);
}

SHARD_MPI_TEST(Bfloat16, RandomDrawsAreTheSameOnEveryMesh) {
  const random::Key key = random::key(7);
  const Shape shape{37, 11};
  std::vector<Tensor<B>> draws;
  for (const auto& mesh : meshes())
    for (const auto& spec : {P("a", None), P(None, "a"), P()}) {
      draws.push_back(random::uniform<B>(key, shape, NamedSharding(mesh, spec), B(-2.0f), B(3.0f)).to_host());
      EXPECT_EQ(draws.back().shape(), shape);
    }
  double s = 0;
  for (std::int64_t i = 0; i < draws[0].size(); ++i) {
    const float v = draws[0].flat(i);
    EXPECT_TRUE(v >= -2.0f && v < 3.0f) << v;
    s += v;
    for (const auto& d : draws) EXPECT_EQ(d.flat(i).bits, draws[0].flat(i).bits);
  }
  EXPECT_NEAR(s / static_cast<double>(draws[0].size()), 0.5, 0.25);
  const Tensor<B> z = random::normal<B>(key, Shape{4000}, NamedSharding(meshes().front(), P("a"))).to_host();
  double m = 0, v2 = 0;
  for (std::int64_t i = 0; i < z.size(); ++i) m += float(z.flat(i)) / 4000.0;
  for (std::int64_t i = 0; i < z.size(); ++i) v2 += (float(z.flat(i)) - m) * (float(z.flat(i)) - m) / 4000.0;
  EXPECT_NEAR(m, 0.0, 0.06);
  EXPECT_NEAR(std::sqrt(v2), 1.0, 0.06);
}

SHARD_MPI_TEST(Bfloat16, NpyAndCheckpointsRoundTripOntoAnotherMesh) {
  TempDir dir("shard-test-bf16-", true);
  const auto ms = meshes();
  const Tensor<B> h = random_bf16({9, 6}, 80, 40.0);
  const auto x = device_put(h, NamedSharding(ms.front(), P("a", None)));
  const std::string npy = (dir.path() / "x.npy").string();
  io::save_npy(x, npy);
  const auto y = io::load_npy<B>(npy, NamedSharding(ms.back(), P(None, "b")));
  const Tensor<B> yh = y.to_host();
  for (std::int64_t i = 0; i < h.size(); ++i) EXPECT_EQ(yh.flat(i).bits, h.flat(i).bits) << i;
  // bfloat16 and float32 load from each other's files ('<V2' as JAX writes bfloat16, '<f4'):
  // into float32 exactly, into bfloat16 rounded to nearest even; other dtypes do not.
  const Tensor<float> yf = io::load_npy<float>(npy, NamedSharding(ms.back(), P("a", None))).to_host();
  for (std::int64_t i = 0; i < h.size(); ++i) EXPECT_EQ(yf.flat(i), float(h.flat(i))) << i;
  const Tensor<float> hf4 = random_tensor<float>({7, 5}, 79);
  const std::string npy_f4 = (dir.path() / "f4.npy").string();
  io::save_npy(device_put(hf4, NamedSharding(ms.back(), P(None, "b"))), npy_f4);
  const Tensor<B> yb = io::load_npy<B>(npy_f4, NamedSharding(ms.front(), P("a", "b"))).to_host();
  for (std::int64_t i = 0; i < hf4.size(); ++i) EXPECT_EQ(yb.flat(i).bits, B(hf4.flat(i)).bits) << i;
  expect_error<IoError>([&] { (void)io::load_npy<double>(npy, NamedSharding(ms.back(), P())); },
                        {"<V2", "bfloat16"});
  expect_error<IoError>(
      [&] { (void)io::load_npy<B>((dir.path() / "missing.npy").string(), NamedSharding(ms.back(), P())); },
      {"missing.npy"});
  // A checkpoint: the manifest names bfloat16; it loads on another mesh, into float32 exactly
  // and a float32 entry into bfloat16 rounded to nearest even.
  const Tensor<float> hf = random_tensor<float>({5, 4}, 81);
  std::string path;
  {
    CheckpointWriter w((dir.path() / "ckpt").string(), 1);
    w.add("w", x);
    w.add("f", device_put(hf, NamedSharding(ms.front(), P())));
    path = w.commit(3);
  }
  const CheckpointManifest man = read_manifest(path);
  EXPECT_EQ(man.entry("w").dtype, "bfloat16");
  const Tensor<B> wb =
      load_checkpoint_array<B>(path, man, "w", NamedSharding(ms.back(), P("b", "a"))).to_host();
  for (std::int64_t i = 0; i < h.size(); ++i) EXPECT_EQ(wb.flat(i).bits, h.flat(i).bits) << i;
  const Tensor<float> wf =
      load_checkpoint_array<float>(path, man, "w", NamedSharding(ms.back(), P())).to_host();
  for (std::int64_t i = 0; i < h.size(); ++i) EXPECT_EQ(wf.flat(i), float(h.flat(i))) << i;
  const Tensor<B> fb =
      load_checkpoint_array<B>(path, man, "f", NamedSharding(ms.back(), P("a", None))).to_host();
  for (std::int64_t i = 0; i < hf.size(); ++i) EXPECT_EQ(fb.flat(i).bits, B(hf.flat(i)).bits) << i;
  expect_error<ValueError>(
      [&] { (void)load_checkpoint_array<std::int32_t>(path, man, "w", NamedSharding(ms.back(), P())); },
      {"bfloat16", "int32"});
}

SHARD_MPI_TEST(Bfloat16, MixedPrecisionGradientsMatchFloat64FiniteDifferences) {
  // loss(W1, W2) = sum(gelu(x @ bf16(W1)) @ bf16(W2)) ^ 2 / 100 in float32, the products in
  // bfloat16; the gradients reach the float32 master weights in float32 (the casts' VJPs),
  // and match the float64 program's central differences to bfloat16's precision.
  const Tensor<double> x64 = random_tensor<double>({8, 12}, 90), w1 = random_tensor<double>({12, 16}, 91),
                       w2 = random_tensor<double>({16, 4}, 92);
  auto scaled = [](const Tensor<double>& t, double s) {
    Tensor<double> out(t.shape());
    for (std::int64_t i = 0; i < t.size(); ++i) out.flat(i) = t.flat(i) * s;
    return out;
  };
  const Tensor<double> xs = scaled(x64, 0.01), w1s = scaled(w1, 0.003), w2s = scaled(w2, 0.003);
  auto loss64 = [&](const Tensor<double>& a, const Tensor<double>& b) {
    const Tensor<double> y = matmul(gelu(matmul(xs, a)), b);
    double s = 0;
    for (std::int64_t i = 0; i < y.size(); ++i) s += y.flat(i) * y.flat(i);
    return s / 100.0;
  };
  for (const auto& mesh : meshes()) {
    const auto x = device_put(astype<B>(astype<float>(xs)), NamedSharding(mesh, P("a", None)));
    const std::vector<ShardedArray<float>> params{
        device_put(astype<float>(w1s), NamedSharding(mesh, P(None, "b"))),
        device_put(astype<float>(w2s), NamedSharding(mesh, P("b", None)))};
    const auto [value, grads] = value_and_grad([&](const std::vector<ShardedArray<float>>& p) {
      const auto h = gelu(matmul(x, astype<B>(p[0])));
      const auto y = astype<float>(matmul(h, astype<B>(p[1])));
      return sum(y * y) / 100.0f;
    })(params);
    static_assert(std::is_same_v<std::decay_t<decltype(grads[0])>, ShardedArray<float>>);
    EXPECT_NEAR(value.to_host().item(), loss64(w1s, w2s), 0.03 * loss64(w1s, w2s)) << mesh.to_string();
    for (int which = 0; which < 2; ++which) {
      const Tensor<double>& w = which == 0 ? w1s : w2s;
      const Tensor<float> g = grads[which].to_host();
      double gmax = 0;
      Tensor<double> fd(w.shape());
      for (std::int64_t i = 0; i < w.size(); ++i) {
        const double eps = 1e-6;
        Tensor<double> up = w, dn = w;
        up.flat(i) += eps;
        dn.flat(i) -= eps;
        fd.flat(i) = which == 0 ? (loss64(up, w2s) - loss64(dn, w2s)) / (2 * eps)
                                : (loss64(w1s, up) - loss64(w1s, dn)) / (2 * eps);
        gmax = std::max(gmax, std::abs(fd.flat(i)));
      }
      for (std::int64_t i = 0; i < w.size(); ++i)
        ASSERT_NEAR(g.flat(i), fd.flat(i), 0.05 * gmax)
            << mesh.to_string() << " W" << which + 1 << " element " << i;
    }
  }
}

SHARD_MPI_TEST(Bfloat16, GradientsOfBfloat16ParametersSumInFloat32) {
  // Parameters held in bfloat16 (no float32 masters): a replicated W used on batch rows split
  // over 'a' gets its gradient summed over 'a' (in float32, rounded once), in shard_map and in
  // the global view.
  const std::int64_t n = runtime().device_count();
  for (const auto& mesh : meshes()) {
    const Tensor<B> hx = random_bf16({2 * n, 6}, 100), hw = random_bf16({6, 3}, 101);
    const auto x = device_put(hx, NamedSharding(mesh, P("a", None)));
    const auto w = device_put(hw, NamedSharding(mesh, P()));
    // d/dW sum(x @ W) = x^T @ ones: column sums of x, for every column of W.
    Tensor<double> want({6, 3});
    for (std::int64_t i = 0; i < 6; ++i) {
      double s = 0;
      for (std::int64_t r = 0; r < 2 * n; ++r) s += static_cast<double>(float(hx.flat(r * 6 + i)));
      for (std::int64_t j = 0; j < 3; ++j) want.flat(i * 3 + j) = s;
    }
    const auto gm = grad([&](const ShardedArray<B>& wp) {
      return shard_map(mesh, {P("a", None), P()}, P(), [](const Tensor<B>& xb, const Tensor<B>& wb) {
        return psum(astype<float>(sum(matmul(xb, wb))), "a");
      })(x, wp);
    })(w);
    static_assert(std::is_same_v<std::decay_t<decltype(gm)>, ShardedArray<B>>);
    expect_shards(gm, want, 1.6e-2, 1.0, "shard_map grad " + mesh.to_string());
    const auto gg = grad([&](const ShardedArray<B>& wp) { return astype<float>(sum(matmul(x, wp))); })(w);
    expect_shards(gg, want, 1.6e-2, 1.0, "global grad " + mesh.to_string());
  }
}

SHARD_MPI_TEST(Bfloat16, ProductsPathIsNamed) {
  const std::string path = bf16_products_path();
  const char* env = std::getenv("SHARD_BF16_PRODUCTS");
  const bool convert = env && std::string(env) == "convert";
  EXPECT_TRUE(path.find("sgemm") != std::string::npos ||
              (!convert && path.find("oneDNN") != std::string::npos))
      << path;
}

}  // namespace
}  // namespace shard::testing
