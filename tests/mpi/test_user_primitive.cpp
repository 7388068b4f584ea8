// A primitive registered from outside the library, in one place (core/primitive.hpp): its
// kernel, factor-form sharding rule and VJP in one struct, bound with shard::bind in both views.
// Checked against serial host references on every rank, on random specs of the 1-3-axis
// meshes with uneven shapes, its gradients against central finite differences of the host
// formula, inside a differentiated shard_map body, and its errors (naming this file's line).

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "mpi_test.hpp"
#include "shard/shard.hpp"
#include "test_util.hpp"

namespace user {

using shard::ArrayLike;
using shard::Dtype;
using shard::KernelVjp;
using shard::Tensor;

/// hypot(a, b) = sqrt(a^2 + b^2), elementwise with numpy broadcasting.
struct Hypot : shard::Primitive {
  const char* name() const { return "hypot"; }
  static const shard::FactorRule& rule() {
    static const shard::FactorRule r("...,...->...");
    return r;
  }
  template <Dtype T>
  Tensor<T> kernel(const Tensor<T>& a, const Tensor<T>& b) const {
    Tensor<T> out(shard::broadcast_shapes(a.shape(), b.shape()));
    const Tensor<T> ab = shard::broadcast_to(a, out.shape()), bb = shard::broadcast_to(b, out.shape());
    for (std::int64_t i = 0; i < out.size(); ++i) out.flat(i) = std::hypot(ab.flat(i), bb.flat(i));
    return out;
  }
  template <ArrayLike X>
  KernelVjp<X, X> vjp(const shard::VjpNeed&, const X& out, const X& a, const X& b) const {
    return [a = a, b = b, out = out](const X& ct, const shard::VjpNeed& need) {
      shard::Cotangents<X> r(2);
      const X q = ct / out;
      if (need[0]) r[0] = shard::sum_to_shape(q * a, a.shape());
      if (need[1]) r[1] = shard::sum_to_shape(q * b, b.shape());
      return r;
    };
  }
};

/// The sum of squares along the last axis: "...j->..." (j is reduced: each device sums its
/// block, one psum over the axes that split j closes it).
struct RowSumSquares : shard::Primitive {
  const char* name() const { return "row_sum_squares"; }
  static const shard::FactorRule& rule() {
    static const shard::FactorRule r("...j->...");
    return r;
  }
  template <Dtype T>
  Tensor<T> kernel(const Tensor<T>& x) const {
    shard::Shape s = x.shape();
    const std::int64_t n = s.back();
    s.pop_back();
    Tensor<T> out(s, T(0));
    for (std::int64_t i = 0; i < out.size(); ++i)
      for (std::int64_t j = 0; j < n; ++j) out.flat(i) += x.flat(i * n + j) * x.flat(i * n + j);
    return out;
  }
  template <ArrayLike X>
  KernelVjp<X, X> vjp(const shard::VjpNeed&, const X&, const X& x) const {
    return [x = x](const X& ct, const shard::VjpNeed&) {
      shard::Shape s = ct.shape();
      s.push_back(1);
      return shard::cotangents<X>(shard::reshape(ct, s) * x * 2.0);
    };
  }
};

/// No vjp(): differentiating it raises.
struct Cube : shard::Primitive {
  const char* name() const { return "cube"; }
  static const shard::FactorRule& rule() {
    static const shard::FactorRule r("...->...");
    return r;
  }
  template <Dtype T>
  Tensor<T> kernel(const Tensor<T>& x) const {
    Tensor<T> out(x.shape());
    for (std::int64_t i = 0; i < x.size(); ++i) out.flat(i) = x.flat(i) * x.flat(i) * x.flat(i);
    return out;
  }
};

}  // namespace user

