#include "shard/spmd/shard_map.hpp"

#include <algorithm>
#include <climits>
#include <optional>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "shard/comm/detail/collective_guard.hpp"
#include "shard/comm/detail/comm_verbs.hpp"
#include "shard/runtime/detail/device_executor.hpp"
#include "shard/comm/detail/mesh_comms.hpp"
#include "shard/error.hpp"
#include "shard/mpi/agree.hpp"
#include "shard/array/reshard.hpp"
#include "shard/core/timeline.hpp"
#include "shard/core/trace.hpp"
#include "shard/runtime/runtime.hpp"
#include "spmd/spmd_state.hpp"

namespace shard {

namespace detail {

void SpmdState::arrive(int local, const CollectiveSpec& spec, void* in, void* out,
                       const std::function<void(std::vector<Slot>&)>& exec) {
  std::unique_lock lock(mutex_);
  auto aborted = [&] {
    raise<Error>("shard_map: device ", devices_[local], " stopped at ", spec.name, " over ", spec.axes_text,
                 " because the body of device ", failed_device_, " failed");
  };
  if (failed_device_ >= 0) aborted();
  slots_[local] = Slot{&spec, in, out};
  ++arrived_;
  const long gen = generation_;
  if (local != 0) {
    cv_.notify_all();
    cv_.wait(lock, [&] { return generation_ != gen || failed_device_ >= 0; });
    if (generation_ == gen) aborted();
    if (errors_[static_cast<std::size_t>(local)]) std::rethrow_exception(errors_[static_cast<std::size_t>(local)]);
    return;
  }
  cv_.wait(lock, [&] { return arrived_ == size() || failed_device_ >= 0; });
  if (arrived_ != size()) aborted();
  lock.unlock();  // the others wait for the generation to change; the slots are stable
  std::exception_ptr err;
  try {
    for (int i = 1; i < size(); ++i)
      if (!(*slots_[i].spec == spec))
        raise<ValueError>("shard_map: the devices of this rank issued different collectives: device ", devices_[0],
                          " called ", spec.name, " over ", spec.axes_text, " on ", spec.dtype, to_string(spec.in_shape),
                          ", device ", devices_[i], " called ", slots_[i].spec->name, " over ",
                          slots_[i].spec->axes_text, " on ", slots_[i].spec->dtype,
                          to_string(slots_[i].spec->in_shape), "; every device must issue the same collectives");
    exec(slots_);
  } catch (...) {
    err = std::current_exception();
  }
  // Each device rethrows its own copy: run_bodies adds the device's context to the exception.
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(size()));
  if (err)
    for (int i = 1; i < size(); ++i) errors[static_cast<std::size_t>(i)] = detail::copy_exception(err);
  lock.lock();
  errors_ = std::move(errors);
  arrived_ = 0;
  ++generation_;
  cv_.notify_all();
  lock.unlock();
  if (err) std::rethrow_exception(err);
}

void SpmdState::fail(int local) {
  std::lock_guard lock(mutex_);
  if (failed_device_ < 0) failed_device_ = devices_[local];
  cv_.notify_all();
}

}  // namespace detail

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
    raise_not_differentiable(op, "grad inside a shard_map body differentiates the device's local program, where a "
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

detail::SharedWindow& DeviceContext::shared_window(const Axes& axes, std::size_t bytes, const std::string& name) {
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
    for (std::size_t i = 0; i < slots.size(); ++i) *static_cast<Tensor<T>*>(slots[i].out) = std::move(outs[i]);
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
    return traced_collective("psum", level, x, [=](const Tensor<T>& v) { return shard::device_context().psum(v, axes, where); });
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
          *tape, "pmean", x, detail::vma_of(x, *tape) & ~m, m, [&] { return pmean(std::move(x), axes, where); },
          [n](const Tensor<T>& ct) { return ct / n; });
    }
  }
  if constexpr (is_floating_v<T>) {
    if (const std::uint64_t level = detail::trace_level_of(x))
      return traced_collective("pmean", level, x, [=](const Tensor<T>& v) { return shard::device_context().pmean(v, axes, where); });
    auto spec = detail::reduce_spec(mesh(), ReduceKind::kMean, axes, x.shape());  // before x is moved from
    return run(std::move(spec), std::move(x), where);
  } else {  // JAX: the exact integer sum, then a true division
    using F = float_of_t<T>;
    const int n = axis_size(axes);
    // (an op, not a loop over the elements: inside a jit the sum is a traced value)
    return astype<F>(psum(astype<sum_t<T>>(x), axes, where)) / static_cast<F>(n);
  }
}
template <typename T>
Tensor<T> DeviceContext::pmax(Tensor<T> x, const Axes& axes, shard::source_location where) {
  const detail::CallScope scope("pmax", where);
  if (auto* tape = detail::recording_tape_for(x)) {
    if constexpr (FloatDtype<T>)
      if (detail::differentiable_on(x, *tape)) detail::raise_not_differentiable("pmax", "JAX defines no transpose for it either");
    const std::uint32_t m = detail::axes_mask(mesh(), axes, "pmax");
    const std::uint32_t vma = detail::vma_of(x, *tape) & ~m;
    Tensor<T> out = detail::paused([&] { return pmax(std::move(x), axes, where); });
    out.set_ad(vma ? std::make_shared<detail::AdValue>(detail::AdValue{tape->id(), vma, nullptr}) : nullptr);
    return out;
  }
  if (const std::uint64_t level = detail::trace_level_of(x))
    return traced_collective("pmax", level, x, [=](const Tensor<T>& v) { return shard::device_context().pmax(v, axes, where); });
  auto spec = detail::reduce_spec(mesh(), ReduceKind::kMax, axes, x.shape());  // before x is moved from
  return run(std::move(spec), std::move(x), where);
}
template <typename T>
Tensor<T> DeviceContext::pmin(Tensor<T> x, const Axes& axes, shard::source_location where) {
  const detail::CallScope scope("pmin", where);
  if (auto* tape = detail::recording_tape_for(x)) {
    if constexpr (FloatDtype<T>)
      if (detail::differentiable_on(x, *tape)) detail::raise_not_differentiable("pmin", "JAX defines no transpose for it either");
    const std::uint32_t m = detail::axes_mask(mesh(), axes, "pmin");
    const std::uint32_t vma = detail::vma_of(x, *tape) & ~m;
    Tensor<T> out = detail::paused([&] { return pmin(std::move(x), axes, where); });
    out.set_ad(vma ? std::make_shared<detail::AdValue>(detail::AdValue{tape->id(), vma, nullptr}) : nullptr);
    return out;
  }
  if (const std::uint64_t level = detail::trace_level_of(x))
    return traced_collective("pmin", level, x, [=](const Tensor<T>& v) { return shard::device_context().pmin(v, axes, where); });
  auto spec = detail::reduce_spec(mesh(), ReduceKind::kMin, axes, x.shape());  // before x is moved from
  return run(std::move(spec), std::move(x), where);
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
  if (detail::varying_collective_tape(x) || detail::trace_level_of(x)) return all_gather(static_cast<const Tensor<T>&>(x), axes, dim, tiled, where);
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
        *tape, "all_gather", x, detail::vma_of(x, *tape) | m, 0, [&] { return all_gather(x, axes, dim, tiled, where); },
        [tape, axes, dim, tiled](const Tensor<T>& ct) { return tape->context()->psum_scatter(ct, axes, dim, tiled); });
  }
  if (const std::uint64_t level = detail::trace_level_of(x))
    return traced_collective("all_gather", level, x, [=](const Tensor<T>& v) { return shard::device_context().all_gather(v, axes, dim, tiled, where); });
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
    const std::int64_t chunk = tiled && d_in >= 0 && d_in < rank ? x.shape()[static_cast<std::size_t>(d_in)] : 1;
    return detail::record_collective(
        *tape, "all_gather_invariant", x, detail::vma_of(x, *tape) & ~m, m,
        [&] { return all_gather(x, axes, dim, tiled, where); },
        [i, rank, dim, tiled, chunk](const Tensor<T>& ct) {
          const int d = dim < 0 ? dim + (tiled ? rank : rank + 1) : dim;
          std::vector<Index> index(static_cast<std::size_t>(d), Slice());
          if (tiled) index.emplace_back(Slice(i * chunk, (i + 1) * chunk));
          else index.emplace_back(i);
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
        [tape, axes, dim, tiled](const Tensor<T>& ct) { return tape->context()->all_gather(ct, axes, dim, tiled); });
  }
  if (const std::uint64_t level = detail::trace_level_of(x))
    return traced_collective("psum_scatter", level, x, [=](const Tensor<T>& v) { return shard::device_context().psum_scatter(v, axes, dim, tiled, where); });
  auto spec = detail::psum_scatter_spec(mesh(), axes, x.shape(), dim, tiled);  // before x is moved from
  return run(std::move(spec), std::move(x), where);
}
template <typename T>
Tensor<T> DeviceContext::all_to_all(Tensor<T>&& x, const Axes& axes, int split_dim, int concat_dim, bool tiled,
                                    shard::source_location where) {
  const detail::CallScope scope("all_to_all", where);
  if (detail::varying_collective_tape(x) || detail::trace_level_of(x))
    return all_to_all(static_cast<const Tensor<T>&>(x), axes, split_dim, concat_dim, tiled, where);
  auto spec = detail::all_to_all_spec(mesh(), axes, x.shape(), split_dim, concat_dim, tiled);  // before x is moved from
  return run(std::move(spec), std::move(x), where);
}
template <typename T>
Tensor<T> DeviceContext::all_to_all(const Tensor<T>& x, const Axes& axes, int split_dim, int concat_dim, bool tiled,
                                    shard::source_location where) {
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
    return traced_collective("all_to_all", level, x, [=](const Tensor<T>& v) { return shard::device_context().all_to_all(v, axes, split_dim, concat_dim, tiled, where); });
  return run(detail::all_to_all_spec(mesh(), axes, x.shape(), split_dim, concat_dim, tiled), view_of(x), where);
}
template <typename T>
Tensor<T> DeviceContext::ppermute(Tensor<T>&& x, const Axes& axes, std::vector<std::pair<int, int>> perm,
                                  shard::source_location where) {
  const detail::CallScope scope("ppermute", where);
  if (detail::varying_collective_tape(x) || detail::trace_level_of(x)) return ppermute(static_cast<const Tensor<T>&>(x), axes, std::move(perm), where);
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
    return traced_collective("ppermute", level, x, [=](const Tensor<T>& v) { return shard::device_context().ppermute(v, axes, perm, where); });
  return run(detail::ppermute_spec(mesh(), axes, x.shape(), std::move(perm)), view_of(x), where);
}

