// Reductions of the local op set. The reduced dims are coalesced into runs, and each run is
// reduced as an [outer, n, inner] view of the array, innermost run first:
//   inner == 1   contiguous: sums pairwise (numpy's blocks of 128 with 8 accumulators,
//                halves recursively above), max/min/prod with 8 independent lanes;
//   inner  > 1   by rows: sums pairwise over blocks of 64 rows, the others row by row;
// vectorised over the contiguous elements either way. Sums of float32 accumulate in float64,
// so a float32 sum of millions of values is exact to float32's rounding.
// Prefix sums (cumsum) run along one dim of the same [outer, n, inner] view, a running sum
// per line (float64 for floating types), vectorised over `inner`.

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "core/tensor_kernels.hpp"
#include "shard/core/tensor_ops.hpp"
#include "shard/core/trace.hpp"
#include "shard/error.hpp"

namespace shard {

namespace {

/// The accumulator type of a reduction of T.
template <typename T>
using acc_t = std::conditional_t<is_floating_v<T>, double,
                                 std::conditional_t<std::is_same_v<T, bool>, bool, std::int64_t>>;

template <typename T>
T lowest() {
  if constexpr (std::is_same_v<T, bool>)
    return false;
  else if constexpr (is_floating_v<T>)
    return -std::numeric_limits<T>::infinity();
  else
    return std::numeric_limits<T>::lowest();
}
template <typename T>
T highest() {
  if constexpr (std::is_same_v<T, bool>)
    return true;
  else if constexpr (is_floating_v<T>)
    return std::numeric_limits<T>::infinity();
  else
    return std::numeric_limits<T>::max();
}

/// The combining step of each kind on an accumulator type A (nan propagates through max/min).
template <typename A>
struct Combine {
  static A sum(A x, A y) {
    if constexpr (std::is_same_v<A, bool>)
      return x || y;
    else
      return detail::add_wrap(x, y);  // integers wrap
  }
  static A prod(A x, A y) {
    if constexpr (std::is_same_v<A, bool>)
      return x && y;
    else
      return detail::mul_wrap(x, y);
  }
  static A max(A x, A y) { return detail::max_nan(x, y); }
  static A min(A x, A y) { return detail::min_nan(x, y); }
};

// ---- contiguous runs

/// numpy's pairwise summation of n contiguous values into A.
template <typename A, typename T>
A pairwise_sum(const T* a, std::int64_t n) {
  using detail::add_wrap;  // integers wrap (their accumulator is int64)
  if (n < 8) {
    A r = A(0);
    for (std::int64_t i = 0; i < n; ++i) r = add_wrap(r, static_cast<A>(a[i]));
    return r;
  }
  if (n <= 128) {
    A r[8];
    for (int j = 0; j < 8; ++j) r[j] = static_cast<A>(a[j]);
    const std::int64_t m = n - n % 8;
    for (std::int64_t i = 8; i < m; i += 8)
      for (int j = 0; j < 8; ++j) r[j] = add_wrap(r[j], static_cast<A>(a[i + j]));
    A res = add_wrap(add_wrap(add_wrap(r[0], r[1]), add_wrap(r[2], r[3])),
                     add_wrap(add_wrap(r[4], r[5]), add_wrap(r[6], r[7])));
    for (std::int64_t i = m; i < n; ++i) res = add_wrap(res, static_cast<A>(a[i]));
    return res;
  }
  std::int64_t half = n / 2;
  half -= half % 8;
  return add_wrap(pairwise_sum<A>(a, half), pairwise_sum<A>(a + half, n - half));
}

/// f-reduction of n contiguous values with 8 independent lanes (n >= 1).
template <typename A, typename T, typename F>
A lanes_reduce(const T* a, std::int64_t n, A init, F f) {
  A r[8];
  for (int j = 0; j < 8; ++j) r[j] = init;
  const std::int64_t m = n - n % 8;
  for (std::int64_t i = 0; i < m; i += 8)
    for (int j = 0; j < 8; ++j) r[j] = f(r[j], static_cast<A>(a[i + j]));
  A res = init;
  for (int j = 0; j < 8; ++j) res = f(res, r[j]);
  for (std::int64_t i = m; i < n; ++i) res = f(res, static_cast<A>(a[i]));
  return res;
}

// ---- runs of rows

constexpr std::int64_t kRowBlock = 64;

/// out[inner] = the pairwise sum of n rows of `inner` values starting at a (row stride inner).
/// scratch holds `inner` values per recursion level.
template <typename A, typename T>
void pairwise_rows(const T* a, std::int64_t n, std::int64_t inner, A* out, A* scratch) {
  if (n <= kRowBlock) {
    for (std::int64_t k = 0; k < inner; ++k) out[k] = static_cast<A>(a[k]);
    for (std::int64_t r = 1; r < n; ++r) {
      const T* __restrict row = a + r * inner;
      A* __restrict o = out;
      for (std::int64_t k = 0; k < inner; ++k) o[k] = detail::add_wrap(o[k], static_cast<A>(row[k]));
    }
    return;
  }
  const std::int64_t half = n / 2;
  pairwise_rows(a, half, inner, out, scratch + inner);
  pairwise_rows(a + half * inner, n - half, inner, scratch, scratch + inner);
  for (std::int64_t k = 0; k < inner; ++k) out[k] = detail::add_wrap(out[k], scratch[k]);
}

template <typename A, typename T, typename F>
void rows_reduce(const T* a, std::int64_t n, std::int64_t inner, A* out, F f) {
  for (std::int64_t k = 0; k < inner; ++k) out[k] = static_cast<A>(a[k]);
  for (std::int64_t r = 1; r < n; ++r) {
    const T* __restrict row = a + r * inner;
    A* __restrict o = out;
    for (std::int64_t k = 0; k < inner; ++k) o[k] = f(o[k], static_cast<A>(row[k]));
  }
}

/// Reduces the middle dim of an [outer, n, inner] array `in` (n >= 1) into [outer, inner].
template <typename A, typename T>
void reduce_middle(const T* in, const detail::ThreeDims& v, ReduceKind kind, A* out) {
  using C = Combine<A>;
  const bool is_sum = kind == ReduceKind::kSum || kind == ReduceKind::kMean;
  std::vector<A> scratch;
  if (is_sum && v.inner > 1 && v.n > kRowBlock) {
    int levels = 1;
    for (std::int64_t m = v.n; m > kRowBlock; m = (m + 1) / 2) ++levels;
    scratch.resize(static_cast<std::size_t>(levels * v.inner));
  }
  for (std::int64_t o = 0; o < v.outer; ++o) {
    const T* a = in + o * v.n * v.inner;
    A* r = out + o * v.inner;
    if (v.inner == 1) {
      switch (kind) {
        case ReduceKind::kSum:
        case ReduceKind::kMean:
          if constexpr (std::is_same_v<A, bool>)
            *r = lanes_reduce<A>(a, v.n, false, C::sum);
          else
            *r = pairwise_sum<A>(a, v.n);
          break;
        case ReduceKind::kProd:
          *r = lanes_reduce<A>(a, v.n, A(1), C::prod);
          break;
        case ReduceKind::kMax:
          *r = lanes_reduce<A>(a, v.n, static_cast<A>(a[0]), C::max);
          break;
        case ReduceKind::kMin:
          *r = lanes_reduce<A>(a, v.n, static_cast<A>(a[0]), C::min);
          break;
      }
      continue;
    }
    switch (kind) {
      case ReduceKind::kSum:
      case ReduceKind::kMean:
        if constexpr (std::is_same_v<A, bool>)
          rows_reduce(a, v.n, v.inner, r, C::sum);
        else
          pairwise_rows(a, v.n, v.inner, r, scratch.data());
        break;
      case ReduceKind::kProd:
        rows_reduce(a, v.n, v.inner, r, C::prod);
        break;
      case ReduceKind::kMax:
        rows_reduce(a, v.n, v.inner, r, C::max);
        break;
      case ReduceKind::kMin:
        rows_reduce(a, v.n, v.inner, r, C::min);
        break;
    }
  }
}

const char* kind_name(ReduceKind k) { return detail::reduce_op_name(k); }

Shape reduced_shape(const Shape& shape, const std::vector<int>& dims, bool keepdims) {
  Shape out;
  std::size_t j = 0;
  for (int d = 0; d < static_cast<int>(shape.size()); ++d) {
    const bool r = j < dims.size() && dims[j] == d;
    if (r) ++j;
    if (!r)
      out.push_back(shape[d]);
    else if (keepdims)
      out.push_back(1);
  }
  return out;
}

}  // namespace

namespace {

/// The accumulators of a reduction of x over `dims` (resolved, non-empty count): sums are
/// not yet divided for means. Identity values where the reduced dims hold no elements.
template <typename A, typename T>
Tensor<A> reduce_acc(const Tensor<T>& x, ReduceKind kind, const std::vector<int>& dims, bool keepdims) {
  Tensor<A> out(reduced_shape(x.shape(), dims, keepdims));
  if (out.size() == 0) return out;
  std::int64_t count = 1;
  for (int d : dims) count *= x.shape()[d];
  if (count == 0) {
    const A fill = kind == ReduceKind::kProd  ? A(1)
                   : kind == ReduceKind::kMax ? lowest<A>()
                   : kind == ReduceKind::kMin ? highest<A>()
                                              : A(0);
    std::fill(out.begin(), out.end(), fill);
    return out;
  }
  // Coalesce the shape into runs of kept / reduced dims (size-1 dims dropped).
  std::vector<std::int64_t> size;
  std::vector<bool> reduced;
  for (int d = 0, j = 0; d < x.rank(); ++d) {
    const bool r = j < static_cast<int>(dims.size()) && dims[j] == d;
    if (r) ++j;
    if (x.shape()[d] == 1) continue;
    if (!size.empty() && reduced.back() == r)
      size.back() *= x.shape()[d];
    else {
      size.push_back(x.shape()[d]);
      reduced.push_back(r);
    }
  }
  // Reduce the runs innermost first; the first pass reads x, later ones the accumulator.
  std::unique_ptr<A[]> acc;  // not std::vector: vector<bool> has no data()
  bool first = true;
  for (int g = static_cast<int>(size.size()) - 1; g >= 0; --g) {
    if (!reduced[g]) continue;
    detail::ThreeDims v;
    for (int k = 0; k < static_cast<int>(size.size()); ++k)
      (k < g ? v.outer : k == g ? v.n : v.inner) *= size[k];
    auto next = std::make_unique<A[]>(static_cast<std::size_t>(v.outer * v.inner));
    if (first)
      reduce_middle<A>(x.data(), v, kind, next.get());
    else
      reduce_middle<A>(acc.get(), v, kind, next.get());
    acc = std::move(next);
    size.erase(size.begin() + g);
    reduced.erase(reduced.begin() + g);
    first = false;
  }
  A* o = out.data();
  if (first)  // nothing of size > 1 was reduced: a copy
    for (std::int64_t i = 0; i < out.size(); ++i) o[i] = static_cast<A>(x.flat(i));
  else
    std::copy(acc.get(), acc.get() + out.size(), o);
  return out;
}

}  // namespace

template <Dtype T>
Tensor<T> detail::reduce_kernel(const Tensor<T>& x, ReduceKind kind, const Dims& dims_in, bool keepdims) {
  using A = acc_t<T>;
  const std::vector<int> dims = dims_in.resolve(x.rank(), kind_name(kind));
  std::int64_t count = 1;
  for (int d : dims) count *= x.shape()[d];
  if (kind == ReduceKind::kMean && !is_floating_v<T>)
    raise<ValueError>("mean kernel of a ", dtype_name<T>(),
                      " tensor: the front end shard::mean converts integers "
                      "to floating first");
  if (count == 0 && (kind == ReduceKind::kMax || kind == ReduceKind::kMin))
    raise<ValueError>(kind_name(kind), " over zero elements of a ", dtype_name<T>(), to_string(x.shape()),
                      " array has no identity (numpy raises too)");
  const Tensor<A> acc = reduce_acc<A>(x, kind, dims, keepdims);
  Tensor<T> out(acc.shape());
  for (std::int64_t i = 0; i < out.size(); ++i) {
    if constexpr (is_floating_v<T>)
      out.flat(i) =
          static_cast<T>(kind == ReduceKind::kMean ? acc.flat(i) / static_cast<double>(count) : acc.flat(i));
    else
      out.flat(i) = static_cast<T>(acc.flat(i));
  }
  return out;
}

namespace detail {

template <Dtype T>
Tensor<double> sum_in_double(const Tensor<T>& x, const std::vector<int>& dims, bool keepdims) {
  return reduce_acc<double>(x, ReduceKind::kSum, dims, keepdims);
}
template <Dtype T>
Tensor<T> reduce_or_identity(const Tensor<T>& x, ReduceKind kind, const std::vector<int>& dims,
                             bool keepdims) {
  if (kind == ReduceKind::kMax || kind == ReduceKind::kMin) return reduce_acc<T>(x, kind, dims, keepdims);
  const Tensor<acc_t<T>> acc = reduce_acc<acc_t<T>>(x, kind, dims, keepdims);
  Tensor<T> out(acc.shape());
  for (std::int64_t i = 0; i < out.size(); ++i) out.flat(i) = static_cast<T>(acc.flat(i));
  return out;
}

}  // namespace detail

namespace {

/// Index of the best element along the middle dim of [outer, n, inner] (nan is best for both).
template <typename T>
void arg_middle(const T* in, const detail::ThreeDims& v, bool want_max, std::int64_t* out) {
  auto better = [want_max](T x, T best) {
    if constexpr (is_floating_v<T>) {
      if (best != best) return false;
      if (x != x) return true;
    }
    return want_max ? x > best : x < best;
  };
  std::vector<T> best(static_cast<std::size_t>(v.inner));
  for (std::int64_t o = 0; o < v.outer; ++o) {
    const T* a = in + o * v.n * v.inner;
    std::int64_t* r = out + o * v.inner;
    for (std::int64_t k = 0; k < v.inner; ++k) {
      best[k] = a[k];
      r[k] = 0;
    }
    for (std::int64_t i = 1; i < v.n; ++i)
      for (std::int64_t k = 0; k < v.inner; ++k)
        if (better(a[i * v.inner + k], best[k])) {
          best[k] = a[i * v.inner + k];
          r[k] = i;
        }
  }
}

template <typename T>
Tensor<std::int64_t> arg_reduce(const Tensor<T>& x, int axis, bool keepdims, bool want_max) {
  const char* what = want_max ? "argmax" : "argmin";
  const int d = resolve_dim(axis, x.rank(), what);
  if (x.shape()[d] == 0)
    raise<ValueError>(what, " of a ", to_string(x.shape()), " array along dim ", d, ", which is empty");
  Tensor<std::int64_t> out(reduced_shape(x.shape(), {d}, keepdims));
  arg_middle(x.data(), detail::three_dims(x.shape(), d, d + 1), want_max, out.data());
  return out;
}

}  // namespace

template <Dtype T>
Tensor<std::int64_t> detail::arg_reduce_kernel(const Tensor<T>& x, int axis, bool keepdims, bool want_max) {
  return arg_reduce(x, axis, keepdims, want_max);
}

// ---------------------------------------------------------------- prefix sums (cumsum)

namespace {

/// The running sums of the lines along the middle dim of [outer, n, inner] (from the end when
/// reverse), each starting at start[o * inner + k] (0 when null), vectorised over `inner`.
/// Writes the sums to `out` when it is not null and the lines' final sums to `totals`. Integers
/// add as unsigned 64-bit values, so overflow wraps (as JAX's int32 and int64 do) instead of
/// being undefined.
template <typename T>
void scan_lines(const T* in, const detail::ThreeDims& v, bool reverse, const detail::scan_acc_t<T>* start,
                T* out, detail::scan_acc_t<T>* totals) {
  using W = std::conditional_t<is_floating_v<T>, double, std::uint64_t>;
  std::vector<W> acc(static_cast<std::size_t>(v.inner));
  for (std::int64_t o = 0; o < v.outer; ++o) {
    for (std::int64_t k = 0; k < v.inner; ++k) acc[k] = start ? static_cast<W>(start[o * v.inner + k]) : W(0);
    for (std::int64_t step = 0; step < v.n; ++step) {
      const std::int64_t i = reverse ? v.n - 1 - step : step;
      const T* __restrict row = in + (o * v.n + i) * v.inner;
      W* __restrict a = acc.data();
      for (std::int64_t k = 0; k < v.inner; ++k) a[k] += static_cast<W>(row[k]);
      if (out) {
        T* __restrict o_row = out + (o * v.n + i) * v.inner;
        for (std::int64_t k = 0; k < v.inner; ++k) o_row[k] = static_cast<T>(a[k]);
      }
    }
    if (totals)
      for (std::int64_t k = 0; k < v.inner; ++k)
        totals[o * v.inner + k] = static_cast<detail::scan_acc_t<T>>(acc[k]);
  }
}

template <typename T>
void no_bool_scan() {
  if constexpr (std::is_same_v<T, bool>)
    raise<ValueError>(
        "prefix_sum kernel of a bool array: the front end shard::cumsum converts bool to int32 first");
}

}  // namespace

namespace detail {

template <Dtype T>
Tensor<scan_acc_t<T>> line_totals(const Tensor<T>& x, int d) {
  no_bool_scan<T>();
  Shape s = x.shape();
  s[d] = 1;
  Tensor<scan_acc_t<T>> totals(s);
  if constexpr (!std::is_same_v<T, bool>)
    scan_lines<T>(x.data(), three_dims(x.shape(), d, d + 1), false, nullptr, nullptr, totals.data());
  return totals;
}

template <Dtype T>
Tensor<T> prefix_sum_from(const Tensor<T>& x, int d, bool reverse, const Tensor<scan_acc_t<T>>* start) {
  no_bool_scan<T>();
  Tensor<T> out(x.shape());
  if constexpr (!std::is_same_v<T, bool>)
    scan_lines<T>(x.data(), three_dims(x.shape(), d, d + 1), reverse, start ? start->data() : nullptr,
                  out.data(), nullptr);
  return out;
}

}  // namespace detail

template <Dtype T>
Tensor<T> detail::prefix_sum_kernel(const Tensor<T>& x, int axis, bool reverse) {
  return detail::prefix_sum_from(x, resolve_dim(axis, x.rank(), "cumsum"), reverse, nullptr);
}

#define SHARD_INSTANTIATE_REDUCE(T)                                                                       \
  template Tensor<T> detail::reduce_kernel<T>(const Tensor<T>&, ReduceKind, const Dims&, bool);           \
  template Tensor<T> detail::prefix_sum_kernel<T>(const Tensor<T>&, int, bool);                           \
  template Tensor<detail::scan_acc_t<T>> detail::line_totals<T>(const Tensor<T>&, int);                   \
  template Tensor<T> detail::prefix_sum_from<T>(const Tensor<T>&, int, bool,                              \
                                                const Tensor<detail::scan_acc_t<T>>*);                    \
  template Tensor<T> detail::reduce_or_identity<T>(const Tensor<T>&, ReduceKind, const std::vector<int>&, \
                                                   bool);                                                 \
  template Tensor<std::int64_t> detail::arg_reduce_kernel<T>(const Tensor<T>&, int, bool, bool);
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_REDUCE)
#undef SHARD_INSTANTIATE_REDUCE
#define SHARD_INSTANTIATE_SUM_IN_DOUBLE(T) \
  template Tensor<double> detail::sum_in_double<T>(const Tensor<T>&, const std::vector<int>&, bool);
SHARD_FOR_EACH_FLOAT_DTYPE(SHARD_INSTANTIATE_SUM_IN_DOUBLE)
#undef SHARD_INSTANTIATE_SUM_IN_DOUBLE

}  // namespace shard
