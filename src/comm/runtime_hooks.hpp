#pragma once
// The comm layer's part in the Runtime's start and end (comm layer internals; runtime_hooks.cpp).

namespace shard::detail {

/// Registers the comm layer's Runtime hooks (shard/runtime/detail/layer_hooks.hpp); called by
/// install_layer_hooks (src/shard.cpp) when a Runtime starts.
void register_comm_runtime_hooks();

}  // namespace shard::detail