namespace shard::testing {
namespace {

using HT = Tensor<double>;
using SA = ShardedArray<double>;

/// A relative tolerance: the random values run to a few hundred.
double tol(double v, double rel = 1e-12) { return rel * (1 + std::abs(v)); }

double host_row_ss(const HT& x, std::int64_t i) {
  const std::int64_t n = x.shape().back();
  double s = 0;
  for (std::int64_t j = 0; j < n; ++j) s += x.flat(i * n + j) * x.flat(i * n + j);
  return s;
}

SHARD_MPI_TEST(UserPrimitive, TensorViewValuesAndGradients) {
  const HT a = random_tensor<double>({5, 3}, 11), b = random_tensor<double>({3}, 12);
  const HT h = bind(user::Hypot{}, a, b);
  ASSERT_EQ(h.shape(), (Shape{5, 3}));
  for (std::int64_t i = 0; i < 5; ++i)
    for (std::int64_t j = 0; j < 3; ++j)
      EXPECT_NEAR(h.flat(i * 3 + j), std::hypot(a.flat(i * 3 + j), b.flat(j)),
                  tol(std::hypot(a.flat(i * 3 + j), b.flat(j)), 1e-14));
  const HT w = random_tensor<double>({5, 3}, 13);
  const auto f = [&](const std::vector<HT>& p) { return sum(bind(user::Hypot{}, p[0], p[1]) * w); };
  const auto g = grad(f)(std::vector<HT>{a, b});
  // Central finite differences of the host formula.
  auto host = [&](const HT& aa, const HT& bb) {
    double s = 0;
    for (std::int64_t i = 0; i < 5; ++i)
      for (std::int64_t j = 0; j < 3; ++j)
        s += std::hypot(aa.flat(i * 3 + j), bb.flat(j)) * w.flat(i * 3 + j);
    return s;
  };
  const double eps = 1e-6;
  for (std::int64_t k = 0; k < a.size(); ++k) {
    HT ap = a, am = a;
    ap.flat(k) += eps;
    am.flat(k) -= eps;
    EXPECT_NEAR(g[0].flat(k), (host(ap, b) - host(am, b)) / (2 * eps), 1e-6 * (1 + std::abs(g[0].flat(k))))
        << k;
  }
  for (std::int64_t k = 0; k < b.size(); ++k) {
    HT bp = b, bm = b;
    bp.flat(k) += eps;
    bm.flat(k) -= eps;
    EXPECT_NEAR(g[1].flat(k), (host(a, bp) - host(a, bm)) / (2 * eps), 1e-6 * (1 + std::abs(g[1].flat(k))))
        << k;
  }
  const HT x = random_tensor<double>({4, 7}, 14);
  const HT r = bind(user::RowSumSquares{}, x);
  ASSERT_EQ(r.shape(), (Shape{4}));
  for (std::int64_t i = 0; i < 4; ++i)
    EXPECT_NEAR(r.flat(i), host_row_ss(x, i), tol(host_row_ss(x, i), 1e-13));
  const HT v = random_tensor<double>({4}, 15);
  const HT gx = grad([&](const HT& p) { return sum(bind(user::RowSumSquares{}, p) * v); })(x);
  for (std::int64_t i = 0; i < 4; ++i)
    for (std::int64_t j = 0; j < 7; ++j)
      EXPECT_NEAR(gx.flat(i * 7 + j), 2 * x.flat(i * 7 + j) * v.flat(i),
                  tol(2 * x.flat(i * 7 + j) * v.flat(i), 1e-13));
}

SHARD_MPI_TEST(UserPrimitive, GlobalViewOnRandomSpecsEqualsTheHost) {
  std::mt19937_64 rng(21);
  const HT ha = random_tensor<double>({7, 5}, 22), hb = random_tensor<double>({7, 5}, 23);
  const HT hw = random_tensor<double>({7}, 24);
  for (const Mesh& mesh : abc_meshes(runtime().device_count())) {
    std::vector<PartitionSpec> specs;  // a's: a fixed-seed sample, every spec in the slow tier
    for (int trial = 0; trial < 3; ++trial) specs.push_back(random_spec(mesh, 2, rng));
    for (const auto& spec : specs_or_all(mesh, 2, specs)) {
      const NamedSharding sa(mesh, spec), sb(mesh, random_spec(mesh, 2, rng));
      const std::string what =
          sa.spec().to_string() + " " + sb.spec().to_string() + " on " + mesh.to_string();
      const SA a = device_put(ha, sa), b = device_put(hb, sb);
      const SA h = bind(user::Hypot{}, a, b);
      EXPECT_EQ(h.sharding(), a.sharding()) << what;  // the first committed operand decides
      const HT got = h.to_host();
      for (std::int64_t i = 0; i < ha.size(); ++i)
        EXPECT_NEAR(got.flat(i), std::hypot(ha.flat(i), hb.flat(i)),
                    tol(std::hypot(ha.flat(i), hb.flat(i)), 1e-14))
            << what;
      // The reduced factor: a psum over the axes that split the last dim, the rows stay split.
      const SA r = bind(user::RowSumSquares{}, a);
      EXPECT_EQ(r.sharding().spec()[0], a.sharding().spec()[0]) << what;
      const HT rh = r.to_host();
      for (std::int64_t i = 0; i < 7; ++i)
        EXPECT_NEAR(rh.flat(i), host_row_ss(ha, i), tol(host_row_ss(ha, i), 1e-13)) << what;
      // Gradients through both, in the global view.
      const SA w = device_put(hw, NamedSharding(mesh, random_spec(mesh, 1, rng)));
      const auto g = grad([&](const std::vector<SA>& p) {
        return sum(bind(user::RowSumSquares{}, bind(user::Hypot{}, p[0], p[1])) * w);
      })(std::vector<SA>{a, b});
      EXPECT_EQ(g[0].sharding(), a.sharding()) << what;
      const HT ga = g[0].to_host(), gb = g[1].to_host();
      for (std::int64_t i = 0; i < 7; ++i)
        for (std::int64_t j = 0; j < 5; ++j) {
          const std::int64_t k = i * 5 + j;
          const double hy = std::hypot(ha.flat(k), hb.flat(k));
          EXPECT_NEAR(ga.flat(k), 2 * hy * hw.flat(i) * ha.flat(k) / hy,
                      tol(2 * hy * hw.flat(i) * ha.flat(k) / hy, 1e-12))
              << what;
          EXPECT_NEAR(gb.flat(k), 2 * hy * hw.flat(i) * hb.flat(k) / hy,
                      tol(2 * hy * hw.flat(i) * hb.flat(k) / hy, 1e-12))
              << what;
        }
    }
  }
}

SHARD_MPI_TEST(UserPrimitive, InsideADifferentiatedShardMap) {
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"d"});
  const HT hx = random_tensor<double>({2 * static_cast<std::int64_t>(n), 3}, 31);
  const HT hy = random_tensor<double>({3}, 32);
  // Rows split over 'd' (shard_map wants them even, as JAX does; the global view's test has
  // the uneven shapes), y invariant: the body's result varies over 'd' and must be psummed
  // before it is returned under P().
  const SA x = device_put(hx, NamedSharding(mesh, P("d")));
  const SA y = device_put(hy, NamedSharding(mesh, P()));
  const auto loss = [&](const std::vector<SA>& p) {
    return sum(shard_map(mesh, {P("d"), P()}, {P()}, [&](const HT& xb, const HT& yb) {
      return psum(sum(bind(user::RowSumSquares{}, bind(user::Hypot{}, xb, yb))), "d");
    })(p[0], p[1]));
  };
  const auto g = grad(loss)(std::vector<SA>{x, y});
  const HT gx = g[0].to_host(), gy = g[1].to_host();
  std::vector<double> host_gy(3, 0.0);
  for (std::int64_t i = 0; i < hx.shape()[0]; ++i)
    for (std::int64_t j = 0; j < 3; ++j) {
      EXPECT_NEAR(gx.flat(i * 3 + j), 2 * hx.flat(i * 3 + j), tol(2 * hx.flat(i * 3 + j), 1e-12));
      host_gy[j] += 2 * hy.flat(j);
    }
  for (std::int64_t j = 0; j < 3; ++j) EXPECT_NEAR(gy.flat(j), host_gy[j], tol(host_gy[j], 1e-10));
  // Without the psum the body's output varies over 'd': the forward vma check raises.
  EXPECT_THROW(shard_map(mesh, {P("d"), P()}, {P()},
                         [&](const HT& xb, const HT& yb) {
                           return sum(bind(user::RowSumSquares{}, bind(user::Hypot{}, xb, yb)));
                         })(x, y),
               ValueError);
}

