// The autodiff tape (autodiff.hpp, detail/tape.hpp): ids, the backward pass.

#include <atomic>

#include "shard/autodiff/autodiff.hpp"
#include "shard/error.hpp"

namespace shard::detail {

namespace {
std::atomic<std::uint64_t> g_next_tape{1};
}  // namespace

Tape::Tape(bool device_view, std::uint64_t parent)
    : id_(g_next_tape.fetch_add(1, std::memory_order_relaxed)), parent_(parent), device_view_(device_view) {}

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

}  // namespace shard::detail
