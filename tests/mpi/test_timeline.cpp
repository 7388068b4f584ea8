// The timeline (runtime/profiler.hpp): start_trace / stop_trace write one Chrome-trace JSON file
// holding every rank's spans: eager ops on every device thread, a shard_map's psum and a reshard
// as collectives on every rank, a jit program's fused chain, block products; times aligned and
// nested; errors (no start_trace, an unwritable path) on every rank; nothing recorded when off.

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "../../src/io/json.hpp"
#include "mpi_test.hpp"
#include "shard/shard.hpp"
#include "test_util.hpp"

namespace {

using namespace shard;
using shard::testing::random_tensor;
namespace json = shard::detail::json;

/// A path every rank agrees on (rank 0's pid in it: concurrent test runs do not collide).
std::string shared_path(const std::string& stem) {
  const Runtime& rt = Runtime::current();
  const long pid = rt.world().broadcast(static_cast<long>(::getpid()), 0);
  return "/tmp/shard_test_" + stem + "_" + std::to_string(pid) + ".json";
}

json::Value read_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str(), path);
}

double number(const json::Value& v, const char* key) {
  const json::Value* m = v.find(key);
  return m ? std::stod(m->text) : -1;
}
std::string text(const json::Value& v, const char* key) {
  const json::Value* m = v.find(key);
  return m ? m->text : std::string();
}

struct Span {
  std::string name, cat;
  double ts, dur;
  int pid, tid;
};

