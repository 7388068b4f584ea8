#pragma once
/// \file Tensor<T>: a dense, row-major, owning N-D block in this process's memory (or, made
/// with Tensor::borrow, a view of memory owned elsewhere), of one of the Dtypes (bool, int32,
/// int64, float32, float64). The numpy-style operations on it are in tensor_ops.hpp.
/// Value semantics (copies are deep, moves are cheap). Storage comes from operator new
/// (16-byte aligned; buffers of 16 KiB or more start on a 64-byte cache line and are kept for
/// reuse, see tensor.cpp) and is left uninitialised unless a fill value is given. Local only:
/// nothing here communicates.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <new>
#include <utility>
#include <source_location>
#include <vector>

#include "shard/error.hpp"  // shard::source_location
#include "shard/core/array_methods.hpp"
#include "shard/core/box.hpp"
#include "shard/core/detail/ad_value.hpp"
#include "shard/core/detail/batch.hpp"
#include "shard/core/detail/tape.hpp"
#include "shard/core/dtype.hpp"
#include "shard/core/index.hpp"

namespace shard {

/// Bytes held by all live Tensor buffers of this process, and the peak since the last reset.
struct TensorMemoryStats {
  std::int64_t live_bytes;
  std::int64_t peak_bytes;
  /// Buffers taken from the system allocator since the process started (not reused from the
  /// freed-buffer cache or a jit program's buffer pool).
  std::int64_t system_allocations = 0;
};
TensorMemoryStats tensor_memory_stats();
/// Sets the peak to the current live bytes.
void reset_tensor_memory_peak();
/// Frees the buffers kept for reuse (see RuntimeOptions::keep_freed_memory).
void release_cached_tensor_memory();

namespace detail {
/// Storage for a tensor: AllocationError naming `shape`, `dtype` and the bytes when it fails.
void* tensor_alloc(std::size_t bytes, const Shape& shape, const char* dtype);
/// A buffer owned jointly by the tensors that alias it (Tensor::alias); freed with the last.
struct SharedBuffer {
  void* data;
  std::size_t bytes;
  SharedBuffer(void* d, std::size_t b) : data(d), bytes(b) {}
  ~SharedBuffer();
  SharedBuffer(const SharedBuffer&) = delete;
  SharedBuffer& operator=(const SharedBuffer&) = delete;
};
void tensor_free(void* p, std::size_t bytes) noexcept;
[[noreturn]] void tensor_shape_error(const Shape& expected, const Shape& got, const char* what);
[[noreturn]] void tensor_index_error(const Shape& shape, std::size_t rank);
}  // namespace detail

template <typename T>
class Tensor;
template <Dtype T>
Tensor<T> reshape(const Tensor<T>& x, Shape shape, shard::source_location where = shard::source_location::current());

/// jax.Array's methods (x.sum(), x.mean(1), x.max(), x.min(), x.reshape({2, -1}), x.transpose())
/// come from detail::ArrayMethods (array_methods.hpp), shared with ShardedArray.
template <typename T>
class Tensor : public detail::ArrayMethods<Tensor, T> {
  static_assert(Dtype<T>, "Tensor<T>: T must be bool, int32_t, int64_t, float or double");

 public:
  using value_type = T;

  /// An empty 1-D tensor of shape (0,).
  Tensor() : shape_{0} {}
  /// Uninitialised storage of the given shape (a 0-d shape holds one element). ValueError for
  /// a negative dim or a size past int64; AllocationError when the memory is not there.
  explicit Tensor(Shape shape) : shape_(std::move(shape)) { allocate(); }
  /// Every element set to `value`.
  Tensor(Shape shape, T value) : Tensor(std::move(shape)) { std::fill(begin(), end(), value); }
  /// The given row-major values; their count must match the shape.
  Tensor(Shape shape, const std::vector<T>& values) : Tensor(std::move(shape)) {
    if (static_cast<std::int64_t>(values.size()) != size_)
      detail::tensor_shape_error(shape_, Shape{static_cast<std::int64_t>(values.size())}, "Tensor(shape, values)");
    std::copy(values.begin(), values.end(), begin());
  }

