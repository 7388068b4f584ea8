#pragma once
// train_mlp's checkpoints: every parameter and optimizer state as a .npy file written with
// one collective MPI-IO write (shard/io/checkpoint.hpp), plus the step, seed, layers and optimizer
// in the manifest, so a run resumes on any mesh and rank count at the exact step.

#include <cstdint>
#include <string>

#include "model.hpp"

namespace train {

/// Collective: writes checkpoint `step` into `dir`, keeping the newest `keep`.
void save(const std::string& dir, int keep, const Model& m, const Hyper& h, std::int64_t step, std::int64_t seed,
          const std::string& layers);

/// Collective: loads the newest checkpoint of `dir` into `m` (already initialised for this
/// mesh; each rank reads only its own boxes) and returns its step. A checkpoint of another
/// model (layers, optimizer, seed) is a ValueError on every rank.
std::int64_t resume(const std::string& dir, Model& m, const Hyper& h, std::int64_t seed,
                    const std::string& layers);

}  // namespace train
