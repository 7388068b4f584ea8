#pragma once
/// \file Manual SPMD: shard_map and pmap run a body once per logical device with that
/// device's blocks; inside it, named-axis collectives with JAX's semantics (jax.lax.psum,
/// all_gather, psum_scatter, all_to_all, ppermute, axis_index, axis_size).

#include <array>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <tuple>
#include <source_location>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "shard/comm/detail/collective.hpp"
#include "shard/core/detail/tape.hpp"
#include "shard/spmd/detail/shard_map_ad.hpp"
#include "shard/spmd/detail/shard_map_jit.hpp"
#include "shard/spmd/detail/vmap_collectives.hpp"
#include "shard/error.hpp"
#include "shard/comm/group_shared.hpp"
#include "shard/sharding/partition_spec.hpp"
#include "shard/array/detail/trace_primitive.hpp"
#include "shard/array/sharded_array.hpp"
#include "shard/core/tensor_ops.hpp"
#include "shard/array/reshard.hpp"
#include "shard/runtime/detail/device_executor.hpp"
#include "shard/ops/ops.hpp"
#include "shard/spmd/device_context.hpp"

namespace shard {

// ---------------------------------------------------------------- typed shard_map

/// The spec of one shard_map argument or result: one PartitionSpec, or (for a std::vector of
/// arrays) a list with one spec per element; a single spec applies to every element of a
/// list, as a PartitionSpec prefix does in JAX's pytrees. `{P("data"), param_specs}`.
class SpecTree {
 public:
  SpecTree(PartitionSpec spec) : specs_{std::move(spec)}, single_(true) {}  // NOLINT: P(...) converts
  SpecTree(std::vector<PartitionSpec> specs) : specs_(std::move(specs)) {}  // NOLINT: {P(...), ...} converts
  bool is_single() const { return single_; }
  /// The spec of an array argument or result (`what` i): ValueError for a list.
  const PartitionSpec& single(const char* what, std::size_t i) const;
  /// The spec of element k of a list of n arrays: ValueError when a list has another length.
  const PartitionSpec& at(std::size_t k, std::size_t n, const char* what, std::size_t i) const;
  const std::vector<PartitionSpec>& specs() const { return specs_; }

