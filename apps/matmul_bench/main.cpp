// matmul_bench: C = A @ B for n x n matrices sharded P('r', 'c') on a p x q mesh, timed for
// each algorithm (Cannon, SUMMA, ScaLAPACK p?gemm, Auto, the rules) interleaved in one launch,
// against the OpenBLAS rate of one rank multiplying n x n alone, with a correctness check.
//
//   mpirun -n 4 --oversubscribe matmul_bench --n 4096 --mesh 2x2
//   mpirun -n 2 --bind-to core matmul_bench --n 1024,4096 --algorithms summa,scalapack --json
//   mpirun -n 2 matmul_bench --overhead            per-call time of 16 x 16 products (rules layouts)

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/bench.hpp"
#include "common/cli.hpp"
#include "shard/core/blas.hpp"
#include "shard/shard.hpp"

namespace {

using shard::Algorithm;
using shard::P;

/// A[i, j] and B[i, j]: a hash of (matrix, i, j) mapped to [-1, 1), the same on every rank.
double value_at(std::uint64_t matrix, std::int64_t i, std::int64_t j) {
  std::uint64_t z = matrix * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(i) * 0xBF58476D1CE4E5B9ull +
                    static_cast<std::uint64_t>(j) * 0x94D049BB133111EBull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-52 - 1.0;
}

template <typename T>
shard::ShardedArray<T> make_matrix(std::uint64_t matrix, std::int64_t n, const shard::NamedSharding& s) {
  return shard::generate<T>({n, n}, s, [&](const shard::Box& b) {
    shard::Tensor<T> t(b.extent);
    for (std::int64_t i = 0; i < b.extent[0]; ++i)
      for (std::int64_t j = 0; j < b.extent[1]; ++j)
        t(i, j) = static_cast<T>(value_at(matrix, b.offset[0] + i, b.offset[1] + j));
    return t;
  });
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string t; std::getline(ss, t, ',');)
    if (!t.empty()) out.push_back(t);
  return out;
}

/// Waits for every rank without spinning (1 ms naps), so a rank timing alone has its core.
void quiet_barrier(MPI_Comm comm) {
  MPI_Request req;
  shard::mpi::check(MPI_Ibarrier(comm, &req), "MPI_Ibarrier");
  for (int done = 0; !done;) {
    shard::mpi::check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (!done) usleep(1000);
  }
}

/// Seconds for one n x n x n product on rank 0 alone (the others nap), the same on every rank.
template <typename T>
struct LocalRate {
  std::int64_t n;
  std::vector<T> a, b, c;
  explicit LocalRate(const shard::Runtime& rt, std::int64_t size) : n(size) {
    if (rt.process_index() != 0) return;
    const auto nn = static_cast<std::size_t>(n * n);
    a.resize(nn);
    b.resize(nn);
    c.resize(nn);
    for (std::size_t i = 0; i < nn; ++i) {
      a[i] = static_cast<T>(value_at(1, 0, static_cast<std::int64_t>(i)));
      b[i] = static_cast<T>(value_at(2, 0, static_cast<std::int64_t>(i)));
    }
  }
  double once(const shard::Runtime& rt) {
    const MPI_Comm comm = rt.world().get();
    quiet_barrier(comm);
    double t = 0;
    if (rt.process_index() == 0) {
      std::fill(c.begin(), c.end(), T(0));
      const double t0 = MPI_Wtime();
      shard::gemm_acc(n, n, n, a.data(), n, b.data(), n, c.data(), n);
      t = MPI_Wtime() - t0;
    }
    quiet_barrier(comm);
    MPI_Bcast(&t, 1, MPI_DOUBLE, 0, comm);
    return t;
  }
};

struct Check {
  std::string how;
  double rel_error = 0;
};

