#pragma once
/// \file numpy's basic indexing and reduction dims as small value types (core layer, no MPI).
///
///   x[3]                  Index(3): drops the dim (negative counts from the end)
///   x[2:8], x[::2]        Slice(2, 8), Slice(None, None, 2)
///   x[1, 2:5]             {1, Slice(2, 5)}: one entry per leading dim, the rest stay whole
///   x.sum(axis=(0, 2))    Dims{0, 2};  axis=None (every dim) is Dims() or {}

#include <cstdint>
#include <initializer_list>
#include <string>
#include <variant>
#include <vector>

#include "shard/core/box.hpp"
#include "shard/core/none.hpp"

namespace shard {

/// A bound of a Slice: an index, or None (the end in the slice's direction).
class SliceBound {
 public:
  SliceBound(NoneType = None) {}  // NOLINT: None converts, as in Python
  template <typename I>
    requires std::is_integral_v<I>
  SliceBound(I v) : set_(true), value_(static_cast<std::int64_t>(v)) {}  // NOLINT
  bool is_none() const { return !set_; }
  std::int64_t value() const { return value_; }

 private:
  bool set_ = false;
  std::int64_t value_ = 0;
};

/// Python's slice(start, stop, step) with numpy's rules: negative bounds count from the end,
/// out-of-range bounds clamp, step may be negative but not zero.
struct Slice {
  SliceBound start, stop;
  std::int64_t step = 1;
  Slice() = default;
  Slice(SliceBound start_, SliceBound stop_, std::int64_t step_ = 1) : start(start_), stop(stop_), step(step_) {}
};

/// One entry of an index: an integer (the dim is dropped) or a Slice (the dim is kept).
using Index = std::variant<std::int64_t, Slice>;

/// The part of a dim of size n that a slice selects: `count` elements from `start` by `step`.
struct SliceRange {
  std::int64_t start = 0, count = 0, step = 1;
};
/// numpy's resolution of a slice against a dim of size n (ValueError for step 0).
SliceRange resolve_slice(const Slice& s, std::int64_t n);
/// The element an integer index names in a dim of size n; ShapeError (naming `dim` and the
/// shape) when it is out of range.
std::int64_t resolve_index(std::int64_t i, std::int64_t n, int dim, const Shape& shape);

/// A resolved index over a whole shape: for each dim its range, and whether it is dropped.
struct IndexPlan {
  std::vector<SliceRange> ranges;
  std::vector<bool> dropped;
  Shape out_shape;  ///< the result's shape (dropped dims removed)
  /// True when every step is 1 (the selection is one box).
  bool is_box() const;
  Box box() const;
};
/// ShapeError when the index has more entries than the shape has dims.
IndexPlan plan_index(const Shape& shape, const std::vector<Index>& index);

/// The dims a reduction runs over. Default (or an empty list): every dim, as numpy's axis=None.
class Dims {
 public:
  Dims() = default;
  Dims(int dim) : dims_{dim} {}  // NOLINT: sum(x, 0)
  Dims(std::initializer_list<int> dims) : dims_(dims) {}
  Dims(std::vector<int> dims) : dims_(std::move(dims)) {}  // NOLINT
  bool is_all() const { return dims_.empty(); }
  const std::vector<int>& list() const { return dims_; }
  /// Sorted, non-negative dims of an array of `rank` (every dim when is_all()); ShapeError
  /// naming `what` for a dim out of range or listed twice.
  std::vector<int> resolve(int rank, const char* what) const;

 private:
  std::vector<int> dims_;
};

/// A dim argument with numpy's negative counting resolved; ShapeError naming `what` otherwise.
int resolve_dim(int dim, int rank, const char* what);

}  // namespace shard
