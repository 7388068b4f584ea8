// Property tests: hundreds of random cases per run, each a random mesh over all devices of
// the job (1-3 axes, sizes a random factorisation of the device count, sometimes a shuffled
// device order), a random array (0-4 dims of size 0-9: uneven, size-1 and zero-size dims),
// a random dtype and random valid specs (each mesh axis used at most once, tuples in random
// order). Every rank checks, against serial host references computed from the global host
// array (never with another Shard op):
//   1. reshard(x, s2) then reshard(., s1) gives back x: every local shard of both results
//      against its independently computed box of the host array, exactly;
//   2. reshard_plan(x, s) predicts the bytes CommStats saw this rank send, for both reshards
//      and for the reshard a binary op makes of its second operand; no MPI call for kNone/kLocal;
//   3. binary ops with numpy broadcasting (+, -, *, maximum, minimum), a unary map (exp of
//      x/16 for floats, abs for integers), sum over random dims, max, argmax and 2-D matmul
//      with random specs (and sometimes a requested output sharding) match the host reference
//      (floats within a rounding tolerance), with the documented result spec. In 30% of the
//      cases the operands hold edge values (nan, +-inf; MIN, MAX, -1, 0), and the references
//      follow numpy: nan propagates through max and argmax picks the first nan, integers wrap.
//
// The seed comes from env SHARD_PROPERTY_SEED, else from the clock; rank 0 picks it and
// broadcasts it, prints it at the start, and every failure message names it and the case,
// so `SHARD_PROPERTY_SEED=<s> SHARD_PROPERTY_CASE=<k>` replays one failing case (case k's
// generator depends only on the seed, k and the device count). SHARD_PROPERTY_CASES sets the
// case count (300); SHARD_PROPERTY_VERBOSE=1 prints each case before it runs (for a crash).

#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iomanip>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "mpi_test.hpp"
#include "test_util.hpp"

namespace shard::testing {
namespace {

using Kind = ReshardPlan::Kind;

// ---------------------------------------------------------------- configuration

struct Config {
  std::uint64_t seed = 0;
  int cases = 300;
  int only = -1;         // >= 0: run just this case
  bool verbose = false;  // rank 0 prints each case before running it (to find a crashing one)
};

std::uint64_t env_u64(const char* name, std::uint64_t fallback, bool& found) {
  const char* v = std::getenv(name);
  found = v && *v;
  return found ? std::strtoull(v, nullptr, 0) : fallback;
}

/// Rank 0 reads the environment (or the clock) and broadcasts, so every rank runs the same cases.
Config config() {
  std::array<std::uint64_t, 4> v{};
  if (runtime().process_index() == 0) {
    bool found = false;
    const auto now = static_cast<std::uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
    v[0] = env_u64("SHARD_PROPERTY_SEED", (now ^ (now >> 29)) % 1000000007ULL, found);
    v[1] = env_u64("SHARD_PROPERTY_CASES", 300, found);
    v[2] = env_u64("SHARD_PROPERTY_CASE", ~0ULL, found);
    v[3] = env_u64("SHARD_PROPERTY_VERBOSE", 0, found);
  }
  MPI_Bcast(v.data(), 4, MPI_UINT64_T, 0, runtime().world().get());
  Config c;
  c.seed = v[0];
  c.cases = static_cast<int>(v[1]);
  c.only = v[2] == ~0ULL ? -1 : static_cast<int>(v[2]);
  c.verbose = v[3] != 0;
  return c;
}

// ---------------------------------------------------------------- random generator

/// splitmix64: a fully specified generator (identical on every rank and every libstdc++).
struct Rng {
  std::uint64_t s;
  explicit Rng(std::uint64_t seed) : s(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  int below(int n) { return static_cast<int>(next() % static_cast<std::uint64_t>(n)); }
  bool chance(double p) { return static_cast<double>(next() >> 11) * 0x1.0p-53 < p; }
  template <typename V>
  void shuffle(std::vector<V>& v) {
    for (int i = static_cast<int>(v.size()) - 1; i > 0; --i) std::swap(v[i], v[below(i + 1)]);
  }
};

/// A dim size in 0..9: zero now and then, 1 often enough to broadcast and to leave shards empty.
std::int64_t random_dim(Rng& rng) {
  if (rng.chance(0.07)) return 0;
  if (rng.chance(0.12)) return 1;
  return 1 + rng.below(9);
}

/// A dim size, a third of the time a multiple (<= 9) of a product of some mesh axis sizes, so
/// the even-only reshard rules (all_gather, all_to_all) and even psum_scatters come up too.
std::int64_t random_dim(Rng& rng, const std::vector<int>& mesh_shape) {
  if (rng.chance(0.35)) {
    std::int64_t p = 1;
    for (int a : mesh_shape)
      if (rng.chance(0.6)) p *= a;
    if (p <= 9) return p * (1 + rng.below(static_cast<int>(9 / p)));
  }
  return random_dim(rng);
}

Shape random_shape(Rng& rng, int rank, const std::vector<int>& mesh_shape) {
  Shape s;
  for (int d = 0; d < rank; ++d) s.push_back(random_dim(rng, mesh_shape));
  return s;
}

/// A valid spec for an array of `rank` dims: each mesh axis goes to no dim or to one dim (in
/// random order within a dim's tuple); trailing Nones are sometimes written, sometimes not.
PartitionSpec random_spec(Rng& rng, const std::vector<std::string>& axes, int rank) {
  std::vector<std::vector<std::string>> entries(static_cast<std::size_t>(rank));
  std::vector<std::string> order = axes;
  rng.shuffle(order);
  for (const auto& a : order) {
    if (rank == 0 || rng.chance(0.3)) continue;  // unused: replicated along it
    entries[static_cast<std::size_t>(rng.below(rank))].push_back(a);
  }
  std::size_t n = entries.size();
  if (rng.chance(0.5))
    while (n > 0 && entries[n - 1].empty()) --n;
  std::vector<SpecEntry> spec;
  for (std::size_t d = 0; d < n; ++d) spec.emplace_back(entries[d]);
  return PartitionSpec(spec);
}

const char* const kDtypes[] = {"float32", "float64", "int32", "int64"};

/// One generated case: everything the checks need, drawn before anything runs.
struct Case {
  int index = 0;
  std::uint64_t data_seed = 0;
  int dtype = 0;
  std::vector<int> mesh_shape;
  std::vector<std::string> axes;
  std::vector<int> device_ids;  // empty: make_mesh's order
  Shape shape;
  PartitionSpec s1, s2;
  // binary op: x op y (y op x when y_first)
  Shape yshape;
  PartitionSpec sy;
  bool y_first = false;
  int op1 = 0, op2 = 0;  // op1 in {+, -}, op2 in {*, maximum, minimum}
  // reductions
  std::vector<int> sum_dims;  // empty: all dims
  std::vector<int> max_dims;  // empty: skip max (a reduced dim is empty)
  bool do_max = false;
  int argmax_dim = 0;
  bool do_argmax = false;
  // matmul [m, k] @ [k, n]
  std::int64_t m = 0, k = 0, n = 0;
  PartitionSpec sa, sb;
  std::optional<PartitionSpec> sout;
  // edge values: nan / +-inf (floats) or MIN / MAX / -1 / 0 (integers) in the operands
  bool edges = false;