/// Relative error of C: against a host product of this rank's rows of A and columns of B
/// (built from value_at, nothing gathered) when n <= host_limit, else a random projection
/// C x against A (B x) with distributed matrix-vector products. Collective.
template <typename T>
Check check_result(const shard::Runtime& rt, const shard::ShardedArray<T>& a, const shard::ShardedArray<T>& b,
                   const shard::ShardedArray<T>& c, std::int64_t host_limit) {
  const std::int64_t n = a.shape()[0];
  double err = 0, norm = 0;
  if (n <= host_limit) {
    for (const auto& s : c.addressable_shards()) {
      const std::int64_t m = s.box.extent[0], w = s.box.extent[1];
      std::vector<double> ar(static_cast<std::size_t>(m * n)), bc(static_cast<std::size_t>(n * w)),
          ref(static_cast<std::size_t>(m * w), 0.0);
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t k = 0; k < n; ++k)
          ar[static_cast<std::size_t>(i * n + k)] = static_cast<T>(value_at(1, s.box.offset[0] + i, k));
      for (std::int64_t k = 0; k < n; ++k)
        for (std::int64_t j = 0; j < w; ++j)
          bc[static_cast<std::size_t>(k * w + j)] = static_cast<T>(value_at(2, k, s.box.offset[1] + j));
      shard::gemm_acc(m, w, n, ar.data(), n, bc.data(), w, ref.data(), w);
      for (std::int64_t i = 0; i < m * w; ++i) {
        err = std::max(err, std::abs(static_cast<double>(s.data.flat(i)) - ref[static_cast<std::size_t>(i)]));
        norm = std::max(norm, std::abs(ref[static_cast<std::size_t>(i)]));
      }
    }
    const MPI_Comm comm = rt.world().get();
    MPI_Allreduce(MPI_IN_PLACE, &err, 1, MPI_DOUBLE, MPI_MAX, comm);
    MPI_Allreduce(MPI_IN_PLACE, &norm, 1, MPI_DOUBLE, MPI_MAX, comm);
    return {"host", norm > 0 ? err / norm : err};
  }
  const shard::NamedSharding replicated(a.mesh(), P());
  const auto v = shard::generate<T>({n, 1}, replicated, [&](const shard::Box& box) {
    shard::Tensor<T> t(box.extent);
    for (std::int64_t i = 0; i < box.extent[0]; ++i) t(i, 0) = static_cast<T>(value_at(3, box.offset[0] + i, 0));
    return t;
  });
  const auto cx = shard::matmul(c, v, Algorithm::kRules).to_host();
  const auto abx = shard::matmul(a, shard::matmul(b, v, Algorithm::kRules), Algorithm::kRules).to_host();
  for (std::int64_t i = 0; i < n; ++i) {
    err = std::max(err, std::abs(static_cast<double>(cx.flat(i)) - static_cast<double>(abx.flat(i))));
    norm = std::max(norm, std::abs(static_cast<double>(abx.flat(i))));
  }
  return {"C x vs A (B x)", norm > 0 ? err / norm : err};
}

struct Options {
  std::vector<std::int64_t> sizes;
  std::vector<Algorithm> algorithms;
  int repeats = 5;
  std::int64_t host_limit = 2048;
  int cannon_panels = 0;
  std::int64_t summa_panel = 0;
  bool json = false;
  bool overlap = true;  ///< Cannon's shifts / SUMMA's broadcasts behind the products
};

/// C = A @ B with `algorithm`, Cannon and SUMMA with the panel options given.
template <typename T>
shard::ShardedArray<T> multiply(const shard::ShardedArray<T>& a, const shard::ShardedArray<T>& b,
                                Algorithm algorithm, const Options& o) {
  if (algorithm == Algorithm::kCannon) return shard::linalg::cannon(a, b, {o.cannon_panels, o.overlap});
  if (algorithm == Algorithm::kSumma) return shard::linalg::summa(a, b, {o.summa_panel, o.overlap});
  return shard::matmul(a, b, algorithm);
}

