#pragma once
/// \file shard::jit (jax.jit / pjit) and shard::make_jaxpr: trace a function once per input
/// signature into a program, choose its intermediate shardings over the whole program, replay it.
///
///   Mesh mesh = make_mesh({2}, {"devices"});
///   auto a = device_put(Tensor<float>({8, 8}, 1.f), NamedSharding(mesh, P())), b = a;
///   auto f = jit([](const ShardedArray<float>& x, const ShardedArray<float>& y) { return matmul(x, y); },
///                JitOptions{.in_shardings = {NamedSharding(mesh, P("devices", None)),
///                                            NamedSharding(mesh, P(None, "devices"))},
///                           .out_shardings = {NamedSharding(mesh, P())}});
///   ShardedArray<float> c = f(a, b);                 // traced, propagated, then replayed
///   c = f(b, a);                                     // same signature: replayed (f.trace_count() == 1)
///   std::string program = make_jaxpr(f)(a, b);       // every value's sharding, every move
///
/// Tracing (JAX's semantics). The first call with a signature (each argument tree's structure,
/// each array's dtype, shape, sharding and commitment, each static value) runs the function once
/// with *traced arrays* as arguments: arrays that report their shape, dtype and sharding but whose
/// elements cannot be read (ValueError, as JAX's ConcretizationTypeError): printing them,
/// `item()`, `data()`, a branch on a value raise. Every op records itself through the op driver
/// into the program; Shard learns each result's shape and sharding by running the op once on
/// *shadows* (the arguments' values on that call, zeros of their shapes under another
/// transformation), so tracing costs about one eager call and communicates as it does. Arrays
/// the function captures or makes from nothing are constants of the program (as in JAX: pass an
/// array that changes between calls as an argument). Arguments that are not arrays (ints,
/// strings, enums, structs with operator==) are static: a new value traces again.
///
/// Composition: jit(grad(f)), grad(jit(f)), jit(vmap(f)), vmap(jit(f)), jit(shard_map(...)) and
/// nested jits. Under an outer grad, vmap or jit the program is replayed op by op through the
/// driver, so the outer transformation sees every op. A shard_map inside jit is one equation of
/// the program (its body runs as written when the program runs); differentiated by a grad inside
/// the jit it is two: the forward keeping the body's pullback, and its application
/// (spmd/detail/shard_map_jit.hpp).
///
/// Sharding propagation (jit/propagate.hpp): with `propagate` on, each factor-rule op's layout
/// (its operands' and result's shardings and the closing collective) is chosen over the whole
/// program to spend the least time moving data by the cost model (jit/cost_model.hpp: bytes per
/// device, each kind of collective at its measured rate), from the arguments' shardings (or
/// in_shardings), the out_shardings and every explicit reshard / with_sharding_constraint
/// inside, which are kept.

#include <algorithm>
#include <any>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "shard/array/driver.hpp"
#include "shard/array/reshard.hpp"
#include "shard/core/buffer_pool.hpp"
#include "shard/core/none.hpp"
#include "shard/core/tree.hpp"
#include "shard/error.hpp"
#include "shard/jit/optimize.hpp"
#include "shard/jit/propagate.hpp"
#include "shard/spmd/device_context.hpp"

namespace shard {

/// One entry of in_shardings / out_shardings: a sharding, or None (as the argument is; chosen by
/// propagation for an output).
class JitSharding {
 public:
  JitSharding(NamedSharding s) : s_(std::move(s)) {}  // NOLINT: converts, as in JAX
  JitSharding(NoneType) {}                            // NOLINT
  bool is_none() const { return !s_; }
  const NamedSharding& sharding() const { return *s_; }
  const std::optional<NamedSharding>& get() const { return s_; }

