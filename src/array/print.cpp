// numpy's str() of arrays (numpy/core/arrayprint.py, default options): the shown elements are
// formatted with one format for the whole array (floats: shortest round-trip digits capped at
// `precision`, decimal points aligned, or scientific notation when the magnitudes call for it
// as numpy decides), then laid out row by row with numpy's line wrapping and "..." summaries.

#include "shard/array/print.hpp"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstdio>
#include <cmath>
#include <ostream>
#include <sstream>
#include <vector>

#include "shard/comm/detail/comm_verbs.hpp"
#include "shard/error.hpp"
#include "shard/runtime/runtime.hpp"

namespace shard {

namespace {

/// For each dim, the indices shown: all of them, or the first and last `edge` of a
/// summarised array's longer dims.
std::vector<std::vector<std::int64_t>> shown_indices(const Shape& shape, bool summarise, int edge) {
  std::vector<std::vector<std::int64_t>> out;
  for (auto n : shape) {
    std::vector<std::int64_t> v;
    if (summarise && n > 2 * edge) {
      for (std::int64_t i = 0; i < edge; ++i) v.push_back(i);
      for (std::int64_t i = n - edge; i < n; ++i) v.push_back(i);
    } else {
      for (std::int64_t i = 0; i < n; ++i) v.push_back(i);
    }
    out.push_back(std::move(v));
  }
  return out;
}

// ---------------------------------------------------------------- element formats

template <typename F>
std::string chars(F v, std::chars_format fmt, int precision = -1) {
  char buf[512];
  const auto r = precision < 0 ? std::to_chars(buf, buf + sizeof buf, v, fmt)
                               : std::to_chars(buf, buf + sizeof buf, v, fmt, precision);
  return std::string(buf, r.ptr);
}

/// bfloat16's shortest round-trip digits (as ml_dtypes prints it: 0.001, not float32's
/// 0.0009994507): the fewest digits whose value rounds back to the same bfloat16.
std::string chars(bfloat16 v, std::chars_format fmt, int precision = -1) {
  if (precision >= 0 || !isfinite(v)) return chars(float(v), fmt, precision);
  for (int p = 0; p < 12; ++p) {
    std::string s = chars(float(v), fmt, p);
    if (bfloat16(std::strtof(s.c_str(), nullptr)).bits == v.bits) return s;
  }
  return chars(float(v), fmt);
}

/// numpy's dragon4 with unique digits capped at `precision` fractional digits, trailing zeros
/// trimmed ("1.", "0.5", "0.03571429").
template <typename F>
std::string positional(F v, int precision) {
  std::string s = chars(v, std::chars_format::fixed);
  const auto dot = s.find('.');
  if (dot != std::string::npos && static_cast<int>(s.size() - dot - 1) > precision) {
    s = chars(v, std::chars_format::fixed, precision);
    while (!s.empty() && s.back() == '0') s.pop_back();
  }
  if (s.find('.') == std::string::npos) s += '.';
  return s;
}

/// The same in scientific notation: mantissa digits, exponent sign and digits.
struct Sci {
  std::string int_part, frac, exp_sign, exp_digits;
};
template <typename F>
Sci scientific(F v, int precision) {
  std::string s = chars(v, std::chars_format::scientific);
  auto e = s.find('e');
  std::string mant = s.substr(0, e);
  const auto dot = mant.find('.');
  if (dot != std::string::npos && static_cast<int>(mant.size() - dot - 1) > precision) {
    s = chars(v, std::chars_format::scientific, precision);
    e = s.find('e');
    mant = s.substr(0, e);
    while (mant.find('.') != std::string::npos && mant.back() == '0') mant.pop_back();
  }
  Sci r;
  const auto d = mant.find('.');
  r.int_part = d == std::string::npos ? mant : mant.substr(0, d);
  r.frac = d == std::string::npos ? "" : mant.substr(d + 1);
  r.exp_sign = s.substr(e + 1, 1);
  r.exp_digits = s.substr(e + 2);
  return r;
}

/// numpy's FloatingFormat for one array.
template <typename F>
class FloatFormat {
 public:
  FloatFormat(const std::vector<F>& values, int precision) : precision_(precision) {
    std::vector<F> finite;
    bool nonfinite = false, neginf = false;
    for (F v : values) {
      if (std::isfinite(v)) finite.push_back(v);
      else {
        nonfinite = true;
        neginf = neginf || (std::isinf(v) && v < 0);
      }
    }
    double max_abs = 0, min_abs = INFINITY;
    for (F v : finite)
      if (v != 0) {
        max_abs = std::max(max_abs, std::abs(static_cast<double>(v)));
        min_abs = std::min(min_abs, std::abs(static_cast<double>(v)));
      }
    exp_ = max_abs >= 1e8 || (min_abs != INFINITY && (min_abs < 1e-4 || max_abs / min_abs > 1000.0));
    if (exp_) {
      for (F v : finite) {
        const Sci s = scientific(v, precision);
        pad_left_ = std::max(pad_left_, static_cast<int>(s.int_part.size()));
        frac_ = std::max(frac_, static_cast<int>(s.frac.size()));
        exp_size_ = std::max(exp_size_, static_cast<int>(s.exp_digits.size()));
      }
      pad_right_ = exp_size_ + 2 + frac_;
    } else {
      for (F v : finite) {
        const std::string s = positional(v, precision);
        const auto dot = s.find('.');
        pad_left_ = std::max(pad_left_, static_cast<int>(dot));
        pad_right_ = std::max(pad_right_, static_cast<int>(s.size() - dot - 1));
      }
    }
    if (nonfinite) {  // room for "nan" / "-inf" right-aligned in the same width
      const int offset = pad_right_ + 1;
      pad_left_ = std::max({pad_left_, 3 - offset, 3 + (neginf ? 1 : 0) - offset});
    }
  }