template <typename T>
int run(shard::Runtime& rt, const shard::Mesh& mesh, const Options& o) {
  const bool is_double = std::is_same_v<T, double>;
  const char* dtype = is_double ? "float64" : "float32";
  const shard::NamedSharding s(mesh, P("r", "c"));
  const int ranks = rt.process_count();
  std::ostringstream head;
  char line[512];
  if (!o.json) {
    head << "matmul_bench: " << ranks << " ranks x " << rt.devices_per_rank() << " devices, " << mesh.to_string()
         << ", A and B sharded P('r', 'c'), " << dtype << ", " << std::thread::hardware_concurrency()
         << " cores; " << shard::blas_summary() << "\n"
         << "medians over " << o.repeats << " repetitions, algorithms interleaved (rotating order); "
         << "local = OpenBLAS n x n x n on rank 0 alone (others nap); efficiency = GFLOP/s / (ranks x local); "
         << "wait_s = time Cannon/SUMMA spent in MPI_Testall/Waitall on posted transfers (slowest rank): the "
            "communication not hidden behind the block products; hidden = 1 - wait_s / (the wait with each transfer "
            "waited for right after posting it)\n";
    std::snprintf(line, sizeof line, "%6s %-10s %10s %10s %10s %11s %8s %7s %10s  %s\n", "n", "algorithm", "median_s",
                  "GFLOP/s", "vs_pdgemm", "efficiency", "wait_s", "hidden", "rel_error", "check");
    head << line;
    shard::apps::print0(rt, head.str());
  }
  bool all_ok = true;
  for (const std::int64_t n : o.sizes) {
    const auto a = make_matrix<T>(1, n, s);
    const auto b = make_matrix<T>(2, n, s);
    LocalRate<T> local(rt, n);
    const std::size_t na = o.algorithms.size();
    std::vector<std::vector<double>> times(na + 1), waits(na);  // times' last: local
    std::vector<std::optional<shard::ShardedArray<T>>> last(na);
    auto time_one = [&](std::size_t i, const Options& opt) {
      if (i == na) return local.once(rt);
      last[i].reset();  // free the previous product first
      quiet_barrier(rt.world().get());
      shard::comm_stats().reset();
      const double t0 = MPI_Wtime();
      last[i] = multiply(a, b, o.algorithms[i], opt);
      double t[2] = {MPI_Wtime() - t0,
                     shard::comm_stats().wait_seconds("cannon") + shard::comm_stats().wait_seconds("summa")};
      MPI_Allreduce(MPI_IN_PLACE, t, 2, MPI_DOUBLE, MPI_MAX, rt.world().get());
      waits[i].push_back(t[1]);
      return t[0];
    };
    for (int r = -1; r < o.repeats; ++r)  // round -1 warms up (BLACS grid, communicators, buffers)
      for (std::size_t k = 0; k <= na; ++k) {
        const std::size_t i = (k + static_cast<std::size_t>(std::max(r, 0))) % (na + 1);
        const double t = time_one(i, o);
        if (r >= 0) times[i].push_back(t);
        if (r < 0 && i < na) waits[i].clear();
      }
    // The same transfers waited for right after posting them: the communication the products
    // hide is the difference (overlapped = 1 - wait_s / wait_unoverlapped_s).
    std::vector<double> unhidden(na, 0.0);
    Options serial = o;
    serial.overlap = false;
    for (std::size_t i = 0; i < na; ++i) {
      if (o.algorithms[i] != Algorithm::kCannon && o.algorithms[i] != Algorithm::kSumma) continue;
      const std::size_t before = waits[i].size();
      for (int r = 0; r < 2; ++r) (void)time_one(i, serial);
      std::vector<double> w(waits[i].begin() + static_cast<std::ptrdiff_t>(before), waits[i].end());
      waits[i].resize(before);
      unhidden[i] = shard::apps::median(w);
    }
    const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
    const double local_rate = flops / shard::apps::median(times[na]) * 1e-9;
    const auto pd = std::find(o.algorithms.begin(), o.algorithms.end(), Algorithm::kScaLAPACK);
    std::ostringstream os;
    if (!o.json) {
      std::snprintf(line, sizeof line, "%6lld %-10s %10.4f %10.2f %10s %11s %8s %7s %10s  %s\n",
                    static_cast<long long>(n), "local", shard::apps::median(times[na]), local_rate, "", "", "", "", "",
                    "rank 0 alone");
      os << line;
    }
    for (std::size_t i = 0; i < na; ++i) {
      const Check c = check_result(rt, a, b, *last[i], o.host_limit);
      const bool ok = c.rel_error <= (is_double ? 1e-12 : 1e-5) * (c.how == "host" ? 1.0 : 100.0);
      all_ok = all_ok && ok;
      const double med = shard::apps::median(times[i]);
      const double gflops = flops / med * 1e-9;
      double vs = 0;  // median over rounds of t(pdgemm) / t(this): paired, immune to drift between rounds
      if (pd != o.algorithms.end()) {
        std::vector<double> ratio;
        const auto& tp = times[static_cast<std::size_t>(pd - o.algorithms.begin())];
        for (std::size_t r = 0; r < times[i].size(); ++r) ratio.push_back(tp[r] / times[i][r]);
        vs = shard::apps::median(ratio);
      }
      const double eff = gflops / (ranks * local_rate);
      const double wait = shard::apps::median(waits[i]);
      const double hidden = unhidden[i] > 0 ? std::max(0.0, 1.0 - wait / unhidden[i]) : 0.0;
      const std::string name = shard::algorithm_name(o.algorithms[i]);
      if (o.json)
        std::snprintf(line, sizeof line,
                      "{\"n\": %lld, \"algorithm\": \"%s\", \"dtype\": \"%s\", \"mesh\": \"%dx%d\", \"ranks\": %d, "
                      "\"devices_per_rank\": %d, \"median_s\": %.6f, \"gflops\": %.3f, \"vs_pdgemm\": %.4f, "
                      "\"local_gflops\": %.3f, \"efficiency\": %.4f, \"wait_s\": %.6f, \"wait_unoverlapped_s\": %.6f, "
                      "\"overlapped\": %.3f, \"rel_error\": %.3e, \"check\": \"%s\", "
                      "\"ok\": %s, \"blas_core\": \"%s\"}\n",
                      static_cast<long long>(n), name.c_str(), dtype, mesh.shape()[0], mesh.shape()[1], ranks,
                      rt.devices_per_rank(), med, gflops, vs, local_rate, eff, wait, unhidden[i], hidden, c.rel_error, c.how.c_str(),
                      ok ? "true" : "false", shard::blas_core_name().c_str());
      else {
        char ratio[32] = "-";
        if (pd != o.algorithms.end()) std::snprintf(ratio, sizeof ratio, "%.3fx", vs);
        char hid[32] = "-";
        if (unhidden[i] > 0) std::snprintf(hid, sizeof hid, "%.0f%%", 100 * hidden);
        std::snprintf(line, sizeof line, "%6lld %-10s %10.4f %10.2f %10s %10.1f%% %8.4f %7s %10.2e  %s %s\n",
                      static_cast<long long>(n), name.c_str(), med, gflops, ratio, 100 * eff, wait, hid, c.rel_error,
                      c.how.c_str(), ok ? "ok" : "WRONG");
      }
      os << line;
    }
    shard::apps::print0(rt, os.str());
  }
  if (!all_ok) shard::raise<shard::Error>("matmul_bench: a result failed its correctness check (see WRONG above)");
  return 0;
}

