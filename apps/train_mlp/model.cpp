// The per-device bodies of train_mlp's step and evaluation (run by shard::shard_map once per
// logical device), with OpenBLAS sgemm for every product. Shapes of one device's blocks, with
// Bl = B / data and M = the 'model' axis size:
//   column-parallel  in [Bl, n_in]    W [n_in, n_out/M]   out [Bl, n_out/M]
//   row-parallel     in [Bl, n_in/M]  W [n_in/M, n_out]   out = psum_model(in @ W) [Bl, n_out]
//   replicated       in [Bl, n_in]    W [n_in, n_out]     out [Bl, n_out]
// Backward mirrors it: a column-parallel layer's input gradient is a partial sum over 'model'
// (one psum), a row-parallel layer's is already split like its input.

#include "model.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>

namespace train {

namespace {

using shard::Tensor;

/// c[m, n] = op(A) @ op(B) with row-major operands; ta/tb transpose A [k, m] / B [n, k].
void gemm_into(const Tensor<float>& a, bool ta, const Tensor<float>& b, bool tb, float* c) {
  const std::int64_t m = ta ? a.shape()[1] : a.shape()[0], k = ta ? a.shape()[0] : a.shape()[1];
  const std::int64_t n = tb ? b.shape()[0] : b.shape()[1];
  if (m == 0 || n == 0) return;
  if (k == 0) {
    std::fill(c, c + m * n, 0.0f);
    return;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), 1.0f, a.data(), static_cast<int>(a.shape()[1]), b.data(),
              static_cast<int>(b.shape()[1]), 0.0f, c, static_cast<int>(n));
}

Tensor<float> gemm(const Tensor<float>& a, bool ta, const Tensor<float>& b, bool tb) {
  Tensor<float> c({ta ? a.shape()[1] : a.shape()[0], tb ? b.shape()[0] : b.shape()[1]});
  gemm_into(a, ta, b, tb, c.data());
  return c;
}

void add_bias(Tensor<float>& z, const Tensor<float>& b) {
  const std::int64_t n = z.shape()[1];
  const float* __restrict bias = b.data();
  for (std::int64_t r = 0; r < z.shape()[0]; ++r) {
    float* __restrict row = z.data() + r * n;
    for (std::int64_t j = 0; j < n; ++j) row[j] += bias[j];
  }
}

Tensor<float> relu(const Tensor<float>& z) {
  Tensor<float> h(z.shape());
  const float* __restrict in = z.data();
  float* __restrict out = h.data();
  for (std::int64_t i = 0; i < z.size(); ++i) out[i] = in[i] > 0.0f ? in[i] : 0.0f;
  return h;
}

/// The forward pass of one device: the input of every layer and the last pre-activation.
struct Forward {
  std::vector<Tensor<float>> inputs;  // inputs[i] feeds layer i (inputs[0] = x)
  std::vector<Tensor<float>> pre;     // pre-activations z_i
};

Forward forward(shard::DeviceContext& ctx, const std::vector<Layer>& layers, const Tensor<float>& x,
                const std::vector<const Tensor<float>*>& params) {
  Forward f;
  f.inputs.push_back(x);
  for (std::size_t i = 0; i < layers.size(); ++i) {
    Tensor<float> z = gemm(f.inputs.back(), false, *params[2 * i], false);
    if (layers[i].kind == Kind::kRow) z = ctx.psum(std::move(z), "model");
    add_bias(z, *params[2 * i + 1]);
    if (i + 1 < layers.size()) f.inputs.push_back(relu(z));
    f.pre.push_back(std::move(z));
  }
  return f;
}

/// Loss of each valid row summed, correct predictions, valid rows; `dz` (when given) gets
/// d(sum loss / total)/d(output).
struct LossStats {
  double loss = 0, correct = 0, count = 0;
};

LossStats loss_and_grad(const Tensor<float>& out, const Tensor<float>& y, bool classify, double total,
                        Tensor<float>* dz) {
  LossStats s;
  const std::int64_t rows = out.shape()[0], n = out.shape()[1];
  if (dz) *dz = Tensor<float>(out.shape(), 0.0f);
  const float scale = static_cast<float>(1.0 / total);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* z = out.data() + r * n;
    if (classify) {
      const int label = static_cast<int>(y[r]);
      if (label < 0) continue;  // padding
      const float mx = *std::max_element(z, z + n);
      double sum = 0;
      for (std::int64_t j = 0; j < n; ++j) sum += std::exp(static_cast<double>(z[j] - mx));
      s.loss += std::log(sum) + mx - z[label];
      s.correct += (std::max_element(z, z + n) - z) == label ? 1 : 0;
      s.count += 1;
      if (dz)
        for (std::int64_t j = 0; j < n; ++j)
          (*dz)[r * n + j] = (static_cast<float>(std::exp(static_cast<double>(z[j] - mx)) / sum) - (j == label)) * scale;
    } else {
      for (std::int64_t j = 0; j < n; ++j) {
        const float d = z[j] - y[r * n + j];
        s.loss += static_cast<double>(d) * d;
        if (dz) (*dz)[r * n + j] = 2.0f * d * scale;
      }
      s.count += 1;
    }
  }
  return s;
}