  /// A tensor over memory it does not own, e.g. a group-shared buffer (group_shared.hpp) that
  /// several processes update in place: nothing is copied, the destructor frees nothing, a
  /// move keeps the borrow, and a copy is an ordinary owning deep copy. The memory must hold
  /// num_elements(shape) elements and outlive the tensor and whatever it is moved into.
  static Tensor borrow(T* data, Shape shape) {
    Tensor t;
    t.shape_ = std::move(shape);
    t.size_ = checked_num_elements(t.shape_, sizeof(T), "Tensor::borrow");
    t.data_ = t.size_ ? data : nullptr;
    t.owned_ = false;
    return t;
  }
  /// False for a borrow() (an alias() owns its memory jointly).
  bool owns_memory() const { return owned_ || shared_ != nullptr; }

  /// Another tensor over the same memory that keeps it alive (the two share the storage from
  /// now on; copies stay deep). What autodiff keeps as residuals instead of copies. Local.
  Tensor alias() const {
    Tensor t;
    t.shape_ = shape_;
    t.size_ = size_;
    t.data_ = data_;
    t.ad_ = ad_;
    t.batch_ = batch_;
    if (!data_) return t;
    if (!owned_ && !shared_) {  // a borrow stays a borrow: the caller keeps that memory alive
      t.owned_ = false;
      return t;
    }
    if (!shared_) shared_ = std::make_shared<detail::SharedBuffer>(data_, bytes());
    t.shared_ = shared_;
    t.owned_ = false;
    return t;
  }

  Tensor(const Tensor& other) : shape_(other.shape_), ad_(other.ad_), batch_(other.batch_) {
    if (batch_) {  // a batched value (vmap) holds no elements: its record is shared
      size_ = other.size_;
      return;
    }
    allocate();
    if (size_) std::memcpy(data_, other.data_, bytes());
  }
  Tensor(Tensor&& other) noexcept
      : shape_(std::move(other.shape_)),
        size_(std::exchange(other.size_, 0)),
        data_(std::exchange(other.data_, nullptr)),
        owned_(std::exchange(other.owned_, true)),
        shared_(std::move(other.shared_)),
        ad_(std::move(other.ad_)),
        batch_(std::move(other.batch_)) {
    other.shape_ = Shape{0};
  }
  Tensor& operator=(const Tensor& other) {
    if (this != &other) *this = Tensor(other);
    return *this;
  }
  Tensor& operator=(Tensor&& other) noexcept {
    if (this != &other) {
      release();
      shape_ = std::exchange(other.shape_, Shape{0});
      size_ = std::exchange(other.size_, 0);
      data_ = std::exchange(other.data_, nullptr);
      owned_ = std::exchange(other.owned_, true);
      shared_ = std::move(other.shared_);
      ad_ = std::move(other.ad_);
      batch_ = std::move(other.batch_);
    }
    return *this;
  }
  ~Tensor() { release(); }

  /// Autodiff's record of this tensor (null unless a tape tracks it; autodiff.hpp).
  const std::shared_ptr<detail::AdValue>& ad() const { return ad_; }
  void set_ad(std::shared_ptr<detail::AdValue> ad) { ad_ = std::move(ad); }
  /// vmap's record of this tensor (null unless it is a batched value inside vmap:
  /// core/detail/batch.hpp). A batched value reports its per-example shape and has no elements.
  const std::shared_ptr<const detail::BatchBase>& batch() const { return batch_; }
  /// A batched value of per-example shape `shape` (vmap's internals: core/detail/batch.hpp).
  static Tensor batched_value(Shape shape, std::shared_ptr<const detail::BatchBase> record) {
    Tensor t;
    t.shape_ = std::move(shape);
    t.size_ = num_elements(t.shape_);
    t.batch_ = std::move(record);
    return t;
  }

  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int ndim() const { return rank(); }
  /// "float32", ... (numpy's name of T).
  static constexpr const char* dtype() { return dtype_name<T>(); }
  std::int64_t size() const { return size_; }
  std::size_t bytes() const { return static_cast<std::size_t>(size_) * sizeof(T); }
  bool empty() const { return size_ == 0; }

