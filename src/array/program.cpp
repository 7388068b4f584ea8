// jit's program (array/detail/program.hpp): replay, printing, the collectives an op ran when
// traced, and the errors of traced values.

#include "shard/array/detail/program.hpp"

#include <algorithm>
#include <sstream>
#include <string>

#include "shard/array/reshard.hpp"
#include "shard/core/timeline.hpp"
#include "shard/error.hpp"

namespace shard::detail {

void replay(const Program& program, ReplayEnv& env) {
  const bool release = program.release.size() == program.eqns.size();
  for (std::size_t i = 0; i < program.eqns.size(); ++i) {
    const ProgramEqn& e = program.eqns[i];
    {
      const TimelineScope traced("jit", e.op.c_str());
      env.dying = release ? &program.release[i] : nullptr;
      e.run(env, e);
      env.dying = nullptr;
    }
    if (release)
      for (const int v : program.release[i]) env.slots[static_cast<std::size_t>(v)].reset();
    // MPI moves a nonblocking transfer's bytes inside MPI calls: give the scheduled ones a turn.
    for (const auto& f : env.in_flight) f->test();
  }
}

CommSnapshot comm_snapshot() { return comm_stats().entries(); }

std::vector<ProgramComm> comms_since(const CommSnapshot& before) {
  std::vector<ProgramComm> out;
  for (const auto& [key, rec] : comm_stats().entries()) {
    CommRecord old;
    if (auto it = before.find(key); it != before.end()) old = it->second;
    if (rec.calls > old.calls)
      out.push_back(ProgramComm{key.first, key.second, rec.bytes - old.bytes, rec.calls - old.calls, false});
    if (rec.in_process_calls > old.in_process_calls)
      out.push_back(ProgramComm{key.first, key.second, rec.in_process_bytes - old.in_process_bytes,
                                rec.in_process_calls - old.in_process_calls, true});
  }
  return out;
}

std::int64_t reshard_bytes_per_device(const ProgramValue& v, const NamedSharding& from,
                                      const NamedSharding& to) {
  if (from == to) return 0;
  std::int64_t most = 0;
  for (int d : to.mesh().device_ids()) {
    const Box now = to.box(d, v.shape);
    const Box before = from.box(d, v.shape);
    most = std::max(most, now.size() - intersect(now, before).size());
  }
  return most * static_cast<std::int64_t>(v.elem_size);
}

void raise_escaped_trace(const char* op) {
  raise<ValueError>("jit: ", op,
                    ": an operand is a traced array of a jit that has returned (it escaped the jitted "
                    "function: stored in a variable outside it, or captured by a lambda that outlives it); "
                    "return it from the function instead (JAX's UnexpectedTracerError)");
}

void raise_outer_capture(const char* op, const char* what) {
  raise<ValueError>("jit: ", op, ": the jitted function uses an array of ", what,
                    " that it did not get as an argument (a lambda capture); pass it to the jitted function "
                    "as an argument");
}

namespace {

/// JAX's names: a .. z, ba, bb, ...
std::string value_name(int id) {
  std::string s;
  int n = id;
  do {
    s.insert(s.begin(), static_cast<char>('a' + n % 26));
    n /= 26;
  } while (n > 0);
  return s;
}

std::string bytes_text(std::int64_t b) {
  std::ostringstream os;
  if (b >= (std::int64_t{1} << 20))
    os << static_cast<double>(b) / (1 << 20) << " MiB";
  else if (b >= 1024)
    os << static_cast<double>(b) / 1024 << " KiB";
  else
    os << b << " B";
  return os.str();
}

std::string typed(const Program& p, int id) {
  const ProgramValue& v = p.values[static_cast<std::size_t>(id)];
  std::string s = value_name(id) + ":";
  if (v.kind == ProgramValue::Kind::kVjp) return s + "vjp";
  if (v.kind == ProgramValue::Kind::kInFlight) return s + "in_flight";
  s += v.dtype + "[";
  for (std::size_t d = 0; d < v.shape.size(); ++d) s += (d ? "," : "") + std::to_string(v.shape[d]);
  s += "]";
  if (v.sharding) s += v.sharding->spec().to_string();
  return s;
}

/// The bytes of one device's block of v.
std::int64_t block_bytes(const ProgramValue& v) {
  auto n = static_cast<std::int64_t>(v.elem_size);
  for (auto d : v.sharding ? v.sharding->shard_shape(v.shape) : v.shape) n *= d;
  return n;
}

/// The reshard line of a value from `from` to `to`.
std::string reshard_line(const ProgramValue& v, const std::string& name, const NamedSharding& to) {
  const ReshardPlan rp = plan_reshard(v.shape, *v.sharding, to, v.elem_size, v.dtype);
  const std::int64_t most = reshard_bytes_per_device(v, *v.sharding, to);
  std::string s = "reshard " + name + " " + rp.from + " -> " + rp.to + ": ";
  static const char* kinds[] = {"no move", "local slices", "all_gather", "all_to_all", "general exchange"};
  s += kinds[static_cast<int>(rp.kind)];
  if (!rp.axis.empty()) s += " over '" + rp.axis + "'";
  s += ", " + bytes_text(most) + " per device";
  return s;
}

}  // namespace

std::string Program::to_string() const {
  std::ostringstream os;
  os << "{ lambda ";
  bool first = true;
  for (const auto& [id, c] : constants) {
    os << (first ? "" : " ") << typed(*this, id);
    first = false;
  }
  os << (constants.empty() ? ";" : " ;");
  for (int id : inputs) os << " " << typed(*this, id);
  os << ". let\n";
  for (const ProgramEqn& e : eqns) {
    os << "    ";
    for (std::size_t k = 0; k < e.out.size(); ++k) os << (k ? " " : "") << typed(*this, e.out[k]);
    if (e.out.empty()) os << "_";
    os << " = " << e.op;
    if (!e.params.empty()) os << "[" << e.params << "]";
    for (int id : e.in) os << " " << value_name(id);
    os << "\n";
    if (e.plan) {
      const Mesh& mesh = values[static_cast<std::size_t>(e.in[e.plan->base])].sharding->mesh();
      for (std::size_t k = 0; k < e.plan->want.size(); ++k)
        if (e.plan->want[k])
          os << "        "
             << reshard_line(values[static_cast<std::size_t>(e.in[k])], value_name(e.in[k]),
                             NamedSharding(mesh, *e.plan->want[k]))
             << "\n";
      if (!e.plan->closing.is_none()) {
        os << "        psum over " << e.plan->closing.to_string() << " of the partial blocks ("
           << bytes_text(block_bytes(values[static_cast<std::size_t>(e.out[0])])) << " per device)\n";
      }
    } else {
      for (std::size_t k = 0; k < e.in.size(); ++k) {
        const ProgramValue& v = values[static_cast<std::size_t>(e.in[k])];
        if (k < e.in_shardings.size() && e.in_shardings[k] && v.sharding &&
            !(*v.sharding == *e.in_shardings[k]))
          os << "        " << reshard_line(v, value_name(e.in[k]), *e.in_shardings[k]) << "\n";
      }
      for (const ProgramComm& c : e.comms)
        os << "        " << c.kind << " over " << c.axes << ": " << c.calls
           << (c.calls == 1 ? " call, " : " calls, ") << bytes_text(c.bytes)
           << (c.in_process ? " moved in memory on this rank" : " sent by this rank") << "\n";
    }
  }
  os << "  in (";
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    os << (k ? ", " : "") << value_name(outputs[k]);
    const ProgramValue& v = values[static_cast<std::size_t>(outputs[k])];
    if (k < out_shardings.size() && out_shardings[k] && v.sharding && !(*v.sharding == *out_shardings[k]))
      os << " -> " << out_shardings[k]->spec().to_string();
  }
  os << ") }";
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    const ProgramValue& v = values[static_cast<std::size_t>(outputs[k])];
    if (k < out_shardings.size() && out_shardings[k] && v.sharding && !(*v.sharding == *out_shardings[k]))
      os << "\n    " << reshard_line(v, value_name(outputs[k]), *out_shardings[k]);
  }
  return os.str();
}

}  // namespace shard::detail
