// Shape, indexing and creation ops of the local op set: reshape, transpose, slicing,
// concatenate/stack, take/take_along_axis, broadcast_to, arange. Every op that moves elements
// is one strided copy through broadcast_rows (dims coalesced, contiguous runs memcpy'd).

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "shard/error.hpp"
#include "shard/core/tensor_ops.hpp"
#include "shard/core/trace.hpp"
#include "shard/core/detail/int_wrap.hpp"
#include "core/tensor_kernels.hpp"

namespace shard {

namespace {

/// out (contiguous, shape `shape`) = the elements of `src` at offset `base` with per-dim
/// strides `strides` (in elements; 0 repeats).
template <typename T>
void strided_copy(const T* src, std::int64_t base, const Shape& strides, const Shape& shape, T* out) {
  const std::array<Shape, 1> st{strides};
  detail::broadcast_rows<1>(shape, st, [&](std::int64_t o, auto off, auto step, std::int64_t n) {
    const T* s = src + base + off[0];
    if (step[0] == 1) std::memcpy(out + o, s, static_cast<std::size_t>(n) * sizeof(T));
    else
      for (std::int64_t k = 0; k < n; ++k) out[o + k] = s[k * step[0]];
  });
}

/// out[b][j][i] = in[b][i][j] for `batches` r x c matrices, in 32 x 32 tiles.
template <typename T>
void transpose_tiles(const T* __restrict in, T* __restrict out, std::int64_t batches, std::int64_t r, std::int64_t c) {
  constexpr std::int64_t kTile = 32;
  for (std::int64_t b = 0; b < batches; ++b, in += r * c, out += r * c)
    for (std::int64_t i0 = 0; i0 < r; i0 += kTile)
      for (std::int64_t j0 = 0; j0 < c; j0 += kTile) {
        const std::int64_t i1 = std::min(r, i0 + kTile), j1 = std::min(c, j0 + kTile);
        for (std::int64_t i = i0; i < i1; ++i)
          for (std::int64_t j = j0; j < j1; ++j) out[j * r + i] = in[i * c + j];
      }
}

}  // namespace

namespace detail {

Shape resolve_reshape(const Shape& from, Shape to) {
  const std::int64_t n = num_elements(from);
  int wild = -1;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < to.size(); ++i) {
    if (to[i] == -1) {
      if (wild >= 0) raise<ShapeError>("reshape: can only infer one dim, got ", to_string(to));
      wild = static_cast<int>(i);
    } else if (to[i] < 0) {
      raise<ValueError>("reshape: negative dim in ", to_string(to));
    } else {
      known *= to[i];
    }
  }
  if (wild >= 0) {
    if (known == 0 || n % known != 0)
      raise<ShapeError>("reshape: cannot reshape an array of shape ", to_string(from), " (", n, " elements) into ",
                        to_string(to));
    to[wild] = n / known;
  }
  if (checked_num_elements(to, 1, "reshape") != n)
    raise<ShapeError>("reshape: cannot reshape an array of shape ", to_string(from), " (", n, " elements) into ",
                      to_string(to));
  return to;
}

Shape expand_dims_shape(const Shape& from, int axis) {
  const int a = resolve_dim(axis, static_cast<int>(from.size()) + 1, "expand_dims");
  Shape s = from;
  s.insert(s.begin() + a, 1);
  return s;
}

Shape squeeze_shape(const Shape& from, const Dims& dims) {
  const std::vector<int> drop = squeezed_dims(from, dims);
  Shape s;
  for (int d = 0; d < static_cast<int>(from.size()); ++d)
    if (!std::binary_search(drop.begin(), drop.end(), d)) s.push_back(from[d]);
  return s;
}

}  // namespace detail

template <Dtype T>
Tensor<T> reshape(Tensor<T>&& x, Shape shape) {
  Shape s = detail::resolve_reshape(x.shape(), std::move(shape));
  return std::move(x).reshaped(std::move(s));
}

