// Sharding propagation over a traced program (jit/propagate.hpp): a descent on the time moves take.

#include "shard/jit/propagate.hpp"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "shard/array/detail/program.hpp"
#include "shard/array/reshard.hpp"
#include "shard/jit/cost_model.hpp"

namespace shard::detail {

namespace {

/// A layout of a factor equation: the mesh axes of each factor.
using Axes = std::vector<SpecEntry>;

PartitionSpec spec_of(const Axes& axes, const std::vector<int>& ids) {
  std::vector<SpecEntry> e;
  e.reserve(ids.size());
  for (int id : ids) e.push_back(id >= 0 ? axes[static_cast<std::size_t>(id)] : SpecEntry());
  return PartitionSpec(std::move(e));
}

/// The factors' axes read from a spec laid on dims with factor ids `ids`; none when an axis would
/// split two factors.
std::optional<Axes> axes_from(const PartitionSpec& spec, const std::vector<int>& ids, std::size_t nfactors) {
  Axes axes(nfactors);
  std::set<std::string> used;
  for (std::size_t d = 0; d < ids.size(); ++d) {
    const SpecEntry e = spec[static_cast<int>(d)];
    if (ids[d] < 0 || e.is_none()) continue;
    for (const auto& a : e.axes())
      if (!used.insert(a).second) return std::nullopt;
    axes[static_cast<std::size_t>(ids[d])] = e;
  }
  return axes;
}

struct Solver {
  Program& p;
  std::vector<std::optional<NamedSharding>> layout;  // per value: its current sharding
  std::vector<std::optional<Axes>> choice;           // per equation: its layout (factor equations)
  std::vector<const Mesh*> mesh;                     // per factor equation: the operands' mesh
  std::vector<std::vector<std::pair<int, int>>>
      consumers;  // per value: (equation, operand), -1 - k for output k
  const CostModel& model;

  Solver(Program& prog, const CostModel& m) : p(prog), model(m) {
    layout.resize(p.values.size());
    for (std::size_t v = 0; v < p.values.size(); ++v) layout[v] = p.values[v].sharding;
    choice.resize(p.eqns.size());
    mesh.resize(p.eqns.size(), nullptr);
    consumers.resize(p.values.size());
    for (std::size_t e = 0; e < p.eqns.size(); ++e)
      for (std::size_t k = 0; k < p.eqns[e].in.size(); ++k)
        consumers[static_cast<std::size_t>(p.eqns[e].in[k])].emplace_back(static_cast<int>(e),
                                                                          static_cast<int>(k));
    for (std::size_t k = 0; k < p.outputs.size(); ++k)
      consumers[static_cast<std::size_t>(p.outputs[k])].emplace_back(-1 - static_cast<int>(k), 0);
  }

  const ProgramValue& value(int id) const { return p.values[static_cast<std::size_t>(id)]; }

  /// The equation is free to choose: a factor rule over ShardedArrays of one mesh.
  bool free_eqn(std::size_t e) {
    const ProgramEqn& q = p.eqns[e];
    if (!q.factors || q.out.size() != 1) return false;
    const Mesh* m = nullptr;
    for (int id : q.in) {
      const auto& s = value(id).sharding;
      if (!s) return false;
      if (!m) m = &s->mesh();
      if (!(*m == s->mesh())) return false;
    }
    mesh[e] = m;
    return m != nullptr;
  }

  /// The sharding consumer (e, k) wants its operand in (none: any).
  std::optional<NamedSharding> want_of(int e, int k,
                                       const std::optional<Axes>& override_axes = std::nullopt) const {
    if (e < 0) {
      const std::size_t o = static_cast<std::size_t>(-1 - e);
      return o < p.out_shardings.size() ? p.out_shardings[o] : std::nullopt;
    }
    const ProgramEqn& q = p.eqns[static_cast<std::size_t>(e)];
    const auto& axes = override_axes ? override_axes : choice[static_cast<std::size_t>(e)];
    if (axes)
      return NamedSharding(*mesh[static_cast<std::size_t>(e)],
                           spec_of(*axes, q.factors->factors.operands[static_cast<std::size_t>(k)]));
    if (q.op == "reshard") return q.out_sharding;
    return k < static_cast<int>(q.in_shardings.size()) ? q.in_shardings[static_cast<std::size_t>(k)]
                                                       : std::nullopt;
  }

