// reshard_bench: representative reshards of an --size square float64 array, each against
// the raw MPI collective that moves the same bytes per rank on contiguous buffers, in one run,
// interleaved (ABBA), medians of the slowest rank.
//
//   mpirun -n 2 --bind-to core reshard_bench --size 4096
//   mpirun -n 4 reshard_bench --mesh 2x2 --json

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "common/bench.hpp"
#include "common/cli.hpp"
#include "shard/shard.hpp"

namespace {

using shard::None;
using shard::P;

double value_at(std::int64_t r, std::int64_t q) { return static_cast<double>((r * 7 + q) % 1009); }

struct Case {
  std::string name;
  shard::Shape shape;
  P from, to;
};

struct Row {
  std::string name, rule, raw_call;
  std::int64_t bytes = 0;  // sent by this rank (the busiest rank's, in the table)
  double shard_ms = 0, raw_ms = 0;
};

/// The raw collective that moves `bytes` per rank: Allgather for the all_gather rule, else
/// Alltoall with the bytes spread evenly over the other ranks.
struct Raw {
  MPI_Comm comm;
  int ranks;
  bool gather;
  std::int64_t count;  // doubles per peer (Alltoall) or per rank (Allgather)
  std::vector<double> send, recv;

  Raw(MPI_Comm c, int n, bool g, std::int64_t bytes) : comm(c), ranks(n), gather(g) {
    count = std::max<std::int64_t>(1, bytes / 8 / (g ? 1 : std::max(1, n - 1)));
    send.assign(static_cast<std::size_t>(count * (g ? 1 : n)), 1.5);
    recv.assign(static_cast<std::size_t>(count * n), 0.0);
  }
  double once() {
    MPI_Barrier(comm);
    const double t0 = MPI_Wtime();
    if (gather)
      MPI_Allgather(send.data(), static_cast<int>(count), MPI_DOUBLE, recv.data(), static_cast<int>(count), MPI_DOUBLE,
                    comm);
    else
      MPI_Alltoall(send.data(), static_cast<int>(count), MPI_DOUBLE, recv.data(), static_cast<int>(count), MPI_DOUBLE,
                   comm);
    return MPI_Wtime() - t0;
  }
};

Row run_case(const shard::Runtime& rt, const shard::Mesh& mesh, const Case& c, int repeats) {
  const shard::NamedSharding from(mesh, c.from), to(mesh, c.to);
  const auto x = shard::generate<double>(c.shape, from, [](const shard::Box& b) {
    shard::Tensor<double> t(b.extent);
    for (std::int64_t r = 0; r < b.extent[0]; ++r)
      for (std::int64_t q = 0; q < b.extent[1]; ++q) t(r, q) = value_at(b.offset[0] + r, b.offset[1] + q);
    return t;
  });
  const auto plan = shard::reshard_plan(x, to);
  const std::int64_t busiest = *std::max_element(plan.bytes_sent.begin(), plan.bytes_sent.end());
  const bool gather = plan.kind == shard::ReshardPlan::Kind::kAllGather;
  Raw raw(rt.world().get(), rt.process_count(), gather, std::max<std::int64_t>(busiest, 8));
  std::vector<double> ts, tr;
  auto shard_once = [&] {
    MPI_Barrier(rt.world().get());
    const double t0 = MPI_Wtime();
    const auto y = shard::reshard(x, to);
    return MPI_Wtime() - t0;
  };
  for (int r = -2; r < repeats; r += 2) {
    double s1, s2, w1, w2;
    if ((r / 2) % 2 == 0) {
      s1 = shard_once();
      w1 = raw.once();
      w2 = raw.once();
      s2 = shard_once();
    } else {
      w1 = raw.once();
      s1 = shard_once();
      s2 = shard_once();
      w2 = raw.once();
    }
    if (r < 0) continue;
    ts.insert(ts.end(), {s1, s2});
    tr.insert(tr.end(), {w1, w2});
  }
  for (auto* v : {&ts, &tr})
    MPI_Allreduce(MPI_IN_PLACE, v->data(), static_cast<int>(v->size()), MPI_DOUBLE, MPI_MAX, rt.world().get());
  // Check the result once: every element of this rank's new shards (a pure function of its index).
  const auto y = shard::reshard(x, to);
  bool ok = true;
  for (const auto& s : y.addressable_shards())
    for (std::int64_t r = 0; r < s.box.extent[0]; ++r)
      for (std::int64_t q = 0; q < s.box.extent[1]; ++q)
        ok = ok && s.data(r, q) == value_at(s.box.offset[0] + r, s.box.offset[1] + q);
  if (rt.world().any(!ok)) shard::raise<shard::Error>("reshard_bench: wrong result for ", c.name);
  static const char* kRules[] = {"none", "local", "all_gather", "all_to_all", "Alltoallv"};
  return Row{c.name, kRules[static_cast<int>(plan.kind)], gather ? "MPI_Allgather" : "MPI_Alltoall", busiest,
             shard::apps::median(ts) * 1e3, shard::apps::median(tr) * 1e3};
}

}  // namespace

