// ops_bench: the op set's speed on sharded arrays against the machine's bandwidth, in one run.
// For float32 and float64 (x, y 1-D, P('a') over all devices):
//   triad     STREAM's a[i] = b[i] + s*c[i] on local arrays of the same per-rank size: the
//             bandwidth baseline for elementwise ops (3 words per element);
//   read      a loop that only reads the array (8 independent partial sums): the baseline for
//             reductions (1 word per element);
//   naive     a sequential sum loop in the array's type (numpy's "naive" summation);
//   each op   x + y, x - y, x * y, x / y, maximum, x < y, where, x * 2, neg, abs, square,
//             relu, astype, sqrt, exp, log, tanh, sin, sigmoid, erf and sum, counting the words
//             each one reads and writes (STREAM's way), so the ratios are ratios of bandwidth;
//   overhead  the time of one op on 16-element arrays (sharded and local), per call.
// Ops marked memory-bound should reach 0.75 of the triad's bandwidth (sum 0.75 of the read
// loop's); the transcendental ones are limited by libm's scalar arithmetic and are shown for
// information. The baselines are compiled like the library's loops (an AVX2 clone chosen at
// load time where the CPU has it). Repetitions interleave every kernel (the order rotates), medians of the
// slowest rank per repetition.
//
//   mpirun -n 2 --bind-to core ops_bench
//   mpirun -n 2 ops_bench --n 4194304 --repeats 5 --json

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "common/bench.hpp"
#include "common/cli.hpp"
#include "shard/shard.hpp"

