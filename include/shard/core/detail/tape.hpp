#pragma once
/// \file The autodiff tape (internals of autodiff.hpp; the design is documented there).
///
/// A Tape records, in order, a node per differentiable primitive op applied to arrays it
/// tracks. A node holds its VJP rule (a closure over the residuals it needs, kept as aliases
/// of the arrays' storage, never copies) and, during the backward pass, the cotangent
/// accumulated from its consumers. The backward pass walks the nodes in reverse order, runs
/// each node's rule on its cotangent and frees the node's residuals as it goes.
///
/// The op driver (array/driver.hpp) starts every primitive with recording_tape_for(operands...),
/// which costs a null-pointer test per operand when nothing is tracked; when a tape records, it
/// runs the kernel with recording paused and appends a node through record_vjp (core/trace.hpp)
/// whose rule, the primitive's VJP, is written with the same ops.
///
/// Device tapes (one per device thread, while a shard_map is differentiated from outside) also
/// track each value's vma: an op's result varies over the union of its operands' axes, and a
/// cotangent contribution that varies over axes its primal does not is summed over them (the
/// transpose of JAX's implicit pvary), once per primal, when the primal's node runs or the
/// leaf is read. Every device runs the same program, so these psums line up across devices.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "shard/core/detail/ad_value.hpp"
#include "shard/core/dtype.hpp"

namespace shard {
template <typename T>
class Tensor;
template <typename T>
class ShardedArray;
class DeviceContext;
}  // namespace shard

namespace shard::detail {

/// A node of the tape: one recorded op (or a leaf: a differentiated input).
struct NodeBase {
  explicit NodeBase(const char* op_) : op(op_) {}
  virtual ~NodeBase() = default;
  NodeBase(const NodeBase&) = delete;
  NodeBase& operator=(const NodeBase&) = delete;
  /// True once a consumer pushed a cotangent here.
  virtual bool has_cotangent() const = 0;
  /// Sums the pending contributions (psums on device tapes), runs the rule, frees the residuals
  /// (keep: leaves them for another backward pass, vjp).
  virtual void backward(bool keep) = 0;
  /// Forgets the cotangent (between two backward passes of one tape).
  virtual void reset() = 0;
  const char* op;
  /// A differentiated input (a parameter, a shard_map argument): its cotangent is what the
  /// caller reads when the pass ends.
  bool leaf = false;
};

class Tape {
 public:
  /// A global tape (ShardedArray and host Tensor ops on the calling thread, and grad inside a
  /// shard_map body: the device's local program), or a device tape (a shard_map body's Tensor
  /// ops on one device thread while the shard_map is differentiated; values carry their vma).
  explicit Tape(bool device_view = false, std::uint64_t parent = 0);
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;

  std::uint64_t id() const { return id_; }
  /// A device tape's outer tape (0 for a global tape).
  std::uint64_t parent() const { return parent_; }
  bool device_view() const { return device_view_; }
  /// The device context psums of a device tape go through (set for each pass).
  DeviceContext* context() const { return context_; }
  void set_context(DeviceContext* c) { context_ = c; }
  /// Bit k of a vma mask is mesh axis k of this tape's body.
  void set_axis_names(std::vector<std::string> names) { axis_names_ = std::move(names); }
  const std::vector<std::string>& axis_names() const { return axis_names_; }
  /// A tape of a checkpointed function's passes (autodiff/remat.hpp): an array of the parent tape
  /// reaching one of its ops was captured by the function instead of passed to it.
  bool remat() const { return remat_; }
  void set_remat() { remat_ = true; }

  void append(std::shared_ptr<NodeBase> node) { nodes_.push_back(std::move(node)); }
  /// Runs the backward pass over every node in reverse order of recording (recording paused).
  void backward(bool keep = false);
  /// Forgets every cotangent (before another backward pass of a kept tape).
  void reset();
  /// Drops every node (and the residuals they hold).
  void clear() { nodes_.clear(); }
  std::size_t size() const { return nodes_.size(); }

 private:
  std::uint64_t id_;
  std::uint64_t parent_;
  bool device_view_;
  bool remat_ = false;
  DeviceContext* context_ = nullptr;
  std::vector<std::string> axis_names_;
  std::vector<std::shared_ptr<NodeBase>> nodes_;
};

/// The thread's recording state.
struct TapeState {
  Tape* tape = nullptr;
  int paused = 0;
};
inline thread_local TapeState t_tape_state;

/// The tape that records now on this thread: null when none or paused.
inline Tape* recording_tape() {
  const TapeState& s = t_tape_state;
  return s.paused ? nullptr : s.tape;
}

/// Makes `tape` the current tape of this thread for the scope (restores the previous one).
class TapeScope {
 public:
  explicit TapeScope(Tape* tape) : saved_(t_tape_state) { t_tape_state = TapeState{tape, 0}; }
  ~TapeScope() { t_tape_state = saved_; }
  TapeScope(const TapeScope&) = delete;
  TapeScope& operator=(const TapeScope&) = delete;

