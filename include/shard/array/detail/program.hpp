#pragma once
/// \file jit's program and its recorder (internals of jit/jit.hpp; DESIGN.md "jit and vmap").
///
/// While jit traces a function, its arguments are *traced values*: arrays that report their
/// shape, dtype and sharding and whose record (a Traced<X>, the same slot a batched value of
/// vmap uses: core/detail/batch.hpp) holds the trace's id of the value and a *shadow*: the
/// concrete array the op ran on when it was traced. The op driver (array/driver.hpp) sees the
/// record and, instead of handing back a plain array, runs the primitive on the shadows (which
/// gives the result's shape and sharding and the collectives its rules insert), appends an
/// equation to the Program (the primitive, copied, with the ids of its operands and result) and
/// returns a traced result. A user cannot read a traced value's elements (ValueError, as JAX's
/// ConcretizationTypeError). An array the function uses that is not traced (one it captures or
/// makes from nothing) is a constant of the program, kept with it.
///
/// Replaying the program runs each equation's primitive again on the values of the new call:
/// through the driver as an eager op would (under vmap, grad or an outer jit: `plain`), or with
/// the layouts propagation chose (jit/propagate.hpp): the plan of a factor-rule op, the operand
/// shardings of every other op as it ran when traced.

#include <algorithm>
#include <any>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <typeinfo>
#include <vector>

#include "shard/array/detail/op_plan.hpp"
#include "shard/array/sharded_array.hpp"
#include "shard/comm/comm_stats.hpp"
#include "shard/core/detail/batch.hpp"
#include "shard/core/detail/tape.hpp"
#include "shard/core/primitive.hpp"
#include "shard/core/tensor.hpp"
#include "shard/error.hpp"