 private:
  std::optional<NamedSharding> s_;
};

/// jit's options (jax.jit's keyword arguments).
struct JitOptions {
  /// One entry per argument (applied to every ShardedArray of its tree), or empty: the arguments'
  /// own shardings. An argument laid out otherwise is resharded to it when the call starts.
  std::vector<JitSharding> in_shardings{};
  /// One entry per output (a tuple/pair result: per element), a single entry for all, or empty:
  /// propagation's choice.
  std::vector<JitSharding> out_shardings{};
  /// Choose the intermediates' shardings over the whole program (off: every op as eager runs it).
  bool propagate = true;
  /// What propagation weighs moves with (empty: SHARD_COST_MODEL, else the measured defaults;
  /// `collectives_bench --cost-model` fits one on the machine it runs on).
  std::optional<CostModel> cost_model{};
  /// Drop the ops whose results nothing uses (jit/optimize.hpp).
  bool dead_code = true;
  /// Drop the ops that compute what an earlier op computes (the same op and parameters on the same
  /// operands), their readers reading the earlier result (jit/optimize.hpp).
  bool cse = true;
  /// Run each chain of elementwise ops as one pass over memory (jit/optimize.hpp). A vmap, grad or
  /// outer jit around the jitted function replays the program op by op either way.
  bool fuse = true;
  /// Start each reshard that is one all_gather (an explicit reshard, or an operand a product or an
  /// elementwise op re-lays out: a weight split over 'data' gathered where a global-view program uses it)
  /// where its operand is ready and wait for it where the result is first used, one gather ahead of the op
  /// that reads it (jit/optimize.hpp); the program prints them as all_gather_start/_done.
  bool schedule = true;
  /// Keep the program's Tensor buffers between calls (core/buffer_pool.hpp): after the first
  /// call, a call with the same signature takes every intermediate and result buffer from the
  /// program's pool, none from the system (`tensor_memory_stats().system_allocations` stays).
  bool reuse_buffers = true;
  /// jax.jit's donate_argnums: the positions of arguments whose arrays the call may reuse. After
  /// the call started, each ShardedArray of a donated argument is deleted in the caller's hands
  /// (is_deleted(); any read or op raises ValueError, as JAX's), and its memory goes back to the
  /// program's buffers once the program no longer needs it, so `params = step(params)` holds one
  /// set of parameters, not two. Host Tensors are not donated. Ignored when a grad, vmap or outer
  /// jit replays the program op by op.
  std::vector<int> donate_argnums{};
};

/// A traced program (make_jaxpr, Jitted::lower): prints as one line per op with each value's
/// dtype, shape and sharding, and under it each reshard or collective with its mesh axes and bytes.
class JitProgram {
 public:
  explicit JitProgram(std::shared_ptr<const detail::Program> p,
                      std::shared_ptr<const detail::Program> optimized = nullptr)
      : p_(std::move(p)), optimized_(std::move(optimized)) {}
  /// The program a call replays after jit's passes (fused chains as `fused[...]`, dead ops
  /// dropped): JAX's `lower(...).compile()` text beside make_jaxpr's.
  JitProgram optimized() const { return JitProgram(optimized_ ? optimized_ : p_); }
  std::string to_string() const { return p_->to_string(); }
  operator std::string() const { return to_string(); }  // NOLINT: as JAX's str(jaxpr)
  /// The number of equations (ops) in the program.
  std::size_t num_ops() const { return p_->eqns.size(); }
  /// The names of the ops in order.
  std::vector<std::string> ops() const {
    std::vector<std::string> v;
    for (const auto& e : p_->eqns) v.push_back(e.op);
    return v;
  }
  /// The sharding of output k (as the program leaves it, before out_shardings).
  std::optional<NamedSharding> output_sharding(std::size_t k) const {
    return p_->values[static_cast<std::size_t>(p_->outputs.at(k))].sharding;
  }
  /// The result sharding of the i-th op whose name is `op` (none for a Tensor result).
  std::optional<NamedSharding> result_sharding(const std::string& op, std::size_t i = 0) const;
  const detail::Program& program() const { return *p_; }