namespace detail {

template <Dtype T>
Tensor<T> transpose_kernel(const Tensor<T>& x, std::vector<int> perm) {
  const int rank = x.rank();
  if (perm.empty())
    for (int k = rank - 1; k >= 0; --k) perm.push_back(k);
  detail::check_permutation(perm, x.shape());
  Shape out_shape, st;
  const Shape in_st = strides_of(x.shape());
  for (int p : perm) {
    out_shape.push_back(x.shape()[p]);
    st.push_back(in_st[p]);
  }
  Tensor<T> out(out_shape);
  bool swap_last = rank >= 2 && perm[rank - 1] == rank - 2 && perm[rank - 2] == rank - 1;
  for (int k = 0; swap_last && k + 2 < rank; ++k) swap_last = perm[k] == k;
  if (swap_last && x.size() > 0) {  // matrices transposed in cache-sized tiles (the gemm operands of autodiff)
    const std::int64_t r = x.shape()[rank - 2], c = x.shape()[rank - 1], batches = x.size() / (r * c);
    transpose_tiles(x.data(), out.data(), batches, r, c);
    return out;
  }
  strided_copy(x.data(), 0, st, out_shape, out.data());
  return out;
}

template <Dtype T>
Tensor<T> broadcast_to_kernel(const Tensor<T>& x, const Shape& shape) {
  if (shape.size() < x.shape().size() || broadcast_shapes(x.shape(), shape) != shape)
    raise<ShapeError>("broadcast_to: shape ", to_string(x.shape()), " does not broadcast to ", to_string(shape));
  Tensor<T> out(shape);
  strided_copy(x.data(), 0, detail::broadcast_strides(x.shape(), shape), shape, out.data());
  return out;
}

template <Dtype T>
Tensor<T> slice_kernel(const Tensor<T>& x, const std::vector<Index>& index) {
  const IndexPlan p = plan_index(x.shape(), index);
  const Shape in_st = strides_of(x.shape());
  Shape full, st;  // the selection with dropped dims kept as size 1
  std::int64_t base = 0;
  for (std::size_t d = 0; d < p.ranges.size(); ++d) {
    base += p.ranges[d].start * in_st[d];
    full.push_back(p.ranges[d].count);
    st.push_back(p.ranges[d].step * in_st[d]);
  }
  Tensor<T> out(p.out_shape);
  if (out.size() > 0) strided_copy(x.data(), base, st, full, out.data());
  return out;
}

template <Dtype T>
Tensor<T> concatenate_kernel(const std::vector<Tensor<T>>& xs, int axis) {
  if (xs.empty()) raise<ValueError>("concatenate: need at least one array");
  const int rank = xs[0].rank();
  const int a = detail::concatenate_axis(axis, rank);
  Shape out_shape = xs[0].shape();
  out_shape[a] = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    detail::check_concatenate_operand(xs[0].shape(), xs[i].shape(), i, a);
    out_shape[a] += xs[i].shape()[a];
  }
  Tensor<T> out(out_shape);
  const auto v = detail::three_dims(out_shape, a, a + 1);
  std::int64_t at = 0;
  for (const auto& x : xs) {
    const std::int64_t run = x.shape()[a] * v.inner;
    if (run > 0)
      for (std::int64_t o = 0; o < v.outer; ++o)
        std::memcpy(out.data() + (o * v.n * v.inner) + at * v.inner, x.data() + o * run,
                    static_cast<std::size_t>(run) * sizeof(T));
    at += x.shape()[a];
  }
  return out;
}

template <Dtype T>
Tensor<T> stack_kernel(const std::vector<Tensor<T>>& xs, int axis) {
  if (xs.empty()) raise<ValueError>("stack: need at least one array");
  const int a = resolve_dim(axis, xs[0].rank() + 1, "stack");
  std::vector<Tensor<T>> expanded;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    detail::check_stack_operand(xs[0].shape(), xs[i].shape(), i);
    Shape s = xs[i].shape();
    s.insert(s.begin() + a, 1);
    expanded.push_back(Tensor<T>::borrow(const_cast<T*>(xs[i].data()), std::move(s)));  // read only
  }
  return concatenate_kernel(expanded, a);
}

template <Dtype T, Dtype I>
Tensor<T> take_kernel(const Tensor<T>& x, const Tensor<I>& indices, int axis) {
  static_assert(std::is_integral_v<I> && !std::is_same_v<I, bool>, "take: indices must be int32 or int64");
  const int a = resolve_dim(axis, x.rank(), "take");
  Shape out_shape(x.shape().begin(), x.shape().begin() + a);
  out_shape.insert(out_shape.end(), indices.shape().begin(), indices.shape().end());
  out_shape.insert(out_shape.end(), x.shape().begin() + a + 1, x.shape().end());
  Tensor<T> out(out_shape);
  const auto v = detail::three_dims(x.shape(), a, a + 1);
  const std::int64_t m = indices.size();
  std::vector<std::int64_t> rows(static_cast<std::size_t>(m));
  for (std::int64_t j = 0; j < m; ++j) {
    const std::int64_t i = static_cast<std::int64_t>(indices.flat(j));
    const std::int64_t r = i < 0 ? i + v.n : i;
    if (r < 0 || r >= v.n)
      raise<ShapeError>("take: index ", i, " is out of bounds for dim ", a, " with size ", v.n, " (array of shape ",
                        to_string(x.shape()), ")");
    rows[j] = r;
  }
  if (v.inner == 0) return out;
  for (std::int64_t o = 0; o < v.outer; ++o)
    for (std::int64_t j = 0; j < m; ++j)
      std::memcpy(out.data() + (o * m + j) * v.inner, x.data() + (o * v.n + rows[j]) * v.inner,
                  static_cast<std::size_t>(v.inner) * sizeof(T));
  return out;
}