 private:
  std::vector<PartitionSpec> specs_;
  bool single_ = false;
};

/// shard_map's options (jax.shard_map's keyword arguments).
struct ShardMapOptions {
  /// JAX's check_vma (its default, true): every value in the body carries the mesh axes it
  /// varies over (from the in_specs; psum/pmean/pmax/pmin remove their axes; an op's result
  /// varies over the union of its operands'), and an output whose out_spec omits an axis it
  /// varies over raises ValueError on every rank, where it would otherwise silently return one
  /// device's partial value. false skips the check (and its small per-op cost) for bodies that
  /// are known to be invariant; a differentiated shard_map checks regardless (its transposes
  /// need the vma to be true).
  bool check_vma = true;
};

namespace detail {

/// Runs body(ctx) once per local device of `mesh` (k threads for k devices, device 0 on the
/// calling thread), with the thread's device_context() set. Returns this rank's first failure
/// (null if none); nothing is agreed yet: agree_after_bodies follows on every rank.
/// Where a shard_map was called and what its arguments are ("float32(8, 6) P('a', None), block
/// (4, 6)"): the line an error raised inside a body gets, with the device it ran on.
struct BodySite {
  shard::source_location where;
  std::vector<std::string> arguments;
};
std::exception_ptr run_bodies(const Mesh& mesh, const std::function<void(DeviceContext&)>& body,
                              const BodySite* site);

/// Collective over all ranks, after run_bodies: ONE allreduce decides whether any rank failed
/// (then every rank raises: the failing ones their own error, the others "rank R failed: ...";
/// a failing rank aborts the job if the others cannot join within SHARD_ABORT_GRACE seconds)
/// and whether every device returned the same block shapes (flattened over all outputs; a
/// second allreduce runs only when some rank holds no device of the mesh, to tell it the
/// shapes). Returns the agreed shapes. `per_device`: this rank's devices' shapes (empty after a
/// failure or without devices).
std::vector<Shape> agree_after_bodies(const std::exception_ptr& err, const std::vector<std::vector<Shape>>& per_device,
                                      bool have_devices);

/// run_bodies, then agree_after_bodies for a body without outputs.
void run_on_devices(const Mesh& mesh, const std::function<void(DeviceContext&)>& body);

/// An argument checked against its in_spec on `mesh` (same device set, dims divisible) and
/// resharded to it if needed.
template <Dtype T>
ShardedArray<T> prepare_argument(const Mesh& mesh, const PartitionSpec& spec, const ShardedArray<T>& x, std::size_t i);
void check_in_spec_divides(const Mesh& mesh, const PartitionSpec& spec, const Shape& shape, std::size_t i);

template <typename A>
struct ArgTraits;
/// What a shard_map accepts as an argument: a ShardedArray, or a std::vector of them.
template <typename A>
concept ShardMapArgument = is_sharded_v<A> || (is_std_vector<A>::value && is_sharded_v<typename A::value_type>);
template <Dtype T>
struct ArgTraits<ShardedArray<T>> {
  using Prepared = ShardedArray<T>;
  using Block = Tensor<T>;
  static Prepared prepare(const Mesh& m, const SpecTree& s, const ShardedArray<T>& x, std::size_t i) {
    return prepare_argument(m, s.single("in_specs", i), x, i);
  }
  static const Tensor<T>& block(const Prepared& p, int li) { return p.addressable_shards()[li].data; }
  static std::string describe(const Prepared& p) {
    std::string s = cat(dtype_name<T>(), to_string(p.shape()), " ", p.spec().to_string());
    if (!p.addressable_shards().empty()) s += cat(", block ", to_string(p.addressable_shards()[0].data.shape()));
    return s;
  }
};
/// A list of arrays with one spec for all (JAX's pytree prefix): the body gets a list of blocks.
template <Dtype T>
struct ArgTraits<std::vector<ShardedArray<T>>> {
  using Prepared = std::vector<ShardedArray<T>>;
  using Block = std::vector<Tensor<T>>;
  static Prepared prepare(const Mesh& m, const SpecTree& s, const std::vector<ShardedArray<T>>& xs, std::size_t i) {
    Prepared out;
    for (std::size_t k = 0; k < xs.size(); ++k) out.push_back(prepare_argument(m, s.at(k, xs.size(), "in_specs", i), xs[k], i));
    return out;
  }
  static Block block(const Prepared& p, int li) {  // views of the blocks (aliases: no copy)
    Block b;
    for (const auto& x : p) b.push_back(x.addressable_shards()[li].data.alias());
    return b;
  }
  static std::string describe(const Prepared& p) {
    std::string s = cat("a list of ", p.size(), " arrays");
    if (!p.empty()) s += cat(" (the first ", ArgTraits<ShardedArray<T>>::describe(p[0]), ")");
    return s;
  }
};

/// What a body may return for one output: a Tensor, a list of Tensors (one spec for all),
/// or a scalar (a 0-d block).
template <typename R>
struct OutTraits {
  static_assert(Scalar<R>, "a shard_map body returns Tensors, std::vector<Tensor>s, scalars or a std::tuple of them");
  using D = scalar_dtype_t<R>;
  using Result = ShardedArray<D>;
  static void shapes(const R&, std::vector<Shape>& out) { out.push_back(Shape{}); }
  static std::size_t count(const R&) { return 1; }
  static Tensor<D> take(R& r, std::size_t) { return Tensor<D>(Shape{}, static_cast<D>(r)); }
  static Result assemble(std::vector<ShardedArray<D>>& parts) { return std::move(parts.front()); }
};
template <Dtype T>
struct OutTraits<Tensor<T>> {
  using D = T;
  using Result = ShardedArray<T>;
  static void shapes(const Tensor<T>& r, std::vector<Shape>& out) { out.push_back(r.shape()); }
  static std::size_t count(const Tensor<T>&) { return 1; }
  static Tensor<T> take(Tensor<T>& r, std::size_t) { return std::move(r); }
  static Result assemble(std::vector<ShardedArray<T>>& parts) { return std::move(parts.front()); }
};
template <Dtype T>
struct OutTraits<std::vector<Tensor<T>>> {
  using D = T;
  using Result = std::vector<ShardedArray<T>>;
  static void shapes(const std::vector<Tensor<T>>& r, std::vector<Shape>& out) {
    out.push_back(Shape{static_cast<std::int64_t>(r.size())});  // the count first, then each shape
    for (const auto& t : r) out.push_back(t.shape());
  }
  static std::size_t count(const std::vector<Tensor<T>>& r) { return r.size(); }
  static Tensor<T> take(std::vector<Tensor<T>>& r, std::size_t k) { return std::move(r[k]); }
  static Result assemble(std::vector<ShardedArray<T>>& parts) { return std::move(parts); }
};

template <typename R>
struct as_tuple {
  using type = std::tuple<R>;
};
template <typename... R>
struct as_tuple<std::tuple<R...>> {
  using type = std::tuple<R...>;
};
/// A std::pair of outputs is a 2-tuple (two out_specs).
template <typename A, typename B>
struct as_tuple<std::pair<A, B>> {
  using type = std::tuple<A, B>;
};

template <typename A>
struct AdArg;
template <Dtype T>
struct AdArg<ShardedArray<T>> {
  static void link(ShardMapAd& ad, const ShardedArray<T>& p, const SpecTree& s, std::size_t i) {
    ad.link(p, s.single("in_specs", i));
  }
  static Tensor<T> block(ShardMapAd& ad, const ShardedArray<T>& p, int li, std::size_t& arg) {
    return ad.block(p.addressable_shards()[li].data, li, arg++);
  }
};
template <Dtype T>
struct AdArg<std::vector<ShardedArray<T>>> {
  static void link(ShardMapAd& ad, const std::vector<ShardedArray<T>>& ps, const SpecTree& s, std::size_t i) {
    for (std::size_t k = 0; k < ps.size(); ++k) ad.link(ps[k], s.at(k, ps.size(), "in_specs", i));
  }
  static std::vector<Tensor<T>> block(ShardMapAd& ad, const std::vector<ShardedArray<T>>& ps, int li, std::size_t& arg) {
    std::vector<Tensor<T>> b;
    for (const auto& p : ps) b.push_back(ad.block(p.addressable_shards()[li].data, li, arg++));
    return b;
  }
};

/// The array of one output from each local device's block (the global shape is the block
/// shape times the parts of each dim of `spec`).
template <Dtype T>
ShardedArray<T> assemble_output(const Mesh& mesh, const PartitionSpec& spec, const Shape& block,
                                std::vector<Tensor<T>> blocks, std::size_t j) {
  if (!mesh.local_device_ids().empty() && blocks.empty())
    raise<ValueError>("shard_map: no blocks for output ", j);
  const NamedSharding sharding(mesh, spec);
  if (spec.size() > static_cast<int>(block.size()))
    raise<ShardingError>("shard_map: out_specs[", j, "] = ", spec.to_string(), " has more entries than the ",
                         block.size(), "-D blocks the body returned");
  Shape global = block;
  for (std::size_t d = 0; d < global.size(); ++d) global[d] *= sharding.num_parts(static_cast<int>(d));
  const auto local = mesh.local_device_ids();
  std::vector<Shard<T>> shards;
  for (std::size_t li = 0; li < local.size(); ++li)
    shards.push_back(Shard<T>{local[li], sharding.box(local[li], global), std::move(blocks[li])});
  return ShardedArray<T>(global, sharding, std::move(shards));
}

}  // namespace detail

/// A function mapped over the devices of a mesh: call it with the arguments (see shard_map).
template <std::size_t N, std::size_t M, typename F>
class ShardMapped {
 public:
  ShardMapped(Mesh mesh, std::array<SpecTree, N> in, std::array<SpecTree, M> out, F f, ShardMapOptions options = {},
              shard::source_location where = shard::source_location::current())
      : mesh_(std::move(mesh)),
        in_(std::move(in)),
        out_(std::move(out)),
        f_(std::move(f)),
        options_(options),
        where_(where) {}