  std::string operator()(F v) const {
    if (!std::isfinite(v)) {
      const std::string r = std::isnan(v) ? "nan" : v < 0 ? "-inf" : "inf";
      return std::string(static_cast<std::size_t>(std::max(0, pad_left_ + pad_right_ + 1 - static_cast<int>(r.size()))), ' ') + r;
    }
    if (exp_) {
      const Sci s = scientific(v, precision_);
      std::string frac = s.frac;
      frac.resize(static_cast<std::size_t>(frac_), '0');
      std::string e = s.exp_digits;
      if (static_cast<int>(e.size()) < exp_size_) e.insert(0, static_cast<std::size_t>(exp_size_) - e.size(), '0');
      const std::string body = s.int_part + "." + frac + "e" + s.exp_sign + e;
      return std::string(static_cast<std::size_t>(std::max(0, pad_left_ - static_cast<int>(s.int_part.size()))), ' ') + body;
    }
    const std::string s = positional(v, precision_);
    const auto dot = s.find('.');
    return std::string(static_cast<std::size_t>(std::max(0, pad_left_ - static_cast<int>(dot))), ' ') + s +
           std::string(static_cast<std::size_t>(std::max(0, pad_right_ - static_cast<int>(s.size() - dot - 1))), ' ');
  }

 private:
  int precision_;
  bool exp_ = false;
  int pad_left_ = 0, pad_right_ = 0, frac_ = 0, exp_size_ = 0;
};

/// numpy's str() of a scalar (Python's float repr for floats).
template <typename T>
std::string scalar_string(T v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "True" : "False";
  } else if constexpr (std::is_integral_v<T>) {
    return std::to_string(v);
  } else {
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
    const double a = std::abs(static_cast<double>(v));
    if (a != 0 && (a < 1e-4 || a >= 1e16)) {
      std::string s = chars(v, std::chars_format::scientific);  // "1e-05", "1.5e+16"
      return s;
    }
    std::string s = chars(v, std::chars_format::fixed);
    if (s.find('.') == std::string::npos) s += ".0";
    return s;
  }
}

/// Lays out the shown elements (row-major in `grid`, already formatted) as numpy does.
class Layout {
 public:
  Layout(const Shape& grid, const std::vector<bool>& summarised, const std::vector<std::string>& words,
         const PrintOptions& o)
      : grid_(grid), summarised_(summarised), words_(words), o_(o) {}

  std::string run() const { return rec(0, 0, " ", o_.linewidth); }

 private:
  /// numpy's _extendLine.
  static void extend(std::string& s, std::string& line, const std::string& word, int width, const std::string& prefix) {
    bool wrap = static_cast<int>(line.size() + word.size()) > width;
    if (line.size() <= prefix.size()) wrap = false;
    if (wrap) {
      while (!line.empty() && line.back() == ' ') line.pop_back();
      s += line + "\n";
      line = prefix;
    }
    line += word;
  }

