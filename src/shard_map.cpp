#include "shard/shard_map.hpp"

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "shard/detail/collective_guard.hpp"
#include "shard/detail/device_executor.hpp"
#include "shard/detail/mesh_comms.hpp"
#include "shard/error.hpp"
#include "shard/mpi/agree.hpp"
#include "shard/reshard.hpp"
#include "shard/runtime.hpp"
#include "spmd_state.hpp"

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
    if (error_) std::rethrow_exception(error_);
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
  lock.lock();
  error_ = err;
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

template <typename T>
Tensor<T> DeviceContext::run(detail::CollectiveSpec spec, Tensor<T> x, const std::source_location& where) {
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
  state_->arrive(local_, spec, &x, &out, [&](std::vector<detail::SpmdState::Slot>& slots) {
    std::vector<Tensor<T>> ins(slots.size()), outs;
    for (std::size_t i = 0; i < slots.size(); ++i) ins[i] = std::move(*static_cast<Tensor<T>*>(slots[i].in));
    detail::execute_collective<T>(m, spec, devices, ins, outs, where);  // device 0's call site
    for (std::size_t i = 0; i < slots.size(); ++i) *static_cast<Tensor<T>*>(slots[i].out) = std::move(outs[i]);
  });
  return out;
}

template <typename T>
Tensor<T> DeviceContext::psum(Tensor<T> x, const Axes& axes, std::source_location where) {
  auto spec = detail::reduce_spec(mesh(), detail::ReduceOp::kSum, axes, x.shape());  // before x is moved from
  return run(std::move(spec), std::move(x), where);
}
template <typename T>
Tensor<T> DeviceContext::pmean(Tensor<T> x, const Axes& axes, std::source_location where) {
  auto spec = detail::reduce_spec(mesh(), detail::ReduceOp::kMean, axes, x.shape());  // before x is moved from
  return run(std::move(spec), std::move(x), where);
}
template <typename T>
Tensor<T> DeviceContext::pmax(Tensor<T> x, const Axes& axes, std::source_location where) {
  auto spec = detail::reduce_spec(mesh(), detail::ReduceOp::kMax, axes, x.shape());  // before x is moved from
  return run(std::move(spec), std::move(x), where);
}
template <typename T>
Tensor<T> DeviceContext::pmin(Tensor<T> x, const Axes& axes, std::source_location where) {
  auto spec = detail::reduce_spec(mesh(), detail::ReduceOp::kMin, axes, x.shape());  // before x is moved from
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
                                    std::source_location where) {
  auto spec = detail::all_gather_spec(mesh(), axes, x.shape(), dim, tiled);  // before x is moved from
  return run(std::move(spec), std::move(x), where);
}
template <typename T>
Tensor<T> DeviceContext::all_gather(const Tensor<T>& x, const Axes& axes, int dim, bool tiled,
                                    std::source_location where) {
  return run(detail::all_gather_spec(mesh(), axes, x.shape(), dim, tiled), view_of(x), where);
}
template <typename T>
Tensor<T> DeviceContext::psum_scatter(Tensor<T> x, const Axes& axes, int dim, bool tiled,
                                      std::source_location where) {
  auto spec = detail::psum_scatter_spec(mesh(), axes, x.shape(), dim, tiled);  // before x is moved from
  return run(std::move(spec), std::move(x), where);
}
template <typename T>
Tensor<T> DeviceContext::all_to_all(Tensor<T>&& x, const Axes& axes, int split_dim, int concat_dim, bool tiled,
                                    std::source_location where) {
  auto spec = detail::all_to_all_spec(mesh(), axes, x.shape(), split_dim, concat_dim, tiled);  // before x is moved from
  return run(std::move(spec), std::move(x), where);
}
template <typename T>
Tensor<T> DeviceContext::all_to_all(const Tensor<T>& x, const Axes& axes, int split_dim, int concat_dim, bool tiled,
                                    std::source_location where) {
  return run(detail::all_to_all_spec(mesh(), axes, x.shape(), split_dim, concat_dim, tiled), view_of(x), where);
}
template <typename T>
Tensor<T> DeviceContext::ppermute(Tensor<T>&& x, const Axes& axes, std::vector<std::pair<int, int>> perm,
                                  std::source_location where) {
  auto spec = detail::ppermute_spec(mesh(), axes, x.shape(), std::move(perm));  // before x is moved from
  return run(std::move(spec), std::move(x), where);
}
template <typename T>
Tensor<T> DeviceContext::ppermute(const Tensor<T>& x, const Axes& axes, std::vector<std::pair<int, int>> perm,
                                  std::source_location where) {
  return run(detail::ppermute_spec(mesh(), axes, x.shape(), std::move(perm)), view_of(x), where);
}

