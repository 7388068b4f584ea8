// Elementwise ops, reductions and transpose on ShardedArrays. Every op works block by block
// on this rank's shards; the only communication is the reshard that lines a second operand
// up with the first (binary ops) and one collective per reduction.

#include "shard/ops.hpp"

#include <algorithm>
#include <cmath>
#include <array>
#include <limits>
#include <optional>

#include "shard/detail/collective.hpp"
#include "shard/error.hpp"

namespace shard {

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  const std::size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const std::int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1)
      raise<ShapeError>("shapes ", to_string(a), " and ", to_string(b), " do not broadcast (dim ", i, ": ", da,
                        " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

namespace {

/// The sharding an operand of `shape` needs so that each device's block lines up with its
/// block of a result sharded as `out` with shape `out_shape`.
NamedSharding matching_sharding(const NamedSharding& out, const Shape& out_shape, const Shape& shape) {
  const std::size_t lead = out_shape.size() - shape.size();
  std::vector<SpecEntry> entries;
  for (std::size_t k = 0; k < shape.size(); ++k) {
    const bool broadcast = shape[k] != out_shape[k + lead];
    entries.push_back(broadcast ? SpecEntry() : out.spec()[static_cast<int>(k + lead)]);
  }
  return NamedSharding(out.mesh(), PartitionSpec(std::move(entries)));
}

/// The result sharding of an op over operands of these shapes (the rule in ops.hpp).
NamedSharding result_sharding(const NamedSharding& sa, const Shape& a, const NamedSharding& sb, const Shape& b,
                              const Shape& out) {
  if (a == out) return sa;
  if (b == out) return sb;
  // Neither has the full shape: a's entries on the dims where a is not broadcast.
  std::vector<SpecEntry> entries(out.size());
  const std::size_t lead = out.size() - a.size();
  for (std::size_t k = 0; k < a.size(); ++k)
    if (a[k] == out[k + lead]) entries[k + lead] = sa.spec()[static_cast<int>(k)];
  return NamedSharding(sa.mesh(), PartitionSpec(std::move(entries)));
}

/// x itself when it already has sharding `want` (no copy), else its reshard, kept in `keep`.
template <typename T>
const ShardedArray<T>& lined_up(const ShardedArray<T>& x, const NamedSharding& want,
                                std::optional<ShardedArray<T>>& keep) {
  if (x.sharding() == want) return x;
  return keep.emplace(reshard(x, want));
}

/// Row-major strides of an operand block seen from the result block: 0 on broadcast or
/// missing dims.
Shape broadcast_strides(const Shape& block, const Shape& out_block) {
  Shape st(out_block.size(), 0);
  const Shape own = strides_of(block);
  const std::size_t lead = out_block.size() - block.size();
  for (std::size_t k = 0; k < block.size(); ++k)
    if (block[k] != 1 || out_block[k + lead] == 1) st[k + lead] = own[k];
  return st;
}

/// Calls f(out_index, {operand offsets}) row by row over an out block; `rows` gives, for
/// each operand, its strides. The innermost dim is a tight loop with per-operand steps.
template <std::size_t N, typename F>
void for_each_row(const Shape& out, const std::array<Shape, N>& strides, F&& f) {
  const int rank = static_cast<int>(out.size());
  const std::int64_t total = num_elements(out);
  if (total == 0) return;
  if (rank == 0) {
    std::array<std::int64_t, N> off{};
    std::array<std::int64_t, N> step{};
    f(0, off, step, 1);
    return;
  }
  const std::int64_t inner = out[rank - 1];
  std::array<std::int64_t, N> step{};
  for (std::size_t k = 0; k < N; ++k) step[k] = strides[k][rank - 1];
  Shape idx(static_cast<std::size_t>(rank), 0);
  for (std::int64_t o = 0; o < total; o += inner) {
    std::array<std::int64_t, N> off{};
    for (std::size_t k = 0; k < N; ++k)
      for (int d = 0; d < rank - 1; ++d) off[k] += idx[d] * strides[k][d];
    f(o, off, step, inner);
    for (int d = rank - 2; d >= 0; --d) {
      if (++idx[d] < out[d]) break;
      idx[d] = 0;
    }
  }
}

template <typename T, typename R, typename F>
ShardedArray<R> zip(const ShardedArray<T>& a, const ShardedArray<T>& b, F&& f, const char* what) {
  detail::check_same_mesh(a.mesh(), b.mesh(), what);
  const Shape out_shape = broadcast_shapes(a.shape(), b.shape());
  const NamedSharding out = result_sharding(a.sharding(), a.shape(), b.sharding(), b.shape(), out_shape);
  std::optional<ShardedArray<T>> keep_a, keep_b;
  const ShardedArray<T>& la = lined_up(a, matching_sharding(out, out_shape, a.shape()), keep_a);
  const ShardedArray<T>& lb = lined_up(b, matching_sharding(out, out_shape, b.shape()), keep_b);
  std::vector<Shard<R>> shards;
  for (std::size_t i = 0; i < la.addressable_shards().size(); ++i) {
    const auto& sa = la.addressable_shards()[i];
    const auto& sb = lb.addressable_shards()[i];
    const Box box = out.box(sa.device, out_shape);
    Tensor<R> res(box.extent);
    const T* pa = sa.data.data();
    const T* pb = sb.data.data();
    R* po = res.data();
    if (sa.data.shape() == box.extent && sb.data.shape() == box.extent) {
      for (std::int64_t k = 0; k < res.size(); ++k) po[k] = f(pa[k], pb[k]);
    } else {
      const std::array<Shape, 2> st{broadcast_strides(sa.data.shape(), box.extent),
                                    broadcast_strides(sb.data.shape(), box.extent)};
      for_each_row<2>(box.extent, st, [&](std::int64_t o, auto off, auto step, std::int64_t n) {
        for (std::int64_t k = 0; k < n; ++k) po[o + k] = f(pa[off[0] + k * step[0]], pb[off[1] + k * step[1]]);
      });
    }
    shards.push_back(Shard<R>{sa.device, box, std::move(res)});
  }
  return ShardedArray<R>(out_shape, out, std::move(shards));
}

template <typename T, typename F>
auto with_binary_op(BinaryOp op, F&& go) {
  switch (op) {
    case BinaryOp::kAdd: return go([](T x, T y) { return static_cast<T>(x + y); });
    case BinaryOp::kSub: return go([](T x, T y) { return static_cast<T>(x - y); });
    case BinaryOp::kMul: return go([](T x, T y) { return static_cast<T>(x * y); });
    case BinaryOp::kDiv: return go([](T x, T y) { return static_cast<T>(x / y); });
    case BinaryOp::kMax: return go([](T x, T y) { return x > y ? x : y; });
    default: return go([](T x, T y) { return x < y ? x : y; });
  }
}

template <typename T, typename F>
auto with_compare_op(CompareOp op, F&& go) {
  using R = std::int32_t;
  switch (op) {
    case CompareOp::kLess: return go([](T x, T y) { return R(x < y); });
    case CompareOp::kLessEqual: return go([](T x, T y) { return R(x <= y); });
    case CompareOp::kGreater: return go([](T x, T y) { return R(x > y); });
    case CompareOp::kGreaterEqual: return go([](T x, T y) { return R(x >= y); });
    case CompareOp::kEqual: return go([](T x, T y) { return R(x == y); });
    default: return go([](T x, T y) { return R(x != y); });
  }
}

/// A 0-d replicated array holding `v` on a's mesh (for scalar operands).
template <typename T>
ShardedArray<T> scalar_like(const ShardedArray<T>& a, T v) {
  return full<T>(Shape{}, v, NamedSharding(a.mesh(), PartitionSpec()));
}

}  // namespace

template <typename T>
ShardedArray<T> binary(const ShardedArray<T>& a, const ShardedArray<T>& b, BinaryOp op) {
  return with_binary_op<T>(op, [&](auto f) { return zip<T, T>(a, b, f, "binary op"); });
}

template <typename T>
ShardedArray<T> binary(const ShardedArray<T>& a, T scalar, BinaryOp op, bool scalar_first) {
  const ShardedArray<T> s = scalar_like(a, scalar);
  return scalar_first ? binary(s, a, op) : binary(a, s, op);
}

namespace {


/// z = alpha * x + y over n contiguous elements: one read of x and y, one write of z.
template <typename T>
void axpy_contiguous(std::int64_t n, T alpha, const T* __restrict x, const T* __restrict y, T* __restrict z) {
  for (std::int64_t k = 0; k < n; ++k) z[k] = static_cast<T>(alpha * x[k] + y[k]);
}

}  // namespace

template <typename T>
ShardedArray<T> axpy(T alpha, const ShardedArray<T>& x, const ShardedArray<T>& y) {
  detail::check_same_mesh(x.mesh(), y.mesh(), "axpy");
  const Shape out_shape = broadcast_shapes(x.shape(), y.shape());
  const NamedSharding out = result_sharding(x.sharding(), x.shape(), y.sharding(), y.shape(), out_shape);
  std::optional<ShardedArray<T>> keep_x, keep_y;
  const ShardedArray<T>& lx = lined_up(x, matching_sharding(out, out_shape, x.shape()), keep_x);
  const ShardedArray<T>& ly = lined_up(y, matching_sharding(out, out_shape, y.shape()), keep_y);
  std::vector<Shard<T>> shards;
  for (std::size_t i = 0; i < lx.addressable_shards().size(); ++i) {
    const auto& sx = lx.addressable_shards()[i];
    const auto& sy = ly.addressable_shards()[i];
    const Box box = out.box(sx.device, out_shape);
    Tensor<T> res(box.extent);
    const T* px = sx.data.data();
    const T* py = sy.data.data();
    T* pz = res.data();
    if (sx.data.shape() == box.extent && sy.data.shape() == box.extent) {
      axpy_contiguous(res.size(), alpha, px, py, pz);
    } else {
      const std::array<Shape, 2> st{broadcast_strides(sx.data.shape(), box.extent),
                                    broadcast_strides(sy.data.shape(), box.extent)};
      for_each_row<2>(box.extent, st, [&](std::int64_t o, auto off, auto step, std::int64_t n) {
        for (std::int64_t k = 0; k < n; ++k)
          pz[o + k] = static_cast<T>(alpha * px[off[0] + k * step[0]] + py[off[1] + k * step[1]]);
      });
    }
    shards.push_back(Shard<T>{sx.device, box, std::move(res)});
  }
  return ShardedArray<T>(out_shape, out, std::move(shards));
}

template <typename T>
ShardedArray<std::int32_t> compare(const ShardedArray<T>& a, const ShardedArray<T>& b, CompareOp op) {
  return with_compare_op<T>(op, [&](auto f) { return zip<T, std::int32_t>(a, b, f, "comparison"); });
}

template <typename T>
ShardedArray<std::int32_t> compare(const ShardedArray<T>& a, T scalar, CompareOp op) {
  return compare(a, scalar_like(a, scalar), op);
}

template <typename T>
ShardedArray<T> where(const ShardedArray<std::int32_t>& cond, const ShardedArray<T>& a, const ShardedArray<T>& b) {
  detail::check_same_mesh(a.mesh(), b.mesh(), "where");
  detail::check_same_mesh(cond.mesh(), a.mesh(), "where");
  const Shape out_shape = broadcast_shapes(cond.shape(), broadcast_shapes(a.shape(), b.shape()));
  // The result follows a, else b, else the condition (the first with the full shape); when
  // none has it, a's entries on the dims where a is not broadcast.
  const NamedSharding out = a.shape() == out_shape || b.shape() != out_shape
                                ? result_sharding(a.sharding(), a.shape(), cond.sharding(), cond.shape(), out_shape)
                                : b.sharding();
  std::optional<ShardedArray<std::int32_t>> keep_c;
  std::optional<ShardedArray<T>> keep_a, keep_b;
  const auto& c = lined_up(cond, matching_sharding(out, out_shape, cond.shape()), keep_c);
  const auto& la = lined_up(a, matching_sharding(out, out_shape, a.shape()), keep_a);
  const auto& lb = lined_up(b, matching_sharding(out, out_shape, b.shape()), keep_b);
  std::vector<Shard<T>> shards;
  for (std::size_t i = 0; i < la.addressable_shards().size(); ++i) {
    const int device = la.addressable_shards()[i].device;
    const Box box = out.box(device, out_shape);
    const auto& sc = c.addressable_shards()[i].data;
    const auto& sa = la.addressable_shards()[i].data;
    const auto& sb = lb.addressable_shards()[i].data;
    Tensor<T> res(box.extent);
    const std::array<Shape, 3> st{broadcast_strides(sc.shape(), box.extent), broadcast_strides(sa.shape(), box.extent),
                                  broadcast_strides(sb.shape(), box.extent)};
    for_each_row<3>(box.extent, st, [&](std::int64_t o, auto off, auto step, std::int64_t n) {
      for (std::int64_t k = 0; k < n; ++k)
        res[o + k] = sc[off[0] + k * step[0]] ? sa[off[1] + k * step[1]] : sb[off[2] + k * step[2]];
    });
    shards.push_back(Shard<T>{device, box, std::move(res)});
  }
  return ShardedArray<T>(out_shape, out, std::move(shards));
}

template <typename T>
ShardedArray<T> unary(const ShardedArray<T>& a, UnaryOp op) {
  auto apply = [&](auto f) { return map(a, f); };
  switch (op) {
    case UnaryOp::kExp: return apply([](T x) { return static_cast<T>(std::exp(x)); });
    case UnaryOp::kLog: return apply([](T x) { return static_cast<T>(std::log(x)); });
    case UnaryOp::kSin: return apply([](T x) { return static_cast<T>(std::sin(x)); });
    case UnaryOp::kCos: return apply([](T x) { return static_cast<T>(std::cos(x)); });
    case UnaryOp::kTanh: return apply([](T x) { return static_cast<T>(std::tanh(x)); });
    case UnaryOp::kRelu: return apply([](T x) { return x > T(0) ? x : T(0); });
    case UnaryOp::kSqrt: return apply([](T x) { return static_cast<T>(std::sqrt(x)); });
    case UnaryOp::kAbs: return apply([](T x) { return x < T(0) ? static_cast<T>(-x) : x; });
    case UnaryOp::kSquare: return apply([](T x) { return static_cast<T>(x * x); });
    default: return apply([](T x) { return static_cast<T>(-x); });
  }
}

// ---------------------------------------------------------------- reductions

namespace {

std::vector<int> canonical_dims(std::vector<int> dims, int rank, const char* what) {
  if (dims.empty())
    for (int d = 0; d < rank; ++d) dims.push_back(d);
  for (auto& d : dims) {
    if (d < -rank || d >= rank)
      raise<ShapeError>(what, ": dim ", d, " is out of range for an array of rank ", rank);
    if (d < 0) d += rank;
  }
  std::sort(dims.begin(), dims.end());
  if (std::adjacent_find(dims.begin(), dims.end()) != dims.end())
    raise<ShapeError>(what, ": a dim is listed twice");
  return dims;
}

/// Reduces a block over `reduced` dims with `f` starting from `init`.
template <typename T, typename F>
Tensor<T> reduce_block(const Tensor<T>& x, const std::vector<bool>& reduced, T init, F&& f) {
  Shape out_shape;
  for (int d = 0; d < x.rank(); ++d)
    if (!reduced[d]) out_shape.push_back(x.shape()[d]);
  Tensor<T> out(out_shape, init);
  Shape ostr(x.shape().size(), 0);  // stride of each input dim in the output
  const Shape os = strides_of(out_shape);
  for (int d = 0, k = 0; d < x.rank(); ++d)
    if (!reduced[d]) ostr[d] = os[k++];
  const std::array<Shape, 1> st{ostr};
  T* o = out.data();
  const T* in = x.data();
  for_each_row<1>(x.shape(), st, [&](std::int64_t i, auto off, auto step, std::int64_t n) {
    for (std::int64_t k = 0; k < n; ++k) o[off[0] + k * step[0]] = f(o[off[0] + k * step[0]], in[i + k]);
  });
  return out;
}

/// The mesh axes that split any of `dims`, as an axes entry in mesh order.
SpecEntry axes_of_dims(const NamedSharding& s, const std::vector<int>& dims) {
  std::vector<std::string> names;
  for (const auto& n : s.mesh().axis_names())
    for (int d : dims)
      for (const auto& a : s.spec()[d].axes())
        if (a == n) names.push_back(n);
  return SpecEntry(names);
}

NamedSharding without_dims(const NamedSharding& s, const std::vector<bool>& reduced) {
  std::vector<SpecEntry> entries;
  for (std::size_t d = 0; d < reduced.size(); ++d)
    if (!reduced[d]) entries.push_back(s.spec()[static_cast<int>(d)]);
  return NamedSharding(s.mesh(), PartitionSpec(std::move(entries)));
}

template <typename T>
std::vector<int> local_devices(const ShardedArray<T>& a) {
  std::vector<int> out;
  for (const auto& s : a.addressable_shards()) out.push_back(s.device);
  return out;
}

/// Combines per-device partial results over `axes` into an array sharded as `out`.
template <typename T>
ShardedArray<T> combine_over(const std::vector<int>& devices, std::vector<Tensor<T>> partial, const SpecEntry& axes,
                             detail::ReduceOp op, const NamedSharding& out, const Shape& out_shape) {
  std::vector<Tensor<T>> outs;
  detail::CollectiveSpec spec = detail::reduce_spec(out.mesh(), op, axes, out.shard_shape(out_shape));
  spec.dtype = dtype_name<T>();
  detail::execute_collective<T>(out.mesh(), spec, devices, partial, outs);
  std::vector<Shard<T>> shards;
  for (std::size_t i = 0; i < devices.size(); ++i)
    shards.push_back(Shard<T>{devices[i], out.box(devices[i], out_shape), std::move(outs[i])});
  return ShardedArray<T>(out_shape, out, std::move(shards));
}

}  // namespace

template <typename T>
ShardedArray<T> reduce(const ShardedArray<T>& a, ReduceKind kind, std::vector<int> dims_in) {
  const int rank = a.ndim();
  const auto dims = canonical_dims(std::move(dims_in), rank, "reduce");
  std::vector<bool> reduced(static_cast<std::size_t>(rank), false);
  Shape out_shape;
  std::int64_t count = 1;
  for (int d : dims) {
    reduced[d] = true;
    count *= a.shape()[d];
  }
  for (int d = 0; d < rank; ++d)
    if (!reduced[d]) out_shape.push_back(a.shape()[d]);
  const NamedSharding out = without_dims(a.sharding(), reduced);
  const bool is_max = kind == ReduceKind::kMax, is_min = kind == ReduceKind::kMin;
  const T init = is_max   ? std::numeric_limits<T>::lowest()
                 : is_min ? std::numeric_limits<T>::max()
                          : T(0);
  std::vector<Tensor<T>> partial;
  for (const auto& s : a.addressable_shards()) {
    if (is_max) partial.push_back(reduce_block(s.data, reduced, init, [](T x, T y) { return y > x ? y : x; }));
    else if (is_min) partial.push_back(reduce_block(s.data, reduced, init, [](T x, T y) { return y < x ? y : x; }));
    else partial.push_back(reduce_block(s.data, reduced, init, [](T x, T y) { return static_cast<T>(x + y); }));
  }
  const detail::ReduceOp op = is_max ? detail::ReduceOp::kMax : is_min ? detail::ReduceOp::kMin : detail::ReduceOp::kSum;
  ShardedArray<T> r = combine_over(local_devices(a), std::move(partial), axes_of_dims(a.sharding(), dims), op, out, out_shape);
  if (kind == ReduceKind::kMean)
    for (auto& s : r.addressable_shards())
      for (auto& v : s.data) v = static_cast<T>(v / static_cast<T>(count > 0 ? count : 1));
  return r;
}

template <typename T>
ShardedArray<std::int64_t> argmax(const ShardedArray<T>& a, int dim) {
  const int rank = a.ndim();
  const int d = canonical_dims({dim}, rank, "argmax")[0];
  std::vector<bool> reduced(static_cast<std::size_t>(rank), false);
  reduced[d] = true;
  Shape out_shape;
  for (int k = 0; k < rank; ++k)
    if (k != d) out_shape.push_back(a.shape()[k]);
  const NamedSharding out = without_dims(a.sharding(), reduced);
  const SpecEntry axes = axes_of_dims(a.sharding(), {d});
  // 1. The global maximum of each line along d.
  std::vector<Tensor<T>> partial;
  for (const auto& s : a.addressable_shards())
    partial.push_back(reduce_block(s.data, reduced, std::numeric_limits<T>::lowest(),
                                   [](T x, T y) { return y > x ? y : x; }));
  const ShardedArray<T> best =
      combine_over(local_devices(a), std::move(partial), axes, detail::ReduceOp::kMax, out, out_shape);
  // 2. The smallest global index along d where a line reaches it.
  constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::max();
  std::vector<Tensor<std::int64_t>> index;
  for (std::size_t i = 0; i < a.addressable_shards().size(); ++i) {
    const auto& s = a.addressable_shards()[i];
    const Tensor<T>& m = best.addressable_shards()[i].data;
    Tensor<std::int64_t> idx(m.shape(), kNone);
    const Shape& sh = s.data.shape();
    const Shape st = strides_of(sh);
    Shape ostr(sh.size(), 0);
    const Shape os = strides_of(m.shape());
    for (int k = 0, j = 0; k < rank; ++k)
      if (k != d) ostr[k] = os[j++];
    Shape pos(sh.size(), 0);
    for (std::int64_t e = 0; e < s.data.size(); ++e) {
      std::int64_t o = 0;
      for (int k = 0; k < rank; ++k) o += pos[k] * ostr[k];
      if (s.data[e] == m[o]) idx[o] = std::min(idx[o], s.box.offset[d] + pos[d]);
      for (int k = rank - 1; k >= 0; --k) {
        if (++pos[k] < sh[k]) break;
        pos[k] = 0;
      }
    }
    index.push_back(std::move(idx));
  }
  return combine_over(local_devices(a), std::move(index), axes, detail::ReduceOp::kMin, out, out_shape);
}

template <typename T>
ShardedArray<T> transpose(const ShardedArray<T>& a, std::vector<int> perm) {
  const int rank = a.ndim();
  if (perm.empty())
    for (int k = rank - 1; k >= 0; --k) perm.push_back(k);
  std::vector<int> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  for (int k = 0; k < std::max(rank, static_cast<int>(sorted.size())); ++k)
    if (static_cast<int>(sorted.size()) != rank || sorted[k] != k)
      raise<ShapeError>("transpose: the permutation does not permute the ", rank, " dims of ", to_string(a.shape()));
  Shape out_shape;
  std::vector<SpecEntry> entries;
  for (int p : perm) {
    out_shape.push_back(a.shape()[p]);
    entries.push_back(a.spec()[p]);
  }
  const NamedSharding out(a.mesh(), PartitionSpec(std::move(entries)));
  std::vector<Shard<T>> shards;
  for (const auto& s : a.addressable_shards()) {
    const Box box = out.box(s.device, out_shape);
    Tensor<T> res(box.extent);
    const Shape in_st = strides_of(s.data.shape());
    Shape st(static_cast<std::size_t>(rank));
    for (int k = 0; k < rank; ++k) st[k] = in_st[perm[k]];
    const std::array<Shape, 1> strides{st};
    const T* in = s.data.data();
    for_each_row<1>(box.extent, strides, [&](std::int64_t o, auto off, auto step, std::int64_t n) {
      for (std::int64_t k = 0; k < n; ++k) res[o + k] = in[off[0] + k * step[0]];
    });
    shards.push_back(Shard<T>{s.device, box, std::move(res)});
  }
  return ShardedArray<T>(out_shape, out, std::move(shards));
}

#define SHARD_INSTANTIATE_OPS(T)                                                                               \
  template ShardedArray<T> binary<T>(const ShardedArray<T>&, const ShardedArray<T>&, BinaryOp);               \
  template ShardedArray<T> binary<T>(const ShardedArray<T>&, T, BinaryOp, bool);                              \
  template ShardedArray<T> axpy<T>(T, const ShardedArray<T>&, const ShardedArray<T>&);                        \
  template ShardedArray<T> unary<T>(const ShardedArray<T>&, UnaryOp);                                         \
  template ShardedArray<std::int32_t> compare<T>(const ShardedArray<T>&, const ShardedArray<T>&, CompareOp);  \
  template ShardedArray<std::int32_t> compare<T>(const ShardedArray<T>&, T, CompareOp);                       \
  template ShardedArray<T> where<T>(const ShardedArray<std::int32_t>&, const ShardedArray<T>&,                \
                                    const ShardedArray<T>&);                                                  \
  template ShardedArray<T> reduce<T>(const ShardedArray<T>&, ReduceKind, std::vector<int>);                   \
  template ShardedArray<std::int64_t> argmax<T>(const ShardedArray<T>&, int);                                 \
  template ShardedArray<T> transpose<T>(const ShardedArray<T>&, std::vector<int>);
SHARD_INSTANTIATE_OPS(float)
SHARD_INSTANTIATE_OPS(double)
SHARD_INSTANTIATE_OPS(std::int32_t)
SHARD_INSTANTIATE_OPS(std::int64_t)

}  // namespace shard
