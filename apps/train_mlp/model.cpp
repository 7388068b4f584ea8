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
#include <cstring>

namespace train {

namespace {

using shard::Tensor;

// The elementwise passes (optimizer, gradient sums) are built for AVX-512, AVX2+FMA and the
// baseline, picked at load time for the CPU that runs them (the build keeps no -march).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TRAIN_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TRAIN_SIMD_CLONES
#endif

/// C [m, n] (row stride ldc) = op(A) @ op(B) for raw row-major operands.
void sgemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda,
           const float* b, std::int64_t ldb, float* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (std::int64_t r = 0; r < m; ++r) std::fill(c + r * ldc, c + r * ldc + n, 0.0f);
    return;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), 1.0f, a, static_cast<int>(lda), b, static_cast<int>(ldb), 0.0f,
              c, static_cast<int>(ldc));
}

/// c[m, n] = op(A) @ op(B) with row-major operands; ta/tb transpose A [k, m] / B [n, k].
void gemm_into(const Tensor<float>& a, bool ta, const Tensor<float>& b, bool tb, float* c) {
  const std::int64_t m = ta ? a.shape()[1] : a.shape()[0], k = ta ? a.shape()[0] : a.shape()[1];
  const std::int64_t n = tb ? b.shape()[0] : b.shape()[1];
  sgemm(ta, tb, m, n, k, a.data(), a.shape()[1], b.data(), b.shape()[1], c, n);
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

/// out[j] = sum over r < rows of d[r * ld + j], for j < n (a bias gradient: the column sums
/// of dZ), summed row after row.
void column_sums(const float* d, std::int64_t rows, std::int64_t ld, std::int64_t n, float* __restrict out) {
  std::fill(out, out + n, 0.0f);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* __restrict dr = d + r * ld;
    for (std::int64_t j = 0; j < n; ++j) out[j] += dr[j];
  }
}