template <Dtype T, Dtype I>
Tensor<T> take_along_axis_kernel(const Tensor<T>& x, const Tensor<I>& indices, int axis) {
  static_assert(std::is_integral_v<I> && !std::is_same_v<I, bool>, "take_along_axis: indices must be int32 or int64");
  if (indices.rank() != x.rank())
    raise<ShapeError>("take_along_axis: indices of shape ", to_string(indices.shape()), " and an array of shape ",
                      to_string(x.shape()), " need the same number of dims");
  const int a = resolve_dim(axis, x.rank(), "take_along_axis");
  const Shape out_shape = detail::take_along_axis_shape(x.shape(), indices.shape(), a);
  Shape xst = strides_of(x.shape());  // the axis contributes through the index
  for (int d = 0; d < x.rank(); ++d)
    if (d == a || (x.shape()[d] == 1 && out_shape[d] != 1)) xst[d] = 0;
  const std::array<Shape, 2> st{xst, detail::broadcast_strides(indices.shape(), out_shape)};
  const std::int64_t n = x.shape()[a], stride = strides_of(x.shape())[a];
  Tensor<T> out(out_shape);
  T* po = out.data();
  detail::broadcast_rows<2>(out_shape, st, [&](std::int64_t o, auto off, auto step, std::int64_t len) {
    for (std::int64_t k = 0; k < len; ++k) {
      const auto i = static_cast<std::int64_t>(indices.flat(off[1] + k * step[1]));
      const std::int64_t r = i < 0 ? i + n : i;
      if (r < 0 || r >= n)
        raise<ShapeError>("take_along_axis: index ", i, " is out of bounds for dim ", a, " with size ", n);
      po[o + k] = x.flat(off[0] + k * step[0] + r * stride);
    }
  });
  return out;
}