  /// Collective over all ranks. Arguments are ShardedArrays (or std::vector<ShardedArray>s,
  /// one spec for the list), resharded to their in_spec when they are laid out otherwise.
  template <typename... Args>
  auto operator()(const Args&... args) const {
    if constexpr (checked<Args...>()) {
      // Inside jit: one equation of the program, the body run as written when it replays (through
      // this operator again: replayed inside an outer jit, it is an equation of that one).
      if (const std::uint64_t level = detail::trace_level_of(args...)) {
        // Each argument laid out as its in_spec says by an equation of its own (a reshard, none
        // when it is laid out so already), before the shard_map's: propagation sees it, and the
        // scheduler can start it early (the all_gather of an FSDP weight split over 'data',
        // prefetched during the equations before; jit/optimize.cpp). Not under a vmap inside
        // the jit (its arrays go to the equation as they are).
        bool plain = true;
        (tree_for_each([&](const auto& leaf) { plain = plain && (!leaf.batch() || leaf.batch()->trace); },
                       args),
         ...);
        if (plain) return [&]<std::size_t... I>(std::index_sequence<I...>) {
            return traced(level, detail::ArgTraits<Args>::prepare(mesh_, in_[I], args, I)...);
          }
        (std::index_sequence_for<Args...>{});
        return traced(level, args...);
      }
      return call(std::index_sequence_for<Args...>{}, args...);
    }
  }

