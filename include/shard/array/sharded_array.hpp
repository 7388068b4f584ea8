#pragma once
/// \file ShardedArray<T>: a global array (any rank, 0-d included) stored as the shards of a
/// NamedSharding. Each process holds only the shards of its own mesh devices. Instantiated
/// for the five Dtypes (bool, int32_t, int64_t, float, double).

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <source_location>
#include <vector>

#include "shard/error.hpp"  // shard::source_location
#include "shard/core/array_methods.hpp"
#include "shard/core/box.hpp"
#include "shard/core/detail/ad_value.hpp"
#include "shard/core/detail/batch.hpp"
#include "shard/core/dtype.hpp"
#include "shard/core/index.hpp"
#include "shard/sharding/named_sharding.hpp"
#include "shard/sharding/positional_sharding.hpp"
#include "shard/core/tensor.hpp"

namespace shard {

/// One device's piece of a ShardedArray: its global box and its dense data.
template <typename T>
struct Shard {
  int device = 0;
  Box box;
  Tensor<T> data;
};

/// jax.Array's methods (x.sum(), x.mean(1), x.max(), x.min(), x.reshape({2, -1}), x.transpose())
/// come from detail::ArrayMethods (core/array_methods.hpp), shared with Tensor: ops.hpp's
/// functions of the same names, collective where those are.
template <typename T>
class ShardedArray : public detail::ArrayMethods<ShardedArray, T> {
 public:
  using value_type = T;

  /// Assembles an array from this process's shards: one per local mesh device, in mesh
  /// order, each with the box the sharding gives it. Throws ShapeError otherwise.
  /// `committed` false makes it JAX's uncommitted array (ops.hpp: it never decides where a
  /// result lives).
  ShardedArray(Shape shape, NamedSharding sharding, std::vector<Shard<T>> local_shards, bool committed = true);
  /// An empty array, to assign to later (`ShardedArray<float> y; if (...) y = f(x);`): it holds
  /// no mesh and no data, and any op, collective or read of it raises ValueError until an
  /// array is assigned. empty() tells.
  ShardedArray() = default;
  /// True for a default-constructed array that was never assigned one.
  bool empty() const { return sharding_.mesh().empty(); }

  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  std::int64_t size() const { return num_elements(shape_); }
  const NamedSharding& sharding() const { return sharding_; }
  const Mesh& mesh() const { return sharding_.mesh(); }
  const PartitionSpec& spec() const { return sharding_.spec(); }
  const char* dtype() const { return dtype_name<T>(); }
  /// False for an uncommitted array (a Tensor lifted into an op with ShardedArrays).
  bool committed() const { return committed_; }

  /// Another array over the same shard memory (Tensor::alias of every shard; copies stay
  /// deep). Local.
  ShardedArray alias() const { return ShardedArray(*this, AliasTag{}); }
  /// Autodiff's record of this array (null unless a tape tracks it; autodiff.hpp).
  const std::shared_ptr<detail::AdValue>& ad() const { return ad_; }
  void set_ad(std::shared_ptr<detail::AdValue> ad) { ad_ = std::move(ad); }
  /// vmap's record of this array (null unless it is a batched value inside vmap:
  /// core/detail/batch.hpp). A batched value reports its per-example shape and sharding and
  /// holds no shards.
  const std::shared_ptr<const detail::BatchBase>& batch() const { return batch_; }
  /// A batched value of per-example shape and sharding (vmap's internals).
  static ShardedArray batched_value(Shape shape, NamedSharding sharding, bool committed,
                                    std::shared_ptr<const detail::BatchBase> record) {
    ShardedArray a;
    a.shape_ = std::move(shape);
    a.sharding_ = std::move(sharding);
    a.committed_ = committed;
    a.batch_ = std::move(record);
    return a;
  }

  /// numpy's x[i] (the first dim dropped) and x[{i, Slice(a, b), ...}]: sharded results,
  /// collective over all ranks when elements move (ops.hpp's slice()).
  ShardedArray operator[](std::int64_t i) const;
  ShardedArray operator[](std::initializer_list<Index> index) const;

  /// The shards of this process's devices (JAX's addressable_shards), in mesh order; a
  /// device whose box is empty has a zero-size shard.
  const std::vector<Shard<T>>& addressable_shards() const {
    if (batch_ || deleted_) [[unlikely]]
      raise_inaccessible("addressable_shards()");
    return shards_;
  }
  std::vector<Shard<T>>& addressable_shards() {
    if (batch_ || deleted_) [[unlikely]]
      raise_inaccessible("addressable_shards()");
    return shards_;
  }
  /// JAX's x.delete(): drops this array's references to its shards' memory (freed unless another
  /// array aliases it); every later read of it, and every op on it, raises ValueError. What
  /// jit's `donate_argnums` does to the caller's donated arrays. Local.
  void delete_buffers() {
    for (auto& s : shards_) s.data = Tensor<T>();
    deleted_ = true;
  }
  /// JAX's x.is_deleted(): true after delete_buffers() (or a jit call it was donated to).
  bool is_deleted() const { return deleted_; }
  /// The shard of a local device; throws ValueError if the device is not local or not in the mesh,
  /// and when a shard_map body reads the block of a differentiated array it captured (its
  /// gradient could not flow back: pass it to the shard_map as an argument).
  const Shard<T>& shard_of(int device_id) const;
  Shard<T>& shard_of(int device_id);