SHARD_MPI_TEST(Timeline, EveryRanksOpsCollectivesAndFusedChainsInOneFile) {
  const Runtime& rt = Runtime::current();
  const int n = rt.device_count(), ranks = rt.process_count(), dpr = rt.devices_per_rank();
  const Mesh mesh = make_mesh({n}, {"x"});
  const NamedSharding rows(mesh, P("x", None)), cols(mesh, P(None, "x"));
  const auto a = device_put(random_tensor<float>({4 * n, 6}, 11), rows);
  const auto b = device_put(random_tensor<float>({6, 3 * n}, 12), cols);
  auto chain = jit([](const ShardedArray<float>& x) { return maximum((x * 2.f + 1.f) - x * x, 0.f); });
  (void)chain(a);  // traced before the trace starts: the trace holds the replay
  const std::string path = shared_path("timeline");
  start_trace();
  ASSERT_TRUE(tracing());
  const auto summed =
      shard_map(mesh, P("x", None), P(None, None),
                [](DeviceContext& ctx, const Tensor<float>& blk) { return ctx.psum(blk * 3.f, "x"); })(a);
  const auto moved = reshard(a, cols);  // a reshard between devices
  const auto product = matmul(a, b);    // block products
  const auto fused = chain(a);          // one fused[...] equation
  const double checksum = sum(summed).to_host().item() + sum(moved).to_host().item() +
                          sum(product).to_host().item() + sum(fused).to_host().item();
  ASSERT_TRUE(std::isfinite(checksum));
  const TraceSummary summary = stop_trace(path);
  ASSERT_FALSE(tracing());

  const json::Value doc = read_json(path);
  const json::Value* events = doc.find("traceEvents");
  ASSERT_NE(events, nullptr);
  ASSERT_EQ(events->kind, json::Value::Kind::kArray);
  std::vector<Span> spans;
  std::map<int, std::string> process_names;
  std::map<int, std::set<int>> named_threads;
  for (const auto& e : events->items) {
    const std::string ph = text(e, "ph");
    const int pid = static_cast<int>(number(e, "pid"));
    ASSERT_GE(pid, 0);
    ASSERT_LT(pid, ranks);
    if (ph == "M") {
      const json::Value* args = e.find("args");
      ASSERT_NE(args, nullptr);
      if (text(e, "name") == "process_name") process_names[pid] = text(*args, "name");
      if (text(e, "name") == "thread_name") named_threads[pid].insert(static_cast<int>(number(e, "tid")));
      continue;
    }
    ASSERT_EQ(ph, "X") << text(e, "name");
    Span s{text(e, "name"),
           text(e, "cat"),
           number(e, "ts"),
           number(e, "dur"),
           pid,
           static_cast<int>(number(e, "tid"))};
    ASSERT_GE(s.dur, 0) << s.name;
    ASSERT_GE(s.ts, -1.0) << s.name << ": spans start after the trace's origin (1 us of clock alignment)";
    spans.push_back(s);
  }
  ASSERT_EQ(static_cast<int>(process_names.size()), ranks);
  for (int r = 0; r < ranks; ++r) {
    EXPECT_EQ(process_names[r], "rank " + std::to_string(r));
    std::set<int> op_threads;
    int psums = 0, reshards = 0, products = 0, fused_eqns = 0;
    for (const auto& s : spans) {
      if (s.pid != r) continue;
      EXPECT_TRUE(named_threads[r].count(s.tid)) << "thread " << s.tid << " of rank " << r << " has no name";
      if (s.cat == "op" && s.name == "multiply") op_threads.insert(s.tid);
      psums += s.cat == "collective" && s.name == "psum 'x'";
      reshards += s.cat == "collective" && s.name.find("reshard") != std::string::npos;
      products += s.cat == "products";
      fused_eqns += s.cat == "jit" && s.name.rfind("fused", 0) == 0;
    }
    // The body's multiply ran on each of the rank's device threads.
    EXPECT_EQ(static_cast<int>(op_threads.size()), dpr) << "rank " << r;
    EXPECT_GE(psums, 1) << "rank " << r;
    if (ranks > 1) {
      EXPECT_GE(reshards, 1) << "rank " << r;
    }
    EXPECT_GE(products, 1) << "rank " << r;
    std::string jit_spans;
    for (const auto& s : spans)
      if (s.pid == r && s.cat == "jit") jit_spans += " " + s.name;
    EXPECT_EQ(fused_eqns, 1) << "rank " << r << "; the jit spans:" << jit_spans;
  }
  // Spans on one thread nest or follow each other (a scope's span encloses the ones it made).
  std::map<std::pair<int, int>, std::vector<Span>> by_thread;
  for (const auto& s : spans) by_thread[{s.pid, s.tid}].push_back(s);
  for (auto& [key, v] : by_thread) {
    std::sort(v.begin(), v.end(),
              [](const Span& x, const Span& y) { return x.ts != y.ts ? x.ts < y.ts : x.dur > y.dur; });
    std::vector<double> open_ends;
    for (const auto& s : v) {
      while (!open_ends.empty() && open_ends.back() <= s.ts + 1e-3) open_ends.pop_back();
      if (!open_ends.empty()) {
        EXPECT_LE(s.ts + s.dur, open_ends.back() + 2e-3) << s.name << " overlaps its enclosing span's end";
      }
      open_ends.push_back(s.ts + s.dur);
    }
  }
  // The summary stop_trace returned, on every rank, against the file's spans: per rank, each
  // elementary stretch between span boundaries belongs on each thread to the innermost span there
  // (the latest begun of those holding it); computing if some thread computes, communicating if
  // some thread communicates, exposed if it communicates and none computes.
  ASSERT_EQ(static_cast<int>(summary.ranks.size()), ranks);
  for (int r = 0; r < ranks; ++r) {
    std::vector<const Span*> mine;
    std::vector<double> cuts;
    for (const auto& sp : spans)
      if (sp.pid == r) {
        mine.push_back(&sp);
        cuts.push_back(sp.ts);
        cuts.push_back(sp.ts + sp.dur);
      }
    ASSERT_FALSE(mine.empty());
    std::sort(cuts.begin(), cuts.end());
    double compute = 0, comm = 0, exposed = 0;
    for (std::size_t i = 0; i + 1 < cuts.size(); ++i) {
      const double lo = cuts[i], hi = cuts[i + 1], mid = (lo + hi) / 2;
      if (hi - lo <= 0) continue;
      std::map<int, const Span*> inner;  // per thread
      for (const Span* sp : mine)
        if (sp->ts <= mid && mid < sp->ts + sp->dur) {
          const Span*& cur = inner[sp->tid];
          if (!cur || sp->ts > cur->ts || (sp->ts == cur->ts && sp->dur < cur->dur)) cur = sp;
        }
      bool computes = false, communicates = false;
      for (const auto& [tid, sp] : inner) {
        const bool c = sp->cat == "collective" || sp->cat == "start" || sp->cat == "wait";
        communicates = communicates || c;
        computes = computes || !c;
      }
      compute += computes ? hi - lo : 0;
      comm += communicates ? hi - lo : 0;
      exposed += communicates && !computes ? hi - lo : 0;
    }
    const RankTimeSplit& got = summary.ranks[static_cast<std::size_t>(r)];
    EXPECT_NEAR(got.wall_ms, (cuts.back() - cuts.front()) / 1e3, 1e-3) << "rank " << r;
    EXPECT_NEAR(got.compute_ms, compute / 1e3, 1e-3) << "rank " << r;
    EXPECT_NEAR(got.communication_ms, comm / 1e3, 1e-3) << "rank " << r;
    EXPECT_NEAR(got.exposed_communication_ms, exposed / 1e3, 1e-3) << "rank " << r;
    EXPECT_GT(got.compute_ms, 0) << "rank " << r;
    EXPECT_GT(got.communication_ms, 0) << "rank " << r << " ran a psum";
    EXPECT_LE(got.exposed_communication_ms, got.communication_ms + 1e-9) << "rank " << r;
  }
  EXPECT_NE(summary.to_string().find("rank 0: "), std::string::npos) << summary.to_string();
  const json::Value* other = doc.find("otherData");
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(number(*other, "ranks"), ranks);
  EXPECT_EQ(number(*other, "dropped_events"), 0);
  rt.world().barrier();  // every rank read the file before rank 0 removes it
  if (rt.process_index() == 0) std::remove(path.c_str());
}

