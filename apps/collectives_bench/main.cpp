// collectives_bench: each Shard collective over mesh axes against the raw MPI call on the
// same bytes and the same communicator, interleaved in one run, medians over many
// repetitions (each repetition's time is the slowest rank's). A third column times the raw
// call under glibc's default memory policy (large temporaries mmap'ed and unmapped on every
// call), which is what a plain MPI program gets; Shard's Runtime keeps freed memory instead.
//
//   mpirun -n 2 collectives_bench
//   mpirun -n 4 collectives_bench --mesh 2x2 --axes b --dtype float32 --json

#include <algorithm>
#include <type_traits>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "common/bench.hpp"
#include "common/cli.hpp"
#include "shard/spmd/interop.hpp"
#include "shard/shard.hpp"
#include "shard/jit/cost_model.hpp"

namespace {

using shard::Tensor;

std::int64_t parse_size(const std::string& t) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(t, &used);
  } catch (const std::exception&) {
    shard::raise<shard::ValueError>("bad size '", t, "' (use e.g. 8, 64K, 16M)");
  }
  const std::string unit = t.substr(used);
  const double mult = unit.empty() || unit == "B"  ? 1.0
                      : unit == "K" || unit == "KiB" ? 1024.0
                      : unit == "M" || unit == "MiB" ? 1048576.0
                                                     : -1.0;
  // At least one byte, and at most 2^40 (also rejects inf and nan).
  if (mult < 0 || !(v * mult >= 1 && v * mult <= 1099511627776.0))
    shard::raise<shard::ValueError>("bad size '", t, "' (use e.g. 8, 64K, 16M: at least 1 byte)");
  return static_cast<std::int64_t>(v * mult);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, sep);)
    if (!item.empty()) out.push_back(item);
  return out;
}

std::string human(std::int64_t b) {
  if (b >= 1048576 && b % 1048576 == 0) return std::to_string(b / 1048576) + "M";
  if (b >= 1024 && b % 1024 == 0) return std::to_string(b / 1024) + "K";
  return std::to_string(b);
}

std::vector<std::pair<int, int>> cyclic(int n) {
  std::vector<std::pair<int, int>> p;
  for (int i = 0; i < n; ++i) p.emplace_back(i, (i + 1) % n);
  return p;
}

template <typename T>
Tensor<T> random_block(std::int64_t n, std::uint64_t seed) {
  Tensor<T> t({n});
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& v : t) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    v = static_cast<T>(static_cast<double>(s % 2001) / 1000.0 - 1.0);
  }
  return t;
}

struct Row {
  std::string collective;
  std::int64_t bytes = 0;
  int repeats = 0;
  double shard_us = 0, raw_us = -1, raw_default_us = -1, busbw = 0;
  double paired_ratio = -1;  ///< median over repetitions of shard/raw measured back to back
  double shard_faults = 0;   ///< minor page faults per Shard call (rank 0)
};

/// Bus bandwidth factor (nccl-tests convention) applied to bytes moved per device.
double bus_factor(const std::string& c, int n) {
  if (n == 1) return 0;
  if (c == "psum") return 2.0 * (n - 1) / n;
  if (c.starts_with("ppermute")) return 1.0;
  return static_cast<double>(n - 1) / n;
}

/// Bytes one device receives in collective `c` of `bytes` per device over n devices (what jit's
/// cost model counts: a ring's 2 (n-1)/n for psum, n-1 blocks for all_gather).
double received_bytes(const std::string& c, std::int64_t bytes, int n) {
  const auto b = static_cast<double>(bytes);
  if (c == "psum") return 2.0 * b * (n - 1) / n;
  if (c == "all_gather") return b * (n - 1);
  if (c == "all_to_all") return b * (n - 1) / n;
  return b;  // ppermute
}