/// --overhead: the time of one small product per call (planning, reshards, the closing psum,
/// the wrapping; the gemm itself is tiny), on a 1-D mesh 'a' over every device, for the rules'
/// layouts and one value_and_grad step: the median over `batches` batches of `calls` calls,
/// the slowest rank's. Public API only, so the same source builds against older libraries.
template <typename T>
int run_overhead(shard::Runtime& rt, std::int64_t n, int batches, int calls, bool json) {
  const MPI_Comm world = rt.world().get();
  const shard::Mesh mesh = shard::make_mesh({rt.device_count()}, {"a"});
  auto on = [&](std::uint64_t matrix, const P& spec) { return make_matrix<T>(matrix, n, shard::NamedSharding(mesh, spec)); };
  const auto rows = on(1, P("a", shard::None)), cols = on(2, P(shard::None, "a")), repl = on(3, P());
  const auto brows = on(4, P("a", shard::None));
  const auto target = on(5, P("a", shard::None));
  volatile double sink = 0;
  auto first = [](const shard::ShardedArray<T>& c) {
    const auto& s = c.addressable_shards();
    return !s.empty() && s[0].data.size() > 0 ? static_cast<double>(s[0].data.flat(0)) : 0.0;
  };
  const std::vector<std::pair<std::string, std::function<double()>>> cases = {
      {"P('a',None) @ P()            no communication", [&] { return first(shard::matmul(rows, repl)); }},
      {"P(None,'a') @ P('a',None)    one psum", [&] { return first(shard::matmul(cols, brows)); }},
      {"P('a',None) @ P('a',None)    B all-gathered first", [&] { return first(shard::matmul(rows, brows)); }},
      {"value_and_grad sum((x @ w) * t), x P('a',None), w P()",
       [&] {
         const std::vector<shard::ShardedArray<T>> params = {rows, repl};
         auto loss = [&](const std::vector<shard::ShardedArray<T>>& p) { return shard::sum(shard::matmul(p[0], p[1]) * target); };
         const auto [value, grads] = shard::value_and_grad(loss)(params);
         return first(grads[1]);
       }},
  };
  std::ostringstream os;
  if (!json)
    os << "matmul_bench --overhead: " << rt.process_count() << " ranks x " << rt.devices_per_rank() << " devices, "
       << mesh.to_string() << ", " << n << "x" << n << " " << shard::dtype_name<T>() << ", median over " << batches
       << " batches of " << calls << " calls (slowest rank)\n";
  for (const auto& [name, f] : cases) {
    for (int i = 0; i < std::max(10, calls / 10); ++i) sink = sink + f();  // warm-up: communicators, buffers
    std::vector<double> per;
    for (int b = 0; b < batches; ++b) {
      MPI_Barrier(world);
      const double t0 = MPI_Wtime();
      for (int i = 0; i < calls; ++i) sink = sink + f();
      per.push_back((MPI_Wtime() - t0) / calls * 1e6);
    }
    double us = shard::apps::median(per);
    MPI_Allreduce(MPI_IN_PLACE, &us, 1, MPI_DOUBLE, MPI_MAX, world);
    char line[512];
    if (json)
      std::snprintf(line, sizeof line, "{\"overhead\": \"%s\", \"n\": %lld, \"ranks\": %d, \"us_per_call\": %.3f}\n",
                    name.c_str(), static_cast<long long>(n), rt.process_count(), us);
    else
      std::snprintf(line, sizeof line, "%-58s %10.2f us per call\n", name.c_str(), us);
    os << line;
  }
  shard::apps::print0(rt, os.str());
  return 0;
}

