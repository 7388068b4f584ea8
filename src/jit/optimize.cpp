// jit's program passes (jit/optimize.hpp): dead code, common subexpressions, elementwise fusion,
// communication scheduling.

#include "shard/jit/optimize.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "shard/array/reshard.hpp"
#include "shard/error.hpp"

namespace shard::detail {

namespace {

/// Elements of each block a fused chain computes at a time: its live intermediates (scratch tiles
/// reused once dead) and the inputs' tiles stay in L1/L2. On jit_bench's chain (2026-11-29, 2 ranks,
/// runs of 1024, 2048 and 4096 interleaved): 2048 0.755-0.846 of the triad (mean 0.82), 1024
/// 0.76-0.82 (0.79), 4096 0.76-0.82 (0.80).
constexpr std::int64_t kTile = 2048;

/// The uses of each value (equation indices) and whether the program returns it.
struct Uses {
  std::vector<std::vector<int>> by;
  std::vector<bool> output;
};

Uses uses_of(const Program& p) {
  Uses u;
  u.by.resize(p.values.size());
  u.output.assign(p.values.size(), false);
  for (std::size_t i = 0; i < p.eqns.size(); ++i)
    for (const int v : p.eqns[i].in)
      if (v >= 0) u.by[static_cast<std::size_t>(v)].push_back(static_cast<int>(i));
  for (const int v : p.outputs) u.output[static_cast<std::size_t>(v)] = true;
  return u;
}

/// Drops the pure equations none of whose results is used (last to first, so chains go at once).
int drop_dead(Program& p) {
  std::vector<bool> live(p.values.size(), false);
  for (const int v : p.outputs) live[static_cast<std::size_t>(v)] = true;
  std::vector<bool> keep(p.eqns.size(), true);
  int dropped = 0;
  for (std::size_t i = p.eqns.size(); i-- > 0;) {
    const ProgramEqn& e = p.eqns[i];
    const bool used =
        std::any_of(e.out.begin(), e.out.end(), [&](int v) { return live[static_cast<std::size_t>(v)]; });
    if (e.pure && !used) {
      keep[i] = false;
      ++dropped;
      continue;
    }
    for (const int v : e.in)
      if (v >= 0) live[static_cast<std::size_t>(v)] = true;
  }
  if (dropped == 0) return 0;
  std::vector<ProgramEqn> kept;
  kept.reserve(p.eqns.size() - static_cast<std::size_t>(dropped));
  for (std::size_t i = 0; i < p.eqns.size(); ++i)
    if (keep[i]) kept.push_back(std::move(p.eqns[i]));
  p.eqns = std::move(kept);
  return dropped;
}

/// Whether the equation moves no data on replay: it ran no collective when traced, and it finds
/// each operand laid out as it wants it (its plan's layout if propagation gave it one, which must
/// close over no axes; else the layout it was traced with), so replay reshards nothing. Only such
/// equations are merged: whether two primitives' bytes agree could differ between ranks (a
/// pointer), and a collective dropped on one rank but not another would hang.
bool moves_nothing(const ProgramEqn& e, const Program& p) {
  if (!e.comms.empty()) return false;
  if (e.plan && !e.plan->closing.is_none()) return false;
  for (std::size_t k = 0; k < e.in.size(); ++k) {
    const auto& have = p.values[static_cast<std::size_t>(e.in[k])].sharding;
    if (e.plan) {
      const auto& want = k < e.plan->want.size() ? e.plan->want[k] : std::nullopt;
      if (want && (!have || !(have->spec() == *want))) return false;
    } else if (k < e.in_shardings.size() && e.in_shardings[k] && !(have == e.in_shardings[k])) {
      return false;
    }
  }
  return true;
}

/// Common subexpressions: a pure equation that computes what an earlier one computes (the same
/// primitive with the same parameters on the same operands, laid out the same way) is dropped and
/// its readers read the earlier result. Runs first to last, so that merged operands make their
/// readers equal too.
int merge_common(Program& p) {
  std::vector<int> rename(p.values.size());
  for (std::size_t v = 0; v < rename.size(); ++v) rename[v] = static_cast<int>(v);
  auto renamed = [&](int v) { return v >= 0 ? rename[static_cast<std::size_t>(v)] : v; };
  std::map<std::pair<std::string, std::vector<int>>, std::vector<std::size_t>> seen;  // -> kept indices
  std::vector<ProgramEqn> kept;
  kept.reserve(p.eqns.size());
  int merged = 0;
  for (auto& e : p.eqns) {
    for (int& v : e.in) v = renamed(v);
    if (e.pure && !e.identity.empty() && e.out.size() == 1 && moves_nothing(e, p)) {
      auto& candidates = seen[{e.identity, e.in}];
      bool found = false;
      for (const std::size_t k : candidates) {
        const ProgramEqn& f = kept[k];
        if (f.in_shardings == e.in_shardings && f.out_sharding == e.out_sharding && f.plan == e.plan &&
            p.values[static_cast<std::size_t>(f.out[0])].shape ==
                p.values[static_cast<std::size_t>(e.out[0])].shape &&
            p.values[static_cast<std::size_t>(f.out[0])].dtype ==
                p.values[static_cast<std::size_t>(e.out[0])].dtype) {
          rename[static_cast<std::size_t>(e.out[0])] = f.out[0];
          found = true;
          break;
        }
      }
      if (found) {
        ++merged;
        continue;
      }
      candidates.push_back(kept.size());
    }
    kept.push_back(std::move(e));
  }
  for (int& v : p.outputs) v = renamed(v);
  p.eqns = std::move(kept);
  return merged;
}

/// The layout a pointwise equation's blocks have on replay (its result's), if every operand is
/// lined up with it there too; false when propagation gave it a plan fusion cannot follow.
bool fusable(const ProgramEqn& e) {
  if (!e.pointwise || e.out.size() != 1) return false;
  if (e.plan) {
    if (!e.plan->closing.is_none()) return false;
    for (const auto& w : e.plan->want)
      if (w && !(*w == e.plan->out)) return false;
  }
  return true;
}

/// One fused chain: the steps in order, each reading inputs of the chain or earlier steps.
struct Chain {
  std::vector<std::shared_ptr<const Pointwise>> steps;
  std::vector<std::vector<int>> args;  ///< per step: < n_in an input, else n_in + an earlier step
  std::vector<int> writes;             ///< per step: the output it writes, or -1 (scratch)
  std::vector<int> in_ids, out_ids;
  std::vector<const ValueAccess*> in_access, out_access;
  std::vector<bool> out_committed;
  std::vector<std::size_t> step_bytes;  ///< per step: its result's element size
  std::vector<int> slot;                ///< per step writing no output: its scratch tile
  std::size_t scratch_slots = 0;        ///< tiles of scratch (reused once a value is dead: stays in L1)
  Shape shape;
  std::optional<NamedSharding> layout;
};

void run_chain(const Chain& c, ReplayEnv& env) {
  const std::size_t n_in = c.in_ids.size(), n_out = c.out_ids.size(), n_steps = c.steps.size();
  std::vector<std::any> ins(n_in);
  std::vector<std::vector<const void*>> in_data(n_in);
  std::vector<std::int64_t> sizes;
  for (std::size_t k = 0; k < n_in; ++k) {
    ins[k] = c.in_access[k]->lined(env.slots[static_cast<std::size_t>(c.in_ids[k])], c.layout);
    std::vector<std::int64_t> s;
    c.in_access[k]->blocks(ins[k], in_data[k], s);
    if (k == 0)
      sizes = s;
    else if (s != sizes)
      raise<Error>("jit: a fused chain's inputs have blocks of different sizes (an internal error)");
  }
  std::vector<std::any> outs(n_out);
  std::vector<std::vector<void*>> out_data(n_out);
  for (std::size_t o = 0; o < n_out; ++o)
    outs[o] = c.out_access[o]->make(c.shape, c.layout, c.out_committed[o], out_data[o]);
  // One scratch tile per step that writes no output, reused across blocks and calls.
  thread_local std::vector<std::max_align_t> scratch_store;
  const std::size_t tile_bytes = static_cast<std::size_t>(kTile) * sizeof(double);
  const std::size_t need =
      (c.scratch_slots * tile_bytes + sizeof(std::max_align_t) - 1) / sizeof(std::max_align_t);
  if (scratch_store.size() < need) scratch_store.resize(need);
  auto* scratch = reinterpret_cast<char*>(scratch_store.data());
  std::vector<const void*> args;
  std::vector<char*> step_out(n_steps);
  for (std::size_t b = 0; b < sizes.size(); ++b) {
    const std::int64_t n = sizes[b];
    for (std::int64_t i0 = 0; i0 < n; i0 += kTile) {
      const std::int64_t m = std::min(kTile, n - i0);
      for (std::size_t s = 0; s < n_steps; ++s) {
        step_out[s] = c.writes[s] >= 0
                          ? static_cast<char*>(out_data[static_cast<std::size_t>(c.writes[s])][b]) +
                                i0 * static_cast<std::int64_t>(c.step_bytes[s])
                          : scratch + static_cast<std::size_t>(c.slot[s]) * tile_bytes;
        args.clear();
        for (const int a : c.args[s]) {
          if (static_cast<std::size_t>(a) < n_in)
            args.push_back(
                static_cast<const char*>(in_data[static_cast<std::size_t>(a)][b]) +
                i0 * static_cast<std::int64_t>(c.in_access[static_cast<std::size_t>(a)]->elem_size));
          else
            args.push_back(step_out[static_cast<std::size_t>(a) - n_in]);
        }
        c.steps[s]->span(m, args.data(), step_out[s]);
      }
    }
  }
  for (std::size_t o = 0; o < n_out; ++o)
    env.slots[static_cast<std::size_t>(c.out_ids[o])] = std::move(outs[o]);
}

/// The fused equation of eqns [first, last) of p.
ProgramEqn fuse_chain(const Program& p, const Uses& uses, std::size_t first, std::size_t last) {
  auto c = std::make_shared<Chain>();
  const ProgramEqn& head = p.eqns[first];
  c->shape = p.values[static_cast<std::size_t>(head.out[0])].shape;
  c->layout = head.out_sharding;
  std::vector<int> step_of_value(p.values.size(), -1);
  ProgramEqn f;
  f.op = "fused";
  f.where = head.where;
  f.pure = true;
  for (std::size_t i = first; i < last; ++i) {
    const ProgramEqn& e = p.eqns[i];
    std::vector<int> args;
    for (std::size_t k = 0; k < e.in.size(); ++k) {
      const int v = e.in[k];
      if (const int s = step_of_value[static_cast<std::size_t>(v)]; s >= 0) {
        args.push_back(-1 - s);  // fixed below, once the inputs are counted
        continue;
      }
      auto it = std::find(c->in_ids.begin(), c->in_ids.end(), v);
      if (it == c->in_ids.end()) {
        c->in_ids.push_back(v);
        c->in_access.push_back(e.pointwise->in[k]);
        it = c->in_ids.end() - 1;
      }
      args.push_back(static_cast<int>(it - c->in_ids.begin()));
    }
    const int step = static_cast<int>(c->steps.size());
    const int v = e.out[0];
    step_of_value[static_cast<std::size_t>(v)] = step;
    c->steps.push_back(e.pointwise);
    c->args.push_back(std::move(args));
    c->step_bytes.push_back(e.pointwise->out->elem_size);
    // A result the rest of the program (or the caller) reads is written out; the others stay in
    // the scratch tile.
    const auto& by = uses.by[static_cast<std::size_t>(v)];
    const bool outside =
        uses.output[static_cast<std::size_t>(v)] || std::any_of(by.begin(), by.end(), [&](int u) {
          return u < static_cast<int>(first) || u >= static_cast<int>(last);
        });
    if (outside) {
      c->writes.push_back(static_cast<int>(c->out_ids.size()));
      c->out_ids.push_back(v);
      c->out_access.push_back(e.pointwise->out);
      c->out_committed.push_back(p.values[static_cast<std::size_t>(v)].committed);
    } else {
      c->writes.push_back(-1);
    }
    f.params += (i > first ? ", " : "") + e.op;
  }
  const int n_in = static_cast<int>(c->in_ids.size());
  for (auto& a : c->args)
    for (int& r : a)
      if (r < 0) r = n_in + (-1 - r);
  // Scratch tiles: a step takes a free one (never one of its own operands': the kernels take
  // restrict pointers); a value's tile is free after the last step that reads it.
  const int n_steps = static_cast<int>(c->steps.size());
  std::vector<int> last_use(c->steps.size(), -1);
  for (int s = 0; s < n_steps; ++s)
    for (const int r : c->args[static_cast<std::size_t>(s)])
      if (r >= n_in) last_use[static_cast<std::size_t>(r - n_in)] = s;
  std::vector<bool> busy;
  c->slot.assign(c->steps.size(), -1);
  for (int s = 0; s < n_steps; ++s) {
    if (c->writes[static_cast<std::size_t>(s)] < 0) {
      int free = 0;
      while (free < static_cast<int>(busy.size()) && busy[static_cast<std::size_t>(free)]) ++free;
      if (free == static_cast<int>(busy.size())) busy.push_back(false);
      busy[static_cast<std::size_t>(free)] = true;
      c->slot[static_cast<std::size_t>(s)] = free;
    }
    for (const int r : c->args[static_cast<std::size_t>(s)])
      if (r >= n_in && last_use[static_cast<std::size_t>(r - n_in)] == s &&
          c->slot[static_cast<std::size_t>(r - n_in)] >= 0)
        busy[static_cast<std::size_t>(c->slot[static_cast<std::size_t>(r - n_in)])] = false;
  }
  c->scratch_slots = busy.size();
  f.in = c->in_ids;
  f.out = c->out_ids;
  f.in_shardings.assign(c->in_ids.size(), c->layout);
  f.out_sharding = c->layout;
  f.run = [c](ReplayEnv& env, const ProgramEqn&) { run_chain(*c, env); };
  return f;
}

bool same_layout(const ProgramEqn& a, const ProgramEqn& b, const Program& p) {
  return a.out_sharding == b.out_sharding && p.values[static_cast<std::size_t>(a.out[0])].shape ==
                                                 p.values[static_cast<std::size_t>(b.out[0])].shape;
}

int fuse_chains(Program& p, OptimizeStats& stats) {
  const Uses uses = uses_of(p);
  std::vector<ProgramEqn> out;
  out.reserve(p.eqns.size());
  int made = 0;
  std::size_t i = 0;
  while (i < p.eqns.size()) {
    std::size_t j = i;
    if (fusable(p.eqns[i]))
      while (j + 1 < p.eqns.size() && fusable(p.eqns[j + 1]) && same_layout(p.eqns[i], p.eqns[j + 1], p)) ++j;
    if (j > i) {
      out.push_back(fuse_chain(p, uses, i, j + 1));
      ++made;
      stats.ops_fused += static_cast<int>(j + 1 - i);
    } else {
      out.push_back(std::move(p.eqns[i]));
    }
    i = j + 1;
  }
  p.eqns = std::move(out);
  return made;
}

/// A reshard that is one all_gather, which the scheduler starts early: of `value` to `to`, first
/// read by equation `first_use` (p.eqns.size(): only returned), either made by the reshard
/// equation `reshard_eqn` (its result `explicit_out`) or by an equation's replay of its operands
/// (`uses`: the operands that read the gathered array).
struct Gather {
  int value = -1;
  NamedSharding to;
  std::string axis;
  int dim = 0;
  int first_use = 0;
  std::vector<std::pair<int, std::size_t>> uses;  ///< (equation, operand)
  int reshard_eqn = -1;
  int explicit_out = -1;
  int start = 0;  ///< the equation it starts before
};

/// The all_gather reshards of p in order of first use: the explicit reshard equations and the
/// operands an equation reshards on replay (to its plan's layout, or to the layout it was traced
/// with), one per value and target layout.
std::vector<Gather> find_gathers(const Program& p) {
  const int n = static_cast<int>(p.eqns.size());
  std::vector<int> first_reader(p.values.size(), -1);
  for (int i = n; i-- > 0;)
    for (const int v : p.eqns[static_cast<std::size_t>(i)].in)
      if (v >= 0) first_reader[static_cast<std::size_t>(v)] = i;
  for (const int v : p.outputs)
    if (first_reader[static_cast<std::size_t>(v)] < 0) first_reader[static_cast<std::size_t>(v)] = n;
  std::vector<Gather> out;
  auto gather_plan = [&](int v, const NamedSharding& to) -> std::optional<ReshardPlan> {
    const ProgramValue& x = p.values[static_cast<std::size_t>(v)];
    if (!x.sharding || !x.access || !x.access->start || *x.sharding == to ||
        !(x.sharding->mesh() == to.mesh()))
      return std::nullopt;
    ReshardPlan rp = plan_reshard(x.shape, *x.sharding, to, x.elem_size, x.dtype);
    if (rp.kind != ReshardPlan::Kind::kAllGather) return std::nullopt;
    return rp;
  };
  for (int i = 0; i < n; ++i) {
    const ProgramEqn& e = p.eqns[static_cast<std::size_t>(i)];
    if (e.op == "reshard" && e.in.size() == 1 && e.out.size() == 1 &&
        p.values[static_cast<std::size_t>(e.out[0])].sharding) {
      const NamedSharding& to = *p.values[static_cast<std::size_t>(e.out[0])].sharding;
      const int reader = first_reader[static_cast<std::size_t>(e.out[0])];
      if (reader < 0) continue;  // read by nothing
      if (auto rp = gather_plan(e.in[0], to))
        out.push_back(Gather{e.in[0], to, rp->axis, rp->dim, reader, {}, i, e.out[0], 0});
      continue;
    }
    for (std::size_t k = 0; k < e.in.size(); ++k) {
      const int v = e.in[k];
      if (v < 0) continue;
      // Only equations whose replay lines their operands up with these layouts: a plan's (the
      // driver reshards to its wants) and a fused chain's (its layout); a VJP or a shard_map's
      // backward reads its operands as they come.
      std::optional<NamedSharding> want;
      if (e.plan) {
        if (k < e.plan->want.size() && e.plan->want[k])
          want = NamedSharding(p.values[static_cast<std::size_t>(e.in[e.plan->base])].sharding->mesh(),
                               *e.plan->want[k]);
      } else if (e.op == "fused" && k < e.in_shardings.size()) {
        want = e.in_shardings[k];
      }
      if (!want) continue;
      // Another reader of the gathered array reads the last gather made, not an older one: the
      // gathered arrays live only until the next gather's reader, as without scheduling.
      if (!out.empty() && out.back().explicit_out < 0 && out.back().value == v && out.back().to == *want) {
        out.back().uses.emplace_back(i, k);
      } else if (auto rp = gather_plan(v, *want)) {
        out.push_back(Gather{v, *want, rp->axis, rp->dim, i, {{i, k}}, -1, -1, 0});
      }
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Gather& a, const Gather& b) { return a.first_use < b.first_use; });
  return out;
}

/// Communication scheduling: each all_gather reshard (find_gathers) becomes two equations,
/// `all_gather_start` where its operand is ready and `all_gather_done` before the equation that
/// first reads the result (an explicit reshard equation is dropped), so the transfer runs while the equations
/// between them compute (the replay gives it a turn between equations: MPI moves a nonblocking collective's
/// bytes inside MPI calls). A gather starts no earlier than the first use of the one before it (one gather
/// ahead, as FSDP's prefetch of the next layer's weights; the gathers one equation reads first, a
/// layer's weights, start together): the gathered arrays are not all alive at once. A gather with no equation
/// to overlap stays where it is. Every rank replays the same program, so every rank starts the transfers in
/// the same order.
int schedule_gathers(Program& p) {
  std::vector<Gather> gathers = find_gathers(p);
  std::vector<int> gather_eqns;  // the explicit reshard equations that are gathers, in order
  for (const Gather& g : gathers)
    if (g.reshard_eqn >= 0) gather_eqns.push_back(g.reshard_eqn);
  std::sort(gather_eqns.begin(), gather_eqns.end());
  std::vector<Gather> moved;
  // The gathers first read by the same equation (a layer's weights, read by its shard_map) are a
  // group: they start together, no earlier than the first use of the group before.
  int floor = 0, group_use = -1;
  for (Gather& g : gathers) {
    const int producer = p.values[static_cast<std::size_t>(g.value)].producer;
    if (g.first_use != group_use) {
      floor = std::max(group_use, 0);
      group_use = g.first_use;
    }
    g.start = std::max(producer + 1, floor);
    // An equation to overlap: one kept between the start and the first use (the explicit
    // reshards of gathers, this one's and the group's, are dropped or become starts and waits).
    int between = 0;
    for (int i = g.start; i < g.first_use; ++i)
      between += !std::binary_search(gather_eqns.begin(), gather_eqns.end(), i);
    if (between > 0) moved.push_back(std::move(g));
  }
  if (moved.empty()) return 0;
  std::vector<std::vector<ProgramEqn>> before(p.eqns.size() + 1);  // inserted before equation i
  std::vector<bool> replaced(p.eqns.size(), false);
  p.values.reserve(p.values.size() + 2 * moved.size());
  for (const Gather& g : moved) {
    const std::optional<NamedSharding> from = p.values[static_cast<std::size_t>(g.value)].sharding;
    const ValueAccess* access = p.values[static_cast<std::size_t>(g.value)].access;
    ProgramValue pending;
    pending.kind = ProgramValue::Kind::kInFlight;
    pending.dtype = "in_flight";
    const int flight = add_value(p, std::move(pending));
    int gathered = g.explicit_out;
    if (gathered < 0) {
      ProgramValue r = p.values[static_cast<std::size_t>(g.value)];
      r.kind = ProgramValue::Kind::kResult;
      r.sharding = g.to;
      r.committed = true;
      gathered = add_value(p, std::move(r));
      for (const auto& [eqn, k] : g.uses) {
        ProgramEqn& q = p.eqns[static_cast<std::size_t>(eqn)];
        q.in[k] = gathered;
        if (q.plan && k < q.plan->want.size()) q.plan->want[k].reset();  // laid out as it wants already
      }
    } else {
      replaced[static_cast<std::size_t>(g.reshard_eqn)] = true;
    }
    const ProgramEqn& reader =
        p.eqns[static_cast<std::size_t>(g.reshard_eqn >= 0 ? g.reshard_eqn : g.first_use)];
    const std::string params =
        "over '" + g.axis + "' along dim " + std::to_string(g.dim) + ", to " + g.to.spec().to_string();
    ProgramEqn start;
    start.op = "all_gather_start";
    start.params = params;
    start.in = {g.value};
    start.out = {flight};
    start.where = reader.where;
    start.in_shardings = {from};
    start.run = [access, to = g.to](ReplayEnv& env, const ProgramEqn& e) {
      auto f = access->start(env.slots[static_cast<std::size_t>(e.in[0])], to);
      env.in_flight.push_back(f);
      env.slots[static_cast<std::size_t>(e.out[0])] = std::any(std::move(f));
    };
    ProgramEqn done;
    done.op = "all_gather_done";
    done.params = params;
    done.in = {flight};
    done.out = {gathered};
    done.where = reader.where;
    done.in_shardings = {std::nullopt};
    done.out_sharding = g.to;
    done.run = [](ReplayEnv& env, const ProgramEqn& e) {
      auto& slot = env.slots[static_cast<std::size_t>(e.in[0])];
      const auto f = std::any_cast<std::shared_ptr<InFlight>>(slot);
      std::erase(env.in_flight, f);
      slot.reset();
      env.slots[static_cast<std::size_t>(e.out[0])] = f->finish();
    };
    before[static_cast<std::size_t>(g.start)].push_back(std::move(start));
    // The wait goes before the starts placed at the same equation (one group ahead).
    auto& at = before[static_cast<std::size_t>(g.first_use)];
    at.insert(
        std::find_if(at.begin(), at.end(), [](const ProgramEqn& q) { return q.op == "all_gather_start"; }),
        std::move(done));
  }
  std::vector<ProgramEqn> eqns;
  eqns.reserve(p.eqns.size() + 2 * moved.size());
  for (std::size_t i = 0; i <= p.eqns.size(); ++i) {
    for (auto& q : before[i]) eqns.push_back(std::move(q));
    if (i < p.eqns.size() && !replaced[i]) eqns.push_back(std::move(p.eqns[i]));
  }
  p.eqns = std::move(eqns);
  return static_cast<int>(moved.size());
}

void set_producers(Program& p) {
  for (auto& v : p.values) v.producer = -1;
  for (std::size_t i = 0; i < p.eqns.size(); ++i)
    for (const int v : p.eqns[i].out)
      if (v >= 0) p.values[static_cast<std::size_t>(v)].producer = static_cast<int>(i);
}

}  // namespace

void plan_release(Program& p) {
  std::vector<int> last(p.values.size(), -1);
  for (std::size_t i = 0; i < p.eqns.size(); ++i) {
    for (const int v : p.eqns[i].in)
      if (v >= 0) last[static_cast<std::size_t>(v)] = static_cast<int>(i);
    for (const int v : p.eqns[i].out)  // made: dropped after its producer unless read later
      if (v >= 0 && last[static_cast<std::size_t>(v)] < static_cast<int>(i))
        last[static_cast<std::size_t>(v)] = static_cast<int>(i);
  }
  for (const int v : p.outputs) last[static_cast<std::size_t>(v)] = -1;
  p.release.assign(p.eqns.size(), {});
  for (std::size_t v = 0; v < last.size(); ++v)
    if (last[v] >= 0) p.release[static_cast<std::size_t>(last[v])].push_back(static_cast<int>(v));
}

std::shared_ptr<Program> optimize(const Program& program, const OptimizeOptions& options,
                                  OptimizeStats* stats) {
  auto p = std::make_shared<Program>(program);
  OptimizeStats s;
  if (options.dead_code) s.dead = drop_dead(*p);
  if (options.cse) s.merged = merge_common(*p);
  if (options.fuse) s.fused_groups = fuse_chains(*p, s);
  set_producers(*p);
  if (options.schedule && (s.scheduled = schedule_gathers(*p)) > 0) set_producers(*p);
  plan_release(*p);
  if (stats) *stats = s;
  return p;
}

}  // namespace shard::detail