  /// Collective over all ranks: every rank receives the whole array (MPI_Allgatherv of the
  /// primary copy of each box). The one operation that builds the global array everywhere.
  Tensor<T> to_host(shard::source_location where = shard::source_location::current()) const;
  /// Collective over all ranks: rank `root` receives the whole array (MPI_Gatherv); the
  /// other ranks get an empty tensor.
  Tensor<T> gather(int root = 0, shard::source_location where = shard::source_location::current()) const;
  /// numpy's / JAX's item(): the one element of a size-1 array, read locally (no
  /// communication, so `if (rank == 0) loss.item()` is fine). A 0-d array is replicated on every
  /// device of its mesh; a size-1 array must be too (ValueError naming its sharding otherwise:
  /// use to_host().item()). ValueError on a rank that holds no device of the array's mesh, and
  /// ShapeError unless the array has exactly one element.
  T item(shard::source_location where = shard::source_location::current()) const;

 private:
  struct AliasTag {};
  ShardedArray(const ShardedArray& o, AliasTag)
      : shape_(o.shape_),
        sharding_(o.sharding_),
        committed_(o.committed_),
        deleted_(o.deleted_),
        ad_(o.ad_),
        batch_(o.batch_) {
    shards_.reserve(o.shards_.size());
    for (const auto& s : o.shards_) shards_.push_back(Shard<T>{s.device, s.box, s.data.alias()});
  }

  /// ValueError for a read of a batched or traced value (its elements do not exist) or of a
  /// deleted (donated) array.
  [[noreturn]] void raise_inaccessible(const char* what) const;

  Shape shape_;
  NamedSharding sharding_;
  std::vector<Shard<T>> shards_;
  bool committed_ = true;
  bool deleted_ = false;  // delete_buffers(): donated to a jit call
  std::shared_ptr<detail::AdValue> ad_;
  std::shared_ptr<const detail::BatchBase> batch_;
};

/// Collective over all ranks (a metadata check only): every local device copies its box of
/// `host`. Every rank must pass a host array of the same shape; otherwise ShapeError on every rank.
template <typename T>
ShardedArray<T> device_put(const Tensor<T>& host, const NamedSharding& sharding, shard::source_location where = shard::source_location::current());

/// device_put with a PositionalSharding, converted for the array's rank (to_named(rank)).
template <typename T>
ShardedArray<T> device_put(const Tensor<T>& host, const PositionalSharding& sharding, shard::source_location where = shard::source_location::current()) {
  return device_put(host, sharding.to_named(host.rank()), where);
}

/// Collective over all ranks: builds the array by calling `fn(box)` once per distinct box of
/// this process's devices (replicas on one rank share the call), so the global array is
/// never materialised. `fn` must return a tensor of shape box.extent; a callback that throws
/// or returns a wrong shape on any rank raises an error on every rank.
template <typename T>
ShardedArray<T> from_callback(const Shape& shape, const NamedSharding& sharding,
                              const std::function<Tensor<T>(const Box&)>& fn);

/// Local (no communication): like from_callback, for a `fn` that cannot fail on some ranks
/// only (a pure function of the box, e.g. a counter-based random generator).
template <typename T>
ShardedArray<T> generate(const Shape& shape, const NamedSharding& sharding,
                         const std::function<Tensor<T>(const Box&)>& fn);

/// Local (no communication): an array of zeros.
template <typename T>
ShardedArray<T> zeros(const Shape& shape, const NamedSharding& sharding);
/// Local (no communication): an array with every element `value`.
template <typename T>
ShardedArray<T> full(const Shape& shape, T value, const NamedSharding& sharding);
/// Local (no communication): element at flat row-major index i is i (numpy's arange(n).reshape(shape)).
template <typename T>
ShardedArray<T> arange(const Shape& shape, const NamedSharding& sharding);

#define SHARD_DECLARE_ARRAY(T)                                                                         \
  extern template class ShardedArray<T>;                                                               \
  extern template ShardedArray<T> device_put<T>(const Tensor<T>&, const NamedSharding&, shard::source_location); \
  extern template ShardedArray<T> from_callback<T>(const Shape&, const NamedSharding&,                 \
                                                   const std::function<Tensor<T>(const Box&)>&);       \
  extern template ShardedArray<T> generate<T>(const Shape&, const NamedSharding&,                      \
                                              const std::function<Tensor<T>(const Box&)>&);            \
  extern template ShardedArray<T> zeros<T>(const Shape&, const NamedSharding&);                        \
  extern template ShardedArray<T> full<T>(const Shape&, T, const NamedSharding&);                      \
  extern template ShardedArray<T> arange<T>(const Shape&, const NamedSharding&);
SHARD_FOR_EACH_DTYPE(SHARD_DECLARE_ARRAY)
#undef SHARD_DECLARE_ARRAY

}  // namespace shard
