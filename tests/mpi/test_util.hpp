#pragma once
// Test helpers: random host arrays, and enumerations of meshes and specs.

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "shard/shard.hpp"

namespace shard::testing {

Runtime& runtime();  // the test harness's Runtime (mpi_main.cpp)

/// The numpy broadcast of two shapes (the host references of binary ops).
inline Shape host_broadcast(const Shape& a, const Shape& b) {
  const std::size_t n = std::max(a.size(), b.size());
  Shape out(n, 1);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t da = i + a.size() >= n ? a[i + a.size() - n] : 1;
    const std::int64_t db = i + b.size() >= n ? b[i + b.size() - n] : 1;
    out[i] = da == 1 ? db : da;
  }
  return out;
}

/// Flat offset in an array of shape `s` of the broadcast multi-index `idx` (numpy rules).
inline std::int64_t broadcast_offset(const Shape& s, const Shape& idx) {
  const std::size_t lead = idx.size() - s.size();
  std::int64_t off = 0;
  for (std::size_t k = 0; k < s.size(); ++k) off = off * s[k] + (s[k] == 1 ? 0 : idx[k + lead]);
  return off;
}

/// Advances a row-major multi-index over `shape` (the loops of the host references).
inline void next_index(Shape& idx, const Shape& shape) {
  for (int d = static_cast<int>(idx.size()) - 1; d >= 0; --d) {
    if (++idx[d] < shape[d]) return;
    idx[d] = 0;
  }
}

/// Host reference of shard::argmax: the index along `dim` of the largest value (the first on ties).
template <typename T>
Tensor<std::int64_t> host_argmax(const Tensor<T>& x, int dim) {
  dim = dim < 0 ? dim + x.rank() : dim;
  Shape out;
  for (int d = 0; d < x.rank(); ++d)
    if (d != dim) out.push_back(x.shape()[d]);
  Tensor<std::int64_t> r(out, -1);
  std::vector<T> best(static_cast<std::size_t>(r.size()));
  Shape idx(x.shape().size(), 0);
  for (std::int64_t i = 0; i < x.size(); ++i, next_index(idx, x.shape())) {
    std::int64_t o = 0;
    for (int d = 0, k = 0; d < x.rank(); ++d)
      if (d != dim) o = o * out[k++] + idx[d];
    // Strictly greater: the first index wins ties; numpy's: the first nan wins over everything.
    const T v = x.flat(i);
    const bool nan_best = r.flat(o) >= 0 && best[o] != best[o], nan_here = v != v;
    if (r.flat(o) < 0 || (!nan_best && (nan_here || v > best[o]))) {
      r.flat(o) = idx[dim];
      best[o] = v;
    }
  }
  return r;
}

/// The tolerance a check uses for T: `f32` for float, `f64` for double, `bf16` for bfloat16
/// (8 significant bits: ~0.4% per rounding), 0 for the exact integer types.
template <typename T>
constexpr double tol_for(double f32, double f64, double bf16 = 1e-2) {
  if constexpr (std::is_same_v<T, float>)
    return f32;
  else if constexpr (std::is_same_v<T, double>)
    return f64;
  else if constexpr (std::is_same_v<T, bfloat16>)
    return bf16;
  else
    return 0.0;
}

/// x's elements as float64 on every rank (a ShardedArray gathered with to_host).
template <typename X>
Tensor<double> host_double(const X& x) {
  if constexpr (detail::is_sharded_v<X>)
    return astype<double>(x.to_host());
  else
    return astype<double>(x);
}

/// Random values (never all zeros or ones), identical on every rank for the same seed.
template <typename T>
Tensor<T> random_tensor(const Shape& shape, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Tensor<T> t(shape);
  for (auto& v : t) {
    const std::uint64_t r = rng();
    if constexpr (is_floating_v<T>)
      v = static_cast<T>(static_cast<double>(r >> 11) * 0x1.0p-53 * 200.0 - 100.0);
    else
      v = static_cast<T>(static_cast<std::int64_t>(r % 2001) - 1000);
  }
  return t;
}