  std::string rec(std::size_t axis, std::int64_t offset, const std::string& hanging, int width) const {
    const std::int64_t n = grid_[axis];
    std::int64_t stride = 1;
    for (std::size_t d = axis + 1; d < grid_.size(); ++d) stride *= grid_[d];
    const std::string next_hanging = hanging + " ";
    const int next_width = width - 1;
    const bool summary = summarised_[axis];
    const std::int64_t lead = summary ? o_.edgeitems : n;
    std::string s;
    if (axis + 1 == grid_.size()) {
      const int elem_width = width - 1;
      std::string line = hanging;
      for (std::int64_t i = 0; i < n; ++i) {
        if (summary && i == lead) {
          extend(s, line, "...", elem_width, hanging);
          line += " ";
        }
        extend(s, line, words_[static_cast<std::size_t>(offset + i * stride)], elem_width, hanging);
        if (i + 1 < n) line += " ";
      }
      s += line;
    } else {
      const std::string sep(grid_.size() - axis - 1, '\n');
      for (std::int64_t i = 0; i < n; ++i) {
        if (summary && i == lead) s += hanging + "..." + sep;
        s += hanging + rec(axis + 1, offset + i * stride, next_hanging, next_width);
        if (i + 1 < n) s += sep;
      }
    }
    return "[" + s.substr(hanging.size()) + "]";
  }

  const Shape& grid_;
  const std::vector<bool>& summarised_;
  const std::vector<std::string>& words_;
  const PrintOptions& o_;
};

/// The text of an array of `shape` whose shown elements (row-major over the shown indices)
/// are `values`.
template <typename T>
std::string format(const Shape& shape, const std::vector<T>& values, bool summarise, const PrintOptions& o) {
  if (shape.empty()) return scalar_string(values.at(0));
  const auto shown = shown_indices(shape, summarise, o.edgeitems);
  Shape grid;
  std::vector<bool> summarised;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    grid.push_back(static_cast<std::int64_t>(shown[d].size()));
    summarised.push_back(static_cast<std::int64_t>(shown[d].size()) < shape[d]);
  }
  if (num_elements(shape) == 0) return "[]";  // numpy prints every empty array so
  std::vector<std::string> words;
  if constexpr (is_floating_v<T>) {
    const FloatFormat<T> f(values, o.precision);
    for (T v : values) words.push_back(f(v));
  } else {
    std::size_t width = 0;
    for (T v : values) width = std::max(width, scalar_string(v).size());
    for (T v : values) {
      const std::string w = scalar_string(v);
      words.push_back(std::string(width - w.size(), ' ') + w);
    }
  }
  return Layout(grid, summarised, words, o).run();
}

/// Visits the shown multi-indices inside `box` in row-major order: f(grid flat position, global offset in box).
template <typename F>
void for_shown_in_box(const std::vector<std::vector<std::int64_t>>& shown, const Box& box, F&& f) {
  const std::size_t rank = shown.size();
  std::vector<std::vector<std::int64_t>> pos(rank);  // positions in the grid along each dim
  for (std::size_t d = 0; d < rank; ++d)
    for (std::size_t k = 0; k < shown[d].size(); ++k)
      if (shown[d][k] >= box.offset[d] && shown[d][k] < box.offset[d] + box.extent[d])
        pos[d].push_back(static_cast<std::int64_t>(k));
  std::int64_t total = 1;
  for (const auto& p : pos) total *= static_cast<std::int64_t>(p.size());
  if (total == 0) return;
  std::vector<std::size_t> idx(rank, 0);
  const Shape bst = strides_of(box.extent);
  std::vector<std::int64_t> gst(rank, 1);
  for (int d = static_cast<int>(rank) - 2; d >= 0; --d) gst[d] = gst[d + 1] * static_cast<std::int64_t>(shown[d + 1].size());
  for (std::int64_t t = 0; t < total; ++t) {
    std::int64_t g = 0, local = 0;
    for (std::size_t d = 0; d < rank; ++d) {
      const std::int64_t k = pos[d][idx[d]];
      g += k * gst[d];
      local += (shown[d][static_cast<std::size_t>(k)] - box.offset[d]) * bst[d];
    }
    f(g, local);
    for (int d = static_cast<int>(rank) - 1; d >= 0; --d) {
      if (++idx[d] < pos[d].size()) break;
      idx[d] = 0;
    }
  }
}

