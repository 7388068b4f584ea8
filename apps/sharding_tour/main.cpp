// sharding_tour: the walk-through of JAX's "Distributed arrays and automatic
// parallelization" tutorial on MPI. An --size square float32 array is placed with every
// layout the tutorial shows on a 4x2 mesh ('a','b'); each layout is drawn and the array is
// brought back with to_host() and compared with the input.
//
//   mpirun -n 4 sharding_tour --devices-per-rank 2 --size 1024

#include <cmath>
#include <cstdint>
#include <sstream>
#include <vector>

#include "common/cli.hpp"
#include "shard/shard.hpp"

namespace {

/// Deterministic pseudo-random normal-ish values, the same on every rank.
shard::Tensor<float> input(std::int64_t n) {
  shard::Tensor<float> x({n, n});
  std::uint64_t s = 0x9E3779B97F4A7C15ull;
  for (auto& v : x) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    const double u1 = (static_cast<double>(s >> 11) + 0.5) * 0x1.0p-53;
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    const double u2 = static_cast<double>(s >> 11) * 0x1.0p-53;
    v = static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  return x;
}

}  // namespace

int main(int argc, char** argv) {
  return shard::apps::run_app(argc, argv, [&](shard::Runtime& rt) {
    namespace po = shard::apps::po;
    std::int64_t size = 8192;
    std::vector<std::string> extra;
    po::options_description options("sharding_tour options");
    shard::apps::add_common_options(options);
    options.add_options()("size", po::value<std::int64_t>(&size)->default_value(8192), "side of the square array")(
        "spec", po::value<std::vector<std::string>>(&extra)->composing(),
        "an extra PartitionSpec to show on the 4x2 mesh, e.g. \"P('b', None)\" (repeatable)")(
        "comm-stats", "print what this rank sent over MPI (Shard's CommStats) at the end");
    po::variables_map vm;
    if (!shard::apps::parse_command_line(argc, argv, options, vm, rt,
                                         "Usage: mpirun -n N sharding_tour [--size S] [--devices-per-rank K]\n"
                                         "Needs 8 devices in all: -n 8, -n 4 --devices-per-rank 2, -n 2 "
                                         "--devices-per-rank 4 or -n 1 --devices-per-rank 8."))
      return 0;
    shard::apps::check_at_least("size", size, 1);
    if (rt.device_count() != 8)
      shard::raise<shard::ValueError>("sharding_tour uses the tutorial's 8 devices but this job has ",
                                      rt.device_count(), " (", rt.process_count(), " ranks x ", rt.devices_per_rank(),
                                      " devices per rank); run e.g. mpirun -n 4 sharding_tour --devices-per-rank 2");

    using shard::None;
    using shard::P;
    const shard::Tensor<float> x = input(size);
    const shard::Mesh mesh = shard::make_mesh({4, 2}, {"a", "b"});
    std::vector<std::pair<std::string, shard::NamedSharding>> layouts;
    for (const P& spec : {P("a", "b"), P("b", "a"), P("a", None), P(None, "b"), P(None, "a"), P({"a", "b"}, None)})
      layouts.emplace_back("NamedSharding(mesh, " + spec.to_string() + ")", shard::NamedSharding(mesh, spec));
    const shard::PositionalSharding sharding = shard::PositionalSharding::from_mesh(
        shard::make_mesh({8}, {"d"}));
    layouts.emplace_back("sharding.reshape(8, 1)", sharding.reshape({8, 1}));
    layouts.emplace_back("sharding.reshape(4, 2)", sharding.reshape({4, 2}));
    layouts.emplace_back("sharding.reshape(1, 8)", sharding.reshape({1, 8}));
    layouts.emplace_back("sharding.reshape(4, 2).replicate(axis=0)", sharding.reshape({4, 2}).replicate(0));
    layouts.emplace_back("sharding.reshape(4, 2).replicate(1)", sharding.reshape({4, 2}).replicate(1));
    for (const auto& text : extra) {
      const P spec = P::parse(text);
      layouts.emplace_back("NamedSharding(mesh, " + spec.to_string() + ")", shard::NamedSharding(mesh, spec));
    }

    shard::apps::print0(rt, "mesh: " + mesh.to_string() + " devices " + mesh.devices_string() + "\n" +
                                "sharding: " + sharding.to_string() + "\n\n");
    int matched = 0;
    for (const auto& [name, s] : layouts) {
      const double t0 = MPI_Wtime();
      const auto y = shard::device_put(x, s);
      const double t1 = MPI_Wtime();
      const bool same = y.to_host() == x;
      const bool all_same = !rt.world().any(!same);
      matched += all_same ? 1 : 0;
      std::ostringstream os;
      os << "y = device_put(x, " << name << ")\n";
      shard::visualize(y, os);
      os << "  local shard shape " << shard::to_string(y.addressable_shards().front().data.shape())
         << ", device_put " << (t1 - t0) * 1e3 << " ms, to_host() == x: " << (all_same ? "yes" : "NO") << "\n\n";
      shard::apps::print0(rt, os.str());
    }
    const int total = static_cast<int>(layouts.size());
    if (matched != total)
      shard::raise<shard::Error>("sharding_tour: ", total - matched, " of ", total, " layouts did not round-trip");
    shard::apps::print0(rt, "all " + std::to_string(total) + " layouts match the input\n");
    if (vm.count("comm-stats")) shard::apps::print0(rt, "\nCommStats of rank 0:\n" + shard::comm_stats().to_string());
    return 0;
  });
}