/// Adam (AdamW weight decay) on n elements: new w, m, v from old ones and the gradient g;
/// ic1, ic2 = 1 / (1 - beta^t). Plain loops over restrict pointers, so they vectorize.
void adam_update(std::int64_t n, const float* __restrict w, const float* __restrict g, const float* __restrict m0,
                 const float* __restrict v0, float* __restrict wn, float* __restrict m1, float* __restrict v1,
                 const Hyper& h, float ic1, float ic2) {
  const float b1 = h.beta1, b2 = h.beta2, lr = h.lr, eps = h.eps, wd = h.weight_decay;
  for (std::int64_t k = 0; k < n; ++k) {
    const float mk = b1 * m0[k] + (1.0f - b1) * g[k];
    const float vk = b2 * v0[k] + (1.0f - b2) * g[k] * g[k];
    m1[k] = mk;
    v1[k] = vk;
    wn[k] = w[k] - lr * ((mk * ic1) / (std::sqrt(vk * ic2) + eps) + wd * w[k]);
  }
}

/// SGD with momentum (L2 weight decay added to the gradient).
void sgd_update(std::int64_t n, const float* __restrict w, const float* __restrict g, const float* __restrict v0,
                float* __restrict wn, float* __restrict v1, const Hyper& h) {
  const float mu = h.momentum, lr = h.lr, wd = h.weight_decay;
  for (std::int64_t k = 0; k < n; ++k) {
    const float vk = mu * v0[k] + g[k] + wd * w[k];
    v1[k] = vk;
    wn[k] = w[k] - lr * vk;
  }
}

std::vector<const Tensor<float>*> slice(const shard::Blocks<float>& b, std::size_t from, std::size_t count) {
  std::vector<const Tensor<float>*> out;
  for (std::size_t i = 0; i < count; ++i) out.push_back(&b[from + i]);
  return out;
}

}  // namespace

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
  return out;
}

bool Model::state_split(std::size_t p) const {
  if (!shard_state || data <= 1) return false;
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

Model init_model(const std::vector<Layer>& layers, const shard::Mesh& mesh, shard::random::Key key, const Hyper& h,
                 bool shard_state) {
  Model m;
  m.layers = layers;
  m.shard_state = shard_state;
  m.data = mesh.axis_size("data");
  m.model = mesh.axis_size("model");
  const auto keys = shard::random::split(key, static_cast<int>(layers.size()));
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const Layer& l = layers[i];
    const auto kk = shard::random::split(keys[i], 2);
    auto w = shard::random::normal<float>(kk[0], {l.n_in, l.n_out}, shard::NamedSharding(mesh, weight_spec(l.kind)));
    const float scale = static_cast<float>(h.classify ? std::sqrt(2.0 / static_cast<double>(l.n_in))
                                                      : 1.0 / std::sqrt(static_cast<double>(l.n_in)));
    for (auto& s : w.addressable_shards())
      for (auto& v : s.data) v *= scale;
    const shard::NamedSharding bs(mesh, bias_spec(l.kind));
    m.params.push_back(std::move(w));
    m.params.push_back(h.classify ? shard::zeros<float>({l.n_out}, bs) : shard::random::normal<float>(kk[1], {l.n_out}, bs));
  }
  const auto specs = m.state_specs(h);
  const auto shapes = m.param_shapes();
  for (std::size_t i = 0; i < specs.size(); ++i)
    m.state.push_back(shard::zeros<float>(shapes[i % shapes.size()], shard::NamedSharding(mesh, specs[i])));
  return m;
}