  /// What moving value `id` from `from` to `to` costs: bytes per device, and µs by the cost model
  /// (the line of the collective the reshard runs as).
  struct Move {
    std::int64_t bytes = 0;
    double us = 0;
  };
  Move move(int id, const NamedSharding& from, const NamedSharding& to) const {
    const ProgramValue& v = value(id);
    const std::int64_t bytes = reshard_bytes_per_device(v, from, to);
    if (bytes == 0) return {};
    const ReshardPlan rp = plan_reshard(v.shape, from, to, v.elem_size, v.dtype);
    const CollectiveCost& line = rp.kind == ReshardPlan::Kind::kAllGather  ? model.all_gather
                                 : rp.kind == ReshardPlan::Kind::kAllToAll ? model.all_to_all
                                                                           : model.exchange;
    return {bytes, line.us(bytes)};
  }

  Move edge_cost(int id, const std::optional<NamedSharding>& from, int e, int k) const {
    const auto want = want_of(e, k);
    if (!want || !from) return {};
    return move(id, *from, *want);
  }

  /// The closing collective's ring traffic of equation e laid out by `axes`, in bytes per device.
  std::int64_t closing_bytes(std::size_t e, const Axes& axes) const {
    const ProgramEqn& q = p.eqns[e];
    const auto& f = q.factors->factors;
    std::int64_t n = 1;
    for (std::size_t id = 0; id < axes.size(); ++id)
      if (f.reduced[id])
        for (const auto& a : axes[id].axes()) n *= mesh[e]->axis_size(a);
    if (n <= 1) return 0;
    const ProgramValue& o = value(q.out[0]);
    const NamedSharding out(*mesh[e], spec_of(axes, f.result));
    auto bytes = static_cast<std::int64_t>(o.elem_size);
    for (auto d : out.shard_shape(o.shape)) bytes *= d;
    return 2 * bytes * (n - 1) / n;
  }

  /// What equation e costs laid out by `axes`, in µs: its operands' reshards, its closing
  /// collective and its consumers' reshards of its result.
  double cost(std::size_t e, const Axes& axes) const {
    const ProgramEqn& q = p.eqns[e];
    const auto& f = q.factors->factors;
    double c = model.psum.us(closing_bytes(e, axes));
    for (std::size_t k = 0; k < q.in.size(); ++k) {
      const auto& from = layout[static_cast<std::size_t>(q.in[k])];
      if (from) c += move(q.in[k], *from, NamedSharding(*mesh[e], spec_of(axes, f.operands[k]))).us;
    }
    const NamedSharding out(*mesh[e], spec_of(axes, f.result));
    for (const auto& [ce, ck] : consumers[static_cast<std::size_t>(q.out[0])])
      c += edge_cost(q.out[0], out, ce, ck).us;
    return c;
  }

  /// The layouts equation e may take: one per operand's layout and per consumer's wish.
  std::vector<Axes> candidates(std::size_t e) const {
    const ProgramEqn& q = p.eqns[e];
    const auto& f = q.factors->factors;
    std::vector<Axes> out;
    auto add = [&](std::optional<Axes> a) {
      if (a && std::find(out.begin(), out.end(), *a) == out.end()) out.push_back(std::move(*a));
    };
    // (a layout on another mesh, as a with_sharding_constraint onto a mesh of the same devices
    // may want, names other axes: not a candidate)
    for (std::size_t k = 0; k < q.in.size(); ++k)
      if (const auto& s = layout[static_cast<std::size_t>(q.in[k])]; s && s->mesh() == *mesh[e])
        add(axes_from(s->spec(), f.operands[k], f.sizes.size()));
    for (const auto& [ce, ck] : consumers[static_cast<std::size_t>(q.out[0])])
      if (auto w = want_of(ce, ck); w && w->mesh() == *mesh[e])
        add(axes_from(w->spec(), f.result, f.sizes.size()));
    return out;
  }

