// Collectives inside shard_map (psum, pmean, pmax, pmin, all_gather, psum_scatter,
// all_to_all, ppermute, axis_index, axis_size), the array-level psum and all_gather, pmap and
// CommStats, checked on every rank against serial references computed on the host from the
// global array, on 1-D, 2-D and 3-D meshes at whatever device count the run has.

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "mpi_test.hpp"
#include "test_util.hpp"

namespace shard::testing {
namespace {

// ---------------------------------------------------------------- host references
// Naive loops over multi-indices, independent of the library's copy and collective code.

Shape unravel(std::int64_t flat, const Shape& shape) {
  Shape idx(shape.size());
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
  return idx;
}

std::int64_t ravel(const Shape& idx, const Shape& shape) {
  std::int64_t f = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + idx[d];
  return f;
}

/// A tensor of `shape` whose element at multi-index i is f(i).
template <typename T, typename F>
Tensor<T> build(const Shape& shape, F f) {
  Tensor<T> out(shape);
  for (std::int64_t k = 0; k < out.size(); ++k) out.flat(k) = f(unravel(k, shape));
  return out;
}

/// numpy.concatenate(xs, dim).
template <typename T>
Tensor<T> concat(const std::vector<Tensor<T>>& xs, int dim) {
  Shape s = xs[0].shape();
  const std::int64_t e = s[dim];
  s[dim] *= static_cast<std::int64_t>(xs.size());
  return build<T>(s, [&](Shape i) {
    const Tensor<T>& x = xs[static_cast<std::size_t>(i[dim] / e)];
    i[dim] %= e;
    return x.flat(ravel(i, x.shape()));
  });
}

/// numpy.stack(xs, dim).
template <typename T>
Tensor<T> stack_ref(const std::vector<Tensor<T>>& xs, int dim) {
  Shape s = xs[0].shape();
  s.insert(s.begin() + dim, static_cast<std::int64_t>(xs.size()));
  return build<T>(s, [&](Shape i) {
    const Tensor<T>& x = xs[static_cast<std::size_t>(i[dim])];
    i.erase(i.begin() + dim);
    return x.flat(ravel(i, x.shape()));
  });
}

/// Chunk k of n equal chunks along dim (tiled), or x[..., k, ...] with dim removed (untiled).
template <typename T>
Tensor<T> piece(const Tensor<T>& x, int dim, int n, int k, bool tiled) {
  Shape s = x.shape();
  const std::int64_t e = s[dim] / n;
  if (tiled) s[dim] = e;
  if (!tiled) s.erase(s.begin() + dim);
  return build<T>(s, [&](Shape i) {
    if (tiled) i[dim] += k * e;
    if (!tiled) i.insert(i.begin() + dim, k);
    return x.flat(ravel(i, x.shape()));
  });
}

enum class Op { kSum, kMean, kMax, kMin };

template <typename T>
Tensor<T> reduce(const std::vector<Tensor<T>>& xs, Op op) {
  Tensor<T> out = xs[0];
  for (std::size_t j = 1; j < xs.size(); ++j)
    for (std::int64_t i = 0; i < out.size(); ++i) {
      const T a = out.flat(i), b = xs[j].flat(i);
      out.flat(i) = op == Op::kMax ? std::max(a, b) : op == Op::kMin ? std::min(a, b) : static_cast<T>(a + b);
    }
  if (op == Op::kMean)
    for (auto& v : out) v = static_cast<T>(v / static_cast<T>(xs.size()));  // integers truncate
  return out;
}

// ---------------------------------------------------------------- meshes and groups

/// The meshes tested at this device count: 1-D, every 2-D factorisation (3x1 and 1x3
/// included), and two 3-D ones: the one with the fewest size-1 axes (2x2x2 with 8 devices)
/// and one with a size-1 middle axis (2x1x2 with 4 devices, 2x1x4 with 8).
std::vector<Mesh> test_meshes() {
  const int n = runtime().device_count();
  std::vector<Mesh> out{make_mesh({n}, {"a"})};
  for (const auto& f : factorisations(n, 2)) out.push_back(make_mesh(f, axis_names(2)));
  auto ones = [](const std::vector<int>& f) { return std::count(f.begin(), f.end(), 1); };
  auto f3 = factorisations(n, 3);
  std::stable_sort(f3.begin(), f3.end(), [&](const auto& x, const auto& y) { return ones(x) < ones(y); });
  out.push_back(make_mesh(f3.front(), axis_names(3)));
  std::vector<int> middle;
  for (const auto& f : f3)
    if (f[1] == 1 && f != f3.front() && (middle.empty() || (f[0] > 1 && f[2] > 1 && ones(middle) > 1)))
      middle = f;
  if (!middle.empty()) out.push_back(make_mesh(middle, axis_names(3)));
  return out;
}

/// Single axes, every ordered pair, and one permuted triple.
std::vector<Axes> axis_choices(const Mesh& mesh) {
  const auto& n = mesh.axis_names();
  std::vector<Axes> out;
  for (const auto& a : n) out.emplace_back(a);
  for (std::size_t i = 0; i < n.size(); ++i)
    for (std::size_t j = 0; j < n.size(); ++j)
      if (i != j) out.push_back(Axes{n[i], n[j]});
  if (n.size() == 3) out.push_back(Axes{n[2], n[0], n[1]});
  return out;
}

int group_size(const Mesh& mesh, const Axes& axes) {
  int s = 1;
  for (const auto& a : axes.axes()) s *= mesh.axis_size(a);
  return s;
}

/// Row-major index of `device` over `axes`, in the order given.
int index_in(const Mesh& mesh, int device, const Axes& axes) {
  const auto c = mesh.coords(device);
  int idx = 0;
  for (const auto& a : axes.axes()) idx = idx * mesh.axis_size(a) + c[mesh.axis_position(a)];
  return idx;
}

/// The devices that differ from `device` only along `axes`, in axis-index order.
std::vector<int> group_of(const Mesh& mesh, int device, const Axes& axes) {
  std::vector<int> out;
  const int n = group_size(mesh, axes);
  for (int p = 0; p < n; ++p) {
    auto c = mesh.coords(device);
    int r = p;
    for (auto it = axes.axes().rbegin(); it != axes.axes().rend(); ++it) {
      const int pos = mesh.axis_position(*it);
      c[pos] = r % mesh.shape()[pos];
      r /= mesh.shape()[pos];
    }
    out.push_back(mesh.device_at(c));
  }
  return out;
}

std::size_t slot_of(const std::vector<int>& local, int device) {
  return static_cast<std::size_t>(std::find(local.begin(), local.end(), device) - local.begin());
}

/// The global input of a mesh: one (2, 3) block per device, under a spec that uses every axis.
struct Layout {
  PartitionSpec spec;
  Shape shape;
};

Layout input_layout(const Mesh& mesh) {
  const auto& s = mesh.shape();
  const auto& n = mesh.axis_names();
  if (mesh.ndim() == 1) return {P(n[0]), {2 * s[0], 3}};
  if (mesh.ndim() == 2) return {P(n[0], n[1]), {2 * s[0], 3 * s[1]}};
  return {P(SpecEntry{n[0], n[2]}, n[1]), {2 * s[0] * s[2], 3 * s[1]}};
}

template <typename T>
Tensor<T> host_block(const Tensor<T>& host, const Mesh& mesh, const PartitionSpec& spec, int device) {
  const Box b = reference_box(mesh, spec, host.shape(), device);
  return Tensor<T>(b.extent, reference_slice(host, b));
}

/// The input of one case: a fixed function of the device's block, of any shape.
template <typename T>
Tensor<T> derive(const Tensor<T>& block, const Shape& shape, int salt) {
  Tensor<T> out(shape);
  for (std::int64_t k = 0; k < out.size(); ++k)
    out.flat(k) = static_cast<T>(block.flat((k * 5 + salt) % block.size()) + static_cast<T>(salt % 7));
  return out;
}

template <typename T>
void expect_match(const Tensor<T>& got, const Tensor<T>& ref, bool sums, const std::string& what) {
  EXPECT_EQ(to_string(got.shape()), to_string(ref.shape())) << what;
  if (got.shape() != ref.shape()) return;
  double tol = 0;
  if constexpr (is_floating_v<T>) tol = sums ? tol_for<T>(2e-3, 1e-10, 8.0) : 0.0;  // bfloat16: ulp(1000) is 8
  std::int64_t bad = 0, first = 0;
  for (std::int64_t k = 0; k < got.size(); ++k)
    if (std::abs(static_cast<double>(got.flat(k)) - static_cast<double>(ref.flat(k))) > tol && bad++ == 0) first = k;
  EXPECT_EQ(bad, 0) << what << ": first mismatch at flat index " << first << ": got "
                    << (bad ? static_cast<double>(got.flat(first)) : 0.0) << ", expected "
                    << (bad ? static_cast<double>(ref.flat(first)) : 0.0);
}

// ---------------------------------------------------------------- cases

/// One collective call: its input shape (derived from the device's block), the call, and the
/// reference from the inputs of the device's group (axis-index order) and its index there.
template <typename T>
struct Case {
  std::string what;
  Axes axes;
  Shape in_shape;
  std::function<Tensor<T>(DeviceContext&, Tensor<T>)> op;
  std::function<Tensor<T>(const std::vector<Tensor<T>>&, int)> ref;
  bool sums = false;
};

/// Runs `fn(ctx, block, out)` on every device of `mesh` (each device's block has shape (2, 3)
/// and values from `host`) and returns what each local device appended to `out`.
template <typename T, typename V, typename F>
std::vector<std::vector<V>> per_device(const Mesh& mesh, const Tensor<T>& host, F fn) {
  const Layout in = input_layout(mesh);
  const auto x = device_put(host, NamedSharding(mesh, in.spec));
  const std::vector<int> local = mesh.local_device_ids();
  std::vector<std::vector<V>> got(local.size());  // one slot per local device thread
  shard_map(mesh, in.spec, in.spec, [&](DeviceContext& ctx, const Tensor<T>& b) {
    fn(ctx, b, got[slot_of(local, ctx.device())]);
    return b;
  })(x);
  return got;
}

/// Runs every case in one shard_map over `mesh` and checks each local device's outputs.
template <typename T>
void run_cases(const Mesh& mesh, const std::vector<Case<T>>& cases, std::uint64_t seed) {
  const Layout in = input_layout(mesh);
  const Tensor<T> host = random_tensor<T>(in.shape, seed);
  const auto got =
      per_device<T, Tensor<T>>(mesh, host, [&](DeviceContext& ctx, const Tensor<T>& b, auto& out) {
        for (std::size_t k = 0; k < cases.size(); ++k)
          out.push_back(cases[k].op(ctx, derive(b, cases[k].in_shape, static_cast<int>(k))));
      });
  std::vector<Tensor<T>> blocks(static_cast<std::size_t>(runtime().device_count()));  // by device id
  for (int d : mesh.device_ids()) blocks[static_cast<std::size_t>(d)] = host_block(host, mesh, in.spec, d);
  const auto local = mesh.local_device_ids();
  for (std::size_t li = 0; li < local.size(); ++li) {
    EXPECT_EQ(got[li].size(), cases.size());
    if (got[li].size() != cases.size()) continue;
    for (std::size_t k = 0; k < cases.size(); ++k) {
      const Case<T>& c = cases[k];
      std::vector<Tensor<T>> ins;
      for (int g : group_of(mesh, local[li], c.axes))
        ins.push_back(derive(blocks[g], c.in_shape, static_cast<int>(k)));
      const std::string what = mesh.to_string() + " " + c.what + " over " + c.axes.to_string() + " on " +
                               to_string(c.in_shape) + ", device " + std::to_string(local[li]);
      expect_match(got[li][k], c.ref(ins, index_in(mesh, local[li], c.axes)), c.sums, what);
    }
  }
}

enum Kind { kPsum, kPmean, kPmax, kPmin, kAllGather, kPsumScatter, kAllToAll, kPpermute };
constexpr std::int64_t kN = -1, k2N = -2, kW = -3;  // shape placeholders: group size, twice it, width

/// One row of the case table: a collective, its input shape (with placeholders), its dims.
struct Row {
  Kind kind;
  Shape shape;
  int d1 = 0, d2 = 0;  // dim (all_gather, psum_scatter) or split_dim and concat_dim (all_to_all)
  bool tiled = false;
  int perm = 0;         // ppermute: 0 shift +1, 1 shift -1, 2 only (n-1 -> 0), 3 swap pairs, 4 empty
  bool scalar = false;  // reductions: the scalar form, ctx.psum(T x, axes)
};

// clang-format off
const std::vector<Row> kRows = {
    {kPsum, {2, kW}}, {kPsum, {}}, {kPmean, {2, kW}}, {kPmax, {2, kW}}, {kPmin, {3, 1, kW}},
    {kPsum, {}, 0, 0, false, 0, true}, {kPmean, {}, 0, 0, false, 0, true}, {kPmax, {}, 0, 0, false, 0, true},
    {kPmin, {}, 0, 0, false, 0, true},
    // all_gather: untiled dims canonicalise over rank + 1, tiled ones over rank
    {kAllGather, {2, kW}, 0}, {kAllGather, {2, kW}, 1}, {kAllGather, {2, kW}, -1}, {kAllGather, {2, kW}, -3},
    {kAllGather, {}, 0}, {kAllGather, {2, kW}, 0, 0, true}, {kAllGather, {2, kW}, -1, 0, true},
    {kAllGather, {3, 2, kW}, 1, 0, true}, {kAllGather, {0, kW}, 0, 0, true},
    {kPsumScatter, {kN, kW}, 0}, {kPsumScatter, {kW, kN}, -1}, {kPsumScatter, {2, kN, kW}, 1},
    {kPsumScatter, {k2N, kW}, 0, 0, true}, {kPsumScatter, {kW, k2N}, -1, 0, true},
    {kPsumScatter, {2, kN, kW}, -2, 0, true}, {kPsumScatter, {0, kW}, 0, 0, true},
    {kAllToAll, {kN, kW}, 0, 1}, {kAllToAll, {kW, kN}, 1, 0}, {kAllToAll, {kN, kW}, 0, 0},
    {kAllToAll, {2, kW, kN}, -1, -3}, {kAllToAll, {2, kN, kW}, 1, 2}, {kAllToAll, {k2N, kW}, 0, 1, true},
    {kAllToAll, {kW, kN}, 1, 0, true}, {kAllToAll, {kW, k2N}, -1, -1, true},
    {kAllToAll, {kN, 2, kW}, 0, 2, true}, {kAllToAll, {0, kW}, 0, 1, true},
    {kPpermute, {2, kW}, 0, 0, false, 0}, {kPpermute, {2, kW}, 0, 0, false, 1},
    {kPpermute, {}, 0, 0, false, 0}, {kPpermute, {2, kW}, 0, 0, false, 2},
    {kPpermute, {2, kW}, 0, 0, false, 3}, {kPpermute, {2, kW}, 0, 0, false, 4},
};
// clang-format on

std::vector<std::pair<int, int>> make_perm(int which, int n) {
  std::vector<std::pair<int, int>> p;
  if (which == 2) p.emplace_back(n - 1, 0);
  for (int i = 0; i < n && which < 2; ++i) p.emplace_back(i, (i + (which == 0 ? 1 : n - 1)) % n);
  for (int i = 0; which == 3 && i + 1 < n; i += 2) {
    p.emplace_back(i, i + 1);
    p.emplace_back(i + 1, i);
  }
  return p;
}

/// The op of an lvalue case: `call` gets the block as a const lvalue (all_gather, all_to_all
/// and ppermute read it where it lies); the block must come back unchanged, and the result
/// must not share its memory (the block is overwritten before the result is checked).
template <typename T, typename F>
std::function<Tensor<T>(DeviceContext&, Tensor<T>)> on_lvalue(F call, std::string what) {
  return [=](DeviceContext& ctx, Tensor<T> x) {
    const Tensor<T> before = x;
    Tensor<T> y = call(ctx, std::as_const(x));
    EXPECT_TRUE(x.shape() == before.shape() && std::equal(x.begin(), x.end(), before.begin()))
        << what << ": the lvalue input changed";
    std::fill(x.begin(), x.end(), T(7));
    return y;
  };
}

/// numpy's canonicalize_axis.
int canon(int dim, int rank) { return dim < 0 ? dim + rank : dim; }

/// The cases of the rows of the given kinds, over `ax` (size n), with width w.
template <typename T>
void add_cases(std::vector<Case<T>>& cs, std::initializer_list<Kind> kinds, const Axes& ax, int n,
               std::int64_t w = 3) {
  using In = std::vector<Tensor<T>>;
  for (const Row& r : kRows) {
    if (std::find(kinds.begin(), kinds.end(), r.kind) == kinds.end()) continue;
    Shape shape = r.shape;
    for (auto& e : shape) e = e == kN ? n : e == k2N ? 2 * n : e == kW ? w : e;
    const int rank = static_cast<int>(shape.size());
    const int d1 = r.d1, d2 = r.d2;
    const bool tiled = r.tiled;
    const std::string dims =
        "(" + std::to_string(d1) + ", " + std::to_string(d2) + (tiled ? ", tiled)" : ")");
    Case<T> c{"", ax, shape, nullptr, nullptr, false};
    std::function<Tensor<T>(DeviceContext&, Tensor<T>)> lvalue_op;
    if (r.kind <= kPmin) {
      static const char* kNames[] = {"psum", "pmean", "pmax", "pmin"};
      const Op op = static_cast<Op>(static_cast<int>(r.kind));
      c.what = std::string(kNames[static_cast<int>(r.kind)]) + (r.scalar ? " of a scalar" : "");
      if (r.scalar) {
        c.op = [=](DeviceContext& ctx, Tensor<T> x) {
          const T v = x();
          // pmean of integers is floating (checked in IntegerPmeanIsFloating); truncated here
          // to compare with the integer reference.
          return Tensor<T>(Shape{}, op == Op::kSum    ? ctx.psum(v, ax)
                                    : op == Op::kMean ? static_cast<T>(ctx.pmean(v, ax))
                                    : op == Op::kMax  ? ctx.pmax(v, ax)
                                                      : ctx.pmin(v, ax));
        };
      } else {
        c.op = [=](DeviceContext& ctx, Tensor<T> x) {
          if (op == Op::kSum) return ctx.psum(std::move(x), ax);
          if (op == Op::kMean) return astype<T>(ctx.pmean(std::move(x), ax));
          return op == Op::kMax ? ctx.pmax(std::move(x), ax) : ctx.pmin(std::move(x), ax);
        };
      }
      c.ref = [=](const In& in, int) { return reduce(in, op); };
      c.sums = true;
    } else if (r.kind == kAllGather) {
      const int d = canon(d1, tiled ? rank : rank + 1);
      c.what = "all_gather" + dims;
      c.op = [=](DeviceContext& ctx, Tensor<T> x) { return ctx.all_gather(std::move(x), ax, d1, tiled); };
      c.ref = [=](const In& in, int) { return tiled ? concat(in, d) : stack_ref(in, d); };
      lvalue_op = on_lvalue<T>([=](DeviceContext& ctx, const Tensor<T>& x) { return ctx.all_gather(x, ax, d1, tiled); },
                               c.what);
    } else if (r.kind == kPsumScatter) {
      const int d = canon(d1, rank);
      c.what = "psum_scatter" + dims;
      c.op = [=](DeviceContext& ctx, Tensor<T> x) { return ctx.psum_scatter(std::move(x), ax, d1, tiled); };
      c.ref = [=](const In& in, int j) {
        const Tensor<T> s = reduce(in, Op::kSum);
        return piece(s, d, n, j, tiled);
      };
      c.sums = true;
    } else if (r.kind == kAllToAll) {
      const int sd = canon(d1, rank), cd = canon(d2, rank);
      c.what = "all_to_all" + dims;
      c.op = [=](DeviceContext& ctx, Tensor<T> x) { return ctx.all_to_all(std::move(x), ax, d1, d2, tiled); };
      lvalue_op = on_lvalue<T>(
          [=](DeviceContext& ctx, const Tensor<T>& x) { return ctx.all_to_all(x, ax, d1, d2, tiled); }, c.what);
      c.ref = [=](const In& in, int j) {
        In pieces;  // chunk j of every source, in source order
        for (const auto& x : in) pieces.push_back(piece(x, sd, n, j, tiled));
        return tiled ? concat(pieces, cd) : stack_ref(pieces, cd);
      };
    } else {
      const auto perm = make_perm(r.perm, n);
      c.what = "ppermute #" + std::to_string(r.perm);
      c.op = [=](DeviceContext& ctx, Tensor<T> x) { return ctx.ppermute(std::move(x), ax, perm); };
      lvalue_op = on_lvalue<T>([=](DeviceContext& ctx, const Tensor<T>& x) { return ctx.ppermute(x, ax, perm); },
                               c.what);
      c.ref = [=](const In& in, int j) {
        for (const auto& [src, dst] : perm)
          if (dst == j) return in[static_cast<std::size_t>(src)];
        return Tensor<T>(in[0].shape(), T(0));  // no one sends to j
      };
    }
    if (lvalue_op) {  // the same case once more with the input passed as an lvalue
      Case<T> lc = c;
      lc.what += " of an lvalue";
      lc.op = std::move(lvalue_op);
      cs.push_back(std::move(lc));
    }
    cs.push_back(std::move(c));
  }
}

const std::initializer_list<Kind> kAllKinds = {kPsum,      kPmean,       kPmax,     kPmin,
                                               kAllGather, kPsumScatter, kAllToAll, kPpermute};

template <typename T>
class Collectives : public MpiTest {};
using Types = ::testing::Types<float, double, std::int32_t, std::int64_t, bfloat16>;
TYPED_TEST_SUITE(Collectives, Types);

/// For every mesh, one shard_map with the cases of `kinds` over every axis choice and None.
template <typename T>
void for_every_mesh(std::uint64_t seed, std::initializer_list<Kind> kinds) {
  for (const Mesh& mesh : test_meshes()) {
    std::vector<Case<T>> cases;
    auto choices = axis_choices(mesh);
    choices.emplace_back(None);
    for (const auto& ax : choices) add_cases<T>(cases, kinds, ax, group_size(mesh, ax));
    run_cases<T>(mesh, cases, seed++);
  }
}

TYPED_TEST(Collectives, PsumPmeanPmaxPmin) { for_every_mesh<TypeParam>(100, {kPsum, kPmean, kPmax, kPmin}); }
TYPED_TEST(Collectives, AllGather) { for_every_mesh<TypeParam>(200, {kAllGather}); }
TYPED_TEST(Collectives, PsumScatter) { for_every_mesh<TypeParam>(300, {kPsumScatter}); }
TYPED_TEST(Collectives, AllToAll) { for_every_mesh<TypeParam>(400, {kAllToAll}); }
TYPED_TEST(Collectives, Ppermute) { for_every_mesh<TypeParam>(500, {kPpermute}); }

// ---------------------------------------------------------------- untyped tests

// Large sums: on one node with one device per rank, blocks of 64 KiB to 1 MiB go through
// group-shared memory (collective_exec.cpp, shared_pays), larger ones and other layouts through
// MPI; the results are the same sums, and the two alternating windows keep repeated calls of
// different sizes apart.
/// group_of by mesh-order index: the indices (into mesh.device_ids()) of the devices in the
/// group over `axes` of the device at index d, in position order.
std::vector<int> group_indices(const Mesh& mesh, int d, const SpecEntry& axes) {
  const auto& ids = mesh.device_ids();
  std::vector<int> out;
  for (int dev : group_of(mesh, ids[static_cast<std::size_t>(d)], Axes(axes)))
    out.push_back(static_cast<int>(std::find(ids.begin(), ids.end(), dev) - ids.begin()));
  return out;
}

SHARD_MPI_TEST(Collectives, LargeSumsOnEveryAxis) {
  const int n = runtime().device_count();
  const auto f2 = factorisations(n, 2);
  const Mesh mesh = make_mesh(f2[f2.size() / 2], {"a", "b"});
  std::uint64_t seed = 77;
  for (const std::int64_t len : {std::int64_t{20000}, std::int64_t{9001}, std::int64_t{140001}, std::int64_t{70001}}) {
    for (const auto& axes : {SpecEntry("a"), SpecEntry("b"), SpecEntry({"a", "b"})}) {
      // Device d's block: rows d of a (devices, len) host array.
      const Tensor<double> host = random_tensor<double>({n, len}, seed++);
      const auto x = device_put(host, NamedSharding(mesh, P(SpecEntry({"a", "b"}))));
      const auto out = shard_map(mesh, P(SpecEntry({"a", "b"})), {P(SpecEntry({"a", "b"})), P(SpecEntry({"a", "b"}))},
                                 [&](const Tensor<double>& b) {
                                   return std::make_tuple(psum(b, axes), pmean(b * 2.0, axes));
                                 })(x);
      const Tensor<double> got = std::get<0>(out).to_host(), got_mean = std::get<1>(out).to_host();
      // The reference: the sum over the devices of each group (same coordinates off `axes`).
      for (int d = 0; d < n; ++d) {
        const std::vector<int> members = group_indices(mesh, d, axes);
        double worst = 0;
        for (std::int64_t i = 0; i < len; ++i) {
          double want = 0;
          for (int e : members) want += host.flat(e * len + i);
          worst = std::max(worst, std::abs(got.flat(d * len + i) - want) / std::max(1.0, std::abs(want)));
          worst = std::max(worst, std::abs(got_mean.flat(d * len + i) - 2.0 * want / members.size()) /
                                      std::max(1.0, std::abs(want)));
        }
        EXPECT_LT(worst, 1e-12) << "len " << len << " axes " << axes.to_string() << " device " << d;
      }
    }
  }
}

/// psum_scatter and all_gather over dim 0 (tiled) of blocks past and below the size at which
/// psum_scatter goes through group-shared memory (one device per rank, groups on one node), on
/// every axis of a 2-D mesh, against the host's sums and concatenations.
SHARD_MPI_TEST(Collectives, LargeScattersAndGathersOnEveryAxis) {
  const int n = runtime().device_count();
  const auto f2 = factorisations(n, 2);
  const Mesh mesh = make_mesh(f2[f2.size() / 2], {"a", "b"});
  const std::int64_t rows = 2 * n;  // divisible by every group size
  std::uint64_t seed = 91;
  for (const std::int64_t cols : {std::int64_t{3}, std::int64_t{2500}, std::int64_t{4099}}) {
    for (const auto& axes : {SpecEntry("a"), SpecEntry("b"), SpecEntry({"a", "b"})}) {
      // Device d's block: rows [d * rows, (d + 1) * rows) of a (devices * rows, cols) host array.
      const Tensor<double> host = random_tensor<double>({n * rows, cols}, seed++);
      const PartitionSpec every(SpecEntry({"a", "b"}), None);
      const auto x = device_put(host, NamedSharding(mesh, every));
      const auto out = shard_map(mesh, every, {every, every}, [&](const Tensor<double>& b) {
        return std::make_tuple(psum_scatter(b, axes, 0, true), all_gather(b, axes, 0, true));
      })(x);
      const Tensor<double> scattered = std::get<0>(out).to_host(), gathered = std::get<1>(out).to_host();
      for (int d = 0; d < n; ++d) {
        const std::vector<int> members = group_indices(mesh, d, axes);  // in position order
        const auto g = static_cast<std::int64_t>(members.size());
        const std::int64_t pos = std::find(members.begin(), members.end(), d) - members.begin();
        const std::int64_t chunk = rows / g;
        double worst = 0;
        for (std::int64_t i = 0; i < chunk; ++i)
          for (std::int64_t j = 0; j < cols; ++j) {
            double want = 0;
            for (int e : members) want += host.flat(((e * rows) + pos * chunk + i) * cols + j);
            const double got = scattered.flat(((d * chunk) + i) * cols + j);
            worst = std::max(worst, std::abs(got - want) / std::max(1.0, std::abs(want)));
          }
        EXPECT_LT(worst, 1e-12) << "psum_scatter cols " << cols << " axes " << axes.to_string() << " device " << d;
        std::int64_t wrong = 0;
        for (std::int64_t p = 0; p < g; ++p)
          for (std::int64_t i = 0; i < rows * cols; ++i)
            wrong += gathered.flat((d * g * rows + p * rows) * cols + i) != host.flat(members[p] * rows * cols + i);
        EXPECT_EQ(wrong, 0) << "all_gather cols " << cols << " axes " << axes.to_string() << " device " << d;
      }
    }
  }
}

SHARD_MPI_TEST(Collectives, AxisIndexAndAxisSize) {
  for (const Mesh& mesh : test_meshes()) {
    auto choices = axis_choices(mesh);
    choices.emplace_back(None);
    const auto got =
        per_device<double, int>(mesh, random_tensor<double>(input_layout(mesh).shape, 1),
                                [&](DeviceContext& ctx, const Tensor<double>&, std::vector<int>& out) {
                                  out.push_back(ctx.device());
                                  out.push_back(ctx.mesh() == mesh ? 1 : 0);
                                  out.push_back(static_cast<int>(ctx.psum(3.0, mesh.axis_names()[0])));
                                  for (const auto& ax : choices) {
                                    out.push_back(ctx.axis_index(ax));
                                    out.push_back(ctx.axis_size(ax));
                                  }
                                });
    const auto local = mesh.local_device_ids();
    for (std::size_t li = 0; li < local.size(); ++li) {
      EXPECT_EQ(got[li].size(), 3 + 2 * choices.size());
      if (got[li].size() != 3 + 2 * choices.size()) continue;
      EXPECT_EQ(got[li][0], local[li]);
      EXPECT_EQ(got[li][1], 1);
      EXPECT_EQ(got[li][2], 3 * mesh.shape()[0]) << mesh.to_string() << " psum(3.0, 'a')";
      for (std::size_t k = 0; k < choices.size(); ++k) {
        const int idx = index_in(mesh, local[li], choices[k]), size = group_size(mesh, choices[k]);
        const std::string what =
            mesh.to_string() + " device " + std::to_string(local[li]) + " " + choices[k].to_string();
        EXPECT_EQ(got[li][3 + 2 * k], idx) << what;
        EXPECT_EQ(got[li][4 + 2 * k], size) << what;
      }
    }
  }
}

SHARD_MPI_TEST(Collectives, RankDevicesInDifferentGroupsAndLargeBlocks) {
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh(n % 2 == 0 ? std::vector<int>{n / 2, 2} : std::vector<int>{n, 1}, {"a", "b"});
  const auto local = mesh.local_device_ids();
  if (runtime().devices_per_rank() == 2) {
    // A rank's two devices differ along the minor axis 'b' only: a collective over 'a' puts
    // them in different groups, one over 'b' in the same group.
    ASSERT_EQ(local.size(), 2u);
    EXPECT_EQ(mesh.coords(local[0])[0], mesh.coords(local[1])[0]);
    EXPECT_NE(group_of(mesh, local[0], "a"), group_of(mesh, local[1], "a"));
    EXPECT_EQ(group_of(mesh, local[0], "b"), group_of(mesh, local[1], "b"));
  }
  std::vector<Case<double>> cases;
  std::vector<Case<std::int64_t>> large;  // rows of 512 int64: past Open MPI's shared-memory eager limit
  for (const Axes& ax : {Axes("a"), Axes("b"), Axes{"b", "a"}}) {
    add_cases<double>(cases, kAllKinds, ax, group_size(mesh, ax));
    add_cases<std::int64_t>(large, {kPsum, kAllGather, kPsumScatter, kAllToAll, kPpermute}, ax,
                            group_size(mesh, ax), 512);
  }
  run_cases<double>(mesh, cases, 600);
  run_cases<std::int64_t>(mesh, large, 601);
}

SHARD_MPI_TEST(Collectives, PermutedAndPartialMeshes) {
  // Device orders make_mesh never gives: reversed, and rank-interleaved (a rank's devices sit
  // at distant positions of one group), and a mesh over some devices only (ranks sit out).
  const int n = runtime().device_count();
  const int k = runtime().devices_per_rank();
  std::vector<int> reversed, interleaved;
  for (int d = n - 1; d >= 0; --d) reversed.push_back(d);
  for (int l = 0; l < k; ++l)
    for (int r = 0; r < runtime().process_count(); ++r) interleaved.push_back(r * k + l);
  std::vector<Mesh> meshes{Mesh({n}, {"a"}, reversed), Mesh({n}, {"a"}, interleaved)};
  if (n % 2 == 0) meshes.push_back(Mesh({2, n / 2}, {"a", "b"}, interleaved));
  if (n >= 2) meshes.push_back(Mesh({n - 1}, {"a"}, std::vector<int>(reversed.begin() + 1, reversed.end())));
  std::uint64_t seed = 650;
  for (const Mesh& mesh : meshes) {
    std::vector<Case<double>> cases;
    for (const Axes& ax : axis_choices(mesh)) add_cases<double>(cases, kAllKinds, ax, group_size(mesh, ax));
    run_cases<double>(mesh, cases, seed++);
  }
}

SHARD_MPI_TEST(Collectives, ResultsThroughOutSpecs) {
  // The JAX pattern: psum over 'b' gives a result replicated along 'b' (out_spec P('a', None));
  // a tiled all_gather_invariant along dim 1 over 'b' rebuilds the rows of the global array (an
  // all_gather's result varies over 'b' as in JAX, so check_vma rejects it under P('a')).
  for (const auto& f : factorisations(runtime().device_count(), 2)) {
    const Mesh mesh = make_mesh(f, {"a", "b"});
    const Shape shape{2 * f[0], 3 * f[1]};
    const Tensor<double> host = random_tensor<double>(shape, 700 + static_cast<std::uint64_t>(f[0]));
    const auto x = device_put(host, NamedSharding(mesh, P("a", "b")));
    const auto [out0, out1] = shard_map(mesh, {P("a", "b")}, {P("a", None), P("a")}, [](const Tensor<double>& b) {
      return std::make_tuple(psum(b, "b"), all_gather_invariant(b, "b", 1, true));  // the free collectives
    })(x);
    const std::vector<ShardedArray<double>> out{out0, out1};
    const Tensor<double> sum = build<double>({shape[0], 3}, [&](const Shape& i) {
      double s = 0;
      for (std::int64_t j = 0; j < f[1]; ++j) s += host.flat(ravel({i[0], 3 * j + i[1]}, shape));
      return s;
    });
    expect_match(out[0].to_host(), sum, true, mesh.to_string() + " psum over 'b' with out_spec P('a', None)");
    EXPECT_TRUE(out[1].to_host() == host) << mesh.to_string() << " tiled all_gather with out_spec P('a')";
    EXPECT_EQ(out[0].spec(), P("a", None));
  }
}

/// Checks the spec and every local shard (box and data) of `a` against `ref(device)`.
template <typename T, typename F>
void expect_shards(const ShardedArray<T>& a, const PartitionSpec& spec, F ref, bool sums,
                   const std::string& what) {
  EXPECT_EQ(a.spec(), spec) << what << " gave " << a.spec().to_string();
  EXPECT_EQ(a.addressable_shards().size(), a.mesh().local_device_ids().size()) << what;
  for (const auto& s : a.addressable_shards()) {
    EXPECT_EQ(s.box, reference_box(a.mesh(), spec, a.shape(), s.device)) << what << " device " << s.device;
    expect_match(s.data, ref(s.device), sums, what + " device " + std::to_string(s.device));
  }
}

/// shard_map returns each device's own block under an out_spec without `axes`, so the
/// replicas along `axes` hold different partial values; shard::psum sums them.
template <typename T>
void check_array_psum(const Mesh& mesh, const Axes& axes, std::uint64_t seed) {
  const Layout in = input_layout(mesh);
  const Tensor<T> host = random_tensor<T>(in.shape, seed);
  const auto x = device_put(host, NamedSharding(mesh, in.spec));
  std::vector<std::string> rest;
  for (const auto& a : mesh.axis_names())
    if (std::find(axes.axes().begin(), axes.axes().end(), a) == axes.axes().end()) rest.push_back(a);
  const PartitionSpec out_spec{SpecEntry(rest)};
  // Unreduced on purpose (what shard::psum of an array sums): JAX's check_vma=False.
  const auto partial =
      shard_map(mesh, in.spec, out_spec, [](const Tensor<T>& b) { return b; }, {.check_vma = false})(x);
  const auto sum = psum(partial, axes);
  EXPECT_EQ(sum.shape(), partial.shape());
  const auto ref = [&](int device) {
    std::vector<Tensor<T>> parts;
    for (int g : group_of(mesh, device, axes)) parts.push_back(host_block(host, mesh, in.spec, g));
    return reduce(parts, Op::kSum);
  };
  expect_shards(sum, out_spec, ref, true, mesh.to_string() + " psum(array, " + axes.to_string() + ")");
}

SHARD_MPI_TEST(ArrayCollectives, PsumOverReplicaAxes) {
  std::uint64_t seed = 800;
  for (const Mesh& mesh : test_meshes()) {
    auto choices = axis_choices(mesh);
    choices.emplace_back(None);
    for (const auto& ax : choices) {
      check_array_psum<double>(mesh, ax, seed++);
      check_array_psum<std::int32_t>(mesh, ax, seed++);
    }
  }
}

SHARD_MPI_TEST(ArrayCollectives, AllGatherAlongOneAxis) {
  std::uint64_t seed = 900;
  for (const Mesh& mesh : test_meshes()) {
    const Layout in = input_layout(mesh);
    const Tensor<float> host = random_tensor<float>(in.shape, seed++);
    const auto& n = mesh.axis_names();
    // (axis to gather, the spec that remains), chained: each step gathers the previous result.
    std::vector<std::pair<std::string, PartitionSpec>> steps;
    if (mesh.ndim() == 1) steps = {{n[0], P(None)}};
    if (mesh.ndim() == 2) steps = {{n[1], P(n[0], None)}, {n[0], P(None, None)}};
    if (mesh.ndim() == 3) steps = {{n[2], P(n[0], n[1])}, {n[1], P(n[0], None)}, {n[0], P()}};
    ShardedArray<float> cur = device_put(host, NamedSharding(mesh, in.spec));
    for (const auto& [axis, want] : steps) {
      cur = all_gather(cur, axis);
      EXPECT_EQ(cur.shape(), host.shape());
      expect_shards(
          cur, want, [&](int device) { return host_block(host, mesh, want, device); }, false,
          mesh.to_string() + " all_gather(array, '" + axis + "') from " + in.spec.to_string());
    }
  }
}

SHARD_MPI_TEST(Collectives, IntegerPmeanIsFloating) {
  // JAX: pmean of int32 is float32 (the exact integer sum, then a true division); bool
  // pmax / pmin are a logical or / and, and a bool psum is refused on every rank.
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"p"});
  Tensor<std::int32_t> h({n});
  for (int i = 0; i < n; ++i) h.flat(i) = 3 * i + 1 - (i % 2) * 7;
  std::int64_t total = 0;
  for (int i = 0; i < n; ++i) total += h.flat(i);
  const auto x = device_put(h, NamedSharding(mesh, P("p")));
  const auto [m32, m64, any, all] = shard_map(mesh, {P("p")}, {P(), P(), P(), P()}, [](const Tensor<std::int32_t>& b) {
    const Tensor<std::int64_t> b64 = astype<std::int64_t>(b);
    return std::make_tuple(pmean(b, "p").reshaped({}), pmean(b64, "p").reshaped({}), pmax(b > 2, "p").reshaped({}),
                           pmin(b > -100, "p").reshaped({}));
  })(x);
  static_assert(std::is_same_v<decltype(m32), const ShardedArray<float>>);
  static_assert(std::is_same_v<decltype(m64), const ShardedArray<double>>);
  EXPECT_FLOAT_EQ(m32.to_host().flat(0), static_cast<float>(static_cast<double>(total) / n));
  EXPECT_DOUBLE_EQ(m64.to_host().flat(0), static_cast<double>(total) / n);
  bool want_any = false;
  for (int i = 0; i < n; ++i) want_any = want_any || h.flat(i) > 2;
  EXPECT_EQ(any.to_host().flat(0), want_any);
  EXPECT_TRUE(all.to_host().flat(0));
  expect_error<ValueError>([&] { (void)shard_map(mesh, P("p"), P(), [](const Tensor<std::int32_t>& b) {
                             return psum(b > 0, "p").reshaped({});
                           })(x); },
                           {"psum", "bool", "astype"});
}

