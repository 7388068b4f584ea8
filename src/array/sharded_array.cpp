#include "shard/array/sharded_array.hpp"

#include <algorithm>
#include <map>

#include "shard/array/driver.hpp"
#include "shard/comm/detail/comm_verbs.hpp"
#include "shard/core/trace.hpp"
#include "shard/error.hpp"
#include "shard/mpi/agree.hpp"
#include "shard/runtime/runtime.hpp"

namespace shard {

namespace {

/// Builds one shard per local mesh device: `make(box)` is called once per distinct box.
template <typename T, typename Make>
std::vector<Shard<T>> make_local_shards(const Shape& shape, const NamedSharding& sharding, Make&& make) {
  checked_num_elements(shape, sizeof(T), "array creation");
  sharding.check_shape(shape);
  std::vector<Shard<T>> shards;
  std::map<Box, std::size_t> first_with_box;
  for (int d : sharding.mesh().local_device_ids()) {
    Box b = sharding.box(d, shape);
    if (auto it = first_with_box.find(b); it != first_with_box.end()) {
      shards.push_back(Shard<T>{d, b, shards[it->second].data});  // a replica on this rank: copy
      continue;
    }
    Tensor<T> t = make(b);
    if (t.shape() != b.extent)
      raise<ShapeError>("the data for device ", d, " (box ", to_string(b), ") has shape ", to_string(t.shape()),
                        " but its shard of the ", to_string(shape), " array needs ", to_string(b.extent));
    first_with_box.emplace(b, shards.size());
    shards.push_back(Shard<T>{d, std::move(b), std::move(t)});
  }
  return shards;
}

const mpi::Communicator& world() { return Runtime::current().world(); }

}  // namespace

template <typename T>
ShardedArray<T>::ShardedArray(Shape shape, NamedSharding sharding, std::vector<Shard<T>> local_shards, bool committed)
    : shape_(std::move(shape)), sharding_(std::move(sharding)), shards_(std::move(local_shards)), committed_(committed) {
  checked_num_elements(shape_, sizeof(T), "ShardedArray");
  sharding_.check_shape(shape_);
  const auto local = sharding_.mesh().local_device_ids();
  if (local.size() != shards_.size())
    raise<ShapeError>("ShardedArray: ", shards_.size(), " shards given but this rank has ", local.size(),
                      " devices in ", sharding_.mesh().to_string());
  for (std::size_t i = 0; i < local.size(); ++i) {
    const Box b = sharding_.box(local[i], shape_);
    if (shards_[i].device != local[i] || shards_[i].box != b || shards_[i].data.shape() != b.extent)
      raise<ShapeError>("ShardedArray: shard ", i, " should be device ", local[i], " with box ", to_string(b),
                        " but is device ", shards_[i].device, " with box ", to_string(shards_[i].box),
                        " and data of shape ", to_string(shards_[i].data.shape()));
  }
}

template <typename T>
void ShardedArray<T>::raise_inaccessible(const char* what) const {
  if (batch_) detail::raise_batched_access(what, *batch_);
  raise<ValueError>(what, " of a deleted array: its buffers were donated to a jit call (JitOptions::donate_argnums) "
                    "or freed with delete_buffers(), as JAX deletes a donated array; use the call's result instead, "
                    "or do not donate an argument you read again");
}

template <typename T>
const Shard<T>& ShardedArray<T>::shard_of(int device_id) const {
  if (deleted_) raise_inaccessible("shard_of()");
  // A shard_map body reading a differentiated array's block through a capture: its gradient
  // could not flow back (it would silently be 0).
  if (ad_)
    if (const detail::Tape* t = detail::recording_tape(); t && t->parent() && ad_->tape == t->parent())
      detail::raise_captured_in_body();
  for (const auto& s : shards_)
    if (s.device == device_id) return s;
  raise<ValueError>("device ", device_id, " holds no shard on this rank (local mesh devices: ",
                    sharding_.mesh().local_device_ids().size(), " of ", sharding_.mesh().devices_string(), ")");
}

template <typename T>
Shard<T>& ShardedArray<T>::shard_of(int device_id) {
  return const_cast<Shard<T>&>(std::as_const(*this).shard_of(device_id));
}

namespace {

/// The primary copy of every box, grouped by owning rank (rank order, then mesh order):
/// the layout of the to_host / gather receive buffer.
struct HostPlan {
  std::vector<std::vector<int>> devices_of_rank;
  std::vector<int> counts;
  std::vector<int> displs;
  std::int64_t total = 0;
};

HostPlan host_plan(const NamedSharding& sharding, const Shape& shape, int ranks) {
  HostPlan p;
  p.devices_of_rank.resize(static_cast<std::size_t>(ranks));
  std::vector<std::int64_t> counts(static_cast<std::size_t>(ranks), 0);
  const Topology& topo = sharding.mesh().topology();
  for (int d : sharding.primary_devices()) {
    const int r = topo.owner(d);
    p.devices_of_rank[r].push_back(d);
    counts[r] += sharding.box(d, shape).size();
  }
  for (int r = 0; r < ranks; ++r) {
    p.counts.push_back(mpi::int_count(counts[r], "elements on one rank", "to_host"));
    p.displs.push_back(mpi::int_count(p.total, "elements on one rank", "to_host"));
    p.total += counts[r];
  }
  return p;
}

template <typename T>
Tensor<T> pack_primaries(const ShardedArray<T>& a, const std::vector<int>& mine) {
  std::int64_t n = 0;
  for (int d : mine) n += a.shard_of(d).data.size();
  Tensor<T> send({n});
  T* o = send.data();
  for (int d : mine) o = std::copy(a.shard_of(d).data.begin(), a.shard_of(d).data.end(), o);
  return send;
}

template <typename T>
void unpack_boxes(const HostPlan& p, const NamedSharding& sharding, const Shape& shape, const T* recv,
                  Tensor<T>& out) {
  const Shape origin(shape.size(), 0);
  std::int64_t off = 0;
  for (const auto& devs : p.devices_of_rank)
    for (int d : devs) {
      const Box b = sharding.box(d, shape);
      copy_box(recv + off, b.extent, b.offset, out.data(), shape, origin, b, sizeof(T));
      off += b.size();
    }
}

/// Every rank's copy of x: one allgatherv of the primary blocks over the world.
template <typename T>
Tensor<T> gather_everywhere(const ShardedArray<T>& x) {
  const auto& comm = world();
  const NamedSharding& sharding = x.sharding();
  const detail::CommOp op{"to_host", detail::cat(dtype_name<T>(), to_string(x.shape()), " ", sharding.to_string())};
  detail::check_transfer(op);
  const HostPlan p = host_plan(sharding, x.shape(), comm.size());
  const Tensor<T> send = pack_primaries(x, p.devices_of_rank[comm.rank()]);
  Tensor<T> recv({p.total});
  detail::allgatherv(detail::world_group(), op, send.data(), detail::transfer_count(send.size(), op), recv.data(),
                     p.counts, p.displs);
  Tensor<T> out(x.shape());
  unpack_boxes(p, sharding, x.shape(), recv.data(), out);
  return out;
}

/// to_host as a primitive that moves its operand across the views: its VJP gives each device
/// its box of the host cotangent back.
struct ToHost : Primitive {
  const char* name() const { return "to_host"; }
  template <typename T>
  Tensor<T> across(const ShardedArray<T>& x) const {
    return gather_everywhere(x);
  }
  template <typename T>
  KernelVjp<Tensor<T>, ShardedArray<T>> vjp(const VjpNeed&, const Tensor<T>&, const ShardedArray<T>& x) const {
    return [s = x.sharding()](const Tensor<T>& ct, const VjpNeed&) {
      return cotangents<ShardedArray<T>>(device_put(ct, s));
    };
  }
  /// Batching: the physical array to the host, the batch dim where it was.
  template <typename T>
  BatchOut<Tensor<T>> batch(const shard::source_location& where, std::int64_t,
                            const BatchArg<ShardedArray<T>>& a) const {
    return {detail::bind_at(ToHost{}, where, a.x), a.bdim};
  }
};

}  // namespace

template <typename T>
Tensor<T> ShardedArray<T>::to_host(shard::source_location where) const {
  return shard::bind(ToHost{}, *this, where);
}

template <typename T>
T ShardedArray<T>::item(shard::source_location where) const {
  const detail::CallScope scope("item", where);
  if (empty()) raise<ValueError>("item(): the array is empty (default-constructed and never assigned an array)");
  if (batch_ || deleted_) raise_inaccessible("item()");
  if (size() != 1)
    raise<ShapeError>("item(): the array has shape ", to_string(shape_), " (", size(),
                      " elements); item() reads a 0-d or size-1 array");
  if (shards_.empty())
    raise<ValueError>("item(): rank ", world().rank(), " holds no device of the array's mesh ", mesh().to_string(),
                      "; read it on a rank that does, or with to_host().item() on every rank");
  for (const auto& s : shards_)
    if (s.data.size() != 1)
      raise<ValueError>("item(): the element is not on every device (sharding ", sharding_.to_string(),
                        "): item() reads it locally; reshard it to P() first, or use to_host().item() on every rank");
  return shards_.front().data.data()[0];
}

template <typename T>
Tensor<T> ShardedArray<T>::gather(int root, shard::source_location where) const {
  const detail::CallScope scope("gather", where);
  if (deleted_) raise_inaccessible("gather()");
  const auto& comm = world();
  if (root < 0 || root >= comm.size())
    raise<ValueError>("gather: root ", root, " is not a rank (there are ", comm.size(), " ranks)");
  const detail::CommOp op{"gather",
                          detail::cat(dtype_name<T>(), to_string(shape_), " ", sharding_.to_string(), " to rank ", root)};
  detail::check_transfer(op);
  const HostPlan p = host_plan(sharding_, shape_, comm.size());
  const Tensor<T> send = pack_primaries(*this, p.devices_of_rank[comm.rank()]);
  const bool is_root = comm.rank() == root;
  Tensor<T> recv({is_root ? p.total : 0});
  detail::gatherv(detail::world_group(), op, send.data(), detail::transfer_count(send.size(), op), recv.data(),
                  p.counts, p.displs, root);
  if (!is_root) return Tensor<T>();
  Tensor<T> out(shape_);
  unpack_boxes(p, sharding_, shape_, recv.data(), out);
  return out;
}

template <typename T>
ShardedArray<T> device_put(const Tensor<T>& host, const NamedSharding& sharding, shard::source_location where) {
  const detail::CallScope scope("device_put", where);
  const Shape& shape = host.shape();
  // A shape the sharding does not fit (wrong ndim, say) on some ranks: the error on every rank.
  mpi::agreed(world(), [&] { sharding.check_shape(shape); });
  // Every rank must have passed the same global array shape: compare a hash of it.
  std::uint64_t h = 1469598103934665603ull ^ shape.size();
  for (auto d : shape) h = (h ^ static_cast<std::uint64_t>(d)) * 1099511628211ull;
  std::int64_t r[2] = {static_cast<std::int64_t>(h >> 1), -static_cast<std::int64_t>(h >> 1)};
  const detail::CommOp op{"device_put", "a host array onto " + sharding.to_string()};
  detail::check_transfer(op);
  detail::allreduce_min(detail::world_group(), op, r, 2);
  if (r[0] != -r[1])
    raise<ShapeError>("device_put: ranks passed host arrays of different shapes (this rank: ", to_string(shape),
                      "); every rank must pass the same global array");
  auto shards = make_local_shards<T>(shape, sharding, [&](const Box& b) {
    Tensor<T> t(b.extent);
    copy_box(host.data(), shape, Shape(shape.size(), 0), t.data(), b.extent, b.offset, b, sizeof(T));
    return t;
  });
  return ShardedArray<T>(shape, sharding, std::move(shards));
}

template <typename T>
ShardedArray<T> from_callback(const Shape& shape, const NamedSharding& sharding,
                              const std::function<Tensor<T>(const Box&)>& fn) {
  std::vector<Shard<T>> shards;
  mpi::agreed(world(), [&] { shards = make_local_shards<T>(shape, sharding, fn); });
  return ShardedArray<T>(shape, sharding, std::move(shards));
}

template <typename T>
ShardedArray<T> generate(const Shape& shape, const NamedSharding& sharding,
                         const std::function<Tensor<T>(const Box&)>& fn) {
  auto shards = make_local_shards<T>(shape, sharding, fn);
  return ShardedArray<T>(shape, sharding, std::move(shards));
}

template <typename T>
ShardedArray<T> full(const Shape& shape, T value, const NamedSharding& sharding) {
  auto shards = make_local_shards<T>(shape, sharding, [&](const Box& b) { return Tensor<T>(b.extent, value); });
  return ShardedArray<T>(shape, sharding, std::move(shards));
}

template <typename T>
ShardedArray<T> zeros(const Shape& shape, const NamedSharding& sharding) {
  return full<T>(shape, T{0}, sharding);
}

template <typename T>
ShardedArray<T> arange(const Shape& shape, const NamedSharding& sharding) {
  const Shape gstride = strides_of(shape);
  auto shards = make_local_shards<T>(shape, sharding, [&](const Box& b) {
    Tensor<T> t(b.extent);
    const int rank = static_cast<int>(shape.size());
    Shape idx(shape.size(), 0);
    for (std::int64_t i = 0; i < t.size(); ++i) {
      std::int64_t g = 0;
      for (int d = 0; d < rank; ++d) g += (b.offset[d] + idx[d]) * gstride[d];
      t.flat(i) = static_cast<T>(g);
      for (int d = rank - 1; d >= 0; --d) {
        if (++idx[d] < b.extent[d]) break;
        idx[d] = 0;
      }
    }
    return t;
  });
  return ShardedArray<T>(shape, sharding, std::move(shards));
}

#define SHARD_INSTANTIATE_ARRAY(T)                                                                           \
  template class ShardedArray<T>;                                                                            \
  template ShardedArray<T> device_put<T>(const Tensor<T>&, const NamedSharding&, shard::source_location);                            \
  template ShardedArray<T> from_callback<T>(const Shape&, const NamedSharding&,                              \
                                            const std::function<Tensor<T>(const Box&)>&);                    \
  template ShardedArray<T> generate<T>(const Shape&, const NamedSharding&,                                   \
                                       const std::function<Tensor<T>(const Box&)>&);                         \
  template ShardedArray<T> zeros<T>(const Shape&, const NamedSharding&);                                     \
  template ShardedArray<T> full<T>(const Shape&, T, const NamedSharding&);                                   \
  template ShardedArray<T> arange<T>(const Shape&, const NamedSharding&);
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_ARRAY)

}  // namespace shard