  /// The elements (row-major). ValueError for a batched value inside vmap (it has none).
  T* data() {
    check_elements("data()");
    return data_;
  }
  const T* data() const {
    check_elements("data()");
    return data_;
  }
  T* begin() { return data(); }
  T* end() { return data() + size_; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size_; }
  /// The element at a flat row-major position (numpy's x.flat[i]; a block's raw access).
  T& flat(std::int64_t i) { return data()[i]; }
  const T& flat(std::int64_t i) const { return data()[i]; }
  /// numpy's x[i]: row i, the first dim dropped (a new tensor, as ShardedArray's x[i]).
  Tensor operator[](std::int64_t i) const;
  /// numpy's basic indexing, x[{1, Slice(2, 5)}]: a new tensor (tensor_ops.hpp's slice()).
  Tensor operator[](std::initializer_list<Index> index) const;
  /// The one element of a size-1 tensor (numpy's item()); ShapeError otherwise.
  T item() const {
    if (size_ != 1) detail::tensor_shape_error(Shape{}, shape_, "Tensor::item (needs exactly one element)");
    return data()[0];
  }

  /// Element at a multi-index (one index per dim; none for 0-d).
  template <typename... I>
  T& operator()(I... idx) {
    return data()[offset_of({static_cast<std::int64_t>(idx)...})];
  }
  template <typename... I>
  const T& operator()(I... idx) const {
    return data()[offset_of({static_cast<std::int64_t>(idx)...})];
  }

  /// The sub-block `box` (coordinates relative to this tensor) as a new tensor.
  Tensor slice(const Box& box) const {
    Tensor out(box.extent);
    copy_box(data(), shape_, Shape(shape_.size(), 0), out.data_, box.extent, box.offset, box, sizeof(T));
    return out;
  }

  /// The same elements with another shape of the same size (moves the storage). While
  /// autodiff records a tensor it tracks, this is reshape() (recorded).
  Tensor reshaped(Shape shape) && {
    if (num_elements(shape) != size_) detail::tensor_shape_error(shape_, shape, "Tensor::reshaped");
    if (batch_ || detail::traced(*this)) return shard::reshape(static_cast<const Tensor&>(*this), std::move(shape));
    Tensor out(std::move(*this));
    out.shape_ = std::move(shape);
    out.ad_.reset();
    return out;
  }
  /// A reshaped copy (inside a differentiated function shard::reshape shares the memory).
  Tensor reshaped(Shape shape) const& {
    if (batch_ || detail::traced(*this)) return shard::reshape(*this, std::move(shape));
    return Tensor(*this).reshaped(std::move(shape));
  }

  /// True when no other tensor shares this storage (no alias, not a borrow): in-place
  /// updates cannot be seen elsewhere.
  bool unique_storage() const { return data_ && (shared_ ? shared_.use_count() == 1 : owned_); }
  /// Before an in-place update: a private copy of the storage if an alias shares it (autodiff
  /// residuals stay intact). Borrows stay borrows (their memory is meant to be updated).
  void detach_if_aliased() {
    if (!shared_ || shared_.use_count() == 1) return;
    Tensor copy(*this);
    copy.ad_ = ad_;
    *this = std::move(copy);
  }

  /// Same shape and bit-identical elements.
  bool operator==(const Tensor& other) const {
    return shape_ == other.shape_ && (size_ == 0 || std::memcmp(data(), other.data(), bytes()) == 0);
  }

 private:
  void check_elements(const char* what) const {
    if (batch_) [[unlikely]]
      detail::raise_batched_access(what, *batch_);
  }
  std::int64_t offset_of(std::initializer_list<std::int64_t> idx) const {
    if (idx.size() != shape_.size()) detail::tensor_index_error(shape_, idx.size());
    std::int64_t off = 0;
    std::size_t d = 0;
    for (auto i : idx) off = off * shape_[d++] + i;
    return off;
  }
  void allocate() {
    size_ = checked_num_elements(shape_, sizeof(T), "Tensor");
    data_ = size_ ? static_cast<T*>(detail::tensor_alloc(bytes(), shape_, dtype())) : nullptr;
  }
  void release() noexcept {
    if (shared_) shared_.reset();  // the last alias frees the buffer
    else if (data_ && owned_) detail::tensor_free(data_, bytes());
    data_ = nullptr;
    size_ = 0;
    owned_ = true;
    batch_.reset();
  }

  Shape shape_;
  std::int64_t size_ = 0;
  T* data_ = nullptr;
  bool owned_ = true;
  mutable std::shared_ptr<detail::SharedBuffer> shared_;  // set once the storage is aliased
  std::shared_ptr<detail::AdValue> ad_;
  std::shared_ptr<const detail::BatchBase> batch_;
};

}  // namespace shard
