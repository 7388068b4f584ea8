// autodiff_bench: what autodiff's bookkeeping costs per recorded op, in one run. A chain of
// --ops small ops (y = sin(y) * c + y, three primitives per link) on --n elements is timed
//   eager     forward, then its backward written by hand with the same ops (what a person
//             would write without autodiff: the same kernels, no tape);
//   autodiff  value_and_grad of the same forward (recording, then the rules);
// for a Tensor (local) and for a ShardedArray sharded over all devices. The bookkeeping per
// recorded op is (autodiff - eager) / recorded ops: the tape, the nodes, the closures and the
// cotangent accumulation. Medians of --repeats; the gradients of both are checked equal
// ("same": to 1e-12 of the largest element).
//
//   mpirun -n 2 autodiff_bench
//   mpirun -n 2 autodiff_bench --ops 1000 --n 16 --repeats 20

#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "common/bench.hpp"
#include "common/cli.hpp"
#include "shard/shard.hpp"

namespace {

double seconds(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// The forward chain (generic over the view): three primitives per link (sin, *, +).
template <typename X>
X chain(const X& x, int links) {
  X y = x;
  for (int k = 0; k < links; ++k) y = sin(y) * 0.5 + y;  // d/dy: cos(y) / 2 + 1
  return y;
}

/// The eager forward and a hand-written backward of sum(chain(x)) with the same ops.
template <typename X>
X eager_grad(const X& x, int links) {
  std::vector<X> ys{x};
  for (int k = 0; k < links; ++k) ys.push_back(sin(ys.back()) * 0.5 + ys.back());
  X ct = ones_like(x);
  for (int k = links; k-- > 0;) ct = ct * (cos(ys[static_cast<std::size_t>(k)]) * 0.5 + 1.0);
  return ct;
}

struct Row {
  std::string view;
  double eager_s, autodiff_s, per_op_us, max_diff;
};

template <typename X>
Row measure(const std::string& view, const X& x, int links, int repeats, shard::Runtime& rt) {
  std::vector<double> te, ta;
  X ge = x, ga = x;
  for (int r = 0; r < repeats; ++r) {
    te.push_back(seconds([&] { ge = eager_grad(x, links); }));
    ta.push_back(seconds([&] { ga = shard::grad([&](const X& v) { return sum(chain(v, links)); })(x); }));
  }
  (void)rt;
  double diff = 0;  // relative to the largest element of the gradient
  if constexpr (shard::detail::is_sharded_v<X>) diff = max(abs(ga - ge)).to_host().item() / max(abs(ge)).to_host().item();
  else diff = max(abs(ga - ge)).item() / max(abs(ge)).item();
  const double e = shard::apps::median(te), a = shard::apps::median(ta);
  return Row{view, e, a, (a - e) / (3.0 * links) * 1e6, diff};
}

}  // namespace

int main(int argc, char** argv) {
  return shard::apps::run_app(argc, argv, [&](shard::Runtime& rt) {
    namespace po = shard::apps::po;
    int ops = 1000, repeats = 20;
    std::int64_t n = 16;
    po::options_description options("autodiff_bench options");
    shard::apps::add_common_options(options);
    options.add_options()("ops", po::value(&ops)->default_value(ops), "recorded ops in the chain (3 per link)")(
        "n", po::value(&n)->default_value(n), "elements of the array")(
        "repeats", po::value(&repeats)->default_value(repeats), "timed repetitions");
    po::variables_map vm;
    if (!shard::apps::parse_command_line(argc, argv, options, vm, rt,
                                         "Usage: mpirun -n N autodiff_bench [options]\n"
                                         "Times autodiff's bookkeeping per recorded op against eager ops."))
      return 0;
    shard::apps::check_at_least("ops", ops, 3);
    shard::apps::check_at_least("n", n, 1);
    shard::apps::check_at_least("repeats", repeats, 1);
    const int links = ops / 3;
    const shard::Tensor<double> host = shard::random::normal_box<double>(shard::random::key(1), {n}, shard::full_box({n}));
    const shard::Mesh mesh = shard::make_mesh({rt.device_count()}, {"a"});
    const auto sharded = shard::device_put(host, shard::NamedSharding(mesh, shard::P("a")));
    const std::vector<Row> rows{measure("Tensor", host, links, repeats, rt),
                                measure("ShardedArray", sharded, links, repeats, rt)};
    std::string out = "autodiff_bench: " + std::to_string(rt.process_count()) + " ranks x " +
                      std::to_string(rt.devices_per_rank()) + " devices, a chain of " + std::to_string(3 * links) +
                      " recorded ops on " + std::to_string(n) + " float64 elements, median of " +
                      std::to_string(repeats) + "\n";
    char line[256];
    std::snprintf(line, sizeof line, "%-13s %12s %12s %16s %10s %14s\n", "view", "eager_ms", "autodiff_ms",
                  "bookkeeping_us", "goal_us", "gradient");
    out += line;
    for (const auto& r : rows) {
      std::snprintf(line, sizeof line, "%-13s %12.3f %12.3f %16.2f %10s %14s\n", r.view.c_str(), r.eager_s * 1e3,
                    r.autodiff_s * 1e3, r.per_op_us, "< 5", r.max_diff <= 1e-12 ? "same" : "DIFFERENT");
      out += line;
    }
    shard::apps::print0(rt, out);
    return 0;
  });
}