  /// The whole program's moves: bytes per device and µs.
  Move total() const {
    Move c;
    auto add = [&](std::int64_t bytes, double us) {
      c.bytes += bytes;
      c.us += us;
    };
    for (std::size_t e = 0; e < p.eqns.size(); ++e) {
      const ProgramEqn& q = p.eqns[e];
      if (choice[e]) {
        const std::int64_t b = closing_bytes(e, *choice[e]);
        add(b, model.psum.us(b));
      }
      for (std::size_t k = 0; k < q.in.size(); ++k) {
        const Move m = edge_cost(q.in[k], layout[static_cast<std::size_t>(q.in[k])], static_cast<int>(e),
                                 static_cast<int>(k));
        add(m.bytes, m.us);
      }
    }
    for (std::size_t k = 0; k < p.outputs.size(); ++k) {
      const Move m = edge_cost(p.outputs[k], layout[static_cast<std::size_t>(p.outputs[k])],
                               -1 - static_cast<int>(k), 0);
      add(m.bytes, m.us);
    }
    return c;
  }

  void set(std::size_t e, const Axes& axes) {
    choice[e] = axes;
    const ProgramEqn& q = p.eqns[e];
    layout[static_cast<std::size_t>(q.out[0])] =
        NamedSharding(*mesh[e], spec_of(axes, q.factors->factors.result));
  }

  void run() {
    // Start where eager is: each free op follows its traced result's layout (with its operands').
    std::vector<std::size_t> free;
    for (std::size_t e = 0; e < p.eqns.size(); ++e) {
      if (!free_eqn(e)) continue;
      const ProgramEqn& q = p.eqns[e];
      const auto& f = q.factors->factors;
      std::optional<Axes> start;
      for (std::size_t k = 0; k < q.in.size() && !start; ++k)
        if (q.in_shardings[k] && *layout[static_cast<std::size_t>(q.in[k])] == *q.in_shardings[k])
          if (auto a = axes_from(q.in_shardings[k]->spec(), f.operands[k], f.sizes.size()))
            if (NamedSharding(*mesh[e], spec_of(*a, f.result)) == *q.out_sharding) start = a;
      if (!start) start = axes_from(q.out_sharding->spec(), f.result, f.sizes.size());
      if (!start) continue;
      set(e, *start);
      free.push_back(e);
    }
    const Move eager = total();
    p.eager_bytes = eager.bytes;
    // Descent: one op at a time to its cheapest layout, forward then backward, until none improves.
    for (int sweep = 0; sweep < 8; ++sweep) {
      bool changed = false;
      auto visit = [&](std::size_t e) {
        double best = cost(e, *choice[e]);
        std::optional<Axes> pick;
        for (const Axes& a : candidates(e)) {
          const double c = cost(e, a);
          if (c < best * (1 - 1e-9)) {
            best = c;
            pick = a;
          }
        }
        if (pick) {
          set(e, *pick);
          changed = true;
        }
      };
      for (std::size_t e : free) visit(e);
      for (auto it = free.rbegin(); it != free.rend(); ++it) visit(*it);
      if (!changed) break;
    }
    const Move planned = total();
    p.planned_bytes = planned.bytes;
    // The plans the replay runs.
    for (std::size_t e : free) {
      ProgramEqn& q = p.eqns[e];
      std::vector<OperandLayout> ops;
      for (int id : q.in)
        ops.push_back(OperandLayout{&*layout[static_cast<std::size_t>(id)], &value(id).shape, true});
      q.plan = plan_with_axes(q.factors->factors, ops, *mesh[e], *choice[e], 0);
      q.out_sharding = NamedSharding(*mesh[e], q.plan->out);
      p.values[static_cast<std::size_t>(q.out[0])].sharding = q.out_sharding;
    }
    p.propagated = true;
  }
};

}  // namespace

void propagate(Program& program, const CostModel& model) { Solver(program, model).run(); }

}  // namespace shard::detail