// ---------------------------------------------------------------- shard_map

namespace {

thread_local DeviceContext* t_context = nullptr;

/// JAX's spelling of a tuple of mesh axes: ('a',) or ('a', 'b').
std::string axes_tuple(const SpecEntry& e) {
  std::string s = "(";
  for (std::size_t i = 0; i < e.axes().size(); ++i) s += (i ? ", '" : "'") + e.axes()[i] + "'";
  return s + (e.axes().size() == 1 ? ",)" : ")");
}

/// What a rank whose shard_map failed prints if it waits for the other ranks at the agreement
/// that turns its error into an error on every rank. The failure may be one the other ranks
/// cannot see (a body that threw on this rank only, a collective check they are not in): they
/// then wait forever in a collective this rank will never join. After the grace period
/// (SHARD_ABORT_GRACE, default 5 s) the process prints both lines and ends (mpirun then ends
/// the whole job with a non-zero code; see detail::ExitUnlessDoneWithin).
std::string unagreed_failure_text(const std::exception_ptr& err, double grace) {
  return detail::cat(detail::error_message(err, "unknown exception"), "\n", detail::rank_prefix(),
                     "error: the other ranks did not reach the end of shard_map within ", grace,
                     " s (SHARD_ABORT_GRACE) after this failure; they wait in a collective this rank will not join: "
                     "aborting the job");
}

}  // namespace