SHARD_MPI_TEST(Collectives, AFailedCollectiveIsOneErrorPerDevice) {
  // A collective that fails for every device of a rank (a bool psum) is rethrown on each device
  // thread; each gets its own copy, so the error names one device's context once. A shared
  // exception object had both threads append to one message (two context lines, or a heap
  // corruption at 2 devices per rank).
  const int n = runtime().device_count();
  const Mesh mesh = make_mesh({n}, {"p"});
  Tensor<std::int32_t> h({n});
  for (int i = 0; i < n; ++i) h.flat(i) = 5 * i - 3;
  const auto x = device_put(h, NamedSharding(mesh, P("p")));
  for (int round = 0; round < 20; ++round) {
    try {
      (void)shard_map(mesh, P("p"), P(), [](const Tensor<std::int32_t>& b) {
        return psum(b > 0, "p").reshaped({});
      })(x);
      ADD_FAILURE() << "a bool psum must raise";
    } catch (const ValueError& e) {
      const std::string what = e.what();
      const std::string line = "in the body of the shard_map called at ";
      const auto first = what.find(line);
      ASSERT_NE(first, std::string::npos) << what;
      EXPECT_EQ(what.find(line, first + 1), std::string::npos) << "two devices' context in one error: " << what;
      EXPECT_NE(what.find("bool"), std::string::npos) << what;
    }
  }
}