// ---------------------------------------------------------------- shard_map

namespace {

/// JAX's spelling of a tuple of mesh axes: ('a',) or ('a', 'b').
std::string axes_tuple(const SpecEntry& e) {
  std::string s = "(";
  for (std::size_t i = 0; i < e.axes().size(); ++i) s += (i ? ", '" : "'") + e.axes()[i] + "'";
  return s + (e.axes().size() == 1 ? ",)" : ")");
}

/// Checks an argument against its in_spec: same mesh, same sharding, even division.
template <typename T>
void check_argument(const Mesh& mesh, const PartitionSpec& spec, const ShardedArray<T>& x, std::size_t i) {
  if (!(x.mesh() == mesh))
    raise<MeshMismatchError>("shard_map: argument ", i, " lives on a mesh with devices ", x.mesh().devices_string(),
                             " (", x.mesh().to_string(), ") but shard_map runs on devices ", mesh.devices_string(),
                             " (", mesh.to_string(), "); put the argument on the shard_map mesh first");
  const NamedSharding want(mesh, spec);
  want.check_shape(x.shape());
  for (int d = 0; d < x.ndim(); ++d) {
    const int parts = want.num_parts(d);
    if (x.shape()[d] % parts != 0)
      raise<ShapeError>("shard_map: in_specs[", i, "] = ", spec.to_string(), " maps array axis ", d, " (of size ",
                        x.shape()[d], ") of argument ", i, " with shape ", to_string(x.shape()), " to mesh axes ",
                        axes_tuple(spec[d]), " (of total size ", parts, "), but ", parts,
                        " does not evenly divide ", x.shape()[d]);
  }
  if (!(x.spec() == spec))
    raise<ShardingError>("shard_map: argument ", i, " is sharded as ", x.spec().to_string(), " but in_specs[", i,
                         "] is ", spec.to_string(), "; reshard the argument to ", spec.to_string(), " first");
}

/// Armed on a rank whose shard_map failed while it waits for the other ranks at the agreement
/// that turns its error into an error on every rank. The failure may be one the other ranks
/// cannot see (a body that threw on this rank only): they then wait forever in a collective
/// this rank will never join. If the agreement has not completed within the grace period
/// (SHARD_ABORT_GRACE, default 5 s), the helper thread prints "[rank r] error: ..." and ends
/// the process; mpirun then ends the whole job with a non-zero code. The helper never calls
/// MPI (the main thread is inside MPI; the thread level is MPI_THREAD_FUNNELED).
class AbortUnlessAgreed {
 public:
  AbortUnlessAgreed(const std::exception_ptr& err, double grace) {
    std::string msg = "unknown exception";
    try {
      std::rethrow_exception(err);
    } catch (const Error& e) {
      msg = e.message();
    } catch (const std::exception& e) {
      msg = e.what();
    } catch (...) {
    }
    msg = detail::rank_prefix() + "error: " + msg + "\n" + detail::rank_prefix() +
          "error: the other ranks did not reach the end of shard_map within " + detail::cat(grace) +
          " s (SHARD_ABORT_GRACE) after this failure; they wait in a collective this rank will not join: "
          "aborting the job\n";
    thread_ = std::thread([this, grace, msg = std::move(msg)] {
      std::unique_lock lock(mutex_);
      if (cv_.wait_for(lock, std::chrono::duration<double>(grace), [&] { return done_; })) return;
      std::fputs(msg.c_str(), stderr);
      std::fflush(stderr);
      std::_Exit(1);
    });
  }
  ~AbortUnlessAgreed() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  AbortUnlessAgreed(const AbortUnlessAgreed&) = delete;
  AbortUnlessAgreed& operator=(const AbortUnlessAgreed&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

/// Every rank learns the block shape of every output (ranks without mesh devices included)
/// and checks that all devices returned the same shapes.
std::vector<Shape> agree_block_shapes(const std::vector<Shape>& mine, std::size_t outputs, bool have) {
  constexpr int kMaxRank = 16;
  const std::size_t w = outputs * (kMaxRank + 1);
  std::vector<std::int64_t> v(2 * w);
  for (std::size_t j = 0; j < outputs; ++j)
    for (int d = -1; d < kMaxRank; ++d) {
      std::int64_t x = -1;
      if (have && j < mine.size()) {
        if (mine[j].size() > kMaxRank) raise<ShapeError>("shard_map: output blocks of rank > ", kMaxRank);
        x = d < 0 ? static_cast<std::int64_t>(mine[j].size()) : (d < static_cast<int>(mine[j].size()) ? mine[j][d] : 0);
      }
      const std::size_t k = j * (kMaxRank + 1) + static_cast<std::size_t>(d + 1);
      v[k] = have ? x : LLONG_MIN;      // max over ranks with devices
      v[w + k] = have ? -x : LLONG_MIN;  // -min
    }
  std::vector<std::int64_t> r(v.size());
  mpi::check(MPI_Allreduce(v.data(), r.data(), static_cast<int>(r.size()), MPI_INT64_T, MPI_MAX,
                           Runtime::current().world().get()),
             "MPI_Allreduce");
  std::vector<Shape> out(outputs);
  for (std::size_t j = 0; j < outputs; ++j) {
    const std::size_t k = j * (kMaxRank + 1);
    for (int d = 0; d <= kMaxRank; ++d)
      if (r[k + d] != -r[w + k + d])
        raise<ShapeError>("shard_map: devices returned blocks of different shapes for output ", j,
                          "; every device must return blocks of one shape");
    out[j].assign(r.begin() + static_cast<long>(k) + 1, r.begin() + static_cast<long>(k) + 1 + r[k]);
  }
  return out;
}

}  // namespace

template <typename T>
std::vector<ShardedArray<T>> shard_map(const Mesh& mesh, const std::vector<PartitionSpec>& in_specs,
                                       const std::vector<PartitionSpec>& out_specs, const ShardMapBody<T>& body,
                                       const std::vector<const ShardedArray<T>*>& args) {
  // Usage errors from metadata every rank holds: raised before any communication.
  if (in_specs.size() != args.size())
    raise<ValueError>("shard_map: ", args.size(), " arguments but ", in_specs.size(), " in_specs");
  for (std::size_t i = 0; i < args.size(); ++i) check_argument(mesh, in_specs[i], *args[i], i);
  for (const auto& s : out_specs) NamedSharding(mesh, s);

  const std::vector<int> local = mesh.local_device_ids();
  const int n = static_cast<int>(local.size());
  auto state = std::make_shared<detail::SpmdState>(mesh, local);
  std::vector<std::vector<Tensor<T>>> results(static_cast<std::size_t>(n));
  std::exception_ptr err;
  try {
    Runtime::current().executor().run(
        n,
        [&](int li) {
          DeviceContext ctx(state, li);
          std::vector<const Tensor<T>*> blocks;
          for (const auto* a : args) blocks.push_back(&a->addressable_shards()[li].data);
          results[li] = body(ctx, Blocks<T>(std::move(blocks)));
          if (results[li].size() != out_specs.size())
            raise<ValueError>("shard_map: the body returned ", results[li].size(), " blocks but there are ",
                              out_specs.size(), " out_specs");
        },
        [&](int li) { state->fail(li); });
  } catch (...) {
    err = std::current_exception();
  }
  if (err) [[unlikely]] {
    const AbortUnlessAgreed watch(err, detail::abort_grace_seconds());
    mpi::raise_if_any(Runtime::current().world(), err);  // throws on every rank
  }
  mpi::raise_if_any(Runtime::current().world(), err);  // a failure on any rank fails every rank

  std::vector<Shape> mine;
  for (std::size_t j = 0; n > 0 && j < out_specs.size(); ++j) mine.push_back(results[0][j].shape());
  bool same = true;
  for (int li = 1; li < n; ++li)
    for (std::size_t j = 0; j < out_specs.size(); ++j) same = same && results[li][j].shape() == mine[j];
  if (Runtime::current().world().any(!same))
    raise<ShapeError>("shard_map: devices returned blocks of different shapes; every device must return one shape");
  const std::vector<Shape> blocks = agree_block_shapes(mine, out_specs.size(), n > 0);

  std::vector<ShardedArray<T>> out;
  for (std::size_t j = 0; j < out_specs.size(); ++j) {
    const NamedSharding sharding(mesh, out_specs[j]);
    if (out_specs[j].size() > static_cast<int>(blocks[j].size()))
      raise<ShardingError>("shard_map: out_specs[", j, "] = ", out_specs[j].to_string(), " has more entries than the ",
                           blocks[j].size(), "-D blocks the body returned");
    Shape global = blocks[j];
    for (std::size_t d = 0; d < global.size(); ++d) global[d] *= sharding.num_parts(static_cast<int>(d));
    std::vector<Shard<T>> shards;
    for (int li = 0; li < n; ++li)
      shards.push_back(Shard<T>{local[li], sharding.box(local[li], global), std::move(results[li][j])});
    out.emplace_back(global, sharding, std::move(shards));
  }
  return out;
}

template <typename T>
ShardedArray<T> pmap(const std::function<Tensor<T>(DeviceContext&, const Tensor<T>&)>& body,
                     const std::string& axis_name, const Tensor<T>& x) {
  const Runtime& rt = Runtime::current();
  if (x.rank() == 0) raise<ShapeError>("pmap: the argument must have a leading dim to map, got a 0-d array");
  const std::int64_t n = x.shape()[0];
  if (n < 1 || n > rt.device_count())
    raise<ShapeError>("pmap: the leading dim of the argument (", n, ") must be between 1 and the device count (",
                      rt.device_count(), ")");
  const Mesh all = make_mesh({rt.device_count()}, {axis_name});
  const Mesh mesh({static_cast<int>(n)}, {axis_name},
                  std::vector<int>(all.device_ids().begin(), all.device_ids().begin() + n));
  const ShardedArray<T> arr = device_put(x, NamedSharding(mesh, P(axis_name)));
  const Shape inner(x.shape().begin() + 1, x.shape().end());
  ShardMapBody<T> wrapped = [&](DeviceContext& ctx, const Blocks<T>& b) {
    Tensor<T> r = body(ctx, Tensor<T>(b[0]).reshaped(inner));
    Shape stacked = r.shape();
    stacked.insert(stacked.begin(), 1);
    std::vector<Tensor<T>> out;
    out.push_back(std::move(r).reshaped(stacked));
    return out;
  };
  return std::move(shard_map<T>(mesh, {P(axis_name)}, {P(axis_name)}, wrapped, {&arr})[0]);
}

// ---------------------------------------------------------------- array-level collectives

namespace {

template <typename T>
ShardedArray<T> run_on_shards(const ShardedArray<T>& x, const detail::CollectiveSpec& spec,
                              const NamedSharding& out_sharding, const Shape& out_shape,
                              const std::source_location& where) {
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
ShardedArray<T> psum(const ShardedArray<T>& x, const Axes& axes, std::source_location where) {
  for (const auto& a : axes.axes())
    for (const auto& used : x.spec().axes())
      if (a == used)
        raise<ShardingError>("psum: mesh axis '", a, "' splits the array (", x.spec().to_string(),
                             "); an array-level psum sums partial values living on the replicas along axes the "
                             "spec does not use");
  detail::CollectiveSpec spec = detail::reduce_spec(x.mesh(), detail::ReduceOp::kSum, axes, x.shape());
  spec.dtype = dtype_name<T>();
  return run_on_shards(x, spec, x.sharding(), x.shape(), where);
}

template <typename T>
ShardedArray<T> all_gather(const ShardedArray<T>& x, const std::string& axis, std::source_location where) {
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
    const detail::CallSiteScope site(where);  // the reshard's collective reports the caller
    return reshard(x, NamedSharding(x.mesh(), PartitionSpec(entries)));
  }
  raise<ShardingError>("all_gather: mesh axis '", axis, "' does not split the array (", spec.to_string(), ")");
}

#define SHARD_INSTANTIATE_SPMD(T)                                                                              \
  template Tensor<T> DeviceContext::psum<T>(Tensor<T>, const Axes&, std::source_location);                     \
  template Tensor<T> DeviceContext::pmean<T>(Tensor<T>, const Axes&, std::source_location);                    \
  template Tensor<T> DeviceContext::pmax<T>(Tensor<T>, const Axes&, std::source_location);                     \
  template Tensor<T> DeviceContext::pmin<T>(Tensor<T>, const Axes&, std::source_location);                     \
  template Tensor<T> DeviceContext::all_gather<T>(Tensor<T>&&, const Axes&, int, bool, std::source_location);  \
  template Tensor<T> DeviceContext::all_gather<T>(const Tensor<T>&, const Axes&, int, bool,                     \
                                                  std::source_location);                                       \
  template Tensor<T> DeviceContext::psum_scatter<T>(Tensor<T>, const Axes&, int, bool, std::source_location);  \
  template Tensor<T> DeviceContext::all_to_all<T>(Tensor<T>&&, const Axes&, int, int, bool,                    \
                                                  std::source_location);                                       \
  template Tensor<T> DeviceContext::all_to_all<T>(const Tensor<T>&, const Axes&, int, int, bool,               \
                                                  std::source_location);                                       \
  template Tensor<T> DeviceContext::ppermute<T>(Tensor<T>&&, const Axes&, std::vector<std::pair<int, int>>,     \
                                                std::source_location);                                         \
  template Tensor<T> DeviceContext::ppermute<T>(const Tensor<T>&, const Axes&, std::vector<std::pair<int, int>>, \
                                                std::source_location);                                         \
  template std::vector<ShardedArray<T>> shard_map<T>(const Mesh&, const std::vector<PartitionSpec>&,           \
                                                     const std::vector<PartitionSpec>&, const ShardMapBody<T>&,  \
                                                     const std::vector<const ShardedArray<T>*>&);              \
  template ShardedArray<T> pmap<T>(const std::function<Tensor<T>(DeviceContext&, const Tensor<T>&)>&,          \
                                   const std::string&, const Tensor<T>&);                                      \
  template ShardedArray<T> psum<T>(const ShardedArray<T>&, const Axes&, std::source_location);                 \
  template ShardedArray<T> all_gather<T>(const ShardedArray<T>&, const std::string&, std::source_location);
SHARD_INSTANTIATE_SPMD(float)
SHARD_INSTANTIATE_SPMD(double)
SHARD_INSTANTIATE_SPMD(std::int32_t)
SHARD_INSTANTIATE_SPMD(std::int64_t)

}  // namespace shard