 private:
  std::shared_ptr<const detail::Program> p_;
  std::shared_ptr<const detail::Program> optimized_;
};
inline std::ostream& operator<<(std::ostream& os, const JitProgram& p) { return os << p.to_string(); }

inline std::optional<NamedSharding> JitProgram::result_sharding(const std::string& op, std::size_t i) const {
  std::size_t seen = 0;
  for (const auto& e : p_->eqns)
    if (e.op == op && seen++ == i) return p_->values[static_cast<std::size_t>(e.out.at(0))].sharding;
  raise<ValueError>("JitProgram::result_sharding: the program has ", seen, " '", op, "' ops, not ", i + 1);
}

namespace detail {

/// What decides whether a call replays a program: every array's type, shape, sharding, commitment
/// and path in its tree, and every static value.
struct JitSignature {
  std::string key;
  std::vector<std::shared_ptr<const void>> statics;
  std::vector<bool (*)(const void*, const void*)> equal;
  bool operator==(const JitSignature& o) const {
    if (key != o.key || statics.size() != o.statics.size()) return false;
    for (std::size_t i = 0; i < statics.size(); ++i)
      if (!equal[i](statics[i].get(), o.statics[i].get())) return false;
    return true;
  }
};

struct SignatureVisitor {
  JitSignature& sig;
  bool& transformed;    // an array carries a record (vmap, jit) or a tape records it
  std::size_t arg = 0;  // the argument being visited
  template <typename X>
  void operator()(const TreePath& path, const X& leaf) {
    sig.key += path.to_string();
    if constexpr (is_sharded_v<X>) {
      sig.key += "S";
      if (leaf.empty())
        raise<ValueError>("jit: argument ", arg, path.to_string(),
                          " is an empty ShardedArray (default-constructed, never assigned an array)");
      if (leaf.is_deleted())
        raise<ValueError>(
            "jit: argument ", arg, path.to_string(),
            " is a deleted array (donated to an earlier jit call, or delete_buffers()); pass the "
            "call's result instead");
    } else {
      sig.key += "T";
    }
    sig.key += dtype_name<elem_t<X>>();
    sig.key += shard::to_string(leaf.shape());
    if constexpr (is_sharded_v<X>) {
      sig.key += leaf.sharding().to_string();
      sig.key += leaf.mesh().to_string();
      sig.key += leaf.mesh().devices_string();  // the same mesh on other devices traces apart
      sig.key += leaf.committed() ? "c" : "u";
    }
    sig.key += ";";
    if (leaf.batch() || (leaf.ad() != nullptr && recording_tape_for(leaf))) transformed = true;
  }
  /// A vector's length and a map's keys (an empty one holds no leaf that would show them).
  template <typename C>
  void on_container(const TreePath& path, const C& c) {
    sig.key += path.to_string() + "{";
    if constexpr (is_string_map<C>::value) {
      for (const auto& entry : c) sig.key += std::to_string(entry.first.size()) + "'" + entry.first;
    } else {
      sig.key += std::to_string(c.size());
    }
    sig.key += "}";
  }
  template <typename S>
  void on_static(const TreePath& path, const S& s) {
    // The value's type first (1, 1L, true and an enum of 1 trace apart: a generic function may
    // differ by type), then the value in full: floats by their bits, strings with their length.
    sig.key += path.to_string() + "=" + typeid(S).name() + ":";
    if constexpr (std::is_same_v<S, NoneType>) {
      sig.key += "None";
    } else if constexpr (std::is_floating_point_v<S>) {
      char bits[64];
      std::snprintf(bits, sizeof bits, "%a", static_cast<double>(s));
      sig.key += bits;
      if constexpr (sizeof(S) > sizeof(double)) {  // long double: its own bits beyond double's
        sig.statics.push_back(std::make_shared<const S>(s));
        sig.equal.push_back([](const void* a, const void* b) {
          return *static_cast<const S*>(a) == *static_cast<const S*>(b);
        });
      }
    } else if constexpr (std::is_arithmetic_v<S>) {
      sig.key += std::to_string(s);
    } else if constexpr (std::is_enum_v<S>) {
      sig.key += std::to_string(static_cast<long long>(s));
    } else if constexpr (std::is_convertible_v<const S&, std::string>) {
      const std::string text(s);
      sig.key += std::to_string(text.size()) + "'" + text;
    } else if constexpr (std::equality_comparable<S>) {
      sig.statics.push_back(std::make_shared<const S>(s));
      sig.equal.push_back([](const void* a, const void* b) {
        return *static_cast<const S*>(a) == *static_cast<const S*>(b);
      });
    } else {
      static_assert(std::equality_comparable<S>,
                    "jit: a static (non-array) argument or tree member must be equality comparable (jit "
                    "compares it with the last call's to decide whether to trace again): give its type "
                    "operator==");
    }
    sig.key += ";";
  }
};

/// One traced program and what a call needs to rebuild its outputs.
struct JitEntry {
  JitSignature signature;
  std::shared_ptr<Program> program;
  std::any output_skeleton;                  // the output tree with empty arrays
  std::shared_ptr<const Program> optimized;  // what a call replays (the passes of optimize.hpp)
  std::shared_ptr<BufferPool> buffers = std::make_shared<BufferPool>();  // its calls' buffers
};

struct JitCache {
  std::mutex mutex;
  std::vector<std::shared_ptr<const JitEntry>> entries;
  std::int64_t traces = 0;
};

/// Pops the trace frame it pushed (also when the function throws).
class TraceFrameScope {
 public:
  TraceFrameScope(std::uint64_t level, Program* p) { t_trace_frames.push_back(TraceFrame{level, p, {}, {}}); }
  ~TraceFrameScope() { t_trace_frames.pop_back(); }
  TraceFrameScope(const TraceFrameScope&) = delete;
  TraceFrameScope& operator=(const TraceFrameScope&) = delete;
};

/// The array a traced argument runs its ops on when traced: x itself when it is a plain array,
/// zeros of its shape (and sharding) under another transformation.
template <typename X>
X shadow_for(const X& x) {
  if (!x.batch() && !(x.ad() != nullptr && recording_tape_for(x))) {
    X s = x.alias();
    s.set_ad(nullptr);
    return s;
  }
  if constexpr (is_tensor_v<X>)
    return X(x.shape());
  else
    return zeros<elem_t<X>>(x.shape(), x.sharding());
}

/// The sharding `s` for every ShardedArray of arg (resharding those laid out otherwise).
template <typename Arg>
Arg with_in_sharding(const Arg& arg, const JitSharding& s, std::size_t position) {
  if constexpr (!has_leaves<Arg>) {
    return arg;
  } else {
    if (!s.is_none()) {  // a sharding for an argument of host Tensors only would be silently ignored
      bool sharded = false;
      tree_for_each(
          [&](const auto& leaf) { sharded = sharded || is_sharded_v<std::remove_cvref_t<decltype(leaf)>>; },
          arg);
      if (!sharded)
        raise<ValueError>(
            "jit: in_shardings gives argument ", position, " the sharding ", s.sharding().to_string(),
            " but it holds host Tensors only, which jit passes as they are: device_put it first (and "
            "take a ShardedArray), or give None for it");
    }
    return tree_map(
        [&](const auto& leaf) {
          using X = std::remove_cvref_t<decltype(leaf)>;
          if constexpr (is_sharded_v<X>) {
            if (!s.is_none()) s.sharding().check_shape(leaf.shape());  // a spec longer than the rank
            if (!s.is_none() && !(leaf.sharding() == s.sharding())) return reshard(leaf, s.sharding());
          }
          return leaf.alias();
        },
        arg);
  }
}

/// A static argument as jit keeps it: a string literal (a char array) as a std::string, anything
/// else as it is.
template <typename A>
decltype(auto) jit_argument(const A& a) {
  if constexpr (std::is_array_v<A>)
    return std::string(a);
  else
    return (a);
}

}  // namespace detail

/// What jit returns: call it like the function.
template <typename F>
class Jitted {
 public:
  Jitted(F f, JitOptions options, shard::source_location where)
      : f_(std::move(f)),
        options_(std::move(options)),
        where_(where),
        cache_(std::make_shared<detail::JitCache>()) {}