template <Dtype T>
Tensor<T> slice_transpose(const Tensor<T>& ct, const NodeMeta<Tensor<T>>& x, const std::vector<Index>& index) {
  const IndexPlan p = plan_index(x.shape, index);
  Tensor<T> out(x.shape, T(0));
  const Shape st_out = strides_of(x.shape);
  Shape full, st;
  std::int64_t base = 0;
  for (std::size_t d = 0; d < p.ranges.size(); ++d) {
    base += p.ranges[d].start * st_out[d];
    full.push_back(p.ranges[d].count);
    st.push_back(p.ranges[d].step * st_out[d]);
  }
  // Walk the selection in row-major order (ct's order) and write each element to its place.
  const std::int64_t n = ct.size();
  std::vector<std::int64_t> idx(full.size(), 0);
  for (std::int64_t k = 0; k < n; ++k) {
    std::int64_t off = base;
    for (std::size_t d = 0; d < full.size(); ++d) off += idx[d] * st[d];
    out.flat(off) = ct.flat(k);
    for (int d = static_cast<int>(full.size()) - 1; d >= 0; --d) {
      if (++idx[d] < full[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

template <Dtype T, Dtype I>
Tensor<T> take_transpose(const Tensor<T>& ct, const Tensor<I>& indices, const NodeMeta<Tensor<T>>& x, int axis) {
  const int a = resolve_dim(axis, static_cast<int>(x.shape.size()), "take");
  Tensor<T> out(x.shape, T(0));
  const auto v = three_dims(x.shape, a, a + 1);
  const std::int64_t m = indices.size();
  for (std::int64_t o = 0; o < v.outer; ++o)
    for (std::int64_t j = 0; j < m; ++j) {
      const auto i = static_cast<std::int64_t>(indices.flat(j));
      const std::int64_t r = i < 0 ? i + v.n : i;
      T* dst = out.data() + (o * v.n + r) * v.inner;
      const T* src = ct.data() + (o * m + j) * v.inner;
      for (std::int64_t k = 0; k < v.inner; ++k) dst[k] = detail::add_wrap(dst[k], src[k]);
    }
  return out;
}

template <Dtype T, Dtype I>
Tensor<T> take_along_axis_transpose(const Tensor<T>& ct, const Tensor<I>& indices, const NodeMeta<Tensor<T>>& x,
                                    int axis) {
  const int rank = static_cast<int>(x.shape.size());
  const int a = resolve_dim(axis, rank, "take_along_axis");
  const Shape& out_shape = ct.shape();
  Shape xst = strides_of(x.shape);
  for (int d = 0; d < rank; ++d)
    if (d == a || (x.shape[d] == 1 && out_shape[d] != 1)) xst[d] = 0;
  const std::array<Shape, 2> st{xst, broadcast_strides(indices.shape(), out_shape)};
  const std::int64_t n = x.shape[a], stride = strides_of(x.shape)[a];
  Tensor<T> out(x.shape, T(0));
  T* po = out.data();
  const T* pc = ct.data();
  broadcast_rows<2>(out_shape, st, [&](std::int64_t o, auto off, auto step, std::int64_t len) {
    for (std::int64_t k = 0; k < len; ++k) {
      const auto i = static_cast<std::int64_t>(indices.flat(off[1] + k * step[1]));
      const std::int64_t r = i < 0 ? i + n : i;
      po[off[0] + k * step[0] + r * stride] += pc[o + k];
    }
  });
  return out;
}

}  // namespace detail

template <Dtype T>
Tensor<T> arange(T start, T stop, T step) {
  if constexpr (std::is_same_v<T, bool>) {
    raise<ValueError>("arange of bool is not defined");
  } else {
    if (step == T(0)) raise<ValueError>("arange: step cannot be zero");
    const double len = std::ceil((static_cast<double>(stop) - static_cast<double>(start)) / static_cast<double>(step));
    const std::int64_t n = len > 0 ? static_cast<std::int64_t>(len) : 0;
    Tensor<T> out(Shape{n});
    for (std::int64_t i = 0; i < n; ++i) out.flat(i) = static_cast<T>(start + static_cast<T>(i) * step);
    return out;
  }
}

#define SHARD_INSTANTIATE_SHAPE(T)                                                            \
  template Tensor<T> reshape<T>(Tensor<T>&&, Shape);                                          \
  template Tensor<T> detail::transpose_kernel<T>(const Tensor<T>&, std::vector<int>);         \
  template Tensor<T> detail::broadcast_to_kernel<T>(const Tensor<T>&, const Shape&);          \
  template Tensor<T> detail::slice_kernel<T>(const Tensor<T>&, const std::vector<Index>&);    \
  template Tensor<T> detail::concatenate_kernel<T>(const std::vector<Tensor<T>>&, int);       \
  template Tensor<T> detail::stack_kernel<T>(const std::vector<Tensor<T>>&, int);             \
  template Tensor<T> arange<T>(T, T, T);
// (array, index) type pairs: every dtype with int32 and int64 indices.
#define SHARD_INSTANTIATE_TAKE(T, I)                                      \
  template Tensor<T> detail::take_kernel<T, I>(const Tensor<T>&, const Tensor<I>&, int); \
  template Tensor<T> detail::take_along_axis_kernel<T, I>(const Tensor<T>&, const Tensor<I>&, int);
SHARD_FOR_EACH_DTYPE_PAIR(ALL, INT, SHARD_INSTANTIATE_TAKE)
#undef SHARD_INSTANTIATE_TAKE
#define SHARD_INSTANTIATE_TRANSPOSES(T)                                                               \
  template Tensor<T> detail::slice_transpose<T>(const Tensor<T>&, const detail::NodeMeta<Tensor<T>>&, \
                                                const std::vector<Index>&);
SHARD_FOR_EACH_FLOAT_DTYPE(SHARD_INSTANTIATE_TRANSPOSES)
#undef SHARD_INSTANTIATE_TRANSPOSES
#define SHARD_INSTANTIATE_TAKE_TRANSPOSES(T, I)                                                  \
  template Tensor<T> detail::take_transpose<T, I>(const Tensor<T>&, const Tensor<I>&,            \
                                                  const detail::NodeMeta<Tensor<T>>&, int);      \
  template Tensor<T> detail::take_along_axis_transpose<T, I>(const Tensor<T>&, const Tensor<I>&, \
                                                             const detail::NodeMeta<Tensor<T>>&, int);
SHARD_FOR_EACH_DTYPE_PAIR(FLOAT, INT, SHARD_INSTANTIATE_TAKE_TRANSPOSES)
#undef SHARD_INSTANTIATE_TAKE_TRANSPOSES
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_SHAPE)
#undef SHARD_INSTANTIATE_SHAPE

}  // namespace shard