SHARD_MPI_TEST(UserPrimitive, ErrorsNameTheCallersLine) {
  const HT a = random_tensor<double>({3, 2}, 41), b = random_tensor<double>({4}, 42);
  const int line0 = __LINE__ + 2;
  try {
    (void)bind(user::RowSumSquares{}, HT(Shape{}, 1.0));
    ADD_FAILURE() << "a 0-d operand of '...j->...' should raise";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("row_sum_squares: "), std::string::npos) << e.what();
    EXPECT_NE(
        std::string(e.what()).find("test_user_primitive.cpp:" + std::to_string(line0) + ", in shard::bind"),
        std::string::npos)
        << e.what();
  }
  const Mesh mesh = make_mesh({runtime().device_count()}, {"d"});
  const int line1 = __LINE__ + 2;
  try {
    (void)bind(user::Hypot{}, device_put(a, NamedSharding(mesh, P())),
               device_put(b, NamedSharding(mesh, P())));
    ADD_FAILURE() << "shapes (3, 2) and (4,) do not broadcast";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("hypot: "), std::string::npos) << e.what();
    EXPECT_NE(
        std::string(e.what()).find("test_user_primitive.cpp:" + std::to_string(line1) + ", in shard::bind"),
        std::string::npos)
        << e.what();
  }
  // No vjp(): it runs, and differentiating it raises (JAX: no differentiation rule).
  const HT c = bind(user::Cube{}, a);
  for (std::int64_t i = 0; i < a.size(); ++i)
    EXPECT_NEAR(c.flat(i), a.flat(i) * a.flat(i) * a.flat(i), tol(a.flat(i) * a.flat(i) * a.flat(i), 1e-14));
  EXPECT_THROW(grad([](const HT& p) { return sum(bind(user::Cube{}, p)); })(a), ValueError);
  // A malformed rule.
  EXPECT_THROW(FactorRule("ij,jk->iz"), ValueError);
  EXPECT_THROW(FactorRule("ij"), ValueError);
}

}  // namespace
}  // namespace shard::testing