const PartitionSpec& SpecTree::single(const char* what, std::size_t i) const {
  if (!single_)
    raise<ValueError>("shard_map: ", what, "[", i, "] is a list of ", specs_.size(),
                      " specs but its value is one array; give one PartitionSpec");
  return specs_[0];
}

const PartitionSpec& SpecTree::at(std::size_t k, std::size_t n, const char* what, std::size_t i) const {
  if (single_) return specs_[0];
  if (specs_.size() != n)
    raise<ValueError>("shard_map: ", what, "[", i, "] lists ", specs_.size(), " specs for a list of ", n,
                      " arrays; give one spec per array, or one PartitionSpec for all");
  return specs_[k];
}

DeviceContext* detail::current_device_context() noexcept { return t_context; }

DeviceContext& device_context() {
  if (!t_context)
    raise<RuntimeError>("a collective was called outside a shard_map or pmap body: named mesh axes are bound only "
                        "inside one (JAX: unbound axis name)");
  return *t_context;
}

namespace detail {

void check_in_spec_divides(const Mesh& mesh, const PartitionSpec& spec, const Shape& shape, std::size_t i) {
  const NamedSharding want(mesh, spec);
  want.check_shape(shape);
  for (int d = 0; d < static_cast<int>(shape.size()); ++d) {
    const int parts = want.num_parts(d);
    if (shape[d] % parts != 0)
      raise<ShapeError>("shard_map: in_specs[", i, "] = ", spec.to_string(), " maps array axis ", d, " (of size ",
                        shape[d], ") of argument ", i, " with shape ", to_string(shape), " to mesh axes ",
                        axes_tuple(spec[d]), " (of total size ", parts, "), but ", parts, " does not evenly divide ",
                        shape[d]);
  }
}

template <Dtype T>
ShardedArray<T> prepare_argument(const Mesh& mesh, const PartitionSpec& spec, const ShardedArray<T>& x, std::size_t i) {
  if (x.empty())
    raise<ValueError>("shard_map: argument ", i, " is an empty ShardedArray (default-constructed and never assigned "
                      "an array)");
  check_same_devices(mesh, x.mesh(), "shard_map argument " + std::to_string(i));
  check_in_spec_divides(mesh, spec, x.shape(), i);
  const NamedSharding want(mesh, spec);
  return x.sharding() == want ? x.alias() : reshard(x, want);  // the body reads its blocks: no copy
}

namespace {
/// The line an error raised in a body gets: which body, which device, the arguments' global
/// shapes beside the blocks the body saw.
std::string body_context(const Mesh& mesh, int device, const BodySite& site) {
  std::string s = cat("in the body of the shard_map called at ", site.where.file_name(), ":", site.where.line(),
                      ", on device ", device, " (mesh ", mesh.to_string(), ", coordinates (");
  const std::vector<int> c = mesh.coords(device);
  for (std::size_t k = 0; k < c.size(); ++k) s += cat(k ? ", " : "", mesh.axis_names()[k], "=", c[k]);
  s += "))";
  for (std::size_t i = 0; i < site.arguments.size(); ++i) s += cat(i ? "; " : ": ", "argument ", i, " ", site.arguments[i]);
  return s;
}
}  // namespace

std::exception_ptr run_bodies(const Mesh& mesh, const std::function<void(DeviceContext&)>& body, const BodySite* site) {
  const std::vector<int> local = mesh.local_device_ids();
  const int n = static_cast<int>(local.size());
  auto state = std::make_shared<SpmdState>(mesh, local);
  try {
    Runtime::current().executor().run(
        n,
        [&](int li) {
          DeviceContext ctx(state, li);
          DeviceContext* const outer = t_context;  // a shard_map inside a body is not supported, but restore anyway
          t_context = &ctx;
          // Device threads start without the caller's scopes: the shard_map call is the user's line
          // until the body's own calls name theirs.
          std::optional<CallScope> scope;
          if (site) scope.emplace("shard_map", site->where);
          try {
            body(ctx);
          } catch (Error& e) {
            t_context = outer;
            if (site) e.add_context(body_context(mesh, local[static_cast<std::size_t>(li)], *site));
            throw;
          } catch (...) {
            t_context = outer;
            throw;
          }
          t_context = outer;
        },
        [&](int li) { state->fail(li); });
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

namespace {

/// The block shapes flattened: a count, then (rank, dims...) per block.
std::vector<std::int64_t> shape_code(const std::vector<Shape>& shapes) {
  std::vector<std::int64_t> code{static_cast<std::int64_t>(shapes.size())};
  for (const auto& s : shapes) {
    code.push_back(static_cast<std::int64_t>(s.size()));
    code.insert(code.end(), s.begin(), s.end());
  }
  return code;
}

std::int64_t hash_code(const std::vector<std::int64_t>& code) {
  std::uint64_t h = 1469598103934665603ULL;
  for (const std::int64_t v : code)
    for (int b = 0; b < 8; ++b) {
      h ^= static_cast<std::uint64_t>(v) >> (8 * b) & 0xffu;
      h *= 1099511628211ULL;
    }
  return static_cast<std::int64_t>(h);
}

[[noreturn]] void raise_different_shapes() {
  raise<ShapeError>("shard_map: devices returned blocks of different shapes (or lists of different lengths); every "
                    "device must return the same shapes");
}

/// Ranks without a device of the mesh learn the shapes from the others (max over the ranks
/// with devices of code and -code: equal iff all agree).
std::vector<std::int64_t> share_code(const std::vector<std::int64_t>& code, bool have, std::int64_t len) {
  std::vector<std::int64_t> r(2 * static_cast<std::size_t>(len));
  for (std::int64_t k = 0; k < len; ++k) {
    r[k] = have ? code[k] : LLONG_MIN;
    r[len + k] = have ? -code[k] : LLONG_MIN;
  }
  detail::allreduce_max(detail::world_group(), detail::CommOp{"shard_map", "the block shapes, for ranks without a device"},
                        r.data(), static_cast<int>(r.size()));
  for (std::int64_t k = 0; k < len; ++k)
    if (r[k] != -r[len + k]) raise_different_shapes();
  r.resize(static_cast<std::size_t>(len));
  return r;
}

}  // namespace

std::vector<Shape> agree_after_bodies(const std::exception_ptr& err, const std::vector<std::vector<Shape>>& per_device,
                                      bool have) {
  const mpi::Communicator& world = Runtime::current().world();
  std::exception_ptr failure = err;
  std::optional<detail::ExitUnlessDoneWithin> watch;
  const auto on_failure = [&](const std::exception_ptr& e) {
    detail::announce_failure(e);  // a rank waiting in a collective of the body raises it
    watch.reset();
    // The others may never get here: abort after the grace.
    watch.emplace(abort_grace_seconds(), unagreed_failure_text(e, abort_grace_seconds()));
  };
  if (failure) [[unlikely]]
    on_failure(failure);
  const bool mine = have && !failure && !per_device.empty();
  bool same = true;
  for (std::size_t li = 1; mine && li < per_device.size(); ++li) same = same && per_device[li] == per_device[0];
  const std::vector<std::int64_t> code = mine ? shape_code(per_device[0]) : std::vector<std::int64_t>{};
  const std::int64_t len = static_cast<std::int64_t>(code.size()), h = mine ? hash_code(code) : 0;
  // One exchange (max) decides everything, with the lowest failing rank: the longest and
  // shortest code, whether a rank's own devices differ, the shapes' hash (max of h and of ~h:
  // equal iff every h is), and whether some rank holds no device (it must be told the shapes).
  // It is the collective check's exchange: a rank still in a collective of its body meets it.
  const std::int64_t words[6] = {mine ? len : LLONG_MIN, mine ? -len : LLONG_MIN, same ? 0 : 1,
                                 mine ? h : LLONG_MIN,   mine ? ~h : LLONG_MIN,   !have && !failure ? 1 : 0};
  const detail::Agreement agreed =
      detail::agree_at_end_of_shard_map(failure, words, on_failure);
  if (agreed.failed >= 0) [[unlikely]] {  // some rank failed: every rank raises
    std::exception_ptr raised;
    try {
      mpi::raise_failure_of(world, agreed.failed, failure);
    } catch (...) {
      raised = std::current_exception();
    }
    watch.reset();
    detail::retire_failure_notices(world);  // every rank is here: none of them is left to hear of it
    std::rethrow_exception(raised);
  }
  std::int64_t v[7] = {0};  // v[1..6]: the words above, reduced
  std::copy(std::begin(agreed.words), std::end(agreed.words), v + 1);
  if (v[3] != 0 || v[1] != -v[2] || v[4] != ~v[5]) raise_different_shapes();
  const std::vector<std::int64_t> all = v[6] ? share_code(code, mine, v[1]) : code;
  std::vector<Shape> out;
  std::size_t k = 1;
  for (std::int64_t b = 0; b < all[0]; ++b) {
    const auto rank = static_cast<std::size_t>(all[k++]);
    out.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(k), all.begin() + static_cast<std::ptrdiff_t>(k + rank));
    k += rank;
  }
  return out;
}

void run_on_devices(const Mesh& mesh, const std::function<void(DeviceContext&)>& body) {
  const bool have = !mesh.local_device_ids().empty();
  (void)agree_after_bodies(run_bodies(mesh, body, nullptr), have ? std::vector<std::vector<Shape>>(1) : std::vector<std::vector<Shape>>{},
                           have);
}

}  // namespace detail

// ---------------------------------------------------------------- array-level collectives

namespace {

template <typename T>
ShardedArray<T> run_on_shards(const ShardedArray<T>& x, const detail::CollectiveSpec& spec,
                              const NamedSharding& out_sharding, const Shape& out_shape,
                              const shard::source_location& where) {
  std::vector<Tensor<T>> ins, outs;
  std::vector<int> devices;
  for (const auto& s : x.addressable_shards()) {
    ins.push_back(s.data);
    devices.push_back(s.device);
  }
  detail::execute_collective<T>(x.mesh(), spec, devices, ins, outs, where);
  std::vector<Shard<T>> shards;
  for (std::size_t i = 0; i < devices.size(); ++i)
    shards.push_back(Shard<T>{devices[i], out_sharding.box(devices[i], out_shape), std::move(outs[i])});
  return ShardedArray<T>(out_shape, out_sharding, std::move(shards));
}

}  // namespace

template <typename T>
ShardedArray<T> psum(const ShardedArray<T>& x, const Axes& axes, shard::source_location where) {
  const detail::CallScope scope("psum", where);
  for (const auto& a : axes.axes())
    for (const auto& used : x.spec().axes())
      if (a == used)
        raise<ShardingError>("psum: mesh axis '", a, "' splits the array (", x.spec().to_string(),
                             "); an array-level psum sums partial values living on the replicas along axes the "
                             "spec does not use");
  detail::CollectiveSpec spec = detail::reduce_spec(x.mesh(), ReduceKind::kSum, axes, x.shape());
  spec.dtype = dtype_name<T>();
  return run_on_shards(x, spec, x.sharding(), x.shape(), where);
}

template <typename T>
ShardedArray<T> all_gather(const ShardedArray<T>& x, const std::string& axis, shard::source_location where) {
  const detail::CallScope scope("all_gather", where);
  const PartitionSpec& spec = x.spec();
  for (int d = 0; d < spec.size(); ++d) {
    const auto& names = spec[d].axes();
    const auto it = std::find(names.begin(), names.end(), axis);
    if (it == names.end()) continue;
    std::vector<SpecEntry> entries = spec.entries();
    std::vector<std::string> rest;
    for (const auto& n : names)
      if (n != axis) rest.push_back(n);
    entries[d] = SpecEntry(rest);
    // reshard runs this as one all_gather over `axis` when the axis is the minor one of its
    // entry and the dims divide evenly, and as one Alltoallv of the missing pieces otherwise.
    return reshard(x, NamedSharding(x.mesh(), PartitionSpec(entries)));
  }
  raise<ShardingError>("all_gather: mesh axis '", axis, "' does not split the array (", spec.to_string(), ")");
}

#define SHARD_INSTANTIATE_SPMD(T)                                                                              \
  template Tensor<T> DeviceContext::psum<T>(Tensor<T>, const Axes&, shard::source_location);                     \
  template Tensor<float_of_t<T>> DeviceContext::pmean<T>(Tensor<T>, const Axes&, shard::source_location);        \
  template Tensor<T> DeviceContext::pmax<T>(Tensor<T>, const Axes&, shard::source_location);                     \
  template Tensor<T> DeviceContext::pmin<T>(Tensor<T>, const Axes&, shard::source_location);                     \
  template Tensor<T> DeviceContext::all_gather<T>(Tensor<T>&&, const Axes&, int, bool, shard::source_location);  \
  template Tensor<T> DeviceContext::all_gather<T>(const Tensor<T>&, const Axes&, int, bool,                     \
                                                  shard::source_location);                                       \
  template Tensor<T> DeviceContext::all_gather_invariant<T>(const Tensor<T>&, const Axes&, int, bool,           \
                                                            shard::source_location);                             \
  template Tensor<T> DeviceContext::psum_scatter<T>(Tensor<T>, const Axes&, int, bool, shard::source_location);  \
  template Tensor<T> DeviceContext::all_to_all<T>(Tensor<T>&&, const Axes&, int, int, bool,                    \
                                                  shard::source_location);                                       \
  template Tensor<T> DeviceContext::all_to_all<T>(const Tensor<T>&, const Axes&, int, int, bool,               \
                                                  shard::source_location);                                       \
  template Tensor<T> DeviceContext::ppermute<T>(Tensor<T>&&, const Axes&, std::vector<std::pair<int, int>>,     \
                                                shard::source_location);                                         \
  template Tensor<T> DeviceContext::ppermute<T>(const Tensor<T>&, const Axes&, std::vector<std::pair<int, int>>, \
                                                shard::source_location);                                         \
  template ShardedArray<T> detail::prepare_argument<T>(const Mesh&, const PartitionSpec&, const ShardedArray<T>&, \
                                                       std::size_t);                                           \
  template ShardedArray<T> psum<T>(const ShardedArray<T>&, const Axes&, shard::source_location);                 \
  template ShardedArray<T> all_gather<T>(const ShardedArray<T>&, const std::string&, shard::source_location);
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_SPMD)

}  // namespace shard
