#include "train_checkpoint.hpp"

#include <cmath>

#include "shard/io/checkpoint.hpp"
#include "shard/train/optim.hpp"

namespace train {

void save(const std::string& dir, int keep, const Model& m, const Hyper& h, std::int64_t step, std::int64_t seed,
          const std::string& layers) {
  // Never replace a good checkpoint with a diverged model (a NaN gradient whose loss was
  // still finite): one psum of the parameters' squared norms.
  const double norm = shard::optim::global_norm(m.params);
  if (!std::isfinite(norm))
    shard::raise<shard::ValueError>("training diverged: the parameters hold NaN or infinite values at step ", step,
                                    "; no checkpoint written, the ones in ", dir,
                                    " are kept (lower --lr, or --on-nan skip to skip such steps)");
  shard::CheckpointWriter w(dir, keep);
  const auto pn = m.param_names(), sn = m.state_names(h);
  for (std::size_t i = 0; i < m.params.size(); ++i) w.add(pn[i], m.params[i]);
  for (std::size_t i = 0; i < m.state.size(); ++i) w.add(sn[i], m.state[i]);
  w.set("layers", layers);
  w.set("optimizer", h.optimizer);
  w.set("optimizer_step", std::to_string(m.step));
  w.set("seed", std::to_string(seed));
  w.commit(step);
}

std::int64_t resume(const std::string& dir, Model& m, const Hyper& h, std::int64_t seed,
                    const std::string& layers) {
  const std::string path = shard::latest_checkpoint(dir);
  if (path.empty()) shard::raise<shard::IoError>("--resume: no checkpoint in ", dir);
  const shard::CheckpointManifest man = shard::read_manifest(path);
  auto meta = [&](const std::string& key) {
    const auto it = man.metadata.find(key);
    if (it == man.metadata.end()) shard::raise<shard::ValueError>("--resume: ", path, " has no '", key, "' entry");
    return it->second;
  };
  if (meta("layers") != layers)
    shard::raise<shard::ValueError>("--resume: ", path, " holds a model with layers ", meta("layers"),
                                    ", this run has --layers ", layers);
  if (meta("optimizer") != h.optimizer)
    shard::raise<shard::ValueError>("--resume: ", path, " was trained with ", meta("optimizer"), ", this run uses ",
                                    h.optimizer);
  if (meta("seed") != std::to_string(seed))
    shard::raise<shard::ValueError>("--resume: ", path, " was trained with --seed ", meta("seed"), ", this run has ",
                                    seed, " (the seed fixes the shuffling order)");
  const auto pn = m.param_names(), sn = m.state_names(h);
  auto load = [&](const std::string& name, shard::ShardedArray<float>& into) {
    into = shard::load_checkpoint_array<float>(path, man, name, into.sharding());
  };
  for (std::size_t i = 0; i < m.params.size(); ++i) load(pn[i], m.params[i]);
  for (std::size_t i = 0; i < m.state.size(); ++i) load(sn[i], m.state[i]);
  meta("optimizer_step");  // present
  m.step = man.integer("optimizer_step");
  if (m.step < 0) shard::raise<shard::ValueError>("--resume: ", path, " has a negative optimizer_step ", m.step);
  return man.step;
}

}  // namespace train