/// All factorisations of n into `dims` factors (each >= 1), e.g. 8 into 2: 1x8 2x4 4x2 8x1.
inline std::vector<std::vector<int>> factorisations(int n, int dims) {
  if (dims == 1) return {{n}};
  std::vector<std::vector<int>> out;
  for (int f = 1; f <= n; ++f)
    if (n % f == 0)
      for (auto rest : factorisations(n / f, dims - 1)) {
        rest.insert(rest.begin(), f);
        out.push_back(rest);
      }
  return out;
}

inline std::vector<std::string> axis_names(int dims) {
  static const char* kNames[] = {"a", "b", "c", "d"};
  return {kNames, kNames + dims};
}

/// Every spec for an array of rank `rank` on a mesh with `axes` axes: each axis goes to no
/// dim or to one dim, in every order within a dim's tuple.
inline std::vector<PartitionSpec> all_specs(const std::vector<std::string>& axes, int rank) {
  std::vector<PartitionSpec> out;
  const int n = static_cast<int>(axes.size());
  std::vector<int> perm(n);
  for (int i = 0; i < n; ++i) perm[i] = i;
  std::vector<std::vector<int>> seen;
  // Assign axes (in permutation order) to dims; permutations give every tuple order.
  int assignments = 1;
  for (int i = 0; i < n; ++i) assignments *= rank + 1;
  do {
    for (int code = 0; code < assignments; ++code) {
      std::vector<std::vector<std::string>> entries(static_cast<std::size_t>(rank));
      int c = code;
      std::vector<int> key;
      for (int i = 0; i < n; ++i) {
        const int dim = c % (rank + 1) - 1;  // -1 = unused
        c /= rank + 1;
        if (dim >= 0) entries[dim].push_back(axes[perm[i]]);
      }
      std::vector<SpecEntry> spec;
      for (const auto& e : entries) spec.emplace_back(e);
      PartitionSpec p(spec);
      if (std::none_of(out.begin(), out.end(), [&](const PartitionSpec& q) { return q == p; }))
        out.push_back(p);
    }
  } while (std::next_permutation(perm.begin(), perm.end()));
  return out;
}

/// The box a device holds, computed from first principles (independent of NamedSharding).
inline Box reference_box(const Mesh& mesh, const PartitionSpec& spec, const Shape& shape, int device) {
  const auto c = mesh.coords(device);
  Box b{Shape(shape.size()), Shape(shape.size())};
  for (std::size_t d = 0; d < shape.size(); ++d) {
    std::int64_t idx = 0;
    std::int64_t parts = 1;
    for (const auto& a : spec[static_cast<int>(d)].axes()) {
      const int pos = mesh.axis_position(a);
      idx = idx * mesh.shape()[pos] + c[pos];
      parts *= mesh.shape()[pos];
    }
    const std::int64_t chunk = (shape[d] + parts - 1) / parts;
    const std::int64_t lo = std::min(idx * chunk, shape[d]);
    const std::int64_t hi = std::min((idx + 1) * chunk, shape[d]);
    b.offset[d] = lo;
    b.extent[d] = hi - lo;
  }
  return b;
}