namespace {

using shard::ShardedArray;
using shard::Tensor;

volatile double g_sink = 0;

// The baselines get the same AVX2 clone as the library's elementwise loops (tensor_elementwise.cpp),
// so ops and baselines run with the same instruction set.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define BENCH_SIMD_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define BENCH_SIMD_CLONES
#endif

template <typename T>
[[gnu::noinline]] BENCH_SIMD_CLONES void triad(std::int64_t n, T* __restrict a, const T* __restrict b, const T* __restrict c, T s) {
  for (std::int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

/// Reads every element once (8 lanes, vectorisable): the read-bandwidth baseline.
template <typename T>
[[gnu::noinline]] BENCH_SIMD_CLONES T read_all(std::int64_t n, const T* __restrict a) {
  T r[8] = {};
  const std::int64_t m = n - n % 8;
  for (std::int64_t i = 0; i < m; i += 8)
    for (int j = 0; j < 8; ++j) r[j] += a[i + j];
  T s = 0;
  for (int j = 0; j < 8; ++j) s += r[j];
  for (std::int64_t i = m; i < n; ++i) s += a[i];
  return s;
}

/// numpy's naive summation: one running sum in the array's type.
template <typename T>
[[gnu::noinline]] T naive_sum(std::int64_t n, const T* __restrict a) {
  T s = 0;
  for (std::int64_t i = 0; i < n; ++i) s += a[i];
  return s;
}

struct Kernel {
  std::string name;
  double words;            // words of T read and written per element (bool counts 1/sizeof(T))
  std::string baseline;    // "triad" or "read": what it is compared with
  bool memory_bound;       // the 0.75 goal applies
  std::function<double()> run;  // one call; returns a value to keep the result observable
  std::vector<double> times;
};

template <typename T>
double first(const ShardedArray<T>& a) {
  const auto& s = a.addressable_shards();
  return !s.empty() && s[0].data.size() > 0 ? static_cast<double>(s[0].data.flat(0)) : 0.0;
}

struct Row {
  std::string dtype, kernel, baseline;
  bool memory_bound = false;
  double median_ms = 0, gbps = 0, ratio = 0, paired = 0;
};

template <typename T>
std::vector<Row> bench(shard::Runtime& rt, std::int64_t n, int repeats, std::vector<double>& overhead_us) {
  MPI_Comm world = rt.world().get();
  const shard::Mesh mesh = shard::make_mesh({rt.device_count()}, {"a"});
  const shard::NamedSharding s(mesh, shard::P("a"));
  const auto x = shard::random::uniform<T>(shard::random::key(1), {n}, s, T(0.5), T(2));
  const auto y = shard::random::uniform<T>(shard::random::key(2), {n}, s, T(0.5), T(2));
  const auto c = x < y;
  std::int64_t local = 0;
  for (const auto& sh : x.addressable_shards()) local += sh.data.size();
  std::int64_t total = local;
  MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_INT64_T, MPI_SUM, world);
  // The triad reads the very shards the ops read (x, y) and writes a Tensor like their outputs.
  Tensor<T> ta({local}, T(0));
  const T* tb = x.addressable_shards().empty() ? nullptr : x.addressable_shards()[0].data.data();
  const T* tc = y.addressable_shards().empty() ? nullptr : y.addressable_shards()[0].data.data();
  if (x.addressable_shards().size() != 1) shard::raise<shard::ValueError>("ops_bench runs one device per rank");
  const double b1 = 1.0 / sizeof(T);  // one bool in words of T
  const T* x0 = x.addressable_shards().empty() ? nullptr : x.addressable_shards()[0].data.data();
  const std::int64_t x0n = x.addressable_shards().empty() ? 0 : x.addressable_shards()[0].data.size();
  std::vector<Kernel> ks = {
      {"triad", 3, "triad", false, [&] { triad(local, ta.data(), tb, tc, T(3)); return double(ta.flat(0)); }, {}},
      {"read", 1, "read", false, [&] { return double(read_all(x0n, x0)); }, {}},
      {"naive sum", 1, "read", false, [&] { return double(naive_sum(x0n, x0)); }, {}},
      {"x + y", 3, "triad", true, [&] { return first(x + y); }, {}},
      {"x - y", 3, "triad", true, [&] { return first(x - y); }, {}},
      {"x * y", 3, "triad", true, [&] { return first(x * y); }, {}},
      {"x / y", 3, "triad", true, [&] { return first(x / y); }, {}},
      {"maximum", 3, "triad", true, [&] { return first(shard::maximum(x, y)); }, {}},
      {"x < y", 2 + b1, "triad", true, [&] { return first(x < y); }, {}},
      {"where", 3 + b1, "triad", true, [&] { return first(shard::where(c, x, y)); }, {}},
      {"x * 2", 2, "triad", true, [&] { return first(x * T(2)); }, {}},
      {"neg", 2, "triad", true, [&] { return first(-x); }, {}},
      {"abs", 2, "triad", true, [&] { return first(shard::abs(x)); }, {}},
      {"square", 2, "triad", true, [&] { return first(shard::square(x)); }, {}},
      {"relu", 2, "triad", true, [&] { return first(shard::relu(x)); }, {}},
      {"astype", 1 + (sizeof(T) == 4 ? 2.0 : 0.5), "triad", true,
       [&] { return first(shard::astype<std::conditional_t<sizeof(T) == 4, double, float>>(x)); }, {}},
      {"sqrt", 2, "triad", true, [&] { return first(shard::sqrt(x)); }, {}},
      {"exp", 2, "triad", false, [&] { return first(shard::exp(x)); }, {}},
      {"log", 2, "triad", false, [&] { return first(shard::log(x)); }, {}},
      {"tanh", 2, "triad", false, [&] { return first(shard::tanh(x)); }, {}},
      {"sin", 2, "triad", false, [&] { return first(shard::sin(x)); }, {}},
      {"sigmoid", 2, "triad", false, [&] { return first(shard::sigmoid(x)); }, {}},
      {"erf", 2, "triad", false, [&] { return first(shard::erf(x)); }, {}},
      {"sum", 1, "read", true, [&] { return first(shard::sum(x)); }, {}},
  };
  double sink = 0;
  auto run = [&](Kernel& k, bool timed) {
    MPI_Barrier(world);
    const double t0 = MPI_Wtime();
    sink += k.run();
    const double t = MPI_Wtime() - t0;
    if (timed) k.times.push_back(t);
  };
  for (auto& k : ks) run(k, false);  // warm-up: first touches and buffer sizes
  for (int r = 0; r < repeats; ++r)
    for (std::size_t i = 0; i < ks.size(); ++i) run(ks[(i + static_cast<std::size_t>(r)) % ks.size()], true);
  for (auto& k : ks)
    MPI_Allreduce(MPI_IN_PLACE, k.times.data(), static_cast<int>(k.times.size()), MPI_DOUBLE, MPI_MAX, world);

  auto find = [&](const std::string& name) -> const Kernel& {
    return *std::find_if(ks.begin(), ks.end(), [&](const Kernel& k) { return k.name == name; });
  };
  std::vector<Row> rows;
  for (const auto& k : ks) {
    const Kernel& base = find(k.baseline);
    Row row;
    row.dtype = shard::dtype_name<T>();
    row.kernel = k.name;
    row.baseline = k.baseline;
    row.memory_bound = k.memory_bound;
    row.median_ms = shard::apps::median(k.times) * 1e3;
    row.gbps = k.words * sizeof(T) * static_cast<double>(total) / (row.median_ms * 1e-3) / 1e9;
    const double base_gbps = base.words * sizeof(T) * static_cast<double>(total) / shard::apps::median(base.times) / 1e9;
    row.ratio = row.gbps / base_gbps;
    std::vector<double> p;
    for (int r = 0; r < repeats; ++r) p.push_back(base.times[r] / base.words / (k.times[r] / k.words));
    row.paired = shard::apps::median(p);
    rows.push_back(row);
  }

  // Per-op overhead on 16-element arrays: the median over batches of 2000 calls.
  const auto sx = shard::random::uniform<T>(shard::random::key(3), {16}, s), sy = shard::random::uniform<T>(shard::random::key(4), {16}, s);
  const Tensor<T> lx = sx.to_host(), ly = sy.to_host();
  const std::vector<std::pair<std::string, std::function<double()>>> small = {
      {"sharded x + y", [&] { return first(sx + sy); }},
      {"sharded exp(x)", [&] { return first(shard::exp(sx)); }},
      {"sharded x * 2", [&] { return first(sx * T(2)); }},
      {"Tensor x + y", [&] { return static_cast<double>((lx + ly).flat(0)); }},
  };
  for (const auto& [name, f] : small) {
    std::vector<double> per;
    for (int b = 0; b < 15; ++b) {
      MPI_Barrier(world);
      const double t0 = MPI_Wtime();
      for (int i = 0; i < 2000; ++i) sink += f();
      per.push_back((MPI_Wtime() - t0) / 2000 * 1e6);
    }
    double m = shard::apps::median(per);
    MPI_Allreduce(MPI_IN_PLACE, &m, 1, MPI_DOUBLE, MPI_MAX, world);
    overhead_us.push_back(m);
  }
  g_sink = sink;
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  return shard::apps::run_app(argc, argv, [&](shard::Runtime& rt) {
    namespace po = shard::apps::po;
    std::int64_t n = std::int64_t{1} << 26;
    int repeats = 10;
    std::string dtypes = "float32,float64";
    po::options_description options("ops_bench options");
    shard::apps::add_common_options(options);
    options.add_options()("n", po::value(&n)->default_value(n), "global number of elements in x and y")(
        "repeats", po::value(&repeats)->default_value(repeats), "timed repetitions of each kernel")(
        "dtype", po::value(&dtypes)->default_value(dtypes), "float32, float64 or both (comma-separated)")(
        "json", "one JSON object per row instead of the table");
    po::variables_map vm;
    if (!shard::apps::parse_command_line(argc, argv, options, vm, rt,
                                         "Usage: mpirun -n N ops_bench [options]\n"
                                         "Times the op set on sharded arrays against STREAM's triad and a read loop."))
      return 0;
    shard::apps::check_at_least("n", n, 1);
    shard::apps::check_at_least("repeats", repeats, 1);
    std::vector<std::string> types;
    std::stringstream ss(dtypes);
    for (std::string t; std::getline(ss, t, ',');) {
      shard::apps::check_choice("dtype", t, {"float32", "float64"});
      types.push_back(t);
    }
    std::ostringstream os;
    const bool json = vm.count("json") > 0;
    if (!json)
      os << "ops_bench: " << rt.process_count() << " ranks x " << rt.devices_per_rank() << " devices, x and y (" << n
         << ",) P('a'), " << repeats << " repetitions; " << shard::blas_summary()
         << "\nGB/s counts the words each op reads and writes (STREAM's way), all ranks together; ratio = GB/s over the "
            "baseline's\n(triad for elementwise ops, the read loop for sums); paired = median of per-repetition ratios; "
            "goal 0.75 for memory-bound ops\n";
    for (const auto& t : types) {
      std::vector<double> overhead;
      const auto rows = t == "float32" ? bench<float>(rt, n, repeats, overhead) : bench<double>(rt, n, repeats, overhead);
      char line[512];
      if (!json) {
        std::snprintf(line, sizeof line, "%-8s %-10s %10s %8s %8s %8s %-6s %s\n", "dtype", "kernel", "median_ms", "GB/s",
                      "ratio", "paired", "vs", "goal");
        os << line;
      }
      for (const auto& r : rows) {
        const std::string goal = r.memory_bound ? (r.paired >= 0.75 ? ">= 0.75 met" : ">= 0.75 NOT met") : "-";
        if (json)
          std::snprintf(line, sizeof line,
                        "{\"dtype\": \"%s\", \"kernel\": \"%s\", \"median_ms\": %.4f, \"GBps\": %.3f, \"ratio\": %.4f, "
                        "\"paired\": %.4f, \"baseline\": \"%s\", \"memory_bound\": %s}\n",
                        r.dtype.c_str(), r.kernel.c_str(), r.median_ms, r.gbps, r.ratio, r.paired, r.baseline.c_str(),
                        r.memory_bound ? "true" : "false");
        else
          std::snprintf(line, sizeof line, "%-8s %-10s %10.3f %8.2f %8.3f %8.3f %-6s %s\n", r.dtype.c_str(),
                        r.kernel.c_str(), r.median_ms, r.gbps, r.ratio, r.paired, r.baseline.c_str(), goal.c_str());
        os << line;
      }
      const double naive = std::find_if(rows.begin(), rows.end(), [](const Row& r) { return r.kernel == "naive sum"; })->median_ms;
      const double pairwise = std::find_if(rows.begin(), rows.end(), [](const Row& r) { return r.kernel == "sum"; })->median_ms;
      const char* names[] = {"sharded x + y", "sharded exp(x)", "sharded x * 2", "Tensor x + y"};
      if (json) {
        std::snprintf(line, sizeof line,
                      "{\"dtype\": \"%s\", \"pairwise_over_naive_sum\": %.4f, \"overhead_us\": {\"%s\": %.3f, \"%s\": "
                      "%.3f, \"%s\": %.3f, \"%s\": %.3f}}\n",
                      t.c_str(), pairwise / naive, names[0], overhead[0], names[1], overhead[1], names[2], overhead[2],
                      names[3], overhead[3]);
        os << line;
      } else {
        std::snprintf(line, sizeof line, "%s: pairwise sum / naive sum time = %.3f (goal <= 1.1: %s)\n", t.c_str(),
                      pairwise / naive, pairwise / naive <= 1.1 ? "met" : "NOT met");
        os << line;
        for (int i = 0; i < 4; ++i) {
          std::snprintf(line, sizeof line, "%s: %s on 16 elements: %.3f us per op%s\n", t.c_str(), names[i],
                        overhead[static_cast<std::size_t>(i)],
                        i < 3 ? (overhead[static_cast<std::size_t>(i)] < 2.0 ? " (goal < 2 us: met)" : " (goal < 2 us: NOT met)") : "");
          os << line;
        }
      }
    }
    shard::apps::print0(rt, os.str());
    return 0;
  });
}
