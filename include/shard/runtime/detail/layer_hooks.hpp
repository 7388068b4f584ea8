#pragma once
/// \file What the layers above the runtime do when the Runtime starts and ends (runtime
/// internals). DESIGN.md "Layers": the runtime does not reach up into comm; comm registers
/// these hooks with it. Registration runs from install_layer_hooks(), which Runtime::init
/// calls first: it is defined at the library's top (src/shard.cpp), the one file that knows
/// every layer, so no registration depends on a static initialiser that a static library
/// might leave out of the link.

#include <cstdint>
#include <exception>
#include <vector>

#include "shard/mpi/communicator.hpp"

namespace shard::detail {

/// What a layer's start hook is given: the Runtime's communicators and this layer's settings.
struct RuntimeStart {
  const mpi::Communicator& world;  ///< the Runtime's world (Runtime::world())
  const mpi::Communicator& node;   ///< the ranks of this rank's node (MPI_COMM_TYPE_SHARED)
  const std::int64_t* settings;    ///< the layer's setting words, agreed over the world (MPI_MAX)
};

/// One layer's part in the Runtime's life. Any function may be null.
struct RuntimeHooks {
  const char* layer = "";
  /// The layer's environment settings, agreed in the Runtime's one start-up exchange:
  /// read_settings writes this rank's `setting_words` words (local; a bad value raises
  /// shard::Error, and the start-up then fails on every rank); each word's maximum over the
  /// world is what `start` is given.
  int setting_words = 0;
  void (*read_settings)(std::int64_t* words) = nullptr;
  /// The end of the Runtime's start-up (world, devices and hosts known): collective over the
  /// world, in registration order.
  void (*start)(const RuntimeStart& s) = nullptr;
  /// The program ends normally (Runtime's destructor, before the device threads stop):
  /// collective over the world. False when the process must exit 1 (this rank's error printed).
  bool (*agree_at_end)() = nullptr;
  /// Local: undoes `start` when the Runtime ends or its start-up fails, before the world is
  /// freed; in reverse registration order.
  void (*stop)() = nullptr;
  /// guarded_main: an error ends the program on this rank (its line is printed). Tells the other
  /// ranks and waits for them to fail too; true if every rank did (else the job is aborted).
  bool (*fail_program)(const std::exception_ptr& err) = nullptr;
};

/// Adds a layer's hooks (once per layer; a second registration of the same layer is ignored).
void register_runtime_hooks(const RuntimeHooks& hooks);
/// The registered hooks, in registration order.
const std::vector<RuntimeHooks>& runtime_hooks();

/// Registers the hooks of every layer above the runtime (each layer's own registration
/// function, lower layers first); idempotent. Defined at the library's top (src/shard.cpp).
void install_layer_hooks();

}  // namespace shard::detail