  /// Collective over all ranks (the function's ops are). Traces on the first call with a new
  /// signature, then replays.
  template <typename... Args>
  auto operator()(const Args&... args) const {
    if constexpr ((std::is_array_v<Args> || ...)) {
      return (*this)(detail::jit_argument(args)...);  // "text" -> std::string
    } else if constexpr (!std::is_invocable_v<const F&, Args&...>) {
      static_assert(std::is_invocable_v<const F&, Args&...>,
                    "jit: the jitted function cannot be called with these arguments (their number or types "
                    "differ from its parameters)");
    } else {
      const detail::CallScope scope("jit", where_);
      check_donate_argnums(sizeof...(Args));
      auto placed = place(args...);
      bool transformed = false;
      const std::shared_ptr<const detail::JitEntry> entry =
          std::apply([&](const auto&... a) { return entry_for(transformed, a...); }, placed);
      if (!transformed && !options_.donate_argnums.empty()) donate(args...);
      return std::apply([&](auto&... a) { return run(*entry, transformed, a...); }, placed);
    }
  }

  /// The program a call with these arguments runs (traced now if it is not yet).
  template <typename... Args>
  JitProgram lower(const Args&... args) const {
    if constexpr ((std::is_array_v<Args> || ...)) {
      return lower(detail::jit_argument(args)...);
    } else {
      static_assert(std::is_invocable_v<const F&, Args&...>,
                    "jit: the jitted function cannot be called with these arguments (their number or types "
                    "differ from its parameters)");
      const detail::CallScope scope("jit", where_);
      bool transformed = false;
      auto entry = std::apply([&](const auto&... a) { return entry_for(transformed, a...); }, place(args...));
      return JitProgram(entry->program, entry->optimized);
    }
  }