 private:
  TapeState saved_;
};
/// Stops recording on this thread for the scope (kernels inside kernels, backward passes).
class Pause {
 public:
  Pause() { ++t_tape_state.paused; }
  ~Pause() { --t_tape_state.paused; }
  Pause(const Pause&) = delete;
  Pause& operator=(const Pause&) = delete;
};

/// x's AdValue when it belongs to `tape`, else null.
template <typename A>
const AdValue* ad_on(const A& x, const Tape* tape) {
  const auto& a = x.ad();
  return a && a->tape == tape->id() ? a.get() : nullptr;
}

/// ValueError: a shard_map body used an array the differentiated function tracks without
/// receiving it as an argument.
[[noreturn]] void raise_captured_in_body();
/// The same for a checkpointed function (tape.remat()), else raise_captured_in_body.
[[noreturn]] void raise_captured(const Tape& tape);

/// The tape an op on these arrays must record on: null unless a tape records on this thread
/// and one of them belongs to it (the common case, nothing tracked, is one test per operand).
template <typename... A>
Tape* recording_tape_for(const A&... xs) {
  if (!((xs.ad() != nullptr) || ...)) return nullptr;
  Tape* t = recording_tape();
  if (!t) return nullptr;
  // An operand of the outer tape (a shard_map body's, a checkpointed function's) reaching this
  // one's op was captured instead of passed: its gradient could not flow back.
  if (t->parent() && ((xs.ad() && xs.ad()->tape == t->parent()) || ...)) raise_captured(*t);
  if (((ad_on(xs, t) != nullptr) || ...)) return t;
  return nullptr;
}
/// True when a tape records one of xs (recording_tape_for's test, without the tape): a kernel
/// with a fast path for untraced operands asks it (Tensor::reshaped moves the storage, an
/// in-place op writes its operand, gelu's VJP fuses its pass); the recording itself is the op
/// driver's (array/driver.hpp).
template <typename... A>
bool traced(const A&... xs) {
  return recording_tape_for(xs...) != nullptr;
}
/// The same for a list of arrays.
template <typename A>
Tape* recording_tape_for_list(const std::vector<A>& xs) {
  for (const auto& x : xs)
    if (Tape* t = recording_tape_for(x)) return t;
  return nullptr;
}

[[noreturn]] void raise_not_differentiable(const char* op, const std::string& why);

/// The mesh axes x varies over on `tape` (0 when it does not belong to it).
template <typename X>
std::uint32_t vma_of(const X& x, const Tape& tape) {
  const AdValue* a = ad_on(x, &tape);
  return a ? a->vma : 0;
}
/// True when x is differentiable on `tape` (it has a node there, not only a vma).
template <typename X>
bool differentiable_on(const X& x, const Tape& tape) {
  const AdValue* a = ad_on(x, &tape);
  return a && a->node;
}
/// out as a constant of `tape` that varies over the axes `vma`.
template <typename Out>
Out with_vma(const Tape& tape, Out out, std::uint32_t vma) {
  out.set_ad(vma ? std::make_shared<AdValue>(AdValue{tape.id(), vma, nullptr}) : nullptr);
  return out;
}
/// A non-differentiable result (comparisons, argmax, int ops): only the operands' vma.
template <typename Out, typename... In>
Out finish_constant(Tape& tape, Out out, const In&... in) {
  return with_vma(tape, std::move(out), (vma_of(in, tape) | ... | 0u));
}

/// Runs f with recording paused (the kernel itself, or a rule).
template <typename F>
auto paused(F&& f) {
  Pause p;
  return f();
}

/// What a rule keeps of an array: an alias of its memory without autodiff's record (a copy
/// when the array only borrows its memory, which may not outlive the tape).
template <Dtype T>
Tensor<T> keep(const Tensor<T>& x) {
  Tensor<T> out = x.owns_memory() || x.size() == 0 ? x.alias() : Tensor<T>(x);
  out.set_ad(nullptr);
  return out;
}
template <Dtype T>
ShardedArray<T> keep(const ShardedArray<T>& x) {
  ShardedArray<T> out = x.alias();
  if (out.batch()) {  // a batched value (vmap) shares its record
    out.set_ad(nullptr);
    return out;
  }
  for (auto& s : out.addressable_shards())
    if (!s.data.owns_memory() && s.data.size() > 0) s.data = Tensor<T>(s.data);
  out.set_ad(nullptr);
  return out;
}

}  // namespace shard::detail