  std::string describe(std::uint64_t seed) const;
};

std::string join(const std::vector<int>& v, const char* sep) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + std::to_string(v[i]);
  return s;
}

std::string Case::describe(std::uint64_t seed) const {
  std::ostringstream os;
  os << "seed " << seed << " case " << index << " (replay: SHARD_PROPERTY_SEED=" << seed
     << " SHARD_PROPERTY_CASE=" << index << "): " << kDtypes[dtype] << " mesh(";
  for (std::size_t i = 0; i < axes.size(); ++i)
    os << (i ? ", " : "") << "'" << axes[i] << "': " << mesh_shape[i];
  os << ")";
  if (!device_ids.empty()) os << " devices [" << join(device_ids, ", ") << "]";
  os << " x" << to_string(shape) << " " << s1.to_string() << " <-> " << s2.to_string() << "; y"
     << to_string(yshape) << " " << sy.to_string() << (y_first ? " (y first)" : "") << "; sum dims ["
     << join(sum_dims, ",") << "]";
  if (do_max) os << " max dims [" << join(max_dims, ",") << "]";
  if (do_argmax) os << " argmax dim " << argmax_dim;
  os << "; matmul (" << m << ", " << k << ") " << sa.to_string() << " @ (" << k << ", " << n << ") "
     << sb.to_string();
  if (sout) os << " -> " << sout->to_string();
  if (edges) os << "; with edge values";
  return os.str();
}

/// Random factors of n over `dims` axes (product n; 1s allowed).
std::vector<int> random_factors(Rng& rng, int n, int dims) {
  std::vector<int> f;
  for (int i = 0; i + 1 < dims; ++i) {
    std::vector<int> divisors;
    for (int d = 1; d <= n; ++d)
      if (n % d == 0) divisors.push_back(d);
    const int d = divisors[static_cast<std::size_t>(rng.below(static_cast<int>(divisors.size())))];
    f.push_back(d);
    n /= d;
  }
  f.push_back(n);
  rng.shuffle(f);
  return f;
}

Case generate_case(std::uint64_t seed, int index, int devices) {
  Rng rng(seed * 0x100000001B3ULL + static_cast<std::uint64_t>(index) * 0x9E3779B97F4A7C15ULL + 1);
  Case c;
  c.index = index;
  c.data_seed = rng.next();
  c.dtype = rng.below(4);
  const int ndim = 1 + rng.below(3);
  c.mesh_shape = random_factors(rng, devices, ndim);
  std::vector<std::string> pool{"a", "b", "c", "x", "y", "data", "model"};
  rng.shuffle(pool);
  c.axes.assign(pool.begin(), pool.begin() + ndim);
  if (rng.chance(0.3)) {
    for (int d = 0; d < devices; ++d) c.device_ids.push_back(d);
    rng.shuffle(c.device_ids);
  }
  const int rank = rng.below(5);
  c.shape = random_shape(rng, rank, c.mesh_shape);
  c.s1 = random_spec(rng, c.axes, rank);
  c.s2 = c.s1;
  if (!rng.chance(0.1))  // else the same spec on purpose; otherwise mostly a different one
    for (int tries = 0; tries < 3 && c.s2 == c.s1; ++tries) c.s2 = random_spec(rng, c.axes, rank);

  // y: a trailing part of x's shape with some dims 1, and where x has 1 sometimes a larger
  // dim (then neither operand may have the result's shape).
  const int yrank = rng.chance(0.4) ? rank : rng.below(rank + 1);
  for (int d = rank - yrank; d < rank; ++d) {
    std::int64_t v = c.shape[static_cast<std::size_t>(d)];
    if (rng.chance(0.25))
      v = 1;
    else if (v == 1 && rng.chance(0.5))
      v = random_dim(rng, c.mesh_shape);
    c.yshape.push_back(v);
  }
  c.sy = random_spec(rng, c.axes, yrank);
  c.y_first = rng.chance(0.3);
  c.op1 = rng.below(2);
  c.op2 = rng.below(3);

  for (int d = 0; d < rank; ++d)
    if (rng.chance(0.5)) c.sum_dims.push_back(rng.chance(0.3) ? d - rank : d);
  if (rank > 0) {
    std::vector<int> dims;
    for (int d = 0; d < rank; ++d)
      if (rng.chance(0.5)) dims.push_back(d);
    if (dims.empty()) dims.push_back(rng.below(rank));
    c.do_max = std::all_of(dims.begin(), dims.end(),
                           [&](int d) { return c.shape[static_cast<std::size_t>(d)] > 0; });
    if (c.do_max) c.max_dims = dims;
    c.argmax_dim = rng.below(rank);
    c.do_argmax = c.shape[static_cast<std::size_t>(c.argmax_dim)] > 0;
    if (rng.chance(0.3)) c.argmax_dim -= rank;
  }

  c.m = random_dim(rng, c.mesh_shape);
  c.k = random_dim(rng, c.mesh_shape);
  c.n = random_dim(rng, c.mesh_shape);
  c.sa = random_spec(rng, c.axes, 2);
  c.sb = random_spec(rng, c.axes, 2);
  if (ndim >= 2 && rng.chance(0.3)) {  // a 2-D block layout on both: Cannon (p == q) or SUMMA
    std::vector<std::string> two = c.axes;
    rng.shuffle(two);
    c.sa = c.sb = P(two[0], two[1]);
  }
  if (rng.chance(0.3)) c.sout = random_spec(rng, c.axes, 2);
  c.edges = rng.chance(0.3);
  return c;
}

// ---------------------------------------------------------------- host references

/// A random array with, in edge cases, one to three edge values at random places: nan, +inf
/// or -inf for floats, MIN, MAX, -1 or 0 for integers (then sums and products wrap).
template <typename T>
Tensor<T> operand(const Shape& shape, std::uint64_t seed, bool edges) {
  Tensor<T> t = random_tensor<T>(shape, seed);
  if (!edges || t.size() == 0) return t;
  std::mt19937_64 g(seed ^ 0xED6E5ULL);
  const int count = 1 + static_cast<int>(g() % 3);
  for (int i = 0; i < count; ++i) {
    const auto at = static_cast<std::int64_t>(g() % static_cast<std::uint64_t>(t.size()));
    const int which = static_cast<int>(g() % 4);
    if constexpr (std::is_floating_point_v<T>) {
      const T v[] = {std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::infinity(),
                     -std::numeric_limits<T>::infinity(), std::numeric_limits<T>::quiet_NaN()};
      t.flat(at) = v[which];
    } else {
      const T v[] = {std::numeric_limits<T>::min(), std::numeric_limits<T>::max(), T(-1), T(0)};
      t.flat(at) = v[which];
    }
  }
  return t;
}

/// numpy's integer arithmetic (two's complement, wrapping) written out on the unsigned type;
/// floats as IEEE's.
template <typename T>
T wrap_add(T a, T b) {
  if constexpr (std::is_integral_v<T>)
    return static_cast<T>(static_cast<std::make_unsigned_t<T>>(a) + static_cast<std::make_unsigned_t<T>>(b));
  else
    return a + b;
}
template <typename T>
T wrap_sub(T a, T b) {
  if constexpr (std::is_integral_v<T>)
    return static_cast<T>(static_cast<std::make_unsigned_t<T>>(a) - static_cast<std::make_unsigned_t<T>>(b));
  else
    return a - b;
}
template <typename T>
T wrap_mul(T a, T b) {
  if constexpr (std::is_integral_v<T>)
    return static_cast<T>(static_cast<std::uint64_t>(static_cast<std::int64_t>(a)) *
                          static_cast<std::uint64_t>(static_cast<std::int64_t>(b)));
  else
    return a * b;
}
/// numpy's maximum / minimum: a nan on either side is the result.
template <typename T>
T nan_max(T a, T b) {
  if (a != a) return a;
  if (b != b) return b;
  return a > b ? a : b;
}
template <typename T>
T nan_min(T a, T b) {
  if (a != a) return a;
  if (b != b) return b;
  return a < b ? a : b;
}

template <typename T, typename F>
Tensor<T> host_zip(const Tensor<T>& a, const Tensor<T>& b, F f) {
  const Shape out = host_broadcast(a.shape(), b.shape());
  Tensor<T> r(out);
  Shape idx(out.size(), 0);
  for (std::int64_t i = 0; i < r.size(); ++i, next_index(idx, out))
    r.flat(i) = f(a.flat(broadcast_offset(a.shape(), idx)), b.flat(broadcast_offset(b.shape(), idx)));
  return r;
}

std::vector<int> canonical(std::vector<int> dims, int rank) {
  if (dims.empty())
    for (int d = 0; d < rank; ++d) dims.push_back(d);
  for (auto& d : dims) d = d < 0 ? d + rank : d;
  return dims;
}

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

/// Sum (long double accumulation) or max over `dims`.
template <typename T>
Tensor<T> host_reduce(const Tensor<T>& x, const std::vector<int>& dims_in, bool is_max) {
  const auto dims = canonical(dims_in, x.rank());
  Shape out;
  for (int d = 0; d < x.rank(); ++d)
    if (!contains(dims, d)) out.push_back(x.shape()[d]);
  std::vector<long double> sum(static_cast<std::size_t>(num_elements(out)), 0);
  std::vector<T> wrapped(sum.size(), T(0));  // integers: the sum as numpy's, wrapping
  std::vector<T> mx(sum.size(), std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity()
                                                                     : std::numeric_limits<T>::lowest());
  Shape idx(x.shape().size(), 0);
  for (std::int64_t i = 0; i < x.size(); ++i, next_index(idx, x.shape())) {
    std::int64_t o = 0;
    for (int d = 0, k = 0; d < x.rank(); ++d)
      if (!contains(dims, d)) o = o * out[k++] + idx[d];
    sum[o] += x.flat(i);
    wrapped[o] = wrap_add(wrapped[o], x.flat(i));
    mx[o] = nan_max(mx[o], x.flat(i));
  }
  Tensor<T> r(out);
  for (std::int64_t o = 0; o < r.size(); ++o)
    r.flat(o) = is_max ? mx[o] : std::is_integral_v<T> ? wrapped[o] : static_cast<T>(sum[o]);
  return r;
}

template <typename T>
Tensor<T> host_matmul(const Tensor<T>& a, const Tensor<T>& b) {
  const std::int64_t m = a.shape()[0], k = a.shape()[1], n = b.shape()[1];
  Tensor<T> c({m, n});
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      long double acc = 0;
      T wrapped = 0;  // integers wrap, as numpy's
      for (std::int64_t l = 0; l < k; ++l) {
        acc += static_cast<long double>(a.flat(i * k + l)) * b.flat(l * n + j);
        wrapped = wrap_add(wrapped, wrap_mul(a.flat(i * k + l), b.flat(l * n + j)));
      }
      c.flat(i * n + j) = std::is_integral_v<T> ? wrapped : static_cast<T>(acc);
    }
  return c;
}

/// The spec without the given (canonical) dims: what reductions document for their result.
PartitionSpec drop_dims(const PartitionSpec& s, int rank, const std::vector<int>& dims) {
  std::vector<SpecEntry> e;
  for (int d = 0; d < rank; ++d)
    if (!contains(dims, d)) e.push_back(s[d]);
  return PartitionSpec(e);
}

/// The layout ops.hpp documents for an operand: the result's spec on its non-broadcast dims,
/// None on its broadcast (size-1 or missing) dims.
PartitionSpec matching_spec(const PartitionSpec& out, const Shape& out_shape, const Shape& shape) {
  const std::size_t lead = out_shape.size() - shape.size();
  std::vector<SpecEntry> e;
  for (std::size_t k = 0; k < shape.size(); ++k)
    e.push_back(shape[k] != out_shape[k + lead] ? SpecEntry() : out[static_cast<int>(k + lead)]);
  return PartitionSpec(e);
}

// ---------------------------------------------------------------- checks

/// Absolute tolerance (0: exact).
template <typename T>
bool close(T got, T want, double atol) {
  if (want != want) return got != got;  // nan where numpy gives nan
  if (atol == 0 || std::isinf(static_cast<double>(want))) return got == want;
  return std::abs(static_cast<double>(got) - static_cast<double>(want)) <= atol;
}

template <typename T>
double eps() {
  return std::is_floating_point_v<T> ? static_cast<double>(std::numeric_limits<T>::epsilon()) : 0.0;
}

/// Every local shard of `r`: device, box (from reference_box of r's spec), data against the
/// host reference; and the spec when `spec` is given. Appends problems to `err`. Local.
template <typename T>
void check_shards(const ShardedArray<T>& r, const Mesh& mesh, const Tensor<T>& want,
                  const PartitionSpec* spec, double atol, const std::string& what, std::ostream& err) {
  if (!(r.mesh() == mesh)) err << "\n  " << what << ": result on mesh " << r.mesh().devices_string();
  if (spec && !(r.spec() == *spec))
    err << "\n  " << what << ": spec " << r.spec().to_string() << ", want " << spec->to_string();
  if (r.shape() != want.shape()) {
    err << "\n  " << what << ": shape " << to_string(r.shape()) << ", want " << to_string(want.shape());
    return;
  }
  const auto local = mesh.local_device_ids();
  if (r.addressable_shards().size() != local.size()) {
    err << "\n  " << what << ": " << r.addressable_shards().size() << " shards for " << local.size()
        << " local devices";
    return;
  }
  for (std::size_t i = 0; i < local.size(); ++i) {
    const auto& s = r.addressable_shards()[i];
    const Box ref = reference_box(mesh, r.spec(), want.shape(), local[i]);
    if (s.device != local[i] || s.box != ref || s.data.shape() != ref.extent) {
      err << "\n  " << what << ": shard " << i << " is device " << s.device << " box " << to_string(s.box)
          << " data " << to_string(s.data.shape()) << ", want device " << local[i] << " box "
          << to_string(ref);
      continue;
    }
    const auto v = reference_slice(want, ref);
    for (std::size_t e = 0; e < v.size(); ++e)
      if (!close(s.data.flat(static_cast<std::int64_t>(e)), v[e], atol)) {
        err << "\n  " << what << ": device " << local[i] << " box " << to_string(ref) << " element " << e
            << ": got " << std::setprecision(17) << +s.data.flat(static_cast<std::int64_t>(e)) << ", want "
            << +v[e] << " (tolerance " << atol << ")";
        break;
      }
  }
}

/// What this rank saw while running one step.
struct Sent {
  std::int64_t calls = 0, bytes = 0;
};

struct Stats {
  std::map<Kind, int> kinds;
  std::map<std::string, int> matmuls;  // by the algorithm matmul picks
  int failed = 0;
  std::int64_t checks = 0;
};

const char* kind_name(Kind k) {
  static const char* kNames[] = {"none", "local", "all_gather", "all_to_all", "general"};
  return kNames[static_cast<int>(k)];
}

/// Runs `fn` (which calls collectives), recording an exception in `err`; returns true when
/// no rank threw (all ranks agree, so they keep making the same MPI calls).
template <typename F>
bool step(const std::string& what, F&& fn, std::ostream& err) {
  bool threw = false;
  try {
    fn();
  } catch (const std::exception& e) {
    threw = true;
    err << "\n  " << what << " threw: " << e.what();
  }
  if (runtime().world().any(threw)) {
    if (!threw) err << "\n  " << what << " threw on another rank";
    return false;
  }
  return true;
}

/// reshard with the plan and CommStats checked: the bytes this rank sent equal the plan's.
template <typename T>
std::optional<ShardedArray<T>> checked_reshard(const ShardedArray<T>& x, const NamedSharding& to,
                                               const std::string& what, Stats& stats, std::ostream& err) {
  const int me = runtime().process_index();
  std::optional<ShardedArray<T>> y;
  ReshardPlan plan;
  Sent sent;
  if (!step(
          what,
          [&] {
            plan = reshard_plan(x, to);
            comm_stats().reset();
            y.emplace(reshard(x, to));
            sent = {comm_stats().total().calls, comm_stats().total().bytes};
          },
          err))
    return std::nullopt;
  ++stats.kinds[plan.kind];
  stats.checks += 2;
  if (plan.bytes_sent.size() != static_cast<std::size_t>(runtime().process_count()) ||
      sent.bytes != plan.bytes_sent[static_cast<std::size_t>(me)])
    err << "\n  " << what << ": CommStats saw " << sent.bytes << " B sent by rank " << me
        << ", reshard_plan says "
        << (plan.bytes_sent.size() > static_cast<std::size_t>(me) ? plan.bytes_sent[me] : -1) << " B ("
        << plan.to_string() << ")\n"
        << comm_stats().to_string();
  if ((plan.kind == Kind::kNone || plan.kind == Kind::kLocal) && sent.calls != 0)
    err << "\n  " << what << ": " << sent.calls << " MPI calls for a " << kind_name(plan.kind) << " plan";
  if (!(y->sharding() == to)) err << "\n  " << what << ": sharding " << y->sharding().to_string();
  return y;
}

template <typename T>
void run_case(const Case& c, const Mesh& mesh, Stats& stats, std::ostream& err) {
  const int me = runtime().process_index();
  const int rank = static_cast<int>(c.shape.size());
  const double e = eps<T>();
  std::uint64_t seed = c.data_seed;
  const Tensor<T> hx = operand<T>(c.shape, seed++, c.edges);
  const NamedSharding s1(mesh, c.s1), s2(mesh, c.s2);
  std::optional<ShardedArray<T>> x;
  if (!step(
          "device_put(x, " + c.s1.to_string() + ")", [&] { x.emplace(device_put(hx, s1)); }, err))
    return;
  check_shards(*x, mesh, hx, &c.s1, 0, "device_put x", err);

  // 1 + 2. reshard there and back: the identity, with the bytes the plans predict.
  {
    auto y = checked_reshard(*x, s2, "reshard " + c.s1.to_string() + " -> " + c.s2.to_string(), stats, err);
    if (!y) return;
    check_shards(*y, mesh, hx, &c.s2, 0, "reshard to s2", err);
    std::optional<Tensor<T>> host;
    if (!step(
            "to_host", [&] { host.emplace(y->to_host()); }, err))
      return;
    if (!(*host == hx)) err << "\n  to_host() of the resharded array differs from the host array";
    auto z =
        checked_reshard(*y, s1, "reshard back " + c.s2.to_string() + " -> " + c.s1.to_string(), stats, err);
    if (!z) return;
    check_shards(*z, mesh, hx, &c.s1, 0, "reshard there and back", err);
    stats.checks += 2;
  }

  // 3a. Binary ops with broadcasting; the second operand's reshard costs what its plan says.
  {
    const Tensor<T> hy = operand<T>(c.yshape, seed++, c.edges);
    const NamedSharding sy(mesh, c.sy);
    std::optional<ShardedArray<T>> y;
    if (!step(
            "device_put(y, " + c.sy.to_string() + ")", [&] { y.emplace(device_put(hy, sy)); }, err))
      return;
    const Shape out = host_broadcast(c.shape, c.yshape);
    const ShardedArray<T>& a = c.y_first ? *y : *x;
    const ShardedArray<T>& b = c.y_first ? *x : *y;
    const Tensor<T>& ha = c.y_first ? hy : hx;
    const Tensor<T>& hb = c.y_first ? hx : hy;
    // The documented rule: the result takes the sharding of the first operand with its shape.
    std::optional<PartitionSpec> want_spec;
    if (a.shape() == out)
      want_spec = a.spec();
    else if (b.shape() == out)
      want_spec = b.spec();
    std::int64_t want_bytes = -1;
    if (want_spec) {
      want_bytes = 0;
      for (const ShardedArray<T>* o : {&a, &b}) {
        const NamedSharding target(mesh, matching_spec(*want_spec, out, o->shape()));
        if (!(o->sharding() == target))
          want_bytes += reshard_plan(*o, target).bytes_sent[static_cast<std::size_t>(me)];
      }
    }
    using Op = std::function<ShardedArray<T>(const ShardedArray<T>&, const ShardedArray<T>&)>;
    using Ref = std::function<T(T, T)>;
    const std::pair<const char*, std::pair<Op, Ref>> first[] = {
        {"+", {[](auto& p, auto& q) { return p + q; }, [](T p, T q) { return wrap_add(p, q); }}},
        {"-", {[](auto& p, auto& q) { return p - q; }, [](T p, T q) { return wrap_sub(p, q); }}},
    };
    const std::pair<const char*, std::pair<Op, Ref>> second[] = {
        {"*", {[](auto& p, auto& q) { return p * q; }, [](T p, T q) { return wrap_mul(p, q); }}},
        {"maximum", {[](auto& p, auto& q) { return maximum(p, q); }, [](T p, T q) { return nan_max(p, q); }}},
        {"minimum", {[](auto& p, auto& q) { return minimum(p, q); }, [](T p, T q) { return nan_min(p, q); }}},
    };
    for (const auto& [name, fns] : {first[c.op1], second[c.op2]}) {
      const std::string what = std::string("a ") + name + " b";
      std::optional<ShardedArray<T>> r;
      Sent sent;
      if (!step(
              what,
              [&] {
                comm_stats().reset();
                r.emplace(fns.first(a, b));
                sent = {comm_stats().total().calls, comm_stats().total().bytes};
              },
              err))
        return;
      check_shards(*r, mesh, host_zip(ha, hb, fns.second), want_spec ? &*want_spec : nullptr, 0, what, err);
      if (want_bytes >= 0 && sent.bytes != want_bytes)
        err << "\n  " << what << ": CommStats saw " << sent.bytes << " B, reshard_plan of the operand says "
            << want_bytes << " B\n"
            << comm_stats().to_string();
      stats.checks += 2;
    }
  }

  // 3b. A unary map (local): exp(x / 16) for floats (no overflow), abs for integers.
  {
    std::optional<ShardedArray<T>> r;
    if (!step(
            "unary",
            [&] {
              if constexpr (std::is_floating_point_v<T>)
                r.emplace(exp(*x * static_cast<T>(0.0625)));
              else
                r.emplace(abs(*x));
            },
            err))
      return;
    Tensor<T> want(hx.shape());
    for (std::int64_t i = 0; i < hx.size(); ++i) {
      if constexpr (std::is_floating_point_v<T>)
        want.flat(i) = std::exp(static_cast<T>(hx.flat(i) * static_cast<T>(0.0625)));
      else
        want.flat(i) = hx.flat(i) < 0 ? wrap_sub(T(0), hx.flat(i)) : hx.flat(i);  // abs(MIN) is MIN
    }
    double atol = 0;
    if constexpr (std::is_floating_point_v<T>)
      atol = 4 * e * std::exp(100.0 / 16);  // a few ulp of the largest
    check_shards(*r, mesh, want, &c.s1, atol, std::is_floating_point_v<T> ? "exp(x / 16)" : "abs(x)", err);
    ++stats.checks;
  }

  // 3c. Reductions: sum over random dims (all when none), max, argmax.
  {
    const auto dims = canonical(c.sum_dims, rank);
    std::int64_t count = 1;
    for (int d : dims) count *= c.shape[static_cast<std::size_t>(d)];
    std::optional<ShardedArray<T>> r;
    if (!step(
            "sum", [&] { r.emplace(sum(*x, c.sum_dims)); }, err))
      return;
    const PartitionSpec want_spec = drop_dims(c.s1, rank, dims);
    // Each of the `count` terms is at most 100 in magnitude; float order of summation differs.
    const double atol = 4 * e * 100.0 * static_cast<double>(count) + 4 * e;
    check_shards(*r, mesh, host_reduce(hx, c.sum_dims, false), &want_spec, atol,
                 "sum over [" + join(c.sum_dims, ",") + "]", err);
    ++stats.checks;
  }
  if (c.do_max) {
    std::optional<ShardedArray<T>> r;
    if (!step(
            "max", [&] { r.emplace(max(*x, c.max_dims)); }, err))
      return;
    const PartitionSpec want_spec = drop_dims(c.s1, rank, c.max_dims);
    check_shards(*r, mesh, host_reduce(hx, c.max_dims, true), &want_spec, 0,
                 "max over [" + join(c.max_dims, ",") + "]", err);
    ++stats.checks;
  }
  if (c.do_argmax) {
    std::optional<ShardedArray<std::int64_t>> r;
    if (!step(
            "argmax", [&] { r.emplace(argmax(*x, c.argmax_dim)); }, err))
      return;
    const int d = c.argmax_dim < 0 ? c.argmax_dim + rank : c.argmax_dim;
    const PartitionSpec want_spec = drop_dims(c.s1, rank, {d});
    check_shards(*r, mesh, host_argmax(hx, c.argmax_dim), &want_spec, 0,
                 "argmax dim " + std::to_string(c.argmax_dim), err);
    ++stats.checks;
  }

  // 3d. matmul of random 2-D layouts (and sometimes a requested output sharding).
  {
    const Tensor<T> ha = operand<T>({c.m, c.k}, seed++, c.edges);
    const Tensor<T> hb = operand<T>({c.k, c.n}, seed++, c.edges);
    std::optional<ShardedArray<T>> a, b, r;
    std::optional<NamedSharding> out;
    if (c.sout) out.emplace(mesh, *c.sout);
    if (!step(
            "matmul",
            [&] {
              a.emplace(device_put(ha, NamedSharding(mesh, c.sa)));
              b.emplace(device_put(hb, NamedSharding(mesh, c.sb)));
              r.emplace(matmul(*a, *b, out ? &*out : nullptr));
            },
            err))
      return;
    Algorithm alg = choose_algorithm(a->shape(), a->sharding(), b->shape(), b->sharding());
    if (!std::is_floating_point_v<T>) alg = Algorithm::kRules;
    ++stats.matmuls[algorithm_name(alg)];
    const double atol = 4 * e * 100.0 * 100.0 * static_cast<double>(c.k) + 4 * e;
    check_shards(*r, mesh, host_matmul(ha, hb), c.sout ? &*c.sout : nullptr, atol, "matmul", err);
    ++stats.checks;
  }
}

SHARD_MPI_TEST(Properties, RandomMeshesShapesAndSpecs) {
  const Config cfg = config();
  const int devices = runtime().device_count();
  const bool root = runtime().process_index() == 0;
  if (root) {
    std::printf(
        "[ property ] seed %llu (replay with SHARD_PROPERTY_SEED=%llu), %d cases on %d devices (%d ranks x "
        "%d)\n",
        static_cast<unsigned long long>(cfg.seed), static_cast<unsigned long long>(cfg.seed),
        cfg.only >= 0 ? 1 : cfg.cases, devices, runtime().process_count(), runtime().devices_per_rank());
    std::fflush(stdout);
  }
  const double t0 = MPI_Wtime();
  Stats stats;
  int run = 0;
  std::map<int, int> by_mesh_ndim;
  constexpr int kReported = 10;  // full messages for the first failures; the rest are counted
  for (int i = 0; i < cfg.cases || (cfg.only >= 0 && i <= cfg.only); ++i) {
    if (cfg.only >= 0 && i != cfg.only) continue;
    const Case c = generate_case(cfg.seed, i, devices);
    if (cfg.verbose && root) {
      std::printf("[ property ] %s\n", c.describe(cfg.seed).c_str());
      std::fflush(stdout);
    }
    std::ostringstream err;
    std::optional<Mesh> mesh;
    try {
      if (c.device_ids.empty())
        mesh.emplace(make_mesh(c.mesh_shape, c.axes));
      else
        mesh.emplace(c.mesh_shape, c.axes, c.device_ids);
    } catch (const std::exception& e) {
      err << "\n  mesh threw: " << e.what();
    }
    if (mesh) {
      ++by_mesh_ndim[mesh->ndim()];
      switch (c.dtype) {
        case 0:
          run_case<float>(c, *mesh, stats, err);
          break;
        case 1:
          run_case<double>(c, *mesh, stats, err);
          break;
        case 2:
          run_case<std::int32_t>(c, *mesh, stats, err);
          break;
        default:
          run_case<std::int64_t>(c, *mesh, stats, err);
          break;
      }
    }
    ++run;
    if (!err.str().empty() && stats.failed++ < kReported) ADD_FAILURE() << c.describe(cfg.seed) << err.str();
  }
  if (stats.failed > kReported)
    ADD_FAILURE() << "seed " << cfg.seed << ": " << stats.failed - kReported
                  << " more failing cases on this rank";
  if (root) {
    std::printf(
        "[ property ] seed %llu: %d cases (%d on 1-D, %d on 2-D, %d on 3-D meshes), %lld checks, %.2f s;"
        " reshard plans:",
        static_cast<unsigned long long>(cfg.seed), run, by_mesh_ndim[1], by_mesh_ndim[2], by_mesh_ndim[3],
        static_cast<long long>(stats.checks), MPI_Wtime() - t0);
    for (const auto& [k, n] : stats.kinds) std::printf(" %s %d", kind_name(k), n);
    std::printf("; matmul:");
    for (const auto& [k, n] : stats.matmuls) std::printf(" %s %d", k.c_str(), n);
    std::printf("; %d failing cases on rank 0\n", stats.failed);
    std::fflush(stdout);
  }
}

}  // namespace
}  // namespace shard::testing