double train_step(Model& m, const Hyper& h, const shard::ShardedArray<float>& x, const shard::ShardedArray<float>& y) {
  const std::size_t np = m.params.size(), ns = m.state.size();
  const double total = static_cast<double>(x.shape()[0]);
  const std::int64_t t = m.step + 1;
  const float c1 = 1.0f - std::pow(h.beta1, static_cast<float>(t)), c2 = 1.0f - std::pow(h.beta2, static_cast<float>(t));
  const auto& layers = m.layers;

  shard::ShardMapBody<float> body = [&](shard::DeviceContext& ctx, const shard::Blocks<float>& b) {
    const auto params = slice(b, 2, np);
    const Forward f = forward(ctx, layers, b[0], params);
    Tensor<float> dz;
    const LossStats ls = loss_and_grad(f.pre.back(), b[1], h.classify, total, &dz);
    // Backward. Gradients of arrays whose state is split over 'data' are psum_scattered right
    // after their layer (rows of this replica's share); the others, and the loss, go into one
    // flat buffer summed with a single psum over 'data' at the end.
    std::vector<Tensor<float>> grad(np);
    std::vector<std::int64_t> offset(np + 1, 0);
    for (std::size_t p = 0; p < np; ++p) offset[p + 1] = offset[p] + (m.state_split(p) ? 0 : params[p]->size());
    Tensor<float> flat({offset[np] + 1});
    auto reduce = [&](std::size_t p, Tensor<float> g) {
      if (m.state_split(p))
        grad[p] = ctx.psum_scatter(std::move(g), "data", 0, true);
      else
        std::copy(g.data(), g.data() + g.size(), flat.data() + offset[p]);
    };
    for (std::size_t i = layers.size(); i-- > 0;) {
      reduce(2 * i, gemm(f.inputs[i], true, dz, false));
      const std::int64_t rows = dz.shape()[0], n = dz.shape()[1];
      Tensor<float> dbias({n});
      float* __restrict db = dbias.data();
      std::fill(db, db + n, 0.0f);
      for (std::int64_t r = 0; r < rows; ++r) {
        const float* __restrict d = dz.data() + r * n;
        for (std::int64_t j = 0; j < n; ++j) db[j] += d[j];
      }
      reduce(2 * i + 1, std::move(dbias));
      if (i == 0) break;
      Tensor<float> din = gemm(dz, false, *params[2 * i], true);
      if (layers[i].kind == Kind::kColumn) din = ctx.psum(std::move(din), "model");
      const float* __restrict z = f.pre[i - 1].data();
      float* __restrict g = din.data();
      for (std::int64_t k = 0; k < din.size(); ++k) g[k] = z[k] > 0.0f ? g[k] : 0.0f;
      dz = std::move(din);
    }
    flat[offset[np]] = static_cast<float>(ls.loss);
    flat = ctx.psum(std::move(flat), "data");

    // The optimizer, elementwise: one pass reading the old parameter rows, gradient and state
    // and writing the new ones; split arrays then all_gather their new rows over 'data'.
    const int di = ctx.axis_index("data");
    std::vector<Tensor<float>> out;
    for (std::size_t p = 0; p < np; ++p) out.emplace_back(params[p]->shape());
    for (std::size_t s = 0; s < ns; ++s) out.emplace_back(b[2 + np + s].shape());
    for (std::size_t p = 0; p < np; ++p) {
      const bool split = m.state_split(p);
      const std::int64_t size = b[2 + np + p].size();  // this device's share of the parameter
      const float* __restrict w = params[p]->data() + (split ? di * size : 0);
      const float* __restrict g = split ? grad[p].data() : flat.data() + offset[p];
      Tensor<float> rows;
      if (split) rows = Tensor<float>(grad[p].shape());
      float* __restrict wn = split ? rows.data() : out[p].data();
      if (h.optimizer == "adam") {
        const float* __restrict m0 = b[2 + np + p].data();
        const float* __restrict v0 = b[2 + 2 * np + p].data();
        float* __restrict m1 = out[np + p].data();
        float* __restrict v1 = out[2 * np + p].data();
        adam_update(size, w, g, m0, v0, wn, m1, v1, h, 1.0f / c1, 1.0f / c2);
      } else {
        const float* __restrict v0 = b[2 + np + p].data();
        float* __restrict v1 = out[np + p].data();
        sgd_update(size, w, g, v0, wn, v1, h);
      }
      if (split) out[p] = ctx.all_gather(std::move(rows), "data", 0, true);
    }
    const std::int64_t off = offset[np];
    out.push_back(Tensor<float>({1}, flat[off]));
    return out;
  };

  std::vector<shard::PartitionSpec> in_specs{shard::P("data", shard::None), shard::P("data", shard::None)};
  std::vector<const shard::ShardedArray<float>*> args{&x, &y};
  for (const auto& p : m.params) args.push_back(&p);
  for (const auto& s : m.state) args.push_back(&s);
  const auto ps = m.param_specs(), ss = m.state_specs(h);
  in_specs.insert(in_specs.end(), ps.begin(), ps.end());
  in_specs.insert(in_specs.end(), ss.begin(), ss.end());
  std::vector<shard::PartitionSpec> out_specs(in_specs.begin() + 2, in_specs.end());
  out_specs.push_back(shard::P());
  auto results = shard::shard_map<float>(x.mesh(), in_specs, out_specs, body, args);
  for (std::size_t p = 0; p < np; ++p) m.params[p] = std::move(results[p]);
  for (std::size_t s = 0; s < ns; ++s) m.state[s] = std::move(results[np + s]);
  m.step = t;
  return static_cast<double>(results.back().addressable_shards()[0].data[0]) / total;
}