/// PrintOptions as numpy's set_printoptions accepts them (checked before any communication).
void check_options(const PrintOptions& o) {
  auto bad = [](const char* field, long long v, const char* range) {
    raise<ValueError>("PrintOptions: ", field, " = ", v, " is out of range (", range, ")");
  };
  if (o.precision < 0 || o.precision > 100) bad("precision", o.precision, "0 to 100 digits");
  if (o.threshold < 0) bad("threshold", o.threshold, ">= 0 elements");
  if (o.edgeitems < 0) bad("edgeitems", o.edgeitems, ">= 0 items");
  if (o.linewidth < 1) bad("linewidth", o.linewidth, ">= 1 character");
}

}  // namespace

template <Dtype T>
std::string to_string(const Tensor<T>& x, const PrintOptions& o) {
  check_options(o);
  const bool summarise = x.size() > o.threshold;
  const auto shown = shown_indices(x.shape(), summarise, o.edgeitems);
  std::int64_t count = 1;
  for (const auto& s : shown) count *= static_cast<std::int64_t>(s.size());
  std::vector<T> values(static_cast<std::size_t>(count));
  if (x.rank() == 0) values[0] = x.flat(0);
  else for_shown_in_box(shown, full_box(x.shape()), [&](std::int64_t g, std::int64_t off) { values[g] = x.flat(off); });
  return format(x.shape(), values, summarise, o);
}

template <Dtype T>
std::string to_string(const ShardedArray<T>& x, const PrintOptions& o) {
  check_options(o);
  const detail::CommOp op{"print", detail::cat(dtype_name<T>(), to_string(x.shape()), " ", x.sharding().to_string())};
  detail::check_transfer(op);
  const Topology& topo = x.mesh().topology();
  const bool summarise = x.size() > o.threshold;
  const auto shown = shown_indices(x.shape(), summarise, o.edgeitems);
  const NamedSharding& s = x.sharding();
  // The primary copy of each box, grouped by rank then mesh order: the receive layout.
  std::vector<std::vector<int>> devices_of(static_cast<std::size_t>(topo.process_count));
  for (int d : s.primary_devices()) devices_of[topo.owner(d)].push_back(d);
  auto count_in = [&](int d) {
    std::int64_t c = 0;
    for_shown_in_box(shown, s.box(d, x.shape()), [&](std::int64_t, std::int64_t) { ++c; });
    return c;
  };
  Tensor<T> send({[&] {
    std::int64_t n = 0;
    for (int d : devices_of[topo.process_index]) n += count_in(d);
    return n;
  }()});
  std::int64_t k = 0;
  for (int d : devices_of[topo.process_index]) {
    const auto& sh = x.shard_of(d);
    for_shown_in_box(shown, sh.box, [&](std::int64_t, std::int64_t off) { send.flat(k++) = sh.data.flat(off); });
  }
  const bool root = topo.process_index == 0;
  std::vector<int> counts, displs;
  std::int64_t total = 0;
  for (const auto& devs : devices_of) {
    std::int64_t c = 0;
    for (int d : devs) c += count_in(d);
    counts.push_back(static_cast<int>(c));
    displs.push_back(static_cast<int>(total));
    total += c;
  }
  Tensor<T> recv({root ? total : 0});
  detail::gatherv(detail::world_group(), op, send.data(), detail::transfer_count(send.size(), op), recv.data(), counts,
                  displs, 0);
  if (!root) return "";
  std::vector<T> values(static_cast<std::size_t>(total));
  std::int64_t at = 0;
  for (const auto& devs : devices_of)
    for (int d : devs)
      for_shown_in_box(shown, s.box(d, x.shape()), [&](std::int64_t g, std::int64_t) { values[g] = recv.flat(at++); });
  return format(x.shape(), values, summarise, o);
}

template <Dtype T>
void print(const ShardedArray<T>& x, const PrintOptions& o, shard::source_location where) {
  const detail::CallScope scope("print", where);
  const std::string s = to_string(x, o);
  if (x.mesh().topology().process_index == 0) std::printf("%s\n", s.c_str());
}

template <Dtype T>
void print(const Tensor<T>& x, const PrintOptions& o) {
  if (!Runtime::exists() || Runtime::current().process_index() == 0) std::printf("%s\n", to_string(x, o).c_str());
}

#define SHARD_INSTANTIATE_PRINT(T)                                              \
  template std::string to_string<T>(const Tensor<T>&, const PrintOptions&);    \
  template std::string to_string<T>(const ShardedArray<T>&, const PrintOptions&); \
  template void print<T>(const ShardedArray<T>&, const PrintOptions&, shard::source_location); \
  template void print<T>(const Tensor<T>&, const PrintOptions&);
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_PRINT)
#undef SHARD_INSTANTIATE_PRINT

}  // namespace shard
