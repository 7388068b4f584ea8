#pragma once
/// \file The state of a checkpointed function's two runs (internals of autodiff/remat.hpp; the op
/// driver, array/driver.hpp, consults it).
///
/// shard::checkpoint runs f once forward, keeping only the outputs of the primitives its policy
/// saves, and once more in the backward pass (the replay), on a tape of its own. The driver sees
/// each primitive f binds itself (depth 0: not the ops a kernel or a VJP binds inside it): on the
/// forward run it keeps the saved ones' outputs in order; on the replay it hands them back in the
/// same order instead of computing them again, and records their VJPs as usual. A replay that
/// binds other primitives than the forward did (f is not a function of its arguments alone) is an
/// error, never a silent mix of values.

#include <any>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shard::detail {

struct RematState {
  /// Whether a primitive's output is kept (the policy; null: nothing is kept).
  std::function<bool(std::string_view)> saveable;
  bool replay = false;
  struct Saved {
    const char* op;
    std::any value;  ///< an alias of the output (Tensor<T> or ShardedArray<T>)
  };
  std::vector<Saved> saved;
  std::size_t next = 0;  ///< the replay's position in `saved`
  int depth = 0;         ///< binds in progress inside f (only depth 0 is f's own)
  /// Appended to the identity of equations a jit trace records during the replay, so jit's
  /// common-subexpression pass never merges the recomputation into the forward's values.
  std::string salt;

  bool saves(const char* op) const { return saveable && saveable(op); }

  /// The replay's next kept output, which the forward run saved for primitive `op`, as an X.
  template <typename X>
  X take(const char* op) {
    if (next >= saved.size() || std::strcmp(saved[next].op, op) != 0) raise_mismatch(op);
    const X* x = std::any_cast<X>(&saved[next].value);
    if (!x) raise_mismatch(op);
    ++next;
    return x->alias();
  }
  /// ValueError: the replay bound `op` where the forward run had bound another primitive.
  [[noreturn]] void raise_mismatch(const char* op) const;
};

/// The checkpointed function running on this thread (null outside one).
inline thread_local RematState* t_remat = nullptr;

/// Makes `state` this thread's for the scope (restores the previous one: checkpoints nest).
class RematScope {
 public:
  explicit RematScope(RematState* state) : saved_(t_remat) { t_remat = state; }
  ~RematScope() { t_remat = saved_; }
  RematScope(const RematScope&) = delete;
  RematScope& operator=(const RematScope&) = delete;

 private:
  RematState* saved_;
};

/// One bind inside f for the scope (nothing when `s` is null).
class RematDepth {
 public:
  explicit RematDepth(RematState* s) : s_(s) {
    if (s_) ++s_->depth;
  }
  ~RematDepth() {
    if (s_) --s_->depth;
  }
  RematDepth(const RematDepth&) = delete;
  RematDepth& operator=(const RematDepth&) = delete;

 private:
  RematState* s_;
};

}  // namespace shard::detail
