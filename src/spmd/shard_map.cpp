#include "shard/spmd/shard_map.hpp"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>

#include "shard/array/reshard.hpp"
#include "shard/comm/detail/collective_guard.hpp"
#include "shard/comm/detail/comm_verbs.hpp"
#include "shard/comm/detail/mesh_comms.hpp"
#include "shard/core/detail/remat.hpp"
#include "shard/core/timeline.hpp"
#include "shard/core/trace.hpp"
#include "shard/error.hpp"
#include "shard/mpi/agree.hpp"
#include "shard/runtime/detail/device_executor.hpp"
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
          // Nor a checkpointed function's state (device 0 runs on the calling thread): a body's
          // ops are the body's, on every device alike (core/detail/remat.hpp).
          const RematScope no_remat(nullptr);
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

#define SHARD_INSTANTIATE_SPMD(T)                                                                \
  template ShardedArray<T> detail::prepare_argument<T>(const Mesh&, const PartitionSpec&,        \
                                                       const ShardedArray<T>&, std::size_t);     \
  template ShardedArray<T> psum<T>(const ShardedArray<T>&, const Axes&, shard::source_location); \
  template ShardedArray<T> all_gather<T>(const ShardedArray<T>&, const std::string&, shard::source_location);
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_SPMD)

}  // namespace shard