/// --products: the block products of the training apps' shapes (train_mlp's 128x784 @ 784x1024,
/// train_gpt's 2048x192 @ 192x768 and 2048x768 @ 768x192, its attention's 128x32 @ 32x128), each
/// rank timing its own (as the apps run them), in float32 (OpenBLAS) and bfloat16
/// (bf16_products_path()), the best of `rounds` in one run; rank 0's GFLOP/s and the ratios.
int run_products(shard::Runtime& rt, int rounds, bool json) {
  struct Shape3 {
    std::int64_t m, k, n;
  };
  const std::vector<Shape3> shapes{{128, 784, 1024}, {2048, 192, 768}, {2048, 768, 192}, {128, 32, 128}};
  auto rate = [&]<typename T>(std::type_identity<T>, const Shape3& s) {
    shard::Tensor<T> am({s.m, s.k}), bm({s.k, s.n});
    for (std::int64_t i = 0; i < am.size(); ++i) am.flat(i) = T(static_cast<float>((i * 7919) % 1000) / 1000.0f - 0.5f);
    for (std::int64_t i = 0; i < bm.size(); ++i) bm.flat(i) = T(static_cast<float>((i * 104729) % 1000) / 1000.0f - 0.5f);
    (void)shard::matmul(am, bm);  // warm-up (and oneDNN's primitive)
    double best = 0;
    for (int r = 0; r < rounds; ++r) {
      int reps = 0;
      const auto t0 = std::chrono::steady_clock::now();
      double sec = 0;
      while (sec < 0.2) {
        (void)shard::matmul(am, bm);
        ++reps;
        sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      best = std::max(best, 2.0 * static_cast<double>(s.m * s.k * s.n) * reps / sec / 1e9);
    }
    return best;
  };
  std::ostringstream os;
  if (!json)
    os << "block products, one per rank at once, best of " << rounds << " rounds; float32: " << shard::blas_summary()
       << "; bfloat16: " << shard::bf16_products_path() << "\n"
       << "| shape | float32 GFLOP/s | bfloat16 GFLOP/s | bfloat16 / float32 |\n|---|---:|---:|---:|\n";
  double log_sum = 0;
  for (const auto& s : shapes) {
    const double f = rate(std::type_identity<float>{}, s), b = rate(std::type_identity<shard::bfloat16>{}, s);
    log_sum += std::log(b / f);
    char line[256];
    if (json)
      std::snprintf(line, sizeof line,
                    "{\"m\": %lld, \"k\": %lld, \"n\": %lld, \"float32_gflops\": %.1f, \"bfloat16_gflops\": %.1f, "
                    "\"ratio\": %.3f, \"bf16_path\": \"%s\"}\n",
                    static_cast<long long>(s.m), static_cast<long long>(s.k), static_cast<long long>(s.n), f, b, b / f,
                    shard::bf16_products_path().c_str());
    else
      std::snprintf(line, sizeof line, "| %lldx%lld @ %lldx%lld | %.1f | %.1f | %.2fx |\n", static_cast<long long>(s.m),
                    static_cast<long long>(s.k), static_cast<long long>(s.k), static_cast<long long>(s.n), f, b, b / f);
    os << line;
  }
  if (!json) os << "geometric mean bfloat16 / float32: " << std::exp(log_sum / static_cast<double>(shapes.size())) << "x\n";
  (void)rt;
  shard::apps::print0(rt, os.str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return shard::apps::run_app(argc, argv, [&](shard::Runtime& rt) {
    namespace po = shard::apps::po;
    std::string sizes = "1024", algorithms, dtype = "float64", mesh_text;
    Options o;
    po::options_description options("matmul_bench options");
    shard::apps::add_common_options(options);
    options.add_options()("n", po::value(&sizes)->default_value("1024"), "matrix sizes, comma-separated (4096,8192)")(
        "algorithms", po::value(&algorithms)->default_value(""),
        "comma-separated from cannon, summa, scalapack, auto, rules (default: all that run on the mesh)")(
        "dtype", po::value(&dtype)->default_value("float64"), "float64 or float32")(
        "mesh", po::value(&mesh_text)->default_value(""), "2-D mesh shape like 2x2 (default: the squarest)")(
        "repeats", po::value(&o.repeats)->default_value(5), "timed repetitions per algorithm")(
        "cannon-panels", po::value(&o.cannon_panels)->default_value(0),
        "row panels per Cannon block product, MPI progressed between them (0: from the block size)")(
        "summa-panel", po::value(&o.summa_panel)->default_value(0), "SUMMA panel width (0: 256)")(
        "host-check-limit", po::value(&o.host_limit)->default_value(2048),
        "largest n checked against a host product (larger n: a random projection)")(
        "json", "one JSON object per row")(
        "overhead", "time small products per call instead (1-D mesh over every device; --n defaults to 16)")(
        "products", "time the training apps' block products in float32 and bfloat16 instead (ratios; --repeats rounds)")(
        "calls", po::value<int>()->default_value(1000), "--overhead: calls per timed batch")(
        "batches", po::value<int>()->default_value(15), "--overhead: timed batches (the median is reported)");
    po::variables_map vm;
    if (!shard::apps::parse_command_line(argc, argv, options, vm, rt,
                                         "Usage: mpirun -n N matmul_bench [--n 4096] [--mesh PxQ] [--algorithms ...]\n"
                                         "Times distributed matmul algorithms against ScaLAPACK and local OpenBLAS."))
      return 0;
    o.json = vm.count("json") > 0;
    if (vm.count("products")) return run_products(rt, std::max(1, o.repeats), o.json);
    if (vm.count("overhead")) {
      const int calls = vm["calls"].as<int>(), batches = vm["batches"].as<int>();
      shard::apps::check_at_least("calls", calls, 1);
      shard::apps::check_at_least("batches", batches, 1);
      const std::int64_t n = vm["n"].defaulted() ? 16 : shard::apps::parse_int_list(sizes, "n", "16", 1).front();
      shard::apps::check_choice("dtype", dtype, {"float64", "f64", "double", "float32", "f32", "float"});
      if (dtype == "float64" || dtype == "f64" || dtype == "double") return run_overhead<double>(rt, n, batches, calls, o.json);
      return run_overhead<float>(rt, n, batches, calls, o.json);
    }
    o.sizes = shard::apps::parse_int_list(sizes, "n", "1024,4096", 1);
    if (o.sizes.empty()) shard::raise<shard::ValueError>("--n needs at least one size");
    shard::apps::check_at_least("repeats", o.repeats, 1);
    shard::apps::check_at_least("cannon-panels", o.cannon_panels, 0, "(0: from the block size)");
    shard::apps::check_at_least("summa-panel", o.summa_panel, 0, "(0: 256)");
    shard::apps::check_at_least("host-check-limit", o.host_limit, 0);
    std::vector<int> shape;
    if (mesh_text.empty()) {
      const int d = rt.device_count();
      int p = 1;
      for (int f = 1; f * f <= d; ++f)
        if (d % f == 0) p = f;
      shape = {p, d / p};
    } else {
      shape = shard::apps::mesh_shape_from(mesh_text, rt.device_count());
    }
    if (shape.size() != 2)
      shard::raise<shard::ValueError>("--mesh '", mesh_text, "': matmul_bench needs a 2-D mesh like 2x2");
    if (shape[0] * shape[1] != rt.device_count())
      shard::raise<shard::ValueError>("--mesh ", shape[0], "x", shape[1], " has ", shape[0] * shape[1],
                                      " devices, but the job has ", rt.device_count());
    const shard::Mesh mesh = shard::make_mesh(shape, {"r", "c"});
    const bool scalapack_ok = rt.devices_per_rank() == 1;
    if (algorithms.empty()) {
      if (shape[0] == shape[1]) o.algorithms.push_back(Algorithm::kCannon);
      o.algorithms.push_back(Algorithm::kSumma);
      if (scalapack_ok) o.algorithms.push_back(Algorithm::kScaLAPACK);
      o.algorithms.push_back(Algorithm::kAuto);
    } else {
      for (const auto& t : split(algorithms)) {
        const Algorithm a = shard::parse_algorithm(t);
        if (a == Algorithm::kCannon && shape[0] != shape[1])
          shard::raise<shard::ValueError>("--algorithms cannon needs a square mesh, got ", shape[0], "x", shape[1]);
        if (a == Algorithm::kScaLAPACK && !scalapack_ok)
          shard::raise<shard::ValueError>("--algorithms scalapack needs one device per rank, got ",
                                          rt.devices_per_rank());
        o.algorithms.push_back(a);
      }
    }
    shard::apps::check_choice("dtype", dtype, {"float64", "f64", "double", "float32", "f32", "float"});
    if (dtype == "float64" || dtype == "f64" || dtype == "double") return run<double>(rt, mesh, o);
    return run<float>(rt, mesh, o);
  });
}