  /// How many times the function was traced (one per signature seen; inside a shard_map body, one
  /// per signature and device).
  std::int64_t trace_count() const {
    const std::lock_guard<std::mutex> lock(cache_->mutex);
    return cache_->traces;
  }

 private:
  /// The arguments laid out as in_shardings says.
  template <typename... Args>
  std::tuple<Args...> place(const Args&... args) const {
    if (!options_.in_shardings.empty() && options_.in_shardings.size() != sizeof...(Args))
      raise<ValueError>(located("jit", where_), ": in_shardings has ", options_.in_shardings.size(),
                        " entries but the function is called with ", sizeof...(Args),
                        " arguments (one entry per argument, or none)");
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::tuple<Args...>{detail::with_in_sharding(args, in_sharding(I), I)...};
    }
    (std::index_sequence_for<Args...>{});
  }
  void check_donate_argnums(std::size_t n) const {
    for (const int i : options_.donate_argnums)
      if (i < 0 || static_cast<std::size_t>(i) >= n)
        raise<ValueError>(located("jit", where_), ": donate_argnums names argument ", i,
                          " but the function is called with ", n, " arguments (positions 0 to ", n - 1, ")");
  }
  bool donated(std::size_t i) const {
    return std::find(options_.donate_argnums.begin(), options_.donate_argnums.end(), static_cast<int>(i)) !=
           options_.donate_argnums.end();
  }
  /// Deletes the caller's donated arrays (the call holds its own references to their memory).
  template <typename... Args>
  void donate(const Args&... args) const {
    std::size_t i = 0;
    (
        [&](const auto& arg) {
          if (donated(i++))
            tree_for_each(
                [](const auto& leaf) {
                  using X = std::remove_cvref_t<decltype(leaf)>;
                  // The caller's array: JAX deletes a donated array in its caller's hands too.
                  if constexpr (detail::is_sharded_v<X>) const_cast<X&>(leaf).delete_buffers();
                },
                arg);
        }(args),
        ...);
  }

  JitSharding in_sharding(std::size_t i) const {
    return options_.in_shardings.empty() ? JitSharding(None) : options_.in_shardings[i];
  }