 private:
  /// The compile-time checks, first and alone (the first error names the fix and nothing from
  /// the library follows it): the argument count and types, the body's parameters, its outputs.
  template <typename... Args>
  static constexpr bool checked() {
    if constexpr (sizeof...(Args) != N) {
      static_assert(sizeof...(Args) == N,
                    "shard_map: call the mapped function with exactly one argument per in_spec");
      return false;
    } else if constexpr (!(detail::ShardMapArgument<Args> && ...)) {
      static_assert((detail::ShardMapArgument<Args> && ...),
                    "shard_map: the arguments must be ShardedArrays (or std::vector<ShardedArray>s); place a host "
                    "Tensor first with device_put(t, NamedSharding(mesh, spec))");
      return false;
    } else if constexpr (!body_invocable<typename detail::ArgTraits<Args>::Block...>()) {
      static_assert(body_invocable<typename detail::ArgTraits<Args>::Block...>(),
                    "shard_map: the body cannot be called with one block per in_spec (a const Tensor<T>& for a "
                    "ShardedArray<T>, a std::vector<Tensor<T>> for a list), with or without a leading "
                    "DeviceContext&: check its parameter count and types against in_specs");
      return false;
    } else {
      using Ret = decltype(std::declval<const ShardMapped&>().invoke_body(
          std::declval<DeviceContext&>(), std::declval<typename detail::ArgTraits<Args>::Block&>()...));
      static_assert(!std::is_void_v<Ret>, "shard_map: the body returns nothing; return its output block(s)");
      if constexpr (!std::is_void_v<Ret>) {
        static_assert(std::tuple_size_v<typename detail::as_tuple<Ret>::type> == M,
                      "shard_map: the body returns a different number of values than there are out_specs; return "
                      "one value per out_spec (a std::tuple, or a std::pair, for several)");
        return std::tuple_size_v<typename detail::as_tuple<Ret>::type> == M;
      }
      return false;
    }
  }

  template <typename... B>
  static constexpr bool body_invocable() {
    return std::is_invocable_v<const F&, DeviceContext&, B&...> || std::is_invocable_v<const F&, B&...>;
  }

