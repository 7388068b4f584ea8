// DeviceContext (spmd/device_context.hpp): what a shard_map / pmap body sees, and jax.lax's
// named-axis collectives over mesh axes. Each collective records on the body's device tape when
// autodiff records (its transpose, as in JAX), is one equation of a jit traced inside the body
// when its operand is traced, and otherwise runs on the rank's devices together (SpmdState).

#include "shard/spmd/device_context.hpp"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "shard/array/detail/trace_primitive.hpp"
#include "shard/comm/detail/collective.hpp"
#include "shard/comm/detail/collective_guard.hpp"
#include "shard/comm/detail/mesh_comms.hpp"
#include "shard/core/timeline.hpp"
#include "shard/error.hpp"
#include "shard/spmd/shard_map.hpp"
#include "spmd/spmd_state.hpp"

namespace shard {

// ---------------------------------------------------------------- collectives on the device tapes

namespace detail {

namespace {
/// The mesh axes (bit mask) a collective `op` names, checked as its spec checks them (the same
/// error whether or not the body's values carry their vma).
std::uint32_t axes_mask(const Mesh& mesh, const Axes& axes, const char* op) {
  CollectiveSpec s;
  s.name = op;
  resolve_axes(mesh, axes, s);
  std::uint32_t m = 0;
  for (int a : s.axes) m |= 1u << a;
  return m;
}
}  // namespace

namespace {

/// The tape a collective whose result varies over its axes (all_gather, psum_scatter,
/// all_to_all, ppermute) records on: the operand's, or the running body's device tape when the
/// operand carries nothing (an invariant value): its result varies over the axes all the same,
/// as JAX's implicit pvary makes it.
template <Dtype T>
Tape* varying_collective_tape(const Tensor<T>& x) {
  if (Tape* t = recording_tape_for(x)) return t;
  Tape* t = recording_tape();
  return t && t->device_view() ? t : nullptr;
}

/// A collective applied to a value a tape tracks. Device tapes: the result varies over
/// `out_vma`; `transpose(ct)` is the input's cotangent, which varies over the result's axes
/// plus `ct_extra` (psum's transpose is pvary). Inside grad within a body (a local tape) a
/// collective of a differentiated value has no derivative of the device's local program.
template <Dtype T, typename Kernel, typename Transpose>
Tensor<T> record_collective(Tape& tape, const char* op, const Tensor<T>& x, std::uint32_t out_vma,
                            std::uint32_t ct_extra, Kernel kernel, Transpose transpose) {
  if (differentiable_on(x, tape) && !tape.device_view())
    raise_not_differentiable(
        op,
        "grad inside a shard_map body differentiates the device's local program, where a "
        "collective has no derivative; differentiate the function that calls the shard_map "
        "instead (its collectives transpose as in JAX)");
  Tensor<T> operand;  // x's record only: the kernel may move x's storage away (psum)
  operand.set_ad(x.ad());
  Tensor<T> out = paused(kernel);
  if constexpr (FloatDtype<T>) {
    KernelVjp<Tensor<T>, Tensor<T>> vjp = [transpose](const Tensor<T>& ct, const VjpNeed&) {
      return cotangents<Tensor<T>>(transpose(ct));
    };
    return record_vjp<Tensor<T>, Tensor<T>>(tape, op, std::move(out), {&operand}, std::move(vjp), out_vma,
                                            ct_extra);
  }
  return with_vma(tape, std::move(out), out_vma);
}

}  // namespace
}  // namespace detail

// ---------------------------------------------------------------- DeviceContext

DeviceContext::DeviceContext(std::shared_ptr<detail::SpmdState> state, int local_index)
    : state_(std::move(state)), local_(local_index) {}

int DeviceContext::device() const { return state_->devices()[local_]; }
const Mesh& DeviceContext::mesh() const { return state_->mesh(); }

int DeviceContext::axis_index(const Axes& axes) const {
  detail::CollectiveSpec s;
  s.name = "axis_index";
  detail::resolve_axes(mesh(), axes, s);
  const auto c = mesh().coords(device());
  int idx = 0;
  for (int a : s.axes) idx = idx * mesh().shape()[a] + c[a];
  return idx;
}

int DeviceContext::axis_size(const Axes& axes) const {
  detail::CollectiveSpec s;
  s.name = "axis_size";
  detail::resolve_axes(mesh(), axes, s);
  return s.group_size;
}

detail::SharedWindow& DeviceContext::shared_window(const Axes& axes, std::size_t bytes,
                                                   const std::string& name) {
  detail::CollectiveSpec s;
  s.name = "group_shared";
  detail::resolve_axes(mesh(), axes, s);
  if (state_->size() != 1)
    raise<ShardingError>("group_shared '", name, "' over ", s.axes_text, ": this rank runs ", state_->size(),
                         " devices of the mesh; group-shared memory needs one device per rank");
  detail::SharedWindow& w = mesh().comms().shared_window(s.axes, name, bytes);
  w.axes_text = s.axes_text;
  return w;
}

bool group_shared_available(const Mesh& mesh, const SpecEntry& axes) {
  detail::CollectiveSpec s;
  s.name = "group_shared_available";
  detail::resolve_axes(mesh, axes, s);
  return mesh.comms().groups_share_node(s.axes);
}

namespace {
/// A collective on a traced value (a jit traced inside a body): one equation of the program, run on
/// the shadow now and, when the program replays, by the body's context on that thread through the
/// public method again (so a tape or vmap around the replay sees it as it sees an eager one).
template <typename T, typename Call>
Tensor<T> traced_collective(const char* name, std::uint64_t level, const Tensor<T>& x, Call call) {
  return detail::trace_opaque(name, std::move(call), level, x);
}

}  // namespace

template <typename T>
Tensor<T> DeviceContext::run(detail::CollectiveSpec spec, Tensor<T> x, const shard::source_location& where) {
  x.detach_if_aliased();  // reductions work in place; an autodiff residual keeps the old values
  spec.dtype = dtype_name<T>();
  const Mesh& m = mesh();
  const auto& devices = state_->devices();
  if (state_->size() == 1) {
    std::vector<Tensor<T>> ins(1), outs;
    ins[0] = std::move(x);
    detail::execute_collective<T>(m, spec, devices, ins, outs, where);
    return std::move(outs[0]);
  }
  Tensor<T> out;
  // Every device thread's time here is communication (device 0's thread runs it, the others wait).
  const detail::TimelineScope span("wait", "collective among the rank's devices");
  state_->arrive(local_, spec, &x, &out, [&](std::vector<detail::SpmdState::Slot>& slots) {
    std::vector<Tensor<T>> ins(slots.size()), outs;
    for (std::size_t i = 0; i < slots.size(); ++i) ins[i] = std::move(*static_cast<Tensor<T>*>(slots[i].in));
    detail::execute_collective<T>(m, spec, devices, ins, outs, where);  // device 0's call site
    for (std::size_t i = 0; i < slots.size(); ++i)
      *static_cast<Tensor<T>*>(slots[i].out) = std::move(outs[i]);
  });
  return out;
}

template <typename T>
Tensor<T> DeviceContext::psum(Tensor<T> x, const Axes& axes, shard::source_location where) {
  const detail::CallScope scope("psum", where);
  if (auto* tape = detail::recording_tape_for(x)) {
    const std::uint32_t m = detail::axes_mask(mesh(), axes, "psum");
    return detail::record_collective(
        *tape, "psum", x, detail::vma_of(x, *tape) & ~m, m, [&] { return psum(std::move(x), axes, where); },
        [](const Tensor<T>& ct) { return ct.alias(); });
  }
  if (const std::uint64_t level = detail::trace_level_of(x))
    return traced_collective(
        "psum", level, x, [=](const Tensor<T>& v) { return shard::device_context().psum(v, axes, where); });
  auto spec = detail::reduce_spec(mesh(), ReduceKind::kSum, axes, x.shape());  // before x is moved from
  return run(std::move(spec), std::move(x), where);
}
template <typename T>
Tensor<float_of_t<T>> DeviceContext::pmean(Tensor<T> x, const Axes& axes, shard::source_location where) {
  const detail::CallScope scope("pmean", where);
  if constexpr (is_floating_v<T>) {
    if (auto* tape = detail::recording_tape_for(x)) {
      const std::uint32_t m = detail::axes_mask(mesh(), axes, "pmean");
      const T n = static_cast<T>(axis_size(axes));
      return detail::record_collective(
          *tape, "pmean", x, detail::vma_of(x, *tape) & ~m, m,
          [&] { return pmean(std::move(x), axes, where); }, [n](const Tensor<T>& ct) { return ct / n; });
    }
  }
  if constexpr (is_floating_v<T>) {
    if (const std::uint64_t level = detail::trace_level_of(x))
      return traced_collective("pmean", level, x, [=](const Tensor<T>& v) {
        return shard::device_context().pmean(v, axes, where);
      });
    auto spec = detail::reduce_spec(mesh(), ReduceKind::kMean, axes, x.shape());  // before x is moved from
    return run(std::move(spec), std::move(x), where);
  } else {  // JAX: the exact integer sum, then a true division
    using F = float_of_t<T>;
    const int n = axis_size(axes);
    // (an op, not a loop over the elements: inside a jit the sum is a traced value)
    return astype<F>(psum(astype<sum_t<T>>(x), axes, where)) / static_cast<F>(n);
  }
}
namespace {
/// The shared body of pmax and pmin: not differentiable (JAX defines no transpose), so under a tape
/// the result only carries the vma left after the axes; one equation inside a jit traced in a body.
/// `self` is the method itself (on the tape's paused path and on a replay), `run` the collective.
template <typename T, typename Self, typename Run>
Tensor<T> extreme_over(DeviceContext& ctx, const char* name, Tensor<T> x, const Axes& axes, Self self,
                       Run run) {
  if (auto* tape = detail::recording_tape_for(x)) {
    if constexpr (FloatDtype<T>)
      if (detail::differentiable_on(x, *tape))
        detail::raise_not_differentiable(name, "JAX defines no transpose for it either");
    const std::uint32_t m = detail::axes_mask(ctx.mesh(), axes, name);
    const std::uint32_t vma = detail::vma_of(x, *tape) & ~m;
    Tensor<T> out = detail::paused([&] { return self(ctx, std::move(x)); });
    out.set_ad(vma ? std::make_shared<detail::AdValue>(detail::AdValue{tape->id(), vma, nullptr}) : nullptr);
    return out;
  }
  if (const std::uint64_t level = detail::trace_level_of(x))
    return traced_collective(name, level, x,
                             [self](const Tensor<T>& v) { return self(shard::device_context(), v); });
  return run(std::move(x));
}
}  // namespace

template <typename T>
Tensor<T> DeviceContext::pmax(Tensor<T> x, const Axes& axes, shard::source_location where) {
  const detail::CallScope scope("pmax", where);
  return extreme_over(
      *this, "pmax", std::move(x), axes,
      [axes, where](DeviceContext& c, Tensor<T> v) { return c.pmax(std::move(v), axes, where); },
      [&](Tensor<T> v) {
        auto spec = detail::reduce_spec(mesh(), ReduceKind::kMax, axes, v.shape());  // before v is moved from
        return run(std::move(spec), std::move(v), where);
      });
}
template <typename T>
Tensor<T> DeviceContext::pmin(Tensor<T> x, const Axes& axes, shard::source_location where) {
  const detail::CallScope scope("pmin", where);
  return extreme_over(
      *this, "pmin", std::move(x), axes,
      [axes, where](DeviceContext& c, Tensor<T> v) { return c.pmin(std::move(v), axes, where); },
      [&](Tensor<T> v) {
        auto spec = detail::reduce_spec(mesh(), ReduceKind::kMin, axes, v.shape());  // before v is moved from
        return run(std::move(spec), std::move(v), where);
      });
}
namespace {
/// A non-owning view of a collective's lvalue input: the executors only read it (ppermute
/// copies a borrowed input it would otherwise move to a local destination).
template <typename T>
Tensor<T> view_of(const Tensor<T>& x) {
  return Tensor<T>::borrow(const_cast<T*>(x.data()), x.shape());
}
}  // namespace

template <typename T>
Tensor<T> DeviceContext::all_gather(Tensor<T>&& x, const Axes& axes, int dim, bool tiled,
                                    shard::source_location where) {
  const detail::CallScope scope("all_gather", where);
  if (detail::varying_collective_tape(x) || detail::trace_level_of(x))
    return all_gather(static_cast<const Tensor<T>&>(x), axes, dim, tiled, where);
  auto spec = detail::all_gather_spec(mesh(), axes, x.shape(), dim, tiled);  // before x is moved from
  return run(std::move(spec), std::move(x), where);
}
template <typename T>
Tensor<T> DeviceContext::all_gather(const Tensor<T>& x, const Axes& axes, int dim, bool tiled,
                                    shard::source_location where) {
  const detail::CallScope scope("all_gather", where);
  if (auto* tape = detail::varying_collective_tape(x)) {  // transpose: psum_scatter
    const std::uint32_t m = detail::axes_mask(mesh(), axes, "all_gather");
    return detail::record_collective(
        *tape, "all_gather", x, detail::vma_of(x, *tape) | m, 0,
        [&] { return all_gather(x, axes, dim, tiled, where); },
        [tape, axes, dim, tiled](const Tensor<T>& ct) {
          return tape->context()->psum_scatter(ct, axes, dim, tiled);
        });
  }
  if (const std::uint64_t level = detail::trace_level_of(x))
    return traced_collective("all_gather", level, x, [=](const Tensor<T>& v) {
      return shard::device_context().all_gather(v, axes, dim, tiled, where);
    });
  return run(detail::all_gather_spec(mesh(), axes, x.shape(), dim, tiled), view_of(x), where);
}
template <typename T>
Tensor<T> DeviceContext::all_gather_invariant(const Tensor<T>& x, const Axes& axes, int dim, bool tiled,
                                              shard::source_location where) {
  const detail::CallScope scope("all_gather_invariant", where);
  if (auto* tape = detail::recording_tape_for(x)) {  // transpose: this device's own chunk
    const std::uint32_t m = detail::axes_mask(mesh(), axes, "all_gather_invariant");
    const std::int64_t i = axis_index(axes);
    const int rank = x.ndim();
    const int d_in = dim < 0 ? dim + rank : dim;  // a bad dim is the kernel's error, raised first
    const std::int64_t chunk =
        tiled && d_in >= 0 && d_in < rank ? x.shape()[static_cast<std::size_t>(d_in)] : 1;
    return detail::record_collective(
        *tape, "all_gather_invariant", x, detail::vma_of(x, *tape) & ~m, m,
        [&] { return all_gather(x, axes, dim, tiled, where); },
        [i, rank, dim, tiled, chunk](const Tensor<T>& ct) {
          const int d = dim < 0 ? dim + (tiled ? rank : rank + 1) : dim;
          std::vector<Index> index(static_cast<std::size_t>(d), Slice());
          if (tiled)
            index.emplace_back(Slice(i * chunk, (i + 1) * chunk));
          else
            index.emplace_back(i);
          return slice(ct, index);
        });
  }
  if (const std::uint64_t level = detail::trace_level_of(x))  // replayed as itself (its transpose)
    return traced_collective("all_gather_invariant", level, x, [=](const Tensor<T>& v) {
      return shard::device_context().all_gather_invariant(v, axes, dim, tiled, where);
    });
  return all_gather(x, axes, dim, tiled, where);
}
template <typename T>
Tensor<T> DeviceContext::psum_scatter(Tensor<T> x, const Axes& axes, int dim, bool tiled,
                                      shard::source_location where) {
  const detail::CallScope scope("psum_scatter", where);
  if (auto* tape = detail::varying_collective_tape(x)) {  // transpose: all_gather
    const std::uint32_t m = detail::axes_mask(mesh(), axes, "psum_scatter");
    return detail::record_collective(
        *tape, "psum_scatter", x, detail::vma_of(x, *tape) | m, 0,
        [&] { return psum_scatter(std::move(x), axes, dim, tiled, where); },
        [tape, axes, dim, tiled](const Tensor<T>& ct) {
          return tape->context()->all_gather(ct, axes, dim, tiled);
        });
  }
  if (const std::uint64_t level = detail::trace_level_of(x))
    return traced_collective("psum_scatter", level, x, [=](const Tensor<T>& v) {
      return shard::device_context().psum_scatter(v, axes, dim, tiled, where);
    });
  auto spec = detail::psum_scatter_spec(mesh(), axes, x.shape(), dim, tiled);  // before x is moved from
  return run(std::move(spec), std::move(x), where);
}
template <typename T>
Tensor<T> DeviceContext::all_to_all(Tensor<T>&& x, const Axes& axes, int split_dim, int concat_dim,
                                    bool tiled, shard::source_location where) {
  const detail::CallScope scope("all_to_all", where);
  if (detail::varying_collective_tape(x) || detail::trace_level_of(x))
    return all_to_all(static_cast<const Tensor<T>&>(x), axes, split_dim, concat_dim, tiled, where);
  auto spec = detail::all_to_all_spec(mesh(), axes, x.shape(), split_dim, concat_dim,
                                      tiled);  // before x is moved from
  return run(std::move(spec), std::move(x), where);
}
template <typename T>
Tensor<T> DeviceContext::all_to_all(const Tensor<T>& x, const Axes& axes, int split_dim, int concat_dim,
                                    bool tiled, shard::source_location where) {
  const detail::CallScope scope("all_to_all", where);
  if (auto* tape = detail::varying_collective_tape(x)) {  // transpose: split and concat swapped
    const std::uint32_t m = detail::axes_mask(mesh(), axes, "all_to_all");
    return detail::record_collective(
        *tape, "all_to_all", x, detail::vma_of(x, *tape) | m, 0,
        [&] { return all_to_all(x, axes, split_dim, concat_dim, tiled, where); },
        [tape, axes, split_dim, concat_dim, tiled](const Tensor<T>& ct) {
          return tape->context()->all_to_all(ct, axes, concat_dim, split_dim, tiled);
        });
  }
  if (const std::uint64_t level = detail::trace_level_of(x))
    return traced_collective("all_to_all", level, x, [=](const Tensor<T>& v) {
      return shard::device_context().all_to_all(v, axes, split_dim, concat_dim, tiled, where);
    });
  return run(detail::all_to_all_spec(mesh(), axes, x.shape(), split_dim, concat_dim, tiled), view_of(x),
             where);
}
template <typename T>
Tensor<T> DeviceContext::ppermute(Tensor<T>&& x, const Axes& axes, std::vector<std::pair<int, int>> perm,
                                  shard::source_location where) {
  const detail::CallScope scope("ppermute", where);
  if (detail::varying_collective_tape(x) || detail::trace_level_of(x))
    return ppermute(static_cast<const Tensor<T>&>(x), axes, std::move(perm), where);
  auto spec = detail::ppermute_spec(mesh(), axes, x.shape(), std::move(perm));  // before x is moved from
  return run(std::move(spec), std::move(x), where);
}
template <typename T>
Tensor<T> DeviceContext::ppermute(const Tensor<T>& x, const Axes& axes, std::vector<std::pair<int, int>> perm,
                                  shard::source_location where) {
  const detail::CallScope scope("ppermute", where);
  if (auto* tape = detail::varying_collective_tape(x)) {  // transpose: the inverse permutation
    const std::uint32_t m = detail::axes_mask(mesh(), axes, "ppermute");
    std::vector<std::pair<int, int>> inverse;
    for (const auto& [src, dst] : perm) inverse.emplace_back(dst, src);
    return detail::record_collective(
        *tape, "ppermute", x, detail::vma_of(x, *tape) | m, 0, [&] { return ppermute(x, axes, perm, where); },
        [tape, axes, inverse](const Tensor<T>& ct) { return tape->context()->ppermute(ct, axes, inverse); });
  }
  if (const std::uint64_t level = detail::trace_level_of(x))
    return traced_collective("ppermute", level, x, [=](const Tensor<T>& v) {
      return shard::device_context().ppermute(v, axes, perm, where);
    });
  return run(detail::ppermute_spec(mesh(), axes, x.shape(), std::move(perm)), view_of(x), where);
}

#define SHARD_INSTANTIATE_DEVICE_CONTEXT(T)                                                                 \
  template Tensor<T> DeviceContext::psum<T>(Tensor<T>, const Axes&, shard::source_location);                \
  template Tensor<float_of_t<T>> DeviceContext::pmean<T>(Tensor<T>, const Axes&, shard::source_location);   \
  template Tensor<T> DeviceContext::pmax<T>(Tensor<T>, const Axes&, shard::source_location);                \
  template Tensor<T> DeviceContext::pmin<T>(Tensor<T>, const Axes&, shard::source_location);                \
  template Tensor<T> DeviceContext::all_gather<T>(Tensor<T>&&, const Axes&, int, bool,                      \
                                                  shard::source_location);                                  \
  template Tensor<T> DeviceContext::all_gather<T>(const Tensor<T>&, const Axes&, int, bool,                 \
                                                  shard::source_location);                                  \
  template Tensor<T> DeviceContext::all_gather_invariant<T>(const Tensor<T>&, const Axes&, int, bool,       \
                                                            shard::source_location);                        \
  template Tensor<T> DeviceContext::psum_scatter<T>(Tensor<T>, const Axes&, int, bool,                      \
                                                    shard::source_location);                                \
  template Tensor<T> DeviceContext::all_to_all<T>(Tensor<T>&&, const Axes&, int, int, bool,                 \
                                                  shard::source_location);                                  \
  template Tensor<T> DeviceContext::all_to_all<T>(const Tensor<T>&, const Axes&, int, int, bool,            \
                                                  shard::source_location);                                  \
  template Tensor<T> DeviceContext::ppermute<T>(Tensor<T>&&, const Axes&, std::vector<std::pair<int, int>>, \
                                                shard::source_location);                                    \
  template Tensor<T> DeviceContext::ppermute<T>(const Tensor<T>&, const Axes&,                              \
                                                std::vector<std::pair<int, int>>, shard::source_location);
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_DEVICE_CONTEXT)

}  // namespace shard