/// Each kind's line through Shard's times: latency the smallest size's, slope the mean of
/// (time - latency) / received over the sizes >= 64K. Kinds not run keep the defaults.
shard::CostModel fit_cost_model(const std::vector<Row>& rows, int n) {
  shard::CostModel m = shard::default_cost_model();
  auto fit = [&](const std::string& c, shard::CollectiveCost& line) {
    const Row* smallest = nullptr;
    for (const Row& r : rows)
      if (r.collective == c && (!smallest || r.bytes < smallest->bytes)) smallest = &r;
    if (!smallest) return;
    double slope = 0;
    int k = 0;
    for (const Row& r : rows)
      if (r.collective == c && r.bytes >= 65536) {
        slope += (r.shard_us - smallest->shard_us) / received_bytes(c, r.bytes, n);
        ++k;
      }
    if (k == 0) return;
    line = {smallest->shard_us, std::max(0.0, slope / k)};
  };
  fit("psum", m.psum);
  fit("all_gather", m.all_gather);
  fit("all_to_all", m.all_to_all);
  fit("ppermute", m.exchange);
  return m;
}

struct Bench {
  shard::DeviceContext& ctx;
  shard::Axes axes;
  MPI_Comm comm;  // the group's communicator, or MPI_COMM_NULL when raw calls are not comparable
  int n;

  /// One Shard call on `in` (refilled from x first, as raw refills its send buffer). psum
  /// works in place and hands `in`'s buffer back. The others write a new result: the
  /// previous one is dropped first (as raw's receive buffer is overwritten), so the Runtime
  /// hands its buffer back; all_gather, all_to_all and ppermute read the lvalue `in` where it
  /// lies, psum_scatter consumes it and the next refill gets its buffer back. ppermute_chain
  /// is a ring of shifts, x = ppermute(x): what was received is sent next, so the two buffers
  /// swap roles call after call (as with `in = ppermute(std::move(in))`, whose result takes
  /// the buffer the previous input left).
  long faults = 0;  // minor page faults inside timed Shard calls

  template <typename T>
  double shard_once(const std::string& c, const Tensor<T>& x, Tensor<T>& in, Tensor<T>& result) {
    if (in.size() != x.size()) in = Tensor<T>(x.shape());
    std::copy(x.begin(), x.end(), in.begin());
    if (c != "psum") result = Tensor<T>();
    if (comm != MPI_COMM_NULL) MPI_Barrier(comm);
    const long f0 = shard::apps::minor_faults();
    struct Count {
      long& total;
      long f0;
      ~Count() { total += shard::apps::minor_faults() - f0; }
    } count{faults, f0};
    const double t0 = MPI_Wtime();
    if (c == "psum") in = ctx.psum(std::move(in), axes);
    else if (c == "all_gather") result = ctx.all_gather(in, axes, 0, true);
    else if (c == "psum_scatter") result = ctx.psum_scatter(std::move(in), axes, 0, true);
    else if (c == "all_to_all") result = ctx.all_to_all(in, axes, 0, 0, true);
    else result = ctx.ppermute(in, axes, cyclic(n));
    const double t = MPI_Wtime() - t0;
    if (c == "ppermute_chain") std::swap(in, result);
    return t;
  }

  template <typename T>
  double raw_once(const std::string& c, const Tensor<T>& x, Tensor<T>& buf, Tensor<T>& out) {
    if (buf.size() != x.size()) buf = Tensor<T>(x.shape());  // after psum_scatter consumed it
    std::copy(x.begin(), x.end(), buf.begin());
    const MPI_Datatype dt = shard::mpi::datatype<T>();
    const int count = static_cast<int>(x.size());
    const int me = ctx.axis_index(axes);
    MPI_Barrier(comm);
    const double t0 = MPI_Wtime();
    if (c == "psum") MPI_Allreduce(MPI_IN_PLACE, buf.data(), count, dt, MPI_SUM, comm);
    else if (c == "all_gather") MPI_Allgather(buf.data(), count, dt, out.data(), count, dt, comm);
    else if (c == "psum_scatter") MPI_Reduce_scatter_block(buf.data(), out.data(), count / n, dt, MPI_SUM, comm);
    else if (c == "all_to_all") MPI_Alltoall(buf.data(), count / n, dt, out.data(), count / n, dt, comm);
    else
      MPI_Sendrecv(buf.data(), count, dt, (me + 1) % n, 0, out.data(), count, dt, (me + n - 1) % n, 0, comm,
                   MPI_STATUS_IGNORE);
    const double t = MPI_Wtime() - t0;
    if (c == "ppermute_chain") std::swap(buf, out);  // what was received is sent next
    return t;
  }

