// The autodiff tape (autodiff.hpp, detail/tape.hpp): ids, the backward pass.

#include "shard/autodiff/autodiff.hpp"

#include <atomic>

#include "shard/core/detail/remat.hpp"
#include "shard/error.hpp"

namespace shard::detail {

Tape::Tape(bool device_view, std::uint64_t parent)
    : id_(next_transform_id()), parent_(parent), device_view_(device_view) {}

void Tape::backward(bool keep) {
  Pause pause;
  for (auto it = nodes_.rbegin(); it != nodes_.rend(); ++it) {
    (*it)->backward(keep);
    progress_reductions();  // the gradients' sums in flight (grad_reduce.hpp)
  }
}

void Tape::reset() {
  for (auto& n : nodes_) n->reset();
}

void raise_not_differentiable(const char* op, const std::string& why) {
  raise<ValueError>("autodiff: '", op, "' is not differentiable here: ", why);
}

void raise_captured_in_body() {
  raise<ValueError>("autodiff: a shard_map body uses an array that the differentiated function tracks without "
                    "receiving it as an argument; pass it to the shard_map as an argument (with its in_spec) so "
                    "that its gradient can flow back");
}

void RematState::raise_mismatch(const char* op) const {
  const char* expected = next < saved.size() ? saved[next].op : nullptr;
  raise<ValueError>("checkpoint: recomputing the checkpointed function bound '", op,
                    "' where its first run had ", expected ? "bound '" : "no more kept results",
                    expected ? expected : "", expected ? "'" : "",
                    " (the function must compute the same ops from its arguments every time it "
                    "runs: no state of its own, no branch on anything but its arguments' shapes)");
}

void raise_captured(const Tape& tape) {
  if (!tape.remat()) raise_captured_in_body();
  raise<ValueError>(
      "checkpoint: the checkpointed function uses an array of the differentiated function around it (one it "
      "tracks, or in a shard_map body one that varies over mesh axes) without receiving it as an argument; "
      "pass "
      "it to the checkpointed function as an argument (its gradient and the axes it varies over then flow "
      "through the checkpoint)");
}

}  // namespace shard::detail