  template <std::size_t... I, typename... Args>
  auto call(std::index_sequence<I...>, const Args&... args) const {
    const detail::CallScope scope("shard_map", where_);
    if (detail::in_device_function())
      raise<ValueError>(located("shard_map", where_),
                        ": called inside a shard_map (or pmap) body; nesting is not supported (JAX nests a "
                        "shard_map only over mesh axes its parent leaves automatic): work on the body's blocks "
                        "with the collectives (psum, all_gather, ...), or call the shard_maps one after the other");
    for (const auto& t : out_)
      for (const auto& s : t.specs()) NamedSharding(mesh_, s);  // usage errors before any communication
    auto prepared = std::make_tuple(detail::ArgTraits<Args>::prepare(mesh_, in_[I], args, I)...);
    using Ret = decltype(invoke_body(std::declval<DeviceContext&>(),
                                     detail::ArgTraits<Args>::block(std::get<I>(prepared), 0)...));
    using Outs = typename detail::as_tuple<Ret>::type;
    static_assert(std::tuple_size_v<Outs> == M, "shard_map: the body must return one value per out_spec");
    const int n = static_cast<int>(mesh_.local_device_ids().size());
    std::vector<std::optional<Outs>> results(static_cast<std::size_t>(n));
    // Device tapes for the body (detail::ShardMapAd): the values' vma, checked against the
    // out_specs; while autodiff records, also the links to the outer tape.
    std::shared_ptr<detail::ShardMapAd> ad;
    detail::Tape* outer = detail::recording_tape();
    if (outer && outer->device_view() && outer->parent() == 0) outer = nullptr;  // a body's vma tape: not differentiated
    if (outer || options_.check_vma) {
      ad = std::make_shared<detail::ShardMapAd>(mesh_, outer, where_);
      (detail::AdArg<Args>::link(*ad, std::get<I>(prepared), in_[I], I), ...);
    }
    const detail::BodySite site{where_, {detail::ArgTraits<Args>::describe(std::get<I>(prepared))...}};
    const std::exception_ptr err = detail::run_bodies(mesh_, [&](DeviceContext& ctx) {
      const int li = ctx.local_index();
      if (ad) {
        detail::Tape& tape = *ad->tapes[li];
        tape.set_context(&ctx);
        std::size_t arg = 0;
        auto blocks = std::tuple<decltype(detail::AdArg<Args>::block(*ad, std::get<I>(prepared), li, arg))...>{
            detail::AdArg<Args>::block(*ad, std::get<I>(prepared), li, arg)...};  // braces: in order
        {
          detail::TapeScope scope(&tape);
          if constexpr (std::tuple_size_v<Outs> == 1 && !std::is_same_v<Ret, Outs>)
            results[li].emplace(std::apply([&](auto&... b) { return invoke_body(ctx, b...); }, blocks));
          else
            results[li] = std::apply([&](auto&... b) { return invoke_body(ctx, b...); }, blocks);
        }
        note_outputs(std::make_index_sequence<M>{}, *ad, li, *results[li]);
        return;
      }
      if constexpr (std::tuple_size_v<Outs> == 1 && !std::is_same_v<Ret, Outs>)
        results[li].emplace(invoke_body(ctx, detail::ArgTraits<Args>::block(std::get<I>(prepared), li)...));
      else
        results[li] = invoke_body(ctx, detail::ArgTraits<Args>::block(std::get<I>(prepared), li)...);
    }, &site);
    // Every device's block shapes, flattened over the outputs; agreed over all ranks together
    // with the failures (one allreduce).
    std::vector<std::vector<Shape>> shapes(err ? 0 : static_cast<std::size_t>(n));
    for (int li = 0; !err && li < n; ++li)
      std::apply([&](const auto&... r) { (detail::OutTraits<std::decay_t<decltype(r)>>::shapes(r, shapes[li]), ...); },
                 *results[li]);
    const std::vector<Shape> agreed = detail::agree_after_bodies(err, shapes, n > 0);
    if (outer) ad->outer->append(ad);  // after the arguments' nodes, before the outputs'

    std::size_t at = 0;
    auto outputs = build(std::make_index_sequence<M>{}, results, agreed, at);
    if (outer) {
      std::size_t f = 0;
      [&]<std::size_t... J>(std::index_sequence<J...>) {
        (attach_output<std::tuple_element_t<J, Outs>>(*ad, std::get<J>(outputs), f, ad), ...);
      }(std::make_index_sequence<M>{});
    }
    if constexpr (M == 1) return std::move(std::get<0>(outputs));
    else return outputs;
  }