  template <typename T>
  std::int64_t elements(std::int64_t bytes) const {
    std::int64_t e = std::max<std::int64_t>(n, bytes / static_cast<std::int64_t>(sizeof(T)));
    return e - e % n;  // the scatters need a multiple of the axis size
  }

  /// The raw call under glibc's default memory policy: run before anything kept memory, so
  /// large temporaries are mmap'ed and unmapped on every call as in a plain MPI program.
  template <typename T>
  double run_default(const std::string& c, std::int64_t bytes, int repeats) {
    const std::int64_t elems = elements<T>(bytes);
    const Tensor<T> x = random_block<T>(elems, 17 + static_cast<std::uint64_t>(ctx.device()));
    Tensor<T> buf = x, out({elems * (c == "all_gather" ? n : 1)});
    std::vector<double> td;
    for (int r = -1; r < repeats; ++r) {
      const double d = raw_once(c, x, buf, out);
      if (r >= 0) td.push_back(d);
    }
    MPI_Allreduce(MPI_IN_PLACE, td.data(), static_cast<int>(td.size()), MPI_DOUBLE, MPI_MAX, comm);
    return shard::apps::median(td) * 1e6;
  }

  /// Shard and the raw call interleaved (alternating which goes first), two warm-up rounds.
  template <typename T>
  Row run(const std::string& c, std::int64_t bytes, int repeats) {
    const std::int64_t elems = elements<T>(bytes);
    const Tensor<T> x = random_block<T>(elems, 17 + static_cast<std::uint64_t>(ctx.device()));
    Tensor<T> in = x, result(shard::Shape{c == "all_gather" ? elems * n : c == "psum_scatter" ? elems / n : elems});
    const bool raw = comm != MPI_COMM_NULL;
    // The raw call sends from and receives into the very buffers Shard's calls use (`in`, and
    // the buffer `result` gets back each call): two raw Sendrecvs on two different pairs of
    // 4-16 MiB buffers measured up to 14% apart here, so separate buffers would compare where
    // the pages lie rather than the code paths.
    // ABBA rounds (Shard, raw, raw, Shard; then the mirror image) cancel drift in the
    // machine's speed; a repetition pairs one Shard call with the raw call next to it.
    std::vector<double> ts, tr;
    long faults_before = 0;
    for (int r = -2; r < repeats; r += 2) {
      if (r == 0) faults_before = faults;
      double s1 = 0, s2 = 0, w1 = 0, w2 = 0;
      if (!raw) {
        s1 = shard_once(c, x, in, result);
        s2 = shard_once(c, x, in, result);
      } else if ((r / 2) % 2 == 0) {
        s1 = shard_once(c, x, in, result);
        w1 = raw_once(c, x, in, result);
        w2 = raw_once(c, x, in, result);
        s2 = shard_once(c, x, in, result);
      } else {
        w1 = raw_once(c, x, in, result);
        s1 = shard_once(c, x, in, result);
        s2 = shard_once(c, x, in, result);
        w2 = raw_once(c, x, in, result);
      }
      if (r < 0) continue;
      ts.insert(ts.end(), {s1, s2});
      tr.insert(tr.end(), {w1, w2});
    }
    if (raw) {  // the Shard call must leave exactly what the raw call leaves, on every rank
      auto left = [&]() -> const Tensor<T>& { return c == "psum" || c == "ppermute_chain" ? in : result; };
      shard_once(c, x, in, result);
      const Tensor<T> got = left();
      raw_once(c, x, in, result);
      // psum and psum_scatter may add in another order than MPI's (through group-shared memory
      // on one node: slot order), so their floating sums agree to rounding; everything else bit
      // for bit.
      int same = got == left() ? 1 : 0;
      // Every rank takes part in the allreduce below, also those whose result is equal bit for
      // bit (the others may differ in the last bit: a nonblocking reduction adds in its own order).
      double big = 0;
      for (const T v : x) big = std::max(big, std::abs(static_cast<double>(v)));
      MPI_Allreduce(MPI_IN_PLACE, &big, 1, MPI_DOUBLE, MPI_MAX, comm);
      if (!same && (c == "psum" || c == "psum_scatter") && shard::is_floating_v<T> && got.shape() == left().shape()) {
        // Rounding of a sum of n terms: n eps of the largest term, whatever their signs.
        const double eps = std::is_same_v<T, float> ? 6e-8 : 1.2e-16;
        same = 1;
        for (std::int64_t i = 0; i < got.size(); ++i)
          if (std::abs(static_cast<double>(got.flat(i)) - static_cast<double>(left().flat(i))) > 2.0 * n * eps * big) same = 0;
      }
      MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, comm);
      if (!same)
        shard::raise<shard::ValueError>("collectives_bench: Shard's ", c, " of ", bytes,
                                        " bytes per device differs from the raw MPI call on the same input");
    }
    Row row{c, elems * static_cast<std::int64_t>(sizeof(T)), repeats, 0};
    if (raw) {  // each repetition counts as long as its slowest rank
      for (auto* v : {&ts, &tr})
        MPI_Allreduce(MPI_IN_PLACE, v->data(), static_cast<int>(v->size()), MPI_DOUBLE, MPI_MAX, comm);
      std::vector<double> ratios;
      for (std::size_t i = 0; i < ts.size(); ++i) ratios.push_back(ts[i] / tr[i]);
      row.raw_us = shard::apps::median(tr) * 1e6;
      row.paired_ratio = shard::apps::median(ratios);
    }
    row.shard_us = shard::apps::median(ts) * 1e6;
    row.shard_faults = static_cast<double>(faults - faults_before) / static_cast<double>(ts.size());
    const double moved = static_cast<double>(row.bytes) * (c == "all_gather" ? n : 1);
    row.busbw = row.shard_us > 0 ? moved / (row.shard_us * 1e-6) * bus_factor(c, n) / 1e9 : 0;
    return row;
  }
};

