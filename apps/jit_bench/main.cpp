// jit_bench: what jit's passes (jit/optimize.hpp) buy, measured side by side in one run.
//
// chain    y = astype<bfloat16>(maximum(((x * a + b) - c) * d, 0)) on float32 arrays of --n elements
//          sharded P('a') over every device: eager (six passes over memory), jit with the passes off
//          (the same six), jit with fusion (one pass); against STREAM's triad on float32 arrays of
//          the same per-rank size (the machine's bandwidth). The chain's rate counts the bytes one
//          pass must move: five float32 reads and one bfloat16 write per element (22 bytes); the
//          triad's STREAM's count (12 bytes). Ratios are of GB/s.
// replay   the cost per op of replaying a program of --ops small elementwise ops (--small elements)
//          against the same ops run eagerly: fused (one equation), not fused (every op replayed),
//          and a chain broken by a reduction after every op (what fusion cannot join).
// schedule --layers layers h = tanh(h @ reshard(w, P())) with each (--width)^2 weight split over
//          'a' (FSDP): jit with communication scheduling (each all_gather started one layer ahead,
//          waited for before its product) against jit without; the time each rank spent
//          communicating and the exposed part (not overlapped by computing) from one traced call.
//
// Every repetition runs every variant in a rotating order, each timed as its slowest rank; the
// medians are printed, and the ratios are also taken repetition by repetition (paired).
//
//   mpirun -n 2 --bind-to core jit_bench
//   mpirun -n 2 jit_bench --n 16777216 --repeats 20 --ops 60 --small 16

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

using shard::bfloat16;
using shard::ShardedArray;
using shard::Tensor;

volatile double g_sink = 0;