namespace shard::detail {

struct ValueAccess;

/// One value of a program: what jit knows of an array.
struct ProgramValue {
  enum class Kind { kInput, kConstant, kResult, kVjp, kInFlight };
  Kind kind = Kind::kResult;
  std::string dtype;  ///< "float32", ...; "vjp" for a VJP's residuals
  Shape shape;
  std::size_t elem_size = 0;              ///< bytes per element
  std::optional<NamedSharding> sharding;  ///< none: a Tensor (or a VJP)
  bool committed = true;
  int producer = -1;                    ///< the equation that makes it (-1: an input or a constant)
  const ValueAccess* access = nullptr;  ///< its type's table (none: a VJP, a collective in flight)
};

/// A collective an equation ran when it was traced (this rank's CommStats over the op).
struct ProgramComm {
  std::string kind, axes;
  std::int64_t bytes = 0;
  std::int64_t calls = 0;
  bool in_process = false;  ///< among this rank's devices, in memory
};

struct ReplayEnv;
struct ProgramEqn;
using EqnRun = std::function<void(ReplayEnv&, const ProgramEqn&)>;

/// A factor-rule equation propagation may lay out otherwise: the rule applied to its operands.
struct EqnFactors {
  std::shared_ptr<const FactorRule> rule;
  FactorRule::Factors factors;
};

/// A reshard in flight (jit's scheduler, jit/optimize.hpp): test() progresses its transfers,
/// finish() completes them and gives the array.
struct InFlight {
  virtual ~InFlight() = default;
  virtual bool test() = 0;
  virtual std::any finish() = 0;
};

/// Starts reshard(x, to) (array/reshard.cpp): a plan that is one all_gather over a mesh axis goes
/// out as nonblocking transfers, completed by finish(); any other plan runs now.
template <typename T>
std::shared_ptr<InFlight> start_reshard(const ShardedArray<T>& x, const NamedSharding& to);

/// What jit's passes need of an array type without knowing it (one table per X: value_access).
struct ValueAccess {
  std::size_t elem_size = 0;
  /// The array in slot x laid out as `layout` (resharded when it is not; none: a Tensor, as it is).
  std::any (*lined)(const std::any& x, const std::optional<NamedSharding>& layout) = nullptr;
  /// Its blocks: one per local device in mesh order (one for a Tensor), each with its elements.
  void (*blocks)(const std::any& x, std::vector<const void*>& data,
                 std::vector<std::int64_t>& sizes) = nullptr;
  /// A new array of `shape` laid out as `layout`, its blocks uninitialised, and pointers to them.
  std::any (*make)(const Shape& shape, const std::optional<NamedSharding>& layout, bool committed,
                   std::vector<void*>& data) = nullptr;
  /// start_reshard of the array in slot x to `to` (null: a Tensor, which has no layout).
  std::shared_ptr<InFlight> (*start)(const std::any& x, const NamedSharding& to) = nullptr;
};

template <typename X>
const ValueAccess& value_access() {
  using T = elem_t<X>;
  static const ValueAccess access{
      sizeof(T),
      [](const std::any& x, const std::optional<NamedSharding>& layout) -> std::any {
        const X& a = *std::any_cast<X>(&x);
        if constexpr (is_sharded_v<X>) {
          if (layout && !(a.sharding() == *layout)) return std::any(reshard(a, *layout));
        }
        return std::any(a.alias());
      },
      [](const std::any& x, std::vector<const void*>& data, std::vector<std::int64_t>& sizes) {
        const X& a = *std::any_cast<X>(&x);
        if constexpr (is_sharded_v<X>) {
          for (const auto& s : a.addressable_shards()) {
            data.push_back(s.data.data());
            sizes.push_back(s.data.size());
          }
        } else {
          data.push_back(a.data());
          sizes.push_back(a.size());
        }
      },
      [](const Shape& shape, const std::optional<NamedSharding>& layout, bool committed,
         std::vector<void*>& data) -> std::any {
        if constexpr (is_sharded_v<X>) {
          const auto local = layout->mesh().local_device_ids();
          std::vector<Shard<T>> shards;
          shards.reserve(local.size());
          for (const int d : local) {
            Box box = layout->box(d, shape);
            Tensor<T> block(box.extent);
            data.push_back(block.data());
            shards.push_back(Shard<T>{d, std::move(box), std::move(block)});
          }
          return std::any(X(shape, *layout, std::move(shards), committed));
        } else {
          (void)layout;
          (void)committed;
          X t(shape);
          data.push_back(t.data());
          return std::any(std::move(t));
        }
      },
      [] {
        using Start = std::shared_ptr<InFlight> (*)(const std::any&, const NamedSharding&);
        if constexpr (is_sharded_v<X>) {
          return Start([](const std::any& x, const NamedSharding& to) {
            return start_reshard(*std::any_cast<X>(&x), to);
          });
        } else {
          return Start(nullptr);
        }
      }()};
  return access;
}

/// An elementwise equation jit's fusion can run on tiles: every operand has the result's shape and
/// layout, and `span` is the primitive's kernel on n contiguous elements.
struct Pointwise {
  std::function<void(std::int64_t n, const void* const* in, void* out)> span;
  std::vector<const ValueAccess*> in;
  const ValueAccess* out = nullptr;
};

/// One equation: the primitive (inside `run`), its operands' and results' value ids.
struct ProgramEqn {
  std::string op;
  std::string params;  ///< the primitive's parameters, printed (params_text())
  std::vector<int> in, out;
  shard::source_location where;
  EqnRun run;
  std::vector<ProgramComm> comms;  ///< the collectives the op ran when traced
  /// The operands' shardings when traced (none for a Tensor): a fixed equation's operands are
  /// resharded to them on replay, so it runs as it ran when traced.
  std::vector<std::optional<NamedSharding>> in_shardings;
  /// The result's sharding (traced, or propagation's): a replay that gives another reshards to it.
  std::optional<NamedSharding> out_sharding;
  std::optional<EqnFactors> factors;  ///< set: propagation may choose the plan
  /// Propagation's plan (factor equations): a primitive the driver plans by its rule replays it
  /// (run_blocks); one that plans itself (matmul) gets its operands resharded to its wants.
  std::optional<OpPlan> plan;
  /// Set for an elementwise equation fusion can take (jit/fuse.hpp).
  std::shared_ptr<const Pointwise> pointwise;
  /// No effect beyond its results (an op of the table): dead-code elimination may drop it.
  bool pure = false;
  /// The primitive's type and parameters (trivially copyable primitives: their bytes), empty when
  /// not known: two pure equations with the same identity, operands and layouts compute the same
  /// value, and jit's common-subexpression pass keeps the first (jit/optimize.hpp). A replay reads
  /// its operands from `in` (which that pass renames), never from ids captured when traced.
  std::string identity;
};

/// A traced program (jit/jit.hpp prints it: make_jaxpr).
struct Program {
  std::vector<ProgramValue> values;
  std::vector<int> inputs, outputs;
  std::vector<ProgramEqn> eqns;
  std::vector<std::pair<int, std::any>> constants;  ///< value id, the array
  /// Reshards of the outputs to out_shardings (value id of the output -> its sharding).
  std::vector<std::optional<NamedSharding>> out_shardings;
  /// Set by propagation: the bytes per rank the program moves with eager's layouts and with the
  /// chosen ones (its estimate).
  bool propagated = false;
  std::int64_t eager_bytes = 0;
  std::int64_t planned_bytes = 0;
  /// Per equation: the values no later equation reads and the program does not return, dropped
  /// from the replay's slots after it runs (their buffers freed, or reused by the next op).
  std::vector<std::vector<int>> release;
  std::string to_string() const;
};

/// The values of one replay, by id.
struct ReplayEnv {
  std::vector<std::any> slots;
  /// The operands carry records (vmap, a tape, an outer jit): each equation binds its primitive as
  /// an eager op does, so the outer transformation sees every op.
  bool plain = false;
  /// The values the running equation reads last (dropped after it; null: not known).
  const std::vector<int>* dying = nullptr;
  /// The reshards the scheduler started and nothing waited for yet: progressed between equations.
  std::vector<std::shared_ptr<InFlight>> in_flight;
  template <typename X>
  const X& get(int id) const {
    return *std::any_cast<X>(&slots[static_cast<std::size_t>(id)]);
  }
  /// The value of slot `id` for an equation that may update it in place: moved out of its slot
  /// when the equation reads it last (and only once: `uses`), so that no other reference keeps
  /// its buffers; an alias otherwise.
  template <typename X>
  X take(int id, std::size_t uses) {
    if (uses == 1 && dying && std::find(dying->begin(), dying->end(), id) != dying->end()) {
      X x = std::move(*std::any_cast<X>(&slots[static_cast<std::size_t>(id)]));
      slots[static_cast<std::size_t>(id)].reset();
      return x;
    }
    return get<X>(id).alias();
  }
  template <typename X>
  void set(int id, X x) {
    slots[static_cast<std::size_t>(id)] = std::move(x);
  }
};

/// Runs every equation of `program` in order on `env` (inputs and constants already set).
void replay(const Program& program, ReplayEnv& env);

/// The record of a traced value.
template <typename X>
struct Traced final : BatchBase {
  Traced(std::uint64_t level_, int id_, X shadow_)
      : BatchBase(level_, -1, true), id(id_), shadow(std::move(shadow_)) {}
  int id;    ///< the value's id in the program
  X shadow;  ///< the array the ops ran on when traced
};

/// One active trace on this thread.
struct TraceFrame {
  std::uint64_t level = 0;
  Program* program = nullptr;
  /// The constants added so far, by buffer (an array used twice is one constant); `held` keeps
  /// each buffer alive while the trace runs, so that no other array reuses its address.
  struct Seen {
    const void* buffer;
    const std::type_info* type;
    int id;
  };
  std::vector<Seen> seen;
  std::vector<std::any> held;
};
inline thread_local std::vector<TraceFrame> t_trace_frames;

inline TraceFrame* trace_frame(std::uint64_t level) {
  for (auto it = t_trace_frames.rbegin(); it != t_trace_frames.rend(); ++it)
    if (it->level == level) return &*it;
  return nullptr;
}

/// ValueError: a traced value reached an op after its jit returned.
[[noreturn]] void raise_escaped_trace(const char* op);
/// ValueError: an op inside jit got a value of an enclosing transformation through a capture.
[[noreturn]] void raise_outer_capture(const char* op, const char* what);

/// What the program keeps of an array.
template <typename X>
ProgramValue value_of(const X& x, ProgramValue::Kind kind) {
  ProgramValue v;
  v.kind = kind;
  v.dtype = dtype_name<elem_t<X>>();
  v.elem_size = sizeof(elem_t<X>);
  v.shape = x.shape();
  v.access = &value_access<X>();
  if constexpr (is_sharded_v<X>) {
    v.sharding = x.sharding();
    v.committed = x.committed();
  }
  return v;
}

inline int add_value(Program& program, ProgramValue v) {
  program.values.push_back(std::move(v));
  return static_cast<int>(program.values.size()) - 1;
}

/// The traced value of `shadow` at `level` with id `id`.
template <typename X>
X make_traced(X shadow, std::uint64_t level, int id) {
  Shape shape = shadow.shape();
  if constexpr (is_tensor_v<X>) {
    return X::batched_value(std::move(shape), std::make_shared<Traced<X>>(level, id, std::move(shadow)));
  } else {
    NamedSharding sharding = shadow.sharding();
    const bool committed = shadow.committed();
    return X::batched_value(std::move(shape), std::move(sharding), committed,
                            std::make_shared<Traced<X>>(level, id, std::move(shadow)));
  }
}

/// x's shadow when it is traced at `level`, else x (a constant).
template <typename X>
const X& shadow_of(const X& x, std::uint64_t level) {
  const auto& b = x.batch();
  if (b && b->trace && b->level == level) return static_cast<const Traced<X>&>(*b).shadow;
  return x;
}

/// The shardings of the operands as they are (none for Tensors).
template <typename X>
std::optional<NamedSharding> sharding_if_sharded(const X& x) {
  if constexpr (is_sharded_v<X>)
    return x.sharding();
  else
    return std::nullopt;
}

/// x's id in the trace at `frame` (a constant is added to the program).
template <typename X>
int trace_operand(TraceFrame& frame, const X& x, const char* op) {
  if (const auto& b = x.batch()) {
    if (b->trace && b->level == frame.level) return static_cast<const Traced<X>&>(*b).id;
    raise_outer_capture(op, b->trace ? "an enclosing jit" : "an enclosing vmap");
  }
  if (x.ad() != nullptr && recording_tape_for(x)) raise_outer_capture(op, "an enclosing grad");
  Program& p = *frame.program;
  const void* buffer = nullptr;
  if constexpr (is_sharded_v<X>) {
    const auto& sh = x.addressable_shards();
    if (!sh.empty() && sh.front().data.size() > 0) buffer = sh.front().data.data();
  } else {
    if (x.size() > 0) buffer = x.data();
  }
  if (buffer)
    for (const auto& s : frame.seen) {
      if (s.buffer != buffer || *s.type != typeid(X)) continue;
      const ProgramValue& v = p.values[static_cast<std::size_t>(s.id)];
      if (v.shape == x.shape() && v.sharding == sharding_if_sharded(x)) return s.id;
    }
  const int id = add_value(p, value_of(x, ProgramValue::Kind::kConstant));
  // Its value now, as JAX embeds a constant: later writes to the captured array do not reach it.
  p.constants.emplace_back(id, std::any(X(x)));
  if (buffer) {
    frame.seen.push_back(TraceFrame::Seen{buffer, &typeid(X), id});
    frame.held.emplace_back(x.alias());
  }
  return id;
}

/// The bytes the device that receives the most gets when v moves from `from` to `to` (the part of
/// its new block its old block does not hold): what jit's propagation and printing count, the same
/// at any number of ranks.
std::int64_t reshard_bytes_per_device(const ProgramValue& v, const NamedSharding& from,
                                      const NamedSharding& to);

/// This rank's CommStats records (to see what one op communicated).
using CommSnapshot = std::map<std::pair<std::string, std::string>, CommRecord>;
CommSnapshot comm_snapshot();
/// What was recorded since `before`, as the collectives of one equation.
std::vector<ProgramComm> comms_since(const CommSnapshot& before);

}  // namespace shard::detail
