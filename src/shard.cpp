// The library's top, as shard.hpp is for the headers: the one file that knows every layer.
// install_layer_hooks registers the Runtime hooks of each layer above the runtime
// (shard/runtime/detail/layer_hooks.hpp; DESIGN.md "Layers": the runtime does not reach up,
// the layers register with it). Runtime::init calls it before anything else, so every
// registration is linked into each program and runs: a static initialiser in a file nothing
// refers to would be left out of the link by the static library.

#include "comm/runtime_hooks.hpp"
#include "shard/runtime/detail/layer_hooks.hpp"

namespace shard::detail {

void install_layer_hooks() {
  register_comm_runtime_hooks();  // the collective check, the watchdog, group-shared memory, single-copy
                                  // reads
}

}  // namespace shard::detail