  /// The shard_map as equations of the jit trace at `level` (its arguments laid out already).
  /// (Its type declared: operator()'s is deduced from it, and its body calls operator() again.)
  template <typename... Args>
  auto traced(std::uint64_t level, const Args&... args) const
      -> decltype(this->call(std::index_sequence_for<Args...>{}, args...)) {
    // A grad inside the jit (jit(grad(f)) with f calling this shard_map) differentiating it:
    // a forward equation that keeps the pullback and a backward one (shard_map_jit.hpp).
    detail::Tape* tape = nullptr;
    (tree_for_each([&](const auto& leaf) { tape = tape ? tape : detail::recording_tape_for(leaf); }, args),
     ...);
    if (tape && tape->id() > level && detail::any_tracked(*tape, args...))
      return detail::trace_shard_map_vjp(
          [self = *this](const auto&... a) -> decltype(this->call(std::index_sequence_for<Args...>{}, a...)) {
            return self(a...);
          },
          level, *tape, args...);
    return detail::trace_opaque(
        "shard_map",
        [self = *this](const auto&... a) -> decltype(this->call(std::index_sequence_for<Args...>{}, a...)) {
          return self(a...);
        },
        level, args...);
  }

  /// Device li's output blocks, in flat order (list elements one by one; scalars are constants).
  template <std::size_t... J, typename Outs>
  void note_outputs(std::index_sequence<J...>, detail::ShardMapAd& ad, int li, Outs& r) const {
    (note_output<J>(ad, li, std::get<J>(r)), ...);
  }
  template <std::size_t J, typename R>
  void note_output(detail::ShardMapAd& ad, int li, R& r) const {
    if constexpr (detail::is_tensor_v<R>) {
      ad.output(li, r, J, out_[J].single("out_specs", J));
    } else if constexpr (!Scalar<R>) {
      for (std::size_t k = 0; k < r.size(); ++k) ad.output(li, r[k], J, out_[J].at(k, r.size(), "out_specs", J));
    }
  }
  template <typename R, typename O>
  static void attach_output(detail::ShardMapAd& ad, O& o, std::size_t& f, const std::shared_ptr<detail::ShardMapAd>& self) {
    if constexpr (Scalar<R>) {
      return;
    } else if constexpr (detail::is_sharded_v<O>) {
      ad.attach(o, f++, self);
    } else {
      for (auto& y : o) ad.attach(y, f++, self);
    }
  }

  template <typename... B>
  auto invoke_body(DeviceContext& ctx, B&&... blocks) const {
    if constexpr (std::is_invocable_v<const F&, DeviceContext&, B...>) return f_(ctx, std::forward<B>(blocks)...);
    else return f_(std::forward<B>(blocks)...);
  }

  template <std::size_t... J, typename Outs>
  auto build(std::index_sequence<J...>, std::vector<std::optional<Outs>>& results, const std::vector<Shape>& agreed,
             std::size_t& at) const {
    return std::tuple{build_one<J>(results, agreed, at)...};
  }

  /// Output j: its blocks from every local device, assembled into arrays.
  template <std::size_t J, typename Outs>
  auto build_one(std::vector<std::optional<Outs>>& results, const std::vector<Shape>& agreed, std::size_t& at) const {
    using R = std::tuple_element_t<J, Outs>;
    using Tr = detail::OutTraits<R>;
    using D = typename Tr::D;
    constexpr bool kList = !std::is_same_v<typename Tr::Result, ShardedArray<D>>;
    std::size_t count = 1;
    if constexpr (kList) count = static_cast<std::size_t>(agreed[at++][0]);
    std::vector<ShardedArray<D>> parts;
    for (std::size_t k = 0; k < count; ++k) {
      std::vector<Tensor<D>> blocks;
      for (auto& r : results) blocks.push_back(Tr::take(std::get<J>(*r), k));
      const PartitionSpec& spec = kList ? out_[J].at(k, count, "out_specs", J) : out_[J].single("out_specs", J);
      parts.push_back(detail::assemble_output(mesh_, spec, agreed[at++], std::move(blocks), J));
    }
    return Tr::assemble(parts);
  }