/// The spans of a trace file (metadata events skipped).
std::vector<Span> spans_of(const json::Value& doc) {
  std::vector<Span> spans;
  for (const auto& e : doc.find("traceEvents")->items)
    if (text(e, "ph") == "X")
      spans.push_back(Span{text(e, "name"), text(e, "cat"), number(e, "ts"), number(e, "dur"),
                           static_cast<int>(number(e, "pid")), static_cast<int>(number(e, "tid"))});
  return spans;
}

SHARD_MPI_TEST(Timeline, AScheduledAllGatherStartsBeforeTheOpBeforeItsFirstUse) {
  // jit's scheduler (jit/optimize.hpp) on two layers whose split weights are gathered where they
  // are used: on every rank's timeline, each all_gather's start span ends before the op that
  // precedes its wait begins, and (across ranks) the wait completes the transfer.
  const Runtime& rt = Runtime::current();
  const int n = rt.device_count(), ranks = rt.process_count();
  const Mesh mesh = make_mesh({n}, {"x"});
  const NamedSharding whole(mesh, P());
  const auto v = device_put(random_tensor<float>({2 * n + 1, 4 * n}, 51), whole);
  const auto w1 = device_put(random_tensor<float>({4 * n, 2 * n}, 52), NamedSharding(mesh, P("x", None)));
  const auto w2 = device_put(random_tensor<float>({2 * n, 2 * n}, 53), NamedSharding(mesh, P("x", None)));
  auto body = [whole](const ShardedArray<float>& x, const ShardedArray<float>& a,
                      const ShardedArray<float>& b) {
    const auto h = matmul(tanh(x) * 3.f - 1.f, reshard(a, whole));
    return matmul(h * 2.f + 1.f, reshard(b, whole));
  };
  auto f = jit(body);
  (void)f(v, w1, w2);  // traced before the trace starts: the trace holds a replay
  const std::string path = shared_path("schedule");
  start_trace();
  const auto out = f(v, w1, w2);
  (void)stop_trace(path);
  const Tensor<double> got = shard::testing::host_double(out),
                       want = shard::testing::host_double(body(v, w1, w2));
  for (std::int64_t i = 0; i < got.size(); ++i) ASSERT_EQ(got.flat(i), want.flat(i));
  const std::vector<Span> spans = spans_of(read_json(path));
  rt.world().barrier();  // every rank has read the file
  if (rt.process_index() == 0) std::remove(path.c_str());
  if (n == 1) return;  // one device: the reshards move nothing, nothing is scheduled
  for (int pid = 0; pid < ranks; ++pid) {
    std::vector<Span> ops;  // the replay's equations, in order
    for (const Span& sp : spans)
      if (sp.pid == pid && sp.cat == "jit") ops.push_back(sp);
    std::sort(ops.begin(), ops.end(), [](const Span& a, const Span& b) { return a.ts < b.ts; });
    std::vector<std::string> names;
    for (const Span& sp : ops) names.push_back(sp.name);
    const std::vector<std::string> expected{"all_gather_start", "fused",  "all_gather_done",
                                            "all_gather_start", "matmul", "fused",
                                            "all_gather_done",  "matmul"};
    ASSERT_EQ(names, expected) << "rank " << pid;
    for (const auto& [start, done] : {std::pair{0, 2}, std::pair{3, 6}}) {
      const Span& s = ops[static_cast<std::size_t>(start)];
      const Span& before_wait = ops[static_cast<std::size_t>(done - 1)];
      EXPECT_LE(s.ts + s.dur, before_wait.ts)
          << "rank " << pid << ": the gather started before " << before_wait.name;
      // The collective's own start span inside the start op, on the replay's thread.
      const bool started = std::any_of(spans.begin(), spans.end(), [&](const Span& c) {
        return c.pid == pid && c.cat == "start" && c.name == "start reshard 'x'" && c.ts >= s.ts - 1 &&
               c.ts + c.dur <= s.ts + s.dur + 1;
      });
      EXPECT_TRUE(started) << "rank " << pid;
    }
  }
}