EvalResult evaluate(const Model& m, const Hyper& h, const shard::ShardedArray<float>& x,
                    const shard::ShardedArray<float>& y) {
  const std::size_t np = m.params.size();
  shard::ShardMapBody<float> body = [&](shard::DeviceContext& ctx, const shard::Blocks<float>& b) {
    const Forward f = forward(ctx, m.layers, b[0], slice(b, 2, np));
    const LossStats ls = loss_and_grad(f.pre.back(), b[1], h.classify, 1.0, nullptr);
    Tensor<float> s({3}, std::vector<float>{static_cast<float>(ls.loss), static_cast<float>(ls.correct),
                                            static_cast<float>(ls.count)});
    std::vector<Tensor<float>> out;
    out.push_back(ctx.psum(std::move(s), "data"));
    return out;
  };
  std::vector<shard::PartitionSpec> in_specs{shard::P("data", shard::None), shard::P("data", shard::None)};
  std::vector<const shard::ShardedArray<float>*> args{&x, &y};
  for (const auto& p : m.params) args.push_back(&p);
  const auto ps = m.param_specs();
  in_specs.insert(in_specs.end(), ps.begin(), ps.end());
  const auto r = shard::shard_map<float>(x.mesh(), in_specs, {shard::P()}, body, args);
  const auto& v = r[0].addressable_shards()[0].data;
  return EvalResult{v[0], v[1], v[2]};
}

}  // namespace train