/// The elements of `box` of a host array, by a naive loop over global indices.
template <typename T>
std::vector<T> reference_slice(const Tensor<T>& host, const Box& box) {
  std::vector<T> out;
  const Shape st = strides_of(host.shape());
  const std::int64_t n = box.size();
  Shape idx(box.extent.size(), 0);
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t off = 0;
    for (std::size_t d = 0; d < idx.size(); ++d) off += (box.offset[d] + idx[d]) * st[d];
    out.push_back(host.flat(off));
    for (int d = static_cast<int>(idx.size()) - 1; d >= 0; --d) {
      if (++idx[d] < box.extent[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

/// The same elements as a tensor of the box's shape (any dtype, bool included).
template <typename T>
Tensor<T> reference_block(const Tensor<T>& host, const Box& box) {
  Tensor<T> out(box.extent);
  const Shape st = strides_of(host.shape());
  Shape idx(box.extent.size(), 0);
  for (std::int64_t i = 0; i < out.size(); ++i) {
    std::int64_t off = 0;
    for (std::size_t d = 0; d < idx.size(); ++d) off += (box.offset[d] + idx[d]) * st[d];
    out.flat(i) = host.flat(off);
    for (int d = static_cast<int>(idx.size()) - 1; d >= 0; --d) {
      if (++idx[d] < box.extent[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

/// The largest |c - ref| over this rank's shards of c and the largest |ref| there (at least
/// 1); `boxes_ok` is false if a shard's box differs from the reference layout of c's spec.
struct MaxError {
  double err = 0, norm = 1;
  bool boxes_ok = true;
};
template <typename T>
MaxError max_error(const ShardedArray<T>& c, const Tensor<double>& ref) {
  MaxError e;
  for (const auto& sh : c.addressable_shards()) {
    e.boxes_ok = e.boxes_ok && sh.box == reference_box(c.mesh(), c.spec(), c.shape(), sh.device);
    const auto want = reference_slice(ref, sh.box);
    for (std::size_t i = 0; i < want.size(); ++i) {
      e.err = std::max(e.err,
                       std::abs(static_cast<double>(sh.data.flat(static_cast<std::int64_t>(i))) - want[i]));
      e.norm = std::max(e.norm, std::abs(want[i]));
    }
  }
  return e;
}

/// Collective: a directory path under /tmp named after rank 0's pid (created by rank 0 when
/// `create`); rank 0 removes it at scope exit.
class TempDir {
 public:
  TempDir(const std::string& prefix, bool create) {
    static int counter = 0;
    long pid = ::getpid();
    MPI_Bcast(&pid, 1, MPI_LONG, 0, runtime().world().get());
    path_ = std::filesystem::temp_directory_path() /
            (prefix + std::to_string(pid) + "-" + std::to_string(counter++));
    if (create && runtime().process_index() == 0) std::filesystem::create_directories(path_);
    MPI_Barrier(runtime().world().get());
  }
  ~TempDir() {
    MPI_Barrier(runtime().world().get());
    std::error_code ec;
    if (runtime().process_index() == 0) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }
  std::filesystem::path path() const { return path_; }

 private:
  std::filesystem::path path_;
};

/// Meshes over every device: 1-D ("a"), 2-D ("a", "b", the middle factorisation) and, from 4
/// devices, 3-D ("a", "b", "c").
inline std::vector<Mesh> abc_meshes(int n) {
  std::vector<Mesh> out{make_mesh({n}, {"a"})};
  const auto f2 = factorisations(n, 2);
  out.push_back(make_mesh(f2[f2.size() / 2], {"a", "b"}));
  if (n >= 4) out.push_back(make_mesh(factorisations(n, 3)[1], {"a", "b", "c"}));
  return out;
}

/// The slow tier (CI: .ci/run sets SHARD_FULL_MATRIX=1): the op table's property tests run the
/// full matrix, every spec of every operand, instead of their fixed-seed sample.
inline bool full_matrix() {
  const char* v = std::getenv("SHARD_FULL_MATRIX");
  return v && std::string(v) == "1";
}

/// `sample` in the default tier; every spec of a rank-`rank` array on `mesh` in the slow tier.
inline std::vector<PartitionSpec> specs_or_all(const Mesh& mesh, int rank,
                                               std::vector<PartitionSpec> sample) {
  return full_matrix() ? all_specs(mesh.axis_names(), rank) : sample;
}

/// A random spec for an array of `rank` dims on `mesh`: each mesh axis goes to a random dim or
/// nowhere (never two entries with the same axis).
inline PartitionSpec random_spec(const Mesh& mesh, int rank, std::mt19937_64& rng) {
  std::vector<std::vector<std::string>> dims(static_cast<std::size_t>(rank));
  for (const auto& name : mesh.axis_names()) {
    const auto pick = static_cast<int>(rng() % static_cast<std::uint64_t>(rank + 1));
    if (pick < rank) dims[static_cast<std::size_t>(pick)].push_back(name);
  }
  std::vector<SpecEntry> entries;
  for (auto& d : dims) entries.push_back(d.empty() ? SpecEntry() : SpecEntry(d));
  return PartitionSpec(std::move(entries));
}

}  // namespace shard::testing