  template <typename... Args>
  std::shared_ptr<const detail::JitEntry> entry_for(bool& transformed, const Args&... args) const {
    detail::JitSignature sig;
    detail::SignatureVisitor visitor{sig, transformed};
    std::size_t i = 0;
    (
        [&] {
          visitor.arg = i;
          // (the argument's type: a tuple and a vector of one array have the same leaves)
          visitor.sig.key += "#" + std::to_string(i++) + typeid(args).name();
          tree_for_each_with_path(visitor, args);
        }(),
        ...);
    // Called inside a shard_map body: a program per device of the body's mesh. Its collectives are
    // equations over the body's named axes, and a value derived from the device (axis_index) is a
    // constant of the program, right for the device that traced it only.
    if (const DeviceContext* ctx = detail::current_device_context())
      sig.key += "@device " + std::to_string(ctx->device()) + " of " + ctx->mesh().to_string() +
                 ctx->mesh().devices_string();
    {
      const std::lock_guard<std::mutex> lock(cache_->mutex);
      for (const auto& e : cache_->entries)
        if (e->signature == sig) return e;
    }
    auto entry = std::make_shared<detail::JitEntry>(trace(std::move(sig), args...));
    const std::lock_guard<std::mutex> lock(cache_->mutex);
    ++cache_->traces;
    cache_->entries.push_back(entry);
    return entry;
  }

  template <typename... Args>
  detail::JitEntry trace(detail::JitSignature sig, const Args&... args) const {
    auto prog = std::make_shared<detail::Program>();
    const std::uint64_t level = detail::next_transform_id();
    detail::JitEntry entry{std::move(sig), prog, {}, nullptr};
    {
      const detail::TraceFrameScope frame(level, prog.get());
      auto traced = std::tuple<Args...>{tree_map(
          [&](const auto& leaf) {
            auto shadow = detail::shadow_for(leaf);
            const int id =
                detail::add_value(*prog, detail::value_of(shadow, detail::ProgramValue::Kind::kInput));
            prog->inputs.push_back(id);
            return detail::make_traced(std::move(shadow), level, id);
          },
          args)...};
      using Out = std::invoke_result_t<const F&, const Args&...>;
      static_assert(!std::is_void_v<Out>, "jit: the function returns nothing; return its result(s)");
      Out out = std::apply(f_, traced);
      detail::TraceFrame& tf = *detail::trace_frame(level);
      std::size_t k = 0;
      tree_for_each_with_path(
          [&](const TreePath& path, const auto& leaf) {
            const auto& b = leaf.batch();
            if (b && b->trace && b->level == level) {
              prog->outputs.push_back(
                  static_cast<const detail::Traced<std::remove_cvref_t<decltype(leaf)>>&>(*b).id);
            } else if (b) {
              raise<ValueError>(located("jit", where_), ": output", path.to_string(),
                                " is a value of another transformation (an enclosing vmap or jit) that the "
                                "function captured; pass it as an argument");
            } else {
              prog->outputs.push_back(detail::trace_operand(tf, leaf, "jit output"));
            }
            const auto want = out_sharding_for(k++);
            if constexpr (detail::is_sharded_v<std::remove_cvref_t<decltype(leaf)>>)
              if (want) want->check_shape(leaf.shape());  // a spec longer than the rank
            prog->out_shardings.push_back(want);
          },
          out);
      check_out_shardings(k);
      entry.output_skeleton =
          std::any(tree_map([](const auto& leaf) { return std::remove_cvref_t<decltype(leaf)>(); }, out));
    }
    if (options_.propagate)
      detail::propagate(*prog, options_.cost_model ? *options_.cost_model : CostModel::current());
    detail::plan_release(*prog);
    entry.optimized = detail::optimize(
        *prog, detail::OptimizeOptions{options_.dead_code, options_.cse, options_.fuse, options_.schedule});
    return entry;
  }

  std::optional<NamedSharding> out_sharding_for(std::size_t k) const {
    if (options_.out_shardings.empty()) return std::nullopt;
    if (options_.out_shardings.size() == 1) return options_.out_shardings[0].get();
    if (k < options_.out_shardings.size()) return options_.out_shardings[k].get();
    return std::nullopt;
  }
  void check_out_shardings(std::size_t n) const {
    if (options_.out_shardings.size() > 1 && options_.out_shardings.size() != n)
      raise<ValueError>(located("jit", where_), ": out_shardings has ", options_.out_shardings.size(),
                        " entries but the function returns ", n,
                        " arrays (one per output array, or one for all)");
  }