template <typename T>
std::vector<Row> run_all(const shard::Mesh& mesh, const shard::Axes& axes, const std::vector<std::string>& colls,
                         const std::vector<std::int64_t>& sizes, int repeats_opt, bool keep_policy) {
  // The raw calls run on Shard's own communicator of the group (one device per rank along the
  // axes); otherwise there is no single MPI call to compare with.
  MPI_Comm raw_comm = MPI_COMM_NULL;
  try {
    raw_comm = shard::axis_communicator(mesh, axes);
  } catch (const shard::ValueError&) {
  }
  std::vector<Row> rows;
  auto body = [&](shard::DeviceContext& ctx, const Tensor<T>&) {
    Bench b{ctx, axes, raw_comm, ctx.axis_size(axes)};
    std::vector<Row> mine;
    auto reps_for = [&](std::int64_t bytes) {
      return repeats_opt > 0 ? repeats_opt : bytes <= 65536 ? 400 : bytes <= 4194304 ? 100 : 41;
    };
    // Phase 1, glibc defaults (the process started with them): the raw calls a plain MPI
    // program makes. Phase 2, Shard's policy: Shard and raw side by side.
    std::vector<double> dflt;
    for (const auto& c : colls)
      for (auto bytes : sizes)
        dflt.push_back(b.comm != MPI_COMM_NULL && bytes >= 65536 ? b.run_default<T>(c, bytes, reps_for(bytes)) : -1);
    shard::set_keep_freed_memory(keep_policy);
    std::size_t i = 0;
    for (const auto& c : colls)
      for (auto bytes : sizes) {
        mine.push_back(b.run<T>(c, bytes, reps_for(bytes)));
        mine.back().raw_default_us = dflt[i++];
      }
    if (ctx.device() == mesh.local_device_ids().front() && ctx.mesh().topology().process_index == 0)
      rows = mine;
    return Tensor<T>(shard::Shape{1}, T(0));
  };
  const auto unused = shard::zeros<T>({1}, shard::NamedSharding(mesh, shard::P()));
  shard::shard_map(mesh, shard::P(), shard::P(), body)(unused);
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  // Start with glibc's default memory policy so the default-malloc baseline is faithful; the
  // policy Shard's Runtime normally sets at start-up is switched on after that phase.
  shard::RuntimeOptions runtime_options;
  runtime_options.keep_freed_memory = false;
  // (a bad value is raised by the Runtime, which reads the same variable)
  bool keep_policy = true;
  try {
    keep_policy = shard::keep_freed_memory_from_env();
  } catch (const shard::Error&) {
  }
  return shard::apps::run_app(argc, argv, [&](shard::Runtime& rt) {
    namespace po = shard::apps::po;
    std::string mesh_text, axes_text, dtype, sizes_text, colls_text;
    int repeats = 0;
    po::options_description options("collectives_bench options");
    shard::apps::add_common_options(options);
    options.add_options()("mesh", po::value(&mesh_text)->default_value(""),
                          "mesh shape like 2x2 (default: all devices on one axis)")(
        "axes", po::value(&axes_text)->default_value(""), "mesh axes to run over, comma separated (default: the first)")(
        "dtype", po::value(&dtype)->default_value("float64"), "float32, float64, int32 or int64")(
        "sizes", po::value(&sizes_text)->default_value("8,64,1K,16K,64K,256K,1M,4M,16M,64M"),
        "bytes per device, comma separated (K, M suffixes)")(
        "collectives", po::value(&colls_text)->default_value("psum,all_gather,psum_scatter,all_to_all,ppermute,ppermute_chain"),
        "which collectives (ppermute: result = ppermute(x); ppermute_chain: x = ppermute(move(x)))")("repeats", po::value(&repeats)->default_value(0),
                             "timed repetitions per row (0: 400 up to 64K, 100 up to 4M, 41 above)")(
        "json", "one JSON object per row instead of the table")("comm-stats", "print Shard's CommStats at the end")(
        "cost-model", "also print the cost model jit's propagation reads (SHARD_COST_MODEL), fitted on these rows");
    po::variables_map vm;
    if (!shard::apps::parse_command_line(argc, argv, options, vm, rt,
                                         "Usage: mpirun -n N collectives_bench [options]\n"
                                         "Times Shard collectives against raw MPI on the same bytes."))
      return 0;

    const std::vector<int> shape = shard::apps::mesh_shape_from(mesh_text, rt.device_count());
    std::vector<std::string> names;
    for (std::size_t i = 0; i < shape.size(); ++i) names.push_back(std::string(1, static_cast<char>('a' + i)));
    const shard::Mesh mesh = shard::make_mesh(shape, names);
    const auto axis_list = split(axes_text, ',');
    const shard::Axes axes = axis_list.empty() ? shard::Axes(names[0]) : shard::Axes(axis_list);
    shard::apps::check_at_least("repeats", repeats, 0, "(0: by size)");
    std::vector<std::int64_t> sizes;
    for (const auto& s : split(sizes_text, ',')) sizes.push_back(parse_size(s));
    if (sizes.empty()) shard::raise<shard::ValueError>("--sizes '", sizes_text, "' names no size; write e.g. 8,64K,16M");
    const auto colls = split(colls_text, ',');
    if (colls.empty())
      shard::raise<shard::ValueError>("--collectives '", colls_text,
                                      "' names no collective; choose from psum,all_gather,psum_scatter,all_to_all,ppermute,ppermute_chain");
    for (const auto& c : colls)
      shard::apps::check_choice("collectives", c,
                                {"psum", "all_gather", "psum_scatter", "all_to_all", "ppermute", "ppermute_chain"});
    shard::apps::check_choice("dtype", dtype, {"float32", "float64", "int32", "int64"});

    std::vector<Row> rows;
    if (dtype == "float32") rows = run_all<float>(mesh, axes, colls, sizes, repeats, keep_policy);
    else if (dtype == "float64") rows = run_all<double>(mesh, axes, colls, sizes, repeats, keep_policy);
    else if (dtype == "int32") rows = run_all<std::int32_t>(mesh, axes, colls, sizes, repeats, keep_policy);
    else rows = run_all<std::int64_t>(mesh, axes, colls, sizes, repeats, keep_policy);

    std::ostringstream os;
    char line[256];
    if (!vm.count("json")) {
      os << "collectives_bench: " << rt.process_count() << " ranks x " << rt.devices_per_rank() << " devices, "
         << mesh.to_string() << ", axes " << axes.to_string() << ", " << dtype << "; " << shard::blas_summary()
         << "; keep freed memory: " << (shard::keep_freed_memory() ? "on" : "off") << "\n";
      os << "times are medians of the slowest rank per repetition, in microseconds; raw = the same MPI call on the "
            "same communicator\nand buffers, and each Shard result was checked equal to the raw call's on the same input;\n"
            "paired = median of shard/raw over back-to-back pairs (robust to drift); faults = minor page faults per Shard call;\nraw-dflt = raw "
            "under glibc's default malloc policy, measured first, before any memory was kept (rows >= 64K); busbw from "
            "Shard's time\n";
      std::snprintf(line, sizeof line, "%-15s %8s %6s %11s %11s %9s %9s %11s %10s %9s %7s\n", "collective", "bytes", "reps",
                    "shard_us", "raw_us", "shard/raw", "paired", "raw-dflt_us", "dflt/shard", "busbw_GB/s", "faults");
      os << line;
    }
    for (const auto& r : rows) {
      if (vm.count("json")) {
        std::snprintf(line, sizeof line,
                      "{\"collective\": \"%s\", \"bytes\": %lld, \"repeats\": %d, \"shard_us\": %.3f, \"raw_us\": %.3f, "
                      "\"paired_ratio\": %.4f, \"shard_page_faults\": %.1f, \"raw_default_malloc_us\": %.3f, \"busbw_GBps\": %.3f, \"ranks\": %d, "
                      "\"dtype\": \"%s\"}\n",
                      r.collective.c_str(), static_cast<long long>(r.bytes), r.repeats, r.shard_us, r.raw_us,
                      r.paired_ratio, r.shard_faults, r.raw_default_us, r.busbw, rt.process_count(), dtype.c_str());
      } else {
        const std::string ratio = r.raw_us > 0 ? std::to_string(r.shard_us / r.raw_us).substr(0, 5) : "-";
        const std::string dflt = r.raw_default_us > 0 ? std::to_string(r.raw_default_us).substr(0, 9) : "-";
        const std::string dr = r.raw_default_us > 0 ? std::to_string(r.raw_default_us / r.shard_us).substr(0, 5) : "-";
        const std::string raw = r.raw_us > 0 ? std::to_string(r.raw_us).substr(0, 9) : "-";
        const std::string paired = r.paired_ratio > 0 ? std::to_string(r.paired_ratio).substr(0, 5) : "-";
        std::snprintf(line, sizeof line, "%-15s %8s %6d %11.2f %11s %9s %9s %11s %10s %9.2f %7.1f\n",
                      r.collective.c_str(), human(r.bytes).c_str(), r.repeats, r.shard_us, raw.c_str(), ratio.c_str(),
                      paired.c_str(), dflt.c_str(), dr.c_str(), r.busbw, r.shard_faults);
      }
      os << line;
    }
    if (vm.count("comm-stats")) os << "\nCommStats of rank 0:\n" << shard::comm_stats().to_string();
    if (vm.count("cost-model")) {
      int n = 1;
      for (const auto& a : axes.axes()) n *= mesh.axis_size(a);
      if (n < 2) shard::raise<shard::ValueError>("--cost-model: the axes hold one device; nothing moves to time");
      os << "\ncost model, fitted on the rows above (latency = the smallest size's time; us per byte = the mean over\n"
            "sizes >= 64K of (time - latency) / bytes a device receives), for jit's propagation:\n"
         << "export SHARD_COST_MODEL=\"" << fit_cost_model(rows, n).to_string() << "\"\n";
    }
    shard::apps::print0(rt, os.str());
    return 0;
  }, runtime_options);
}