[[gnu::noinline]] void triad(std::int64_t n, float* __restrict a, const float* __restrict b,
                             const float* __restrict c, float s) {
  for (std::int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

ShardedArray<bfloat16> chain(const ShardedArray<float>& x, const ShardedArray<float>& a,
                             const ShardedArray<float>& b, const ShardedArray<float>& c,
                             const ShardedArray<float>& d) {
  return shard::astype<bfloat16>(shard::maximum(((x * a + b) - c) * d, 0.f));
}

/// --ops elementwise ops on one array; `reduce_between` puts a row reduction (broadcast back)
/// after every op, so that no two elementwise ops are adjacent.
struct SmallProgram {
  int ops;
  bool reduce_between;
  ShardedArray<float> operator()(const ShardedArray<float>& x) const {
    ShardedArray<float> h = x;
    for (int k = 0; k < ops; ++k) {
      switch (k % 4) {
        case 0:
          h = h * 0.999f;
          break;
        case 1:
          h = h + x;
          break;
        case 2:
          h = shard::maximum(h, -1.f);
          break;
        default:
          h = h - 0.001f;
          break;
      }
      if (reduce_between) h = shard::sum(h, {0}, true) * 0.f + h;
    }
    return h;
  }
};

/// Element 0 of the first local block (0 when empty): keeps a result observably used.
template <typename T>
double first_value(const ShardedArray<T>& z) {
  const auto& s = z.addressable_shards();
  return !s.empty() && s[0].data.size() > 0 ? static_cast<double>(s[0].data.flat(0)) : 0;
}

struct Variant {
  std::string name;
  std::function<double()> run;  // returns a value of its result (kept observable)
  std::vector<double> times;
  long faults = 0;  // minor page faults in the timed calls (this rank)
};

/// Runs every variant once untimed, then `repeats` rotating rounds timed (max over ranks).
void measure(std::vector<Variant>& vs, int repeats, MPI_Comm world, double& sink) {
  for (auto& v : vs) sink += v.run();
  for (int r = 0; r < repeats; ++r)
    for (std::size_t k = 0; k < vs.size(); ++k) {
      Variant& v = vs[(k + static_cast<std::size_t>(r)) % vs.size()];
      MPI_Barrier(world);
      const long f0 = shard::apps::minor_faults();
      const double t0 = MPI_Wtime();
      sink += v.run();
      v.times.push_back(MPI_Wtime() - t0);
      v.faults += shard::apps::minor_faults() - f0;
    }
  for (auto& v : vs)
    MPI_Allreduce(MPI_IN_PLACE, v.times.data(), static_cast<int>(v.times.size()), MPI_DOUBLE, MPI_MAX, world);
}

double paired(const Variant& num, const Variant& den) {  // median of den/num time ratios: num's speed-up
  std::vector<double> v;
  for (std::size_t r = 0; r < num.times.size(); ++r) v.push_back(den.times[r] / num.times[r]);
  return shard::apps::median(v);
}

}  // namespace

int main(int argc, char** argv) {
  return shard::apps::run_app(argc, argv, [&](shard::Runtime& rt) {
    namespace po = shard::apps::po;
    std::int64_t n = std::int64_t{1} << 24;
    std::int64_t small = 16;
    int ops = 60;
    int repeats = 20;
    int layers = 6;
    std::int64_t width = 1024, rows = 256;
    std::string trace;  // --schedule-trace PREFIX
    po::options_description options("jit_bench options");
    shard::apps::add_common_options(options);
    options.add_options()("n", po::value(&n)->default_value(n), "global elements of the chain's arrays")(
        "small", po::value(&small)->default_value(small), "global elements of the replay program's array")(
        "ops", po::value(&ops)->default_value(ops), "elementwise ops of the replay program")(
        "repeats", po::value(&repeats)->default_value(repeats), "timed repetitions of each variant")(
        "layers", po::value(&layers)->default_value(layers), "layers of the scheduling program")(
        "width", po::value(&width)->default_value(width), "its weights' side (float32, split over the mesh)")(
        "rows", po::value(&rows)->default_value(rows), "its activations' rows (replicated)")(
        "schedule-trace", po::value(&trace),
        "write the scheduling section's traced calls to PREFIX.unscheduled.json and "
        "PREFIX.scheduled.json (Chrome trace)");
    po::variables_map vm;
    if (!shard::apps::parse_command_line(
            argc, argv, options, vm, rt,
            "Usage: mpirun -n N jit_bench [options]\n"
            "Times jit's fused elementwise chains against eager and STREAM's triad, "
            "jit's replay cost per op, and jit's communication scheduling against none."))
      return 0;
    shard::apps::check_at_least("n", n, 1);
    shard::apps::check_at_least("small", small, 1);
    shard::apps::check_at_least("ops", ops, 1);
    shard::apps::check_at_least("repeats", repeats, 1);
    shard::apps::check_at_least("layers", layers, 1);
    shard::apps::check_at_least("width", width, 1);
    shard::apps::check_at_least("rows", rows, 1);
    MPI_Comm world = rt.world().get();
    const shard::Mesh mesh = shard::make_mesh({rt.device_count()}, {"a"});
    const shard::NamedSharding sharding(mesh, shard::P("a"));
    double sink = 0;

    // ---- the chain
    std::vector<ShardedArray<float>> in;
    for (int k = 0; k < 5; ++k)
      in.push_back(shard::generate<float>({n}, sharding, [k](const shard::Box& box) {
        Tensor<float> t(box.extent);
        for (std::int64_t i = 0; i < t.size(); ++i)
          t.flat(i) = static_cast<float>(((box.offset[0] + i) * (7 + k)) % 1001) * 0.002f - 1.f;
        return t;
      }));
    auto fused = shard::jit(chain);
    auto unfused = shard::jit(chain, shard::JitOptions{.dead_code = false, .fuse = false});
    {  // correctness first: the three give the same elements
      const auto e = chain(in[0], in[1], in[2], in[3], in[4]).to_host();
      const auto f = fused(in[0], in[1], in[2], in[3], in[4]).to_host();
      const auto u = unfused(in[0], in[1], in[2], in[3], in[4]).to_host();
      for (std::int64_t i = 0; i < e.size(); i += std::max<std::int64_t>(1, e.size() / 4099))
        if (!(static_cast<float>(f.flat(i)) == static_cast<float>(e.flat(i))) ||
            !(static_cast<float>(u.flat(i)) == static_cast<float>(e.flat(i))))
          shard::raise<shard::RuntimeError>("jit_bench: the jitted chain is WRONG at ", i);
    }
    std::int64_t local = 0;
    for (const auto& s : in[0].addressable_shards()) local += s.data.size();
    std::int64_t total = local;
    MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_INT64_T, MPI_SUM, world);
    std::vector<float> ta(static_cast<std::size_t>(local)), tb(ta.size(), 0.5f), tc(ta.size(), 0.25f);
    std::vector<Variant> cv{
        {"triad",
         [&] {
           triad(local, ta.data(), tb.data(), tc.data(), 3.f);
           return local ? double(ta[0]) : 0.;
         },
         {}},
        {"eager", [&] { return first_value(chain(in[0], in[1], in[2], in[3], in[4])); }, {}},
        {"jit_unfused", [&] { return first_value(unfused(in[0], in[1], in[2], in[3], in[4])); }, {}},
        {"jit_fused", [&] { return first_value(fused(in[0], in[1], in[2], in[3], in[4])); }, {}},
    };
    measure(cv, repeats, world, sink);
    const double triad_bytes = 12.0 * static_cast<double>(total),
                 chain_bytes = 22.0 * static_cast<double>(total);
    std::vector<double> gbps;
    for (std::size_t k = 0; k < cv.size(); ++k)
      gbps.push_back((k == 0 ? triad_bytes : chain_bytes) / shard::apps::median(cv[k].times) / 1e9);

    // ---- replay cost per op
    const shard::NamedSharding small_sharding(mesh, shard::P());
    const auto xs = shard::generate<float>({small}, small_sharding, [](const shard::Box& box) {
      Tensor<float> t(box.extent);
      for (std::int64_t i = 0; i < t.size(); ++i) t.flat(i) = 0.01f * static_cast<float>(box.offset[0] + i);
      return t;
    });
    const SmallProgram prog{ops, false}, broken{ops, true};
    auto p_fused = shard::jit(prog);
    auto p_unfused = shard::jit(prog, shard::JitOptions{.dead_code = false, .fuse = false});
    auto b_fused = shard::jit(broken);
    std::vector<Variant> rv{
        {"eager", [&] { return first_value(prog(xs)); }, {}},
        {"jit_unfused", [&] { return first_value(p_unfused(xs)); }, {}},
        {"jit_fused", [&] { return first_value(p_fused(xs)); }, {}},
        {"eager_reduce_between", [&] { return first_value(broken(xs)); }, {}},
        {"jit_reduce_between", [&] { return first_value(b_fused(xs)); }, {}},
    };
    const int inner = 50;  // calls per timed repetition (a call is microseconds)
    for (auto& v : rv) {
      auto one = v.run;
      v.run = [one, inner] {
        double s = 0;
        for (int i = 0; i < inner; ++i) s += one();
        return s;
      };
    }
    measure(rv, repeats, world, sink);
    const std::size_t fused_eqns = p_fused.lower(xs).optimized().num_ops();
    const std::size_t broken_ops = b_fused.lower(xs).num_ops(),
                      broken_eqns = b_fused.lower(xs).optimized().num_ops();
    auto us_per_op = [&](const Variant& v, int count) {
      return shard::apps::median(v.times) / inner / count * 1e6;
    };

    // ---- communication scheduling: layers whose weights are split over 'a' (FSDP) and gathered
    // where they are used; with the scheduler each gather starts one layer ahead.
    const shard::NamedSharding whole(mesh, shard::P()), split(mesh, shard::P("a", shard::None));
    auto init = [](std::int64_t seed) {
      return [seed](const shard::Box& box) {
        Tensor<float> t(box.extent);
        for (std::int64_t i = 0; i < t.size(); ++i)
          t.flat(i) = static_cast<float>((box.offset[0] * 31 + i * 17 + seed * 7) % 97) * 2e-3f - 0.09f;
        return t;
      };
    };
    std::vector<ShardedArray<float>> weights;
    for (int l = 0; l < layers; ++l)
      weights.push_back(shard::generate<float>({width, width}, split, init(l)));
    const auto acts = shard::generate<float>({rows, width}, whole, init(99));
    auto layered = [whole](const ShardedArray<float>& x, const std::vector<ShardedArray<float>>& ws) {
      ShardedArray<float> h = x;
      for (const auto& w : ws) h = tanh(shard::matmul(h, shard::reshard(w, whole)));
      return h;
    };
    auto sched_on = shard::jit(layered),
         sched_off = shard::jit(layered, shard::JitOptions{.schedule = false});
    {  // correctness first
      const auto a = sched_on(acts, weights).to_host(), b = sched_off(acts, weights).to_host();
      for (std::int64_t i = 0; i < a.size(); ++i)
        if (!(a.flat(i) == b.flat(i)))
          shard::raise<shard::RuntimeError>("jit_bench: the scheduled program is WRONG at ", i);
    }
    std::vector<Variant> sv{
        {"unscheduled", [&] { return first_value(sched_off(acts, weights)); }, {}},
        {"scheduled", [&] { return first_value(sched_on(acts, weights)); }, {}},
    };
    measure(sv, repeats, world, sink);
    std::vector<shard::TraceSummary> splits;  // one traced call of each (--schedule-trace: kept as files)
    for (auto* f : {&sched_off, &sched_on}) {
      shard::start_trace();
      sink += first_value((*f)(acts, weights));
      const char* which = splits.empty() ? ".unscheduled.json" : ".scheduled.json";
      splits.push_back(shard::stop_trace(trace.empty() ? std::string("/dev/null") : trace + which));
    }
    auto exposed = [&](const shard::TraceSummary& t) {
      double most = 0;
      for (const auto& r : t.ranks) most = std::max(most, r.exposed_communication_ms);
      return most;
    };
    auto comm = [&](const shard::TraceSummary& t) {
      double most = 0;
      for (const auto& r : t.ranks) most = std::max(most, r.communication_ms);
      return most;
    };

    std::ostringstream os;
    char line[512];
    os << "jit_bench: " << rt.process_count() << " ranks x " << rt.devices_per_rank() << " devices, "
       << mesh.to_string() << ", " << repeats
       << " repetitions in rotating order (median of the slowest rank; "
       << "paired = median of per-repetition ratios); " << shard::blas_summary() << "\n";
    os << "chain: astype<bfloat16>(maximum(((x * a + b) - c) * d, 0)), float32 (" << n << ",) P('a'), "
       << local << " elements on rank 0\n";
    std::snprintf(line, sizeof line, "%-12s %10s %9s %10s %14s %8s\n", "variant", "median_ms", "GB/s",
                  "vs_triad", "speedup_paired", "faults");
    os << line;
    for (std::size_t k = 0; k < cv.size(); ++k) {
      std::snprintf(line, sizeof line, "%-12s %10.2f %9.2f %10.3f %14s %8.1f\n", cv[k].name.c_str(),
                    shard::apps::median(cv[k].times) * 1e3, gbps[k], gbps[k] / gbps[0],
                    k < 2 ? "-" : (std::to_string(paired(cv[k], cv[1])).substr(0, 5) + "x eager").c_str(),
                    static_cast<double>(cv[k].faults) / repeats);
      os << line;
    }
    std::snprintf(
        line, sizeof line,
        "fused chain / triad bandwidth = %.3f (goal >= 0.8); fused over eager %.2fx, over jit unfused "
        "%.2fx (paired)\n",
        gbps[3] / gbps[0], paired(cv[3], cv[1]), paired(cv[3], cv[2]));
    os << line;
    os << "replay: " << ops << " elementwise ops on float32 (" << small << ",) replicated, " << inner
       << " calls per repetition; per op = call time / " << ops << " (the reduce_between program: / "
       << broken_ops << " traced ops, " << broken_eqns << " after fusion)\n";
    std::snprintf(line, sizeof line, "%-22s %12s\n", "variant", "us_per_op");
    os << line;
    for (std::size_t k = 0; k < rv.size(); ++k) {
      const int count = k < 3 ? ops : static_cast<int>(broken_ops);
      std::snprintf(line, sizeof line, "%-22s %12.3f\n", rv[k].name.c_str(), us_per_op(rv[k], count));
      os << line;
    }
    std::snprintf(
        line, sizeof line,
        "jit fused: %zu equation(s) for %d ops, %.3f us per op (goal < 0.3); not fused %.3f us per op, "
        "eager %.3f\n",
        fused_eqns, ops, us_per_op(rv[2], ops), us_per_op(rv[1], ops), us_per_op(rv[0], ops));
    os << line;
    os << "scheduling: " << layers << " layers h = tanh(h @ reshard(w, P())), h float32 (" << rows << ", "
       << width << ") replicated, w (" << width << ", " << width
       << ") P('a', None): one all_gather per layer; the scheduled program: "
       << sched_on.lower(acts, weights).optimized().to_string() << "\n";
    std::snprintf(line, sizeof line, "%-12s %10s %22s %20s\n", "variant", "median_ms",
                  "communicating_ms(1 call)", "exposed_ms(1 call)");
    os << line;
    for (std::size_t k = 0; k < sv.size(); ++k) {
      std::snprintf(line, sizeof line, "%-12s %10.2f %22.2f %20.2f\n", sv[k].name.c_str(),
                    shard::apps::median(sv[k].times) * 1e3, comm(splits[k]), exposed(splits[k]));
      os << line;
    }
    std::snprintf(line, sizeof line,
                  "scheduled over unscheduled %.3fx (paired); exposed communication %.2f ms against %.2f "
                  "(goal: less with scheduling on; the busiest rank of one traced call each)\n",
                  paired(sv[1], sv[0]), exposed(splits[1]), exposed(splits[0]));
    os << line;
    shard::apps::print0(rt, os.str());
    g_sink = sink;
    return 0;
  });
}
