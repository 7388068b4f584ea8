#pragma once
/// \file What an array carries inside `vmap` (internals of vmap/vmap.hpp; DESIGN.md "jit and
/// vmap"): a batched value is an array that reports its per-example shape (JAX's BatchTracer,
/// functorch's BatchedTensor) and holds no elements of its own; its record holds the physical
/// array, whose dim `bdim` is the batch, and the vmap level it belongs to. The op driver
/// (array/driver.hpp) sees the record and runs the primitive's batching rule on the physical
/// arrays (ops/batching.hpp); nested vmaps nest records (the physical array of level 2 is itself
/// batched at level 1). Arrays made outside any vmap carry nothing (a null pointer: no cost).
///
/// Levels and autodiff tapes draw their ids from one counter, so the driver knows which
/// transformation is innermost (the one with the larger id handles an op first): vmap(grad(f))
/// records batched values on the tape, grad(vmap(f)) records the physical ops.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shard/core/box.hpp"  // Shape

namespace shard::detail {

/// The next id of a transformation level (a tape or a vmap level); ids grow and are never reused.
std::uint64_t next_transform_id();

/// The record of a batched value (Batched<X> holds the physical array), or of a traced one (jit:
/// array/detail/program.hpp's Traced<X>, with `trace` set and no batch dim): an array with a
/// record holds no elements a user can read.
struct BatchBase {
  BatchBase(std::uint64_t level_, int bdim_, bool trace_ = false)
      : level(level_), bdim(bdim_), trace(trace_) {}
  virtual ~BatchBase() = default;
  BatchBase(const BatchBase&) = delete;
  BatchBase& operator=(const BatchBase&) = delete;
  std::uint64_t level;  ///< the vmap level the batch dim belongs to
  int bdim;             ///< the batch dim of the physical array
  bool trace;           ///< a value traced by jit at `level`, not a batched one
};

template <typename X>
struct Batched final : BatchBase {
  Batched(std::uint64_t level_, int bdim_, X value_) : BatchBase(level_, bdim_), value(std::move(value_)) {}
  X value;  ///< the physical array (may itself be batched at an outer level)
};

/// One active vmap on this thread: its level, the batch size and its axis name ("" for none).
struct BatchFrame {
  std::uint64_t level = 0;
  std::int64_t size = 0;
  std::string axis_name;
  /// Primitives without a batching rule run as a loop over the batch (vmap's loop_fallback
  /// option); off by default: such a primitive raises instead.
  bool loop_fallback = false;
};

/// The thread's active vmaps, innermost last.
inline thread_local std::vector<BatchFrame> t_batch_frames;

/// The frame of `level` (null when that vmap is not active on this thread).
inline const BatchFrame* batch_frame(std::uint64_t level) {
  for (auto it = t_batch_frames.rbegin(); it != t_batch_frames.rend(); ++it)
    if (it->level == level) return &*it;
  return nullptr;
}
/// The innermost active frame whose axis_name is `name` (null when none).
inline const BatchFrame* batch_frame_named(const std::string& name) {
  if (name.empty()) return nullptr;
  for (auto it = t_batch_frames.rbegin(); it != t_batch_frames.rend(); ++it)
    if (it->axis_name == name) return &*it;
  return nullptr;
}

/// The record with the highest level among the operands (null: none has one).
template <typename... A>
const BatchBase* top_record(const A&... xs) {
  const BatchBase* top = nullptr;
  (
      [&] {
        if (const auto& b = xs.batch(); b && (!top || b->level > top->level)) top = b.get();
      }(),
      ...);
  return top;
}

/// x is batched by a vmap (a record that is not jit's).
template <typename X>
bool vmap_batched(const X& x) {
  return x.batch() && !x.batch()->trace;
}

/// The highest batch level among the operands (0: none is batched).
template <typename... A>
std::uint64_t top_batch_level(const A&... xs) {
  std::uint64_t level = 0;
  (
      [&] {
        if (const auto& b = xs.batch(); b && b->level > level) level = b->level;
      }(),
      ...);
  return level;
}

/// The physical array of x at `level` and its batch dim; (x itself, -1) when x is not batched
/// at that level.
template <typename X>
const X& physical_at(const X& x, std::uint64_t level, int& bdim) {
  const auto& b = x.batch();
  if (b && b->level == level) {
    bdim = b->bdim;
    return static_cast<const Batched<X>&>(*b).value;
  }
  bdim = -1;
  return x;
}

/// ValueError: an element of a batched value was read (inside vmap an array is an abstract
/// per-example value; its elements exist only batched), or of a traced one (inside jit).
[[noreturn]] void raise_batched_access(const char* what, const BatchBase& record);

}  // namespace shard::detail

namespace shard {

/// An operand of a batching rule: the physical array and its batch dim (-1: not batched).
template <typename X>
struct BatchArg {
  const X& x;
  int bdim;
  bool batched() const { return bdim >= 0; }
  /// The rank of one example.
  int rank() const { return x.ndim() - (bdim >= 0 ? 1 : 0); }
  /// The shape of one example.
  Shape shape() const {
    Shape s = x.shape();
    if (bdim >= 0) s.erase(s.begin() + bdim);
    return s;
  }
};

/// What a batching rule returns: the physical result and its batch dim (-1: not batched).
template <typename X>
struct BatchOut {
  X value;
  int bdim = 0;
};

}  // namespace shard