int main(int argc, char** argv) {
  return shard::apps::run_app(argc, argv, [&](shard::Runtime& rt) {
    namespace po = shard::apps::po;
    std::int64_t size = 4096;
    int repeats = 20;
    std::string mesh_text;
    po::options_description options("reshard_bench options");
    shard::apps::add_common_options(options);
    options.add_options()("size", po::value(&size)->default_value(4096), "side of the square float64 array")(
        "repeats", po::value(&repeats)->default_value(20), "timed repetitions per case")(
        "mesh", po::value(&mesh_text)->default_value(""), "mesh shape like 2x2 (default: all devices on axis 'a')")(
        "json", "one JSON object per row");
    po::variables_map vm;
    if (!shard::apps::parse_command_line(argc, argv, options, vm, rt,
                                         "Usage: mpirun -n N reshard_bench [--size S] [--mesh AxB]\n"
                                         "Times reshards against raw MPI collectives moving the same bytes."))
      return 0;
    shard::apps::check_at_least("size", size, 2);
    shard::apps::check_at_least("repeats", repeats, 1);
    const std::vector<int> shape = shard::apps::mesh_shape_from(mesh_text, rt.device_count());
    if (shape.size() > 3)
      shard::raise<shard::ValueError>("--mesh ", mesh_text, ": reshard_bench takes a mesh of 1 to 3 axes, got ",
                                      shape.size());
    const std::vector<std::string> names = shape.size() == 1 ? std::vector<std::string>{"a"}
                                                             : std::vector<std::string>{"a", "b", "c"};
    const shard::Mesh mesh = shard::make_mesh(shape, {names.begin(), names.begin() + static_cast<long>(shape.size())});
    std::vector<Case> cases = {
        {"rows -> columns", {size, size}, P("a", None), P(None, "a")},
        {"rows -> replicated", {size, size}, P("a", None), P()},
        {"replicated -> rows", {size, size}, P(), P("a", None)},
        {"rows -> columns, uneven", {size - 1, size - 1}, P("a", None), P(None, "a")},
    };
    if (shape.size() >= 2) cases.push_back({"P('a','b') -> P('b','a')", {size, size}, P("a", "b"), P("b", "a")});

    std::ostringstream os;
    char line[256];
    if (!vm.count("json")) {
      os << "reshard_bench: " << rt.process_count() << " ranks x " << rt.devices_per_rank() << " devices, "
         << mesh.to_string() << ", float64 " << size << "x" << size << "; " << shard::blas_summary() << "\n"
         << "medians of the slowest rank over " << repeats
         << " ABBA-interleaved repetitions; raw = the MPI collective moving the same bytes per rank (the busiest "
            "rank's) between contiguous buffers\n";
      std::snprintf(line, sizeof line, "%-28s %-10s %14s %10s %10s %-14s %9s\n", "reshard", "rule", "bytes/rank",
                    "shard_ms", "raw_ms", "raw call", "shard/raw");
      os << line;
    }
    for (const auto& c : cases) {
      const Row r = run_case(rt, mesh, c, repeats);
      if (vm.count("json"))
        std::snprintf(line, sizeof line,
                      "{\"reshard\": \"%s\", \"rule\": \"%s\", \"bytes_per_rank\": %lld, \"shard_ms\": %.3f, "
                      "\"raw_ms\": %.3f, \"raw_call\": \"%s\", \"ranks\": %d}\n",
                      r.name.c_str(), r.rule.c_str(), static_cast<long long>(r.bytes), r.shard_ms, r.raw_ms,
                      r.raw_call.c_str(), rt.process_count());
      else
        std::snprintf(line, sizeof line, "%-28s %-10s %14lld %10.2f %10.2f %-14s %9.3f\n", r.name.c_str(),
                      r.rule.c_str(), static_cast<long long>(r.bytes), r.shard_ms, r.raw_ms, r.raw_call.c_str(),
                      r.raw_ms > 0 ? r.shard_ms / r.raw_ms : 0.0);
      os << line;
    }
    shard::apps::print0(rt, os.str());
    return 0;
  });
}