SHARD_MPI_TEST(Timeline, NothingIsRecordedWhenOff) {
  const Mesh mesh = make_mesh({Runtime::current().device_count()}, {"x"});
  const auto a = device_put(random_tensor<float>({8, 4}, 3), NamedSharding(mesh, P("x", None)));
  const std::string path = shared_path("timeline_off");
  start_trace();
  stop_trace(path);            // an empty trace: the ranks' names only
  (void)sum(a * a).to_host();  // not recorded: the trace is off
  const std::string second = shared_path("timeline_off2");
  start_trace();
  stop_trace(second);
  for (const std::string& p : {path, second}) {
    const json::Value doc = read_json(p);
    for (const auto& e : doc.find("traceEvents")->items) EXPECT_EQ(text(e, "ph"), "M") << text(e, "name");
  }
  Runtime::current().world().barrier();
  if (Runtime::current().process_index() == 0) {
    std::remove(path.c_str());
    std::remove(second.c_str());
  }
}

SHARD_MPI_TEST(Timeline, ErrorsOnEveryRank) {
  // stop_trace without start_trace: ValueError on every rank (no rank waits for another).
  EXPECT_THROW(stop_trace(shared_path("never_started")), ValueError);
  // An unwritable path: IoError on every rank, naming the path.
  start_trace();
  try {
    stop_trace("/nonexistent_dir_of_shard/timeline.json");
    ADD_FAILURE() << "no IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent_dir_of_shard/timeline.json"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(tracing());
  // Inside a shard_map body (run once per device thread): ValueError on every rank, naming the
  // fix, for start_trace and stop_trace; the trace started outside is still written.
  const Mesh mesh = make_mesh({shard::testing::runtime().device_count()}, {"d"});
  const auto x = device_put(random_tensor<float>({2 * mesh.size()}, 7), NamedSharding(mesh, P("d")));
  start_trace();
  const std::string in_body = shared_path("in_body");
  for (const bool stop : {false, true}) {
    try {
      (void)shard_map(mesh, P("d"), P("d"), [stop, &in_body](const Tensor<float>& b) {
        if (stop)
          stop_trace(in_body);
        else
          start_trace();
        return b * 2.0f;
      })(x);
      ADD_FAILURE() << "no ValueError";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("outside the body"), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(tracing());
  const std::string path = shared_path("after_body");
  stop_trace(path);
  EXPECT_FALSE(tracing());
  shard::testing::runtime().world().barrier();
  if (shard::testing::runtime().process_index() == 0) std::remove(path.c_str());
}

}  // namespace
