// The autodiff tape (autodiff.hpp, detail/tape.hpp): ids, the backward pass.

#include <atomic>

#include "shard/autodiff/autodiff.hpp"
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

}  // namespace shard::detail
