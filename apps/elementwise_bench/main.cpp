// elementwise_bench: memory bandwidth of elementwise ops on local shards. In one run,
// interleaved (the order rotates every repetition so drift in the machine's speed hits all
// alike), medians over the repetitions, each repetition counting as long as its slowest rank:
//   triad    STREAM's triad a[i] = b[i] + s*c[i], a plain loop over local arrays of the same
//            per-rank size, on every rank at once: the machine's bandwidth baseline;
//   axpy     shard::axpy(alpha, x, y), the fused op (one pass over memory);
//   unfused  alpha * x + y with the operators (two passes and a temporary), for information.
// x and y are 1-D, sharded P('a') on a 1-D mesh over all devices. Every rate counts STREAM's
// way, 3 words per element (read two, write one), so the ratios are ratios of times.
//
//   mpirun -n 2 --bind-to core elementwise_bench
//   mpirun -n 2 elementwise_bench --n 16777216 --repeats 50 --json

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "common/bench.hpp"
#include "common/cli.hpp"
#include "shard/shard.hpp"

namespace {

using shard::ShardedArray;
using shard::Tensor;

constexpr double kAlpha = 3.0;
volatile double g_sink = 0;  // the kernels' results flow here, so none can be optimised away

double x_value(std::int64_t i) { return 1.0 + static_cast<double>(i % 1000) * 1e-3; }
double y_value(std::int64_t i) { return static_cast<double>(i % 777) * 0.5 - 100.0; }

/// STREAM's triad kernel, written as STREAM writes it.
[[gnu::noinline]] void triad(std::int64_t n, double* __restrict a, const double* __restrict b,
                             const double* __restrict c, double s) {
  for (std::int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

ShardedArray<double> filled(const shard::NamedSharding& sharding, std::int64_t n, double (*value)(std::int64_t)) {
  return shard::generate<double>({n}, sharding, [value](const shard::Box& box) {
    Tensor<double> t(box.extent);
    for (std::int64_t i = 0; i < t.size(); ++i) t.flat(i) = value(box.offset[0] + i);
    return t;
  });
}

/// Throws (run_app then ends the job with a non-zero exit) unless r = kAlpha * x + y at a few elements of
/// every local shard, computed from the input shards on this rank.
void verify(const ShardedArray<double>& r, const ShardedArray<double>& x, const ShardedArray<double>& y,
            const char* what) {
  if (!(r.shape() == x.shape()) || !(r.sharding() == x.sharding()))
    shard::raise<shard::RuntimeError>(what, ": result has shape ", shard::to_string(r.shape()), " and spec ",
                                      r.spec().to_string(), ", want x's");
  for (std::size_t s = 0; s < r.addressable_shards().size(); ++s) {
    const auto& rs = r.addressable_shards()[s];
    const auto& xs = x.addressable_shards()[s];
    const auto& ys = y.addressable_shards()[s];
    if (rs.device != xs.device || !(rs.box == xs.box) || rs.data.size() != xs.data.size())
      shard::raise<shard::RuntimeError>(what, ": shard ", s, " does not line up with x's");
    const std::int64_t n = rs.data.size();
    if (n == 0) continue;
    for (std::int64_t k : {std::int64_t{0}, std::int64_t{1}, n / 3, n / 2, n - 2, n - 1, n / 7 * 5}) {
      k = std::clamp<std::int64_t>(k, 0, n - 1);
      const double want = kAlpha * xs.data.flat(k) + ys.data.flat(k);
      const double expect_x = x_value(xs.box.offset[0] + k), expect_y = y_value(ys.box.offset[0] + k);
      if (std::abs(rs.data.flat(k) - want) > 1e-12 * std::abs(want) || xs.data.flat(k) != expect_x || ys.data.flat(k) != expect_y)
        shard::raise<shard::RuntimeError>(what, " is WRONG on device ", rs.device, " at global index ",
                                          rs.box.offset[0] + k, ": got ", rs.data.flat(k), ", want ", want);
    }
  }
}

struct Kernel {
  const char* name;
  std::vector<double> times;  // seconds per timed repetition (this rank, then the max over ranks)
  long faults = 0;            // minor page faults inside timed calls (this rank)
};

}  // namespace

int main(int argc, char** argv) {
  return shard::apps::run_app(argc, argv, [&](shard::Runtime& rt) {
    namespace po = shard::apps::po;
    std::int64_t n = std::int64_t{1} << 27;
    int repeats = 20;
    po::options_description options("elementwise_bench options");
    shard::apps::add_common_options(options);
    options.add_options()("n", po::value(&n)->default_value(n), "global number of doubles in x and y")(
        "repeats", po::value(&repeats)->default_value(repeats), "timed repetitions of each kernel")(
        "json", "one JSON object instead of the table");
    po::variables_map vm;
    if (!shard::apps::parse_command_line(argc, argv, options, vm, rt,
                                         "Usage: mpirun -n N elementwise_bench [options]\n"
                                         "Times shard::axpy and alpha * x + y against STREAM's triad."))
      return 0;
    shard::apps::check_at_least("n", n, 1);
    shard::apps::check_at_least("repeats", repeats, 1);

    MPI_Comm world = rt.world().get();
    const shard::Mesh mesh = shard::make_mesh({rt.device_count()}, {"a"});
    const shard::NamedSharding sharding(mesh, shard::P("a"));
    const ShardedArray<double> x = filled(sharding, n, x_value);
    const ShardedArray<double> y = filled(sharding, n, y_value);

    // The triad's arrays: as many elements as this rank's shards of x hold.
    std::int64_t local = 0;
    for (const auto& s : x.addressable_shards()) local += s.data.size();
    std::int64_t total = local;
    MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_INT64_T, MPI_SUM, world);
    std::vector<double> ta(static_cast<std::size_t>(local), 0.0), tb(ta.size()), tc(ta.size());
    for (std::int64_t i = 0; i < local; ++i) {
      tb[static_cast<std::size_t>(i)] = x_value(i);
      tc[static_cast<std::size_t>(i)] = y_value(i);
    }

    // Correctness first (this also touches every page the kernels will use once).
    verify(shard::axpy(kAlpha, x, y), x, y, "shard::axpy");
    verify(kAlpha * x + y, x, y, "alpha * x + y");
    triad(local, ta.data(), tb.data(), tc.data(), kAlpha);
    for (std::int64_t i : {std::int64_t{0}, local / 2, local - 1}) {
      const auto u = static_cast<std::size_t>(i);
      if (local > 0 && ta[u] != tb[u] + kAlpha * tc[u])
        shard::raise<shard::RuntimeError>("the triad loop is WRONG at local index ", i);
    }

    std::vector<Kernel> kernels{{"triad", {}, 0}, {"axpy", {}, 0}, {"unfused", {}, 0}};
    double sink = 0;  // keeps the results observably used
    auto run = [&](std::size_t which, bool timed) {
      MPI_Barrier(world);
      const long f0 = shard::apps::minor_faults();
      double t = 0;
      if (which == 0) {
        const double t0 = MPI_Wtime();
        triad(local, ta.data(), tb.data(), tc.data(), kAlpha);
        t = MPI_Wtime() - t0;
        sink += local > 0 ? ta[0] : 0;
      } else {
        const double t0 = MPI_Wtime();
        ShardedArray<double> z = which == 1 ? shard::axpy(kAlpha, x, y) : kAlpha * x + y;
        t = MPI_Wtime() - t0;
        const auto& shards = z.addressable_shards();
        sink += !shards.empty() && shards[0].data.size() > 0 ? shards[0].data.flat(0) : 0;
      }  // z freed here, outside the timed region; the next call gets its memory back
      if (!timed) return;
      kernels[which].times.push_back(t);
      kernels[which].faults += shard::apps::minor_faults() - f0;
    };
    for (std::size_t k = 0; k < kernels.size(); ++k) run(k, false);  // warm-up: first touch is not timed
    for (int r = 0; r < repeats; ++r)
      for (std::size_t k = 0; k < kernels.size(); ++k) run((k + static_cast<std::size_t>(r)) % kernels.size(), true);
    for (auto& k : kernels)
      MPI_Allreduce(MPI_IN_PLACE, k.times.data(), static_cast<int>(k.times.size()), MPI_DOUBLE, MPI_MAX, world);

    const double bytes = 3.0 * sizeof(double) * static_cast<double>(total);
    std::vector<double> med, gbps;
    for (const auto& k : kernels) {
      med.push_back(shard::apps::median(k.times));
      gbps.push_back(bytes / med.back() / 1e9);
    }
    // The ratio of rates measured back to back, repetition by repetition (robust to drift).
    auto paired = [&](std::size_t k) {
      std::vector<double> v;
      for (int r = 0; r < repeats; ++r) v.push_back(kernels[0].times[r] / kernels[k].times[r]);
      return shard::apps::median(v);
    };
    const double axpy_ratio = gbps[1] / gbps[0], unfused_ratio = gbps[2] / gbps[0];
    const bool pass = axpy_ratio >= 0.70;

    std::ostringstream os;
    char line[512];
    if (vm.count("json")) {
      std::snprintf(line, sizeof line,
                    "{\"n\": %lld, \"ranks\": %d, \"devices_per_rank\": %d, \"repeats\": %d, \"triad_GBps\": %.3f, "
                    "\"axpy_GBps\": %.3f, \"unfused_GBps\": %.3f, \"axpy_over_triad\": %.4f, "
                    "\"axpy_over_triad_paired\": %.4f, \"unfused_over_triad\": %.4f, "
                    "\"unfused_over_triad_paired\": %.4f, \"target\": 0.70, \"pass\": %s, "
                    "\"axpy_page_faults_per_call\": %.1f, \"unfused_page_faults_per_call\": %.1f, \"blas\": \"%s\"}\n",
                    static_cast<long long>(n), rt.process_count(), rt.devices_per_rank(), repeats, gbps[0], gbps[1],
                    gbps[2], axpy_ratio, paired(1), unfused_ratio, paired(2), pass ? "true" : "false",
                    static_cast<double>(kernels[1].faults) / repeats, static_cast<double>(kernels[2].faults) / repeats,
                    shard::blas_summary().c_str());
      os << line;
    } else {
      os << "elementwise_bench: " << rt.process_count() << " ranks x " << rt.devices_per_rank() << " devices, "
         << mesh.to_string() << ", x and y float64 (" << n << ",) P('a') (" << local << " elements on rank 0), "
         << repeats << " repetitions; " << shard::blas_summary() << "\n";
      os << "medians over repetitions, each the slowest rank's time (MPI_Barrier before each); order rotates every "
            "repetition;\nGB/s = 3 words x 8 bytes per element (STREAM's count), all ranks together; paired = median "
            "of the per-repetition ratio;\ntriad writes a preallocated array; axpy and unfused allocate fresh output "
            "arrays (unfused also a temporary) on every call,\nwhich the Runtime's keep-freed-memory policy and Shard's "
            "buffer cache serve from reused memory; one untimed warm-up\nrepetition of each kernel keeps first-touch "
            "page faults out of the timings (faults = minor page faults per timed call, rank 0)\n";
      std::snprintf(line, sizeof line, "%-8s %10s %9s %11s %9s %8s\n", "kernel", "median_ms", "GB/s", "vs_triad",
                    "paired", "faults");
      os << line;
      for (std::size_t k = 0; k < kernels.size(); ++k) {
        std::snprintf(line, sizeof line, "%-8s %10.2f %9.2f %11.3f %9.3f %8.1f\n", kernels[k].name, med[k] * 1e3,
                      gbps[k], gbps[k] / gbps[0], k == 0 ? 1.0 : paired(k),
                      static_cast<double>(kernels[k].faults) / repeats);
        os << line;
      }
      std::snprintf(line, sizeof line, "axpy/triad = %.3f (target >= 0.70: %s); unfused/triad = %.3f\n", axpy_ratio,
                    pass ? "met" : "NOT met", unfused_ratio);
      os << line;
    }
    shard::apps::print0(rt, os.str());
    g_sink = sink;
    return 0;
  });
}