  Mesh mesh_;
  std::array<SpecTree, N> in_;
  std::array<SpecTree, M> out_;
  F f_;
  ShardMapOptions options_;
  shard::source_location where_;
};

/// jax.experimental.shard_map: `shard_map(mesh, {P("data"), P()}, {P()}, f)(x, w)` runs
/// f(ctx, x_block, w_block) (or f(x_block, w_block): the context is optional, device_context()
/// and the free collectives reach it) once per device of `mesh`, each argument's block being
/// the shard its in_spec gives the device; the returned blocks (a Tensor, a std::vector of
/// Tensors, a scalar, or a std::tuple of those, one per out_spec) are assembled into arrays
/// with the out_specs (global shape = block shape times the parts of each dim). Arity and
/// types are checked at compile time; in_specs must divide the argument dims evenly.
/// An output must not vary over a mesh axis its out_spec omits (JAX's check_vma, on by
/// default: see ShardMapOptions); `shard_map(mesh, in, out, f, {.check_vma = false})` opts out.
/// Collective over all ranks; with k devices per rank the body runs on k threads.
template <std::size_t N, std::size_t M, typename F>
auto shard_map(const Mesh& mesh, const SpecTree (&in_specs)[N], const SpecTree (&out_specs)[M], F f,
               ShardMapOptions options = {}, shard::source_location where = shard::source_location::current()) {
  return ShardMapped<N, M, F>(mesh, std::to_array(in_specs), std::to_array(out_specs), std::move(f), options, where);
}
/// One in_spec (or one out_spec) may be given without braces.
template <std::size_t M, typename F, std::same_as<PartitionSpec> S>
auto shard_map(const Mesh& mesh, const S& in_spec, const SpecTree (&out_specs)[M], F f, ShardMapOptions options = {},
               shard::source_location where = shard::source_location::current()) {
  return ShardMapped<1, M, F>(mesh, {SpecTree(in_spec)}, std::to_array(out_specs), std::move(f), options, where);
}
template <std::size_t N, typename F, std::same_as<PartitionSpec> S>
auto shard_map(const Mesh& mesh, const SpecTree (&in_specs)[N], const S& out_spec, F f, ShardMapOptions options = {},
               shard::source_location where = shard::source_location::current()) {
  return ShardMapped<N, 1, F>(mesh, std::to_array(in_specs), {SpecTree(out_spec)}, std::move(f), options, where);
}
template <typename F, std::same_as<PartitionSpec> S1, std::same_as<PartitionSpec> S2>
auto shard_map(const Mesh& mesh, const S1& in_spec, const S2& out_spec, F f, ShardMapOptions options = {},
               shard::source_location where = shard::source_location::current()) {
  return ShardMapped<1, 1, F>(mesh, {SpecTree(in_spec)}, {SpecTree(out_spec)}, std::move(f), options, where);
}

/// Collective over the mesh: sums an array over mesh axes its spec does not use (partial
/// sums living on the replicas along those axes); the result keeps x's sharding.
template <typename T>
ShardedArray<T> psum(const ShardedArray<T>& x, const Axes& axes, shard::source_location where = shard::source_location::current());
/// Collective over all ranks: replicates x along mesh axis `axis` (the spec loses that axis):
/// one all_gather over the axis when it is the minor axis of its entry and the dims divide
/// evenly, otherwise the reshard that moves only the missing pieces.
template <typename T>
ShardedArray<T> all_gather(const ShardedArray<T>& x, const std::string& axis, shard::source_location where = shard::source_location::current());

}  // namespace shard
