// train_mlp's layer plan, shardings, parameter initialisation and the names and layouts of the
// parameters and optimizer state (saved in checkpoints); the step is in model_autodiff.cpp.

#include "model.hpp"

#include <cmath>

namespace train {

std::vector<Layer> plan_layers(const std::vector<std::int64_t>& sizes, int model) {
  if (sizes.size() < 2) shard::raise<shard::ValueError>("--layers needs at least an input and an output size");
  for (auto s : sizes)
    if (s < 1) shard::raise<shard::ValueError>("--layers sizes must be >= 1, got ", s);
  std::vector<Layer> layers;
  const std::size_t n = sizes.size() - 1;
  for (std::size_t i = 0; i < n; ++i) {
    Kind k = Kind::kReplicated;
    if (i % 2 == 0 && i + 1 < n) k = Kind::kColumn;
    if (i % 2 == 1) k = Kind::kRow;
    if (k == Kind::kColumn && sizes[i + 1] % model != 0)
      shard::raise<shard::ValueError>("hidden size ", sizes[i + 1], " of layer ", i + 1,
                                      " is not divisible by model=", model,
                                      " (column-parallel layers split their outputs over 'model')");
    layers.push_back(Layer{sizes[i], sizes[i + 1], k});
  }
  return layers;
}

shard::PartitionSpec weight_spec(Kind k) {
  if (k == Kind::kColumn) return shard::P(shard::None, "model");
  if (k == Kind::kRow) return shard::P("model", shard::None);
  return shard::P();
}

shard::PartitionSpec bias_spec(Kind k) { return k == Kind::kColumn ? shard::P("model") : shard::P(); }

std::vector<std::string> Model::param_names() const {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    out.push_back("W" + std::to_string(i));
    out.push_back("b" + std::to_string(i));
  }
  return out;
}

std::vector<std::string> Model::state_names(const Hyper& h) const {
  std::vector<std::string> out;
  for (const char* prefix : h.optimizer == "adam" ? std::vector<const char*>{"adam_m_", "adam_v_"}
                                                  : std::vector<const char*>{"momentum_"})
    for (const auto& p : param_names()) out.push_back(prefix + p);
  return out;
}

std::vector<shard::PartitionSpec> Model::param_specs() const {
  std::vector<shard::PartitionSpec> out;
  for (const auto& l : layers) {
    out.push_back(weight_spec(l.kind));
    out.push_back(bias_spec(l.kind));
  }
  if (!fsdp || data <= 1) return out;
  const auto shapes = param_shapes();
  for (std::size_t p = 0; p < out.size(); ++p) {
    std::vector<shard::SpecEntry> e = out[p].entries();
    e.resize(shapes[p].size());
    for (std::size_t d = 0; d < e.size(); ++d)
      if (e[d].is_none() && shapes[p][d] % data == 0) {
        e[d] = shard::SpecEntry("data");
        break;
      }
    out[p] = shard::PartitionSpec(e);
  }
  return out;
}

bool Model::state_split(std::size_t p) const {
  if (!shard_state || fsdp || data <= 1) return false;
  const Layer& l = layers[p / 2];
  const bool weight = p % 2 == 0;
  // Rows of this device's block: a weight's n_in (split over 'model' when row-parallel), a
  // bias's n_out (split over 'model' when column-parallel).
  const std::int64_t rows = weight ? (l.kind == Kind::kRow ? l.n_in / model : l.n_in)
                                   : (l.kind == Kind::kColumn ? l.n_out / model : l.n_out);
  return rows % data == 0;
}

std::vector<shard::PartitionSpec> Model::state_specs(const Hyper& h) const {
  std::vector<shard::PartitionSpec> one = param_specs();
  for (std::size_t p = 0; p < one.size(); ++p) {
    if (!state_split(p)) continue;
    std::vector<shard::SpecEntry> e = one[p].entries();
    if (e.empty()) e.emplace_back();
    std::vector<std::string> axes = e[0].axes();
    axes.push_back("data");
    e[0] = shard::SpecEntry(axes);
    one[p] = shard::PartitionSpec(e);
  }
  std::vector<shard::PartitionSpec> out = one;
  if (h.optimizer == "adam") out.insert(out.end(), one.begin(), one.end());
  return out;
}

std::vector<shard::Shape> Model::param_shapes() const {
  std::vector<shard::Shape> out;
  for (const auto& l : layers) {
    out.push_back({l.n_in, l.n_out});
    out.push_back({l.n_out});
  }
  return out;
}

Model init_model(const std::vector<Layer>& layers, const shard::Mesh& mesh, shard::random::Key key,
                 const Hyper& h, bool shard_state, bool fsdp) {
  Model m;
  m.layers = layers;
  m.shard_state = shard_state && !fsdp;
  m.fsdp = fsdp;
  m.data = mesh.axis_size("data");
  m.model = mesh.axis_size("model");
  const auto keys = shard::random::split(key, static_cast<int>(layers.size()));
  const auto specs_at_rest = m.param_specs();
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const Layer& l = layers[i];
    const auto kk = shard::random::split(keys[i], 2);
    auto w = shard::random::normal<float>(kk[0], {l.n_in, l.n_out},
                                          shard::NamedSharding(mesh, specs_at_rest[2 * i]));
    const float scale = static_cast<float>(h.classify ? std::sqrt(2.0 / static_cast<double>(l.n_in))
                                                      : 1.0 / std::sqrt(static_cast<double>(l.n_in)));
    for (auto& s : w.addressable_shards())
      for (auto& v : s.data) v *= scale;
    const shard::NamedSharding bs(mesh, specs_at_rest[2 * i + 1]);
    m.params.push_back(std::move(w));
    m.params.push_back(h.classify ? shard::zeros<float>({l.n_out}, bs) : shard::random::normal<float>(kk[1], {l.n_out}, bs));
  }
  const auto specs = m.state_specs(h);
  const auto shapes = m.param_shapes();
  for (std::size_t i = 0; i < specs.size(); ++i)
    m.state.push_back(shard::zeros<float>(shapes[i % shapes.size()], shard::NamedSharding(mesh, specs[i])));
  return m;
}

}  // namespace train