SHARD_MPI_TEST(Pmap, NormalizeLikeTheJaxDocs) {
  // jax.pmap(lambda x: x / jax.lax.psum(x, 'p'), axis_name='p')(jnp.arange(n)).
  const int n = runtime().device_count();
  for (const int m : {n, n - 1}) {  // all devices, then all but the last: a rank may sit out
    if (m < 1) continue;
    Tensor<float> host({m});
    for (int i = 0; i < m; ++i) host.flat(i) = static_cast<float>(i);
    const auto out = pmap([](const Tensor<float>& x) { return x / psum(x, "p"); }, "p")(host);  // x: the 0-d x[i]
    EXPECT_EQ(out.shape(), Shape{m});
    const Tensor<float> h = out.to_host();
    ASSERT_EQ(h.size(), m);
    if (m == 1) continue;                                     // 0 / 0
    const float total = static_cast<float>(m * (m - 1) / 2);  // 28 with 8 devices
    for (int i = 0; i < m; ++i)
      EXPECT_FLOAT_EQ(h.flat(i), static_cast<float>(i) / total) << "element " << i << " of " << m;
  }
}

SHARD_MPI_TEST(CommStats, PsumRecordsOneCallPerGroupThatSpansRanksAndCountsTheOthersInProcess) {
  const int n = runtime().device_count();
  const int k = runtime().devices_per_rank();
  const Topology& topo = runtime().topology();
  // make_mesh({n/k, k}): axis 'b' holds one rank's devices, 'a' runs across ranks.
  for (const Mesh& mesh : {make_mesh({n}, {"a"}), make_mesh({n / k, k}, {"a", "b"})})
    for (const auto& axis : mesh.axis_names()) {
      const Layout in = input_layout(mesh);
      const auto x = device_put(random_tensor<double>(in.shape, 1000), NamedSharding(mesh, in.spec));
      int expected_calls = 0;  // local groups whose devices live on two or more ranks
      std::int64_t in_process = 0, in_process_devices = 0;  // groups inside this rank (no MPI)
      std::vector<std::vector<int>> seen;
      for (int d : mesh.local_device_ids()) {
        const auto g = group_of(mesh, d, axis);
        if (std::find(seen.begin(), seen.end(), g) != seen.end()) continue;
        seen.push_back(g);
        if (std::any_of(g.begin(), g.end(), [&](int e) { return topo.owner(e) != topo.owner(d); })) {
          ++expected_calls;
        } else {
          ++in_process;
          in_process_devices += static_cast<std::int64_t>(g.size());
        }
      }
      comm_stats().reset();
      shard_map(mesh, in.spec, in.spec, [&](DeviceContext& ctx, const Tensor<double>& b) { return ctx.psum(b, axis); })(x);
      const CommRecord r = comm_stats().get("psum", "'" + axis + "'");
      const std::string what = mesh.to_string() + " psum over '" + axis + "'";
      EXPECT_EQ(r.calls, expected_calls) << what << "\n" << comm_stats().to_string();
      EXPECT_EQ(r.bytes, expected_calls * 2 * 3 * static_cast<std::int64_t>(sizeof(double))) << what;
      EXPECT_EQ(comm_stats().get("psum").calls, expected_calls) << what;
      // The groups inside this rank are counted apart: one call each, their blocks moved in memory.
      EXPECT_EQ(r.in_process_calls, in_process) << what << "\n" << comm_stats().to_string();
      EXPECT_EQ(r.in_process_bytes, in_process_devices * 2 * 3 * static_cast<std::int64_t>(sizeof(double))) << what;
      // Over the minor axis the groups stay inside one rank; over a 1-D mesh one group spans all.
      const bool minor = mesh.ndim() == 2 && axis == "b", one = mesh.ndim() == 1;
      EXPECT_EQ(r.calls, minor ? 0 : one ? std::min(runtime().process_count() - 1, 1) : r.calls) << what;
    }
}

}  // namespace
}  // namespace shard::testing