  template <typename... Args>
  auto run(const detail::JitEntry& entry, bool transformed, Args&... args) const {
    using Out = std::invoke_result_t<const F&, const Args&...>;
    const detail::Program& prog = transformed || !entry.optimized ? *entry.program : *entry.optimized;
    detail::BufferPool* const pool = !transformed && options_.reuse_buffers ? entry.buffers.get() : nullptr;
    const detail::BufferPoolScope buffers(pool);
    if (pool) pool->begin_call();
    detail::ReplayEnv env;
    env.plain = transformed;
    env.slots.resize(prog.values.size());
    for (const auto& [id, c] : prog.constants) env.slots[static_cast<std::size_t>(id)] = c;
    std::size_t k = 0;
    (tree_for_each(
         [&](const auto& leaf) {
           env.slots[static_cast<std::size_t>(prog.inputs[k++])] = std::any(leaf.alias());
         },
         args),
     ...);
    if (!transformed && !options_.donate_argnums.empty()) {
      // The program's slots hold the donated arrays now: drop the call's own references, so
      // their memory is freed (into the pool) after its last use in the program.
      std::size_t i = 0;
      const auto drop = [&](auto& arg) {
        using A = std::remove_cvref_t<decltype(arg)>;
        if constexpr (detail::has_leaves<A> && std::is_default_constructible_v<A> &&
                      std::is_move_assignable_v<A>)
          if (donated(i)) arg = A{};
        ++i;
      };
      (drop(args), ...);
    }
    detail::replay(prog, env);
    std::size_t o = 0;
    std::vector<int> returned;  // a value returned twice gives two arrays, as eager's copies are
    const Out& skeleton = *std::any_cast<Out>(&entry.output_skeleton);
    auto out = tree_map(
        [&](const auto& leaf) {
          using X = std::remove_cvref_t<decltype(leaf)>;
          const std::size_t i = o++;
          const int id = prog.outputs[i];
          const X& v = env.get<X>(id);
          if constexpr (detail::is_sharded_v<X>) {
            const auto& want = prog.out_shardings[i];
            if (want && !(v.sharding() == *want)) return reshard(v, *want);
          }
          // An argument or a constant returned as it is, or a value returned again: a copy (the
          // caller may write the result).
          const auto kind = prog.values[static_cast<std::size_t>(id)].kind;
          const bool again = std::find(returned.begin(), returned.end(), id) != returned.end();
          returned.push_back(id);
          if (again || (!env.plain && (kind == detail::ProgramValue::Kind::kInput ||
                                       kind == detail::ProgramValue::Kind::kConstant)))
            return X(v);
          return v.alias();
        },
        skeleton);
    env.slots.clear();  // the intermediates go back to the pool within the call
    if (pool) pool->end_call();
    return out;
  }

  F f_;
  JitOptions options_;
  shard::source_location where_;
  std::shared_ptr<detail::JitCache> cache_;
};

/// jax.jit(f, in_shardings=..., out_shardings=...) (pjit).
template <typename F>
Jitted<F> jit(F f, JitOptions options = {},
              shard::source_location where = shard::source_location::current()) {
  return Jitted<F>(std::move(f), std::move(options), where);
}

/// jax.make_jaxpr(f)(args...): the program jit traces for these arguments (a JitProgram, which
/// prints). Given a Jitted, its program (shardings as its options and propagation chose).
template <typename F>
auto make_jaxpr(F f, shard::source_location where = shard::source_location::current()) {
  return [f = std::move(f), where](const auto&... args) {
    if constexpr (requires { f.lower(args...); })
      return f.lower(args...);
    else
      return Jitted<F>(f, JitOptions{}, where).lower(args...);
  };
}

}  // namespace shard