/// dZ of layer i - 1 from dZ of layer i (i > 0): through W_i (one psum over 'model' for a
/// column-parallel layer, whose input gradient is a partial sum) and the ReLU.
Tensor<float> input_gradient(shard::DeviceContext& ctx, const std::vector<Layer>& layers, std::size_t i,
                             const Forward& f, const std::vector<const Tensor<float>*>& params,
                             const Tensor<float>& dz) {
  Tensor<float> din = gemm(dz, false, *params[2 * i], true);
  if (layers[i].kind == Kind::kColumn) din = ctx.psum(std::move(din), "model");
  const float* __restrict z = f.pre[i - 1].data();
  float* __restrict g = din.data();
  for (std::int64_t k = 0; k < din.size(); ++k) g[k] = z[k] > 0.0f ? g[k] : 0.0f;
  return din;
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

/// Adam (AdamW weight decay) in place on n elements: w, m, v from themselves and the gradient
/// g; ic1, ic2 = 1 / (1 - beta^t). Plain loops over restrict pointers, so they vectorize.
TRAIN_SIMD_CLONES void adam_update(std::int64_t n, float* __restrict w, const float* __restrict g, float* __restrict m,
                                   float* __restrict v, const Hyper& h, float ic1, float ic2) {
  const float b1 = h.beta1, b2 = h.beta2, lr = h.lr, eps = h.eps, wd = h.weight_decay;
  for (std::int64_t k = 0; k < n; ++k) {
    const float mk = b1 * m[k] + (1.0f - b1) * g[k];
    const float vk = b2 * v[k] + (1.0f - b2) * g[k] * g[k];
    m[k] = mk;
    v[k] = vk;
    w[k] = w[k] - lr * ((mk * ic1) / (std::sqrt(vk * ic2) + eps) + wd * w[k]);
  }
}

/// SGD with momentum (L2 weight decay added to the gradient), in place.
TRAIN_SIMD_CLONES void sgd_update(std::int64_t n, float* __restrict w, const float* __restrict g, float* __restrict v,
                                  const Hyper& h) {
  const float mu = h.momentum, lr = h.lr, wd = h.weight_decay;
  for (std::int64_t k = 0; k < n; ++k) {
    const float vk = mu * v[k] + g[k] + wd * w[k];
    v[k] = vk;
    w[k] = w[k] - lr * vk;
  }
}

/// The configured optimizer, in place on n elements with gradient g; s0, s1 its state (Adam's
/// m and v, or SGD's momentum and nullptr).
void optimizer_update(const Hyper& h, std::int64_t n, float* w, const float* g, float* s0, float* s1, float ic1,
                      float ic2) {
  if (h.optimizer == "adam")
    adam_update(n, w, g, s0, s1, h, ic1, ic2);
  else
    sgd_update(n, w, g, s0, h);
}

/// This device's block of `a` (the model's arrays are updated in place).
Tensor<float>& block_of(shard::ShardedArray<float>& a, int device) {
  for (auto& s : a.addressable_shards())
    if (s.device == device) return s.data;
  shard::raise<shard::ValueError>("train_mlp: device ", device, " holds no block of a model array");
}

std::vector<const Tensor<float>*> pointers(const std::vector<Tensor<float>>& blocks) {
  std::vector<const Tensor<float>*> out;
  for (const auto& b : blocks) out.push_back(&b);
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
                 bool shard_state, bool shared) {
  Model m;
  m.layers = layers;
  m.shard_state = shard_state || shared;
  m.shared = shared;
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

/// A data-parallel step through group-shared memory over 'data' (Model::shared), for one
/// replica of a group of N on one node. Every layer's input A_i and output gradient dZ_i of the
/// whole batch (B = N x this replica's rows) live once in group-shared memory, and the replicas
/// split the work of each product between them instead of each doing its own batch:
///   - forward, hidden layers: replica r computes columns r of A_i @ W_i for the whole batch
///     (half of W_i packed per replica, whole-batch rows); the last layer, its own rows;
///   - backward through the activations, hidden layers: columns r of dZ_i @ W_i^T, masked by
///     A_i > 0 (the ReLU's derivative read from its output);
///   - weight gradients: replica r's rows of A_i^T dZ_i over the whole batch in one gemm (the
///     psum_scatter of the gradient, with no per-replica gradient formed), then the optimizer
///     on those rows, in place in the one copy of the parameters the group shares (arrays whose
///     rows do not split over 'data' are computed and updated whole by every replica in its
///     own memory, the same bits everywhere).
/// A width that N does not divide falls back to the replica's own rows. One barrier follows each
/// exchange (six for three layers); psums over 'model' stay where the Megatron layout puts them.
/// Returns the summed loss of the batch.
float step_shared(shard::DeviceContext& ctx, Model& m, const Hyper& h, const Tensor<float>& x, const Tensor<float>& y,
                  const std::vector<const Tensor<float>*>& params, double total, float ic1, float ic2) {
  const auto& layers = m.layers;
  const std::size_t nl = layers.size(), np = 2 * nl;
  const int dev = ctx.device();
  const std::int64_t b = x.shape()[0];  // this replica's rows of the batch
  std::vector<std::int64_t> n_in(nl), n_out(nl);
  std::vector<shard::GroupShared<float>> acts, grads;  // A_i [B, n_in], dZ_i [B, n_out], stacked by replica
  for (std::size_t i = 0; i < nl; ++i) {
    n_in[i] = params[2 * i]->shape()[0];
    n_out[i] = params[2 * i]->shape()[1];
    acts.push_back(ctx.group_shared<float>("data", b * n_in[i], "train_mlp.a" + std::to_string(i)));
    grads.push_back(ctx.group_shared<float>("data", b * n_out[i], "train_mlp.dz" + std::to_string(i)));
  }
  const auto losses = ctx.group_shared<float>("data", 1, "train_mlp.loss");
  const int n = losses.size(), di = losses.index();
  const std::int64_t rows = n * b, r0 = di * b;  // the whole batch; this replica's first row

  // This replica's share of each parameter: the rows it updates (all of an array whose rows do
  // not split over 'data', which every replica then updates alike in its own memory).
  std::vector<std::int64_t> share(np), first(np), poff(np + 1, 0);
  for (std::size_t p = 0; p < np; ++p) {
    share[p] = block_of(m.state[p], dev).size();
    first[p] = m.state_split(p) ? di * share[p] : 0;
    poff[p + 1] = poff[p] + params[p]->size();
  }
  // The split parameters live once per group, in group-shared memory that every replica reads
  // and updates its rows of in place. After init_model or a resume they are private arrays:
  // each replica writes its rows into the shared copy and then borrows it.
  const auto wshared = ctx.group_shared<float>("data", (poff[np] + n - 1) / n, "train_mlp.parameters");
  float* const wall = wshared.stacked();
  bool bound = true;
  for (std::size_t p = 0; p < np; ++p)
    if (m.state_split(p) && block_of(m.params[p], dev).data() != wall + poff[p]) bound = false;
  if (!bound) {
    for (std::size_t p = 0; p < np; ++p)
      if (m.state_split(p))
        std::memcpy(wall + poff[p] + first[p], block_of(m.params[p], dev).data() + first[p],
                    static_cast<std::size_t>(share[p]) * sizeof(float));
    wshared.barrier();
    for (std::size_t p = 0; p < np; ++p)
      if (m.state_split(p)) {
        Tensor<float>& w = block_of(m.params[p], dev);
        w = Tensor<float>::borrow(wall + poff[p], w.shape());
      }
  }

  // Forward. `mine`: the rows of the current input that this replica reads were all written by
  // it (otherwise a barrier comes first).
  std::memcpy(acts[0].mine(), x.data(), x.bytes());
  bool mine = true;
  Tensor<float> logits;
  for (std::size_t i = 0; i < nl; ++i) {
    const bool last = i + 1 == nl, split = !last && n_out[i] % n == 0;
    if (split || !mine) acts[i].barrier();
    const float* a = acts[i].stacked();
    const float* w = params[2 * i]->data();
    const float* bias = params[2 * i + 1]->data();
    const std::int64_t nc = split ? n_out[i] / n : n_out[i], c0 = split ? di * nc : 0, nr = split ? rows : b;
    Tensor<float> z({nr, nc});
    sgemm(false, false, nr, nc, n_in[i], a + (split ? 0 : r0 * n_in[i]), n_in[i], w + c0, n_out[i], z.data(), nc);
    if (layers[i].kind == Kind::kRow) z = ctx.psum(std::move(z), "model");
    if (last) {
      add_bias(z, *params[2 * i + 1]);
      logits = std::move(z);
      break;
    }
    float* out = acts[i + 1].stacked() + (split ? c0 : r0 * n_out[i]);
    for (std::int64_t r = 0; r < nr; ++r) {
      const float* __restrict zr = z.data() + r * nc;
      const float* __restrict br = bias + c0;
      float* __restrict o = out + r * n_out[i];
      for (std::int64_t j = 0; j < nc; ++j) {
        const float v = zr[j] + br[j];
        o[j] = v > 0.0f ? v : 0.0f;
      }
    }
    mine = !split;
  }
  Tensor<float> dz;
  const LossStats ls = loss_and_grad(logits, y, h.classify, total, &dz);
  *losses.mine() = static_cast<float>(ls.loss);
  std::memcpy(grads[nl - 1].mine(), dz.data(), dz.bytes());

  // Backward through the activations: dZ_{i-1} = (dZ_i @ W_i^T) * (A_i > 0).
  mine = true;
  for (std::size_t i = nl - 1; i > 0; --i) {
    const bool split = i + 1 < nl && n_in[i] % n == 0;
    if (split || !mine) grads[i].barrier();
    const float* g = grads[i].stacked();
    const float* w = params[2 * i]->data();
    const std::int64_t nc = split ? n_in[i] / n : n_in[i], c0 = split ? di * nc : 0, nr = split ? rows : b;
    const std::int64_t row0 = split ? 0 : r0;
    Tensor<float> d({nr, nc});
    sgemm(false, true, nr, nc, n_out[i], g + row0 * n_out[i], n_out[i], w + c0 * n_out[i], n_out[i], d.data(), nc);
    if (layers[i].kind == Kind::kColumn) d = ctx.psum(std::move(d), "model");
    const float* act = acts[i].stacked() + row0 * n_in[i] + c0;
    float* out = grads[i - 1].stacked() + row0 * n_in[i] + c0;
    for (std::int64_t r = 0; r < nr; ++r) {
      const float* __restrict dr = d.data() + r * nc;
      const float* __restrict ar = act + r * n_in[i];
      float* __restrict o = out + r * n_in[i];
      for (std::int64_t j = 0; j < nc; ++j) o[j] = ar[j] > 0.0f ? dr[j] : 0.0f;
    }
    mine = !split;
  }
  losses.barrier();  // every dZ_i and A_i of the whole batch is written

  float sum = 0;
  for (int s = 0; s < n; ++s) sum += losses.slot(s)[0];
  for (std::size_t i = 0; i < nl; ++i) {
    const float* a = acts[i].stacked();
    const float* dzs = grads[i].stacked();
    for (std::size_t p : {2 * i, 2 * i + 1}) {
      Tensor<float> g({share[p]});
      if (p % 2 == 0) {  // rows [f0, f0 + nr) of A^T dZ over the whole batch
        const std::int64_t nr = n_out[i] > 0 ? share[p] / n_out[i] : 0, f0 = n_out[i] > 0 ? first[p] / n_out[i] : 0;
        sgemm(true, false, nr, n_out[i], rows, a + f0, n_in[i], dzs, n_out[i], g.data(), n_out[i]);
      } else {  // columns [first, first + share) of the column sums of dZ over the whole batch
        column_sums(dzs + first[p], rows, n_out[i], share[p], g.data());
      }
      float* s1 = h.optimizer == "adam" ? block_of(m.state[np + p], dev).data() : nullptr;
      optimizer_update(h, share[p], block_of(m.params[p], dev).data() + first[p], g.data(),
                       block_of(m.state[p], dev).data(), s1, ic1, ic2);
    }
  }
  wshared.barrier();  // every replica's rows are written before anyone reads them
  return sum;
}

double train_step(Model& m, const Hyper& h, const shard::ShardedArray<float>& x, const shard::ShardedArray<float>& y) {
  const std::size_t np = m.params.size();
  const double total = static_cast<double>(x.shape()[0]);
  const std::int64_t t = m.step + 1;
  const float c1 = 1.0f - std::pow(h.beta1, static_cast<float>(t)), c2 = 1.0f - std::pow(h.beta2, static_cast<float>(t));
  const auto& layers = m.layers;
  const bool adam = h.optimizer == "adam";

  auto body = [&](shard::DeviceContext& ctx, const Tensor<float>& xb, const Tensor<float>& yb,
                  const std::vector<Tensor<float>>& param_blocks) {
    const auto params = pointers(param_blocks);
    if (m.shared) return Tensor<float>({1}, step_shared(ctx, m, h, xb, yb, params, total, 1.0f / c1, 1.0f / c2));
    const Forward f = forward(ctx, layers, xb, params);
    Tensor<float> dz;
    const LossStats ls = loss_and_grad(f.pre.back(), yb, h.classify, total, &dz);

    // Where each gradient goes: arrays whose state is split over 'data' are psum_scattered
    // right after their layer (rows of this replica's share); the others, and the loss, are
    // written into one flat buffer summed with a single psum over 'data' at the end.
    std::vector<Tensor<float>> scattered(np);
    std::vector<std::int64_t> offset(np + 1, 0);
    for (std::size_t p = 0; p < np; ++p) offset[p + 1] = offset[p] + (m.state_split(p) ? 0 : params[p]->size());
    const std::int64_t nflat = offset[np];
    Tensor<float> flat({nflat + 1});
    for (std::size_t i = layers.size(); i-- > 0;) {
      const std::size_t pw = 2 * i, pb = 2 * i + 1;
      if (m.state_split(pw))
        scattered[pw] = ctx.psum_scatter(gemm(f.inputs[i], true, dz, false), "data", 0, true);
      else
        gemm_into(f.inputs[i], true, dz, false, flat.data() + offset[pw]);
      const std::int64_t rows = dz.shape()[0], n = dz.shape()[1];
      Tensor<float> dbias;
      if (m.state_split(pb)) dbias = Tensor<float>({n});
      column_sums(dz.data(), rows, n, n, m.state_split(pb) ? dbias.data() : flat.data() + offset[pb]);
      if (m.state_split(pb)) scattered[pb] = ctx.psum_scatter(std::move(dbias), "data", 0, true);
      if (i == 0) break;
      dz = input_gradient(ctx, layers, i, f, params, dz);
    }
    flat[nflat] = static_cast<float>(ls.loss);
    flat = ctx.psum(std::move(flat), "data");

    // The optimizer, in place on this device's blocks of the model's parameters and state.
    // Split arrays update this replica's rows only and all_gather them over 'data'.
    const int dev = ctx.device(), di = ctx.axis_index("data");
    for (std::size_t p = 0; p < np; ++p) {
      const bool split = m.state_split(p);
      Tensor<float>& w = block_of(m.params[p], dev);
      const std::int64_t share = block_of(m.state[p], dev).size();  // this replica's share of the parameter
      const std::int64_t first = split ? di * share : 0;
      float* s1 = adam ? block_of(m.state[np + p], dev).data() : nullptr;
      optimizer_update(h, share, w.data() + first, split ? scattered[p].data() : flat.data() + offset[p],
                       block_of(m.state[p], dev).data(), s1, 1.0f / c1, 1.0f / c2);
      if (split) {
        Tensor<float> rows(scattered[p].shape());
        std::memcpy(rows.data(), w.data() + first, rows.bytes());
        w = ctx.all_gather(std::move(rows), "data", 0, true);
      }
    }
    return Tensor<float>({1}, flat[nflat]);
  };
  const auto data = shard::P("data", shard::None);
  const auto loss = shard::shard_map(x.mesh(), {data, data, m.param_specs()}, shard::P(), body)(x, y, m.params);
  m.step = t;
  return static_cast<double>(loss.addressable_shards()[0].data[0]) / total;
}

EvalResult evaluate(const Model& m, const Hyper& h, const shard::ShardedArray<float>& x,
                    const shard::ShardedArray<float>& y) {
  auto body = [&](shard::DeviceContext& ctx, const Tensor<float>& xb, const Tensor<float>& yb,
                  const std::vector<Tensor<float>>& params) {
    const Forward f = forward(ctx, m.layers, xb, pointers(params));
    const LossStats ls = loss_and_grad(f.pre.back(), yb, h.classify, 1.0, nullptr);
    Tensor<float> s({3}, std::vector<float>{static_cast<float>(ls.loss), static_cast<float>(ls.correct),
                                            static_cast<float>(ls.count)});
    return ctx.psum(std::move(s), "data");
  };
  const auto data = shard::P("data", shard::None);
  const auto r = shard::shard_map(x.mesh(), {data, data, m.param_specs()}, shard::P(), body)(x, y, m.params);
  const auto& v = r.addressable_shards()[0].data;
  return EvalResult{v[0], v[1], v[2]};
}

}  // namespace train
