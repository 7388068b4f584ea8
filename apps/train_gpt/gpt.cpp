#include "gpt.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <type_traits>

namespace gpt {

namespace {

using Block = shard::Tensor<float>;
using TokenBlock = shard::Tensor<std::int32_t>;
using shard::None;
using shard::P;

constexpr int kPerLayer = 16;  // ln1 g b, wq bq, wk bk, wv bv, wo bo, ln2 g b, w1 b1, w2 b2

template <typename X>
X layer_norm(const X& x, const X& g, const X& b) {
  return shard::standardize(x, -1, 1e-5) * g + b;
}

/// Rows (b t, C) of this device's tokens -> rows (b T, C) of the whole sequence of its batch rows.
/// (With one device on 'model' there is nothing to gather or scatter, as in Megatron's mappings.)
template <typename X>
X gather_sequence(X z, std::int64_t b, std::int64_t t, std::int64_t c) {
  if (shard::axis_size("model") == 1) return z;
  const X whole = shard::all_gather(shard::reshape(z, {b, t, c}), "model", 1, true);
  return shard::reshape(whole, {-1, c});
}
/// Partial sums (b T, C) over the 'model' group -> this device's tokens, summed: (b t, C).
template <typename X>
X scatter_sequence(X z, std::int64_t b, std::int64_t t, std::int64_t c) {
  const auto m = static_cast<std::int64_t>(shard::axis_size("model"));
  if (m == 1) return z;
  return shard::reshape(shard::psum_scatter(shard::reshape(z, {b, t * m, c}), "model", 1, true), {b * t, c});
}

std::vector<shard::PartitionSpec> specs_of(const Config& cfg) {
  std::vector<shard::PartitionSpec> out;
  for (const auto& i : param_info(cfg)) out.push_back(i.spec);
  return out;
}

/// The attention half of a transformer block on this device's tokens h (b t, C), given its 10
/// parameters' blocks w (ln1 g b, wq bq, wk bk, wv bv, wo bo; Block: float32, or bfloat16 under
/// --dtype bfloat16): h plus causal self-attention over this device's heads on the whole sequence.
template <typename Block>
Block attention_half(const Config& cfg, const Block& h, const std::vector<Block>& w, std::int64_t b,
                     std::int64_t t) {
  const auto m = static_cast<std::int64_t>(shard::axis_size("model"));
  const std::int64_t T = t * m, C = cfg.d_model;
  const std::int64_t hl = cfg.heads / m, dh = C / cfg.heads;                       // this device's heads
  auto heads = [&](const Block& z) { return shard::reshape(z, {b, T, hl, dh}); };  // (b, T, hl, dh)
  const Block a = gather_sequence(layer_norm(h, w[0], w[1]), b, t, C);  // (b T, C)
  const Block q = heads(shard::matmul(a, w[2]) + w[3]);
  const Block k = heads(shard::matmul(a, w[4]) + w[5]);
  const Block v = heads(shard::matmul(a, w[6]) + w[7]);
  const Block o = shard::reshape(shard::dot_product_attention(q, k, v, /*is_causal=*/true), {b * T, hl * dh});
  return h + scatter_sequence(shard::matmul(o, w[8]), b, t, C) + w[9];
}

/// The MLP half: h (b t, C) plus the MLP over this device's hidden columns, given its 6
/// parameters' blocks (ln2 g b, w1 b1, w2 b2).
template <typename Block>
Block mlp_half(const Config& cfg, const Block& h, const std::vector<Block>& w, std::int64_t b,
               std::int64_t t) {
  const std::int64_t C = cfg.d_model;
  const Block a2 = gather_sequence(layer_norm(h, w[0], w[1]), b, t, C);
  const Block f = shard::gelu(shard::matmul(a2, w[2]) + w[3]);
  return h + scatter_sequence(shard::matmul(f, w[4]), b, t, C) + w[5];
}

/// A parameter's block in the compute dtype E: as it is in float32; cast inside the body in
/// bfloat16, so that its gradient leaves the body in float32 and is summed over the mesh in float32
/// (shard::MixedBfloat16: float32 master parameters, bfloat16 compute).
template <typename E>
shard::Tensor<E> compute(const Block& w) {
  if constexpr (std::is_same_v<E, float>)
    return w.alias();
  else
    return shard::MixedBfloat16::cast_to_compute(w);
}

/// The residual stream (B, T, C) after the last block, laid out P('data', 'model', None), computed
/// in E (float32, or bfloat16). One shard_map per stage: the embeddings, then each block with its
/// own parameters, so that under jit each block's parameters are laid out (under --fsdp:
/// all_gathered over 'data') by equations of their own, which the scheduler starts during the block
/// before (prefetch), and under grad each block's parameter gradients are summed over 'data' as
/// soon as its backward ran.
template <typename E>
shard::ShardedArray<E> residual_stream(const Config& cfg, const shard::Mesh& mesh,
                                       const std::vector<Array>& p, const Tokens& x) {
  using B = shard::Tensor<E>;
  const std::vector<shard::PartitionSpec> specs = specs_of(cfg);
  const P stream(batch_axes(mesh), "model", None);
  // Token and position embeddings of each device's part of the sequence (wpe is split over 'model').
  shard::ShardedArray<E> h =
      shard::shard_map(mesh, {P(batch_axes(mesh), "model"), specs[0], specs[1]}, stream,
                       [](const TokenBlock& xb, const Block& wte, const Block& wpe) {
                         return shard::take(compute<E>(wte), xb, 0) + compute<E>(wpe);
                       })(x, p[0], p[1]);
  for (std::int64_t l = 0; l < cfg.layers; ++l) {
    const auto first = static_cast<std::ptrdiff_t>(2 + kPerLayer * l);
    const std::vector<Array> w(p.begin() + first, p.begin() + first + kPerLayer);
    const std::vector<shard::PartitionSpec> ws(specs.begin() + first, specs.begin() + first + kPerLayer);
    h = shard::shard_map(mesh, {stream, ws}, stream, [&cfg](const B& hb, const std::vector<Block>& wb) {
      // One transformer block on this device's tokens (b, t, C): its attention half (parameters
      // 0-9), then its MLP half (10-15), each casting its parameters' blocks to E.
      const std::int64_t b = hb.shape()[0], t = hb.shape()[1];
      const auto half = [&cfg, b, t](bool attention) {
        return [&cfg, b, t, attention](const B& h, const std::vector<Block>& wi) {
          std::vector<B> wc;
          for (const Block& x : wi) wc.push_back(compute<E>(x));
          return attention ? attention_half(cfg, h, wc, b, t) : mlp_half(cfg, h, wc, b, t);
        };
      };
      const std::vector<Block> wa(wb.begin(), wb.begin() + 10), wm(wb.begin() + 10, wb.end());
      B h2 = shard::reshape(hb, {b * t, cfg.d_model});
      if (cfg.remat == "none") {
        h2 = half(false)(half(true)(h2, wa), wm);
      } else {
        // --remat: the backward pass runs each half again from its input (and, for "dots", its
        // products' outputs), the bfloat16 casts of its weights included; only the halves'
        // inputs are kept between the forward and the backward pass.
        const shard::RematPolicy policy = cfg.remat == "dots" ? shard::checkpoint_policies::dots_saveable
                                                              : shard::checkpoint_policies::nothing_saveable;
        h2 = shard::checkpoint(half(true), policy)(h2, wa);
        h2 = shard::checkpoint(half(false), policy)(h2, wm);
      }
      return shard::reshape(h2, {b, t, cfg.d_model});
    })(h, w);
  }
  return h;
}

}  // namespace

std::string Config::to_string() const {
  std::ostringstream s;
  s << "layers=" << layers << ",d_model=" << d_model << ",heads=" << heads << ",context=" << context
    << ",vocab=" << vocab;
  return s.str();
}

void Config::check(int data, int model, std::int64_t batch) const {
  if (dtype != "float32" && dtype != "bfloat16")
    shard::raise<shard::ValueError>("--dtype ", dtype, ": expected float32 or bfloat16");
  if (remat != "none" && remat != "blocks" && remat != "dots")
    shard::raise<shard::ValueError>("--remat ", remat, ": expected none, blocks or dots");
  if (layers < 1 || d_model < 1 || heads < 1 || context < 1 || vocab < 1)
    shard::raise<shard::ValueError>("the model's sizes must be >= 1: ", to_string());
  if (d_model % heads != 0)
    shard::raise<shard::ValueError>("--d-model ", d_model, " is not divisible by --heads ", heads);
  if (heads % model != 0)
    shard::raise<shard::ValueError>("--heads ", heads, " is not divisible by model=", model,
                                    " (each 'model' device runs whole heads)");
  if (context % model != 0)
    shard::raise<shard::ValueError>("--context ", context, " is not divisible by model=", model,
                                    " (the sequence is split over 'model' between the blocks)");
  if (batch % data != 0)
    shard::raise<shard::ValueError>("--batch ", batch, " is not divisible by data=", data,
                                    " (the batch is split evenly over 'data')");
  // Before anything is allocated: what a rank holds at least (its parameters, their gradients and
  // Adam's two moments, 16 bytes per float32 parameter; the matrices split over 'model'), in
  // double so that no size overflows, against this node's memory shared by its ranks.
  const double C = static_cast<double>(d_model), m = static_cast<double>(model);
  const double per_rank = static_cast<double>(vocab) * C + static_cast<double>(context) * C / m +
                          static_cast<double>(layers) * (12 * C * C / m + 13 * C) + 2 * C;
  const double need = 16 * per_rank;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  const shard::Runtime& rt = shard::Runtime::current();
  const double ranks_here = std::max(1.0, static_cast<double>(rt.process_count()) / static_cast<double>(rt.node_count()));
  const double have = pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) / ranks_here : 0;
  if (have > 0 && need > have)
    shard::raise<shard::ValueError>("the model (", to_string(), ") needs at least ", need / (1 << 30),
                                    " GiB per rank for its parameters, gradients and Adam's state (16 bytes per "
                                    "parameter, the matrices split over model=", model, ") but this node has ",
                                    have / (1 << 30), " GiB for each of its ", ranks_here,
                                    " ranks: shrink --layers / --d-model or split over more 'model' devices");
}

std::vector<ParamInfo> param_info(const Config& c) {
  const std::int64_t C = c.d_model;
  const float std_w = 0.02f, std_proj = 0.02f / std::sqrt(2.0f * static_cast<float>(c.layers));
  std::vector<ParamInfo> out{{"wte", {c.vocab, C}, P(), std_w}, {"wpe", {c.context, C}, P("model", None), std_w}};
  for (std::int64_t l = 0; l < c.layers; ++l) {
    const std::string h = "h" + std::to_string(l) + ".";
    const std::vector<ParamInfo> layer{
        {h + "ln1_g", {C}, P(), 0}, {h + "ln1_b", {C}, P(), 0},
        {h + "wq", {C, C}, P(None, "model"), std_w}, {h + "bq", {C}, P("model"), 0},
        {h + "wk", {C, C}, P(None, "model"), std_w}, {h + "bk", {C}, P("model"), 0},
        {h + "wv", {C, C}, P(None, "model"), std_w}, {h + "bv", {C}, P("model"), 0},
        {h + "wo", {C, C}, P("model", None), std_proj}, {h + "bo", {C}, P(), 0},
        {h + "ln2_g", {C}, P(), 0}, {h + "ln2_b", {C}, P(), 0},
        {h + "w1", {C, 4 * C}, P(None, "model"), std_w}, {h + "b1", {4 * C}, P("model"), 0},
        {h + "w2", {4 * C, C}, P("model", None), std_proj}, {h + "b2", {C}, P(), 0}};
    out.insert(out.end(), layer.begin(), layer.end());
  }
  out.push_back({"lnf_g", {C}, P(), 0});
  out.push_back({"lnf_b", {C}, P(), 0});
  return out;
}

std::vector<std::string> Model::names() const {
  std::vector<std::string> out;
  for (const auto& i : param_info(cfg)) out.push_back(i.name);
  return out;
}

std::int64_t Model::parameter_count() const {
  std::int64_t n = 0;
  for (const auto& p : params) n += p.size();
  return n;
}

shard::SpecEntry batch_axes(const shard::Mesh& mesh) {
  if (mesh.has_axis("replica")) return shard::SpecEntry(std::vector<std::string>{"replica", "fsdp"});
  return shard::SpecEntry("data");
}

std::string fsdp_axis(const shard::Mesh& mesh) { return mesh.has_axis("replica") ? "fsdp" : "data"; }

shard::PartitionSpec fsdp_spec(const ParamInfo& info, const shard::Mesh& mesh) {
  const std::string axis = fsdp_axis(mesh);
  const int data = mesh.axis_size(axis);
  std::vector<shard::SpecEntry> entries(info.shape.size());
  for (int d = 0; d < info.spec.size() && d < static_cast<int>(entries.size()); ++d) entries[static_cast<std::size_t>(d)] = info.spec[d];
  for (std::size_t d = 0; d < entries.size(); ++d)
    if (entries[d].is_none() && info.shape[d] % data == 0) {
      entries[d] = shard::SpecEntry(axis);
      return shard::PartitionSpec(std::move(entries));
    }
  return info.spec;
}

Model init(const Config& cfg, const shard::Mesh& mesh, shard::random::Key key, bool fsdp) {
  Model m{cfg, mesh, {}};
  const auto info = param_info(cfg);
  for (std::size_t i = 0; i < info.size(); ++i) {
    const shard::NamedSharding s(mesh, fsdp ? fsdp_spec(info[i], mesh) : info[i].spec);
    const bool gain = info[i].name.size() > 2 && info[i].name.ends_with("_g");
    if (info[i].init_std > 0)
      m.params.push_back(shard::random::normal<float>(shard::random::fold_in(key, static_cast<std::uint32_t>(i)),
                                                       info[i].shape, s) * info[i].init_std);
    else
      m.params.push_back(shard::full<float>(info[i].shape, gain ? 1.0f : 0.0f, s));
  }
  return m;
}

namespace {

/// The loss computed in E (float32, or bfloat16 with the logits in float32): the residual stream,
/// then the final LayerNorm, the tied output and the cross-entropy, summed over the mesh.
template <typename E>
Array loss_in(const Config& cfg, const shard::Mesh& mesh, const std::vector<Array>& p, const Tokens& x,
              const Tokens& y) {
  using B = shard::Tensor<E>;
  const double count = static_cast<double>(x.size());
  const std::vector<shard::PartitionSpec> specs = specs_of(cfg);
  const std::size_t last = 2 + kPerLayer * static_cast<std::size_t>(cfg.layers);
  std::vector<std::string> all = batch_axes(mesh).axes();
  all.push_back("model");
  auto head = [&cfg, count, all](const B& hb, const TokenBlock& yb, const Block& g, const Block& b,
                                 const Block& wte) {
    const B hf = layer_norm(shard::reshape(hb, {-1, cfg.d_model}), compute<E>(g), compute<E>(b));
    const Block z = [&] {
      if constexpr (std::is_same_v<E, float>)
        return shard::matmul(hf, shard::transpose(wte));
      else
        return shard::MixedBfloat16::cast_to_output(shard::matmul(hf, shard::transpose(compute<E>(wte))));
    }();
    const Block logp = shard::log_softmax(z, -1);  // tied output
    const Block picked = shard::take_along_axis(logp, shard::reshape(yb, {-1, 1}), 1);
    return shard::psum(-shard::sum(picked), shard::SpecEntry(all)) / static_cast<float>(count);
  };
  return shard::shard_map(mesh,
                          {P(batch_axes(mesh), "model", None), P(batch_axes(mesh), "model"), specs[last],
                           specs[last + 1], specs[0]},
                          P(), head)(residual_stream<E>(cfg, mesh, p, x), y, p[last], p[last + 1], p[0]);
}

}  // namespace

Array loss(const Config& cfg, const shard::Mesh& mesh, const std::vector<Array>& params, const Tokens& x,
           const Tokens& y) {
  if (cfg.dtype == "bfloat16") return loss_in<shard::bfloat16>(cfg, mesh, params, x, y);
  return loss_in<float>(cfg, mesh, params, x, y);
}

Array logits(const Config& cfg, const shard::Mesh& mesh, const std::vector<Array>& params, const Tokens& x) {
  const std::vector<shard::PartitionSpec> specs = specs_of(cfg);
  const std::size_t last = 2 + kPerLayer * static_cast<std::size_t>(cfg.layers);
  auto head = [&cfg](const Block& hb, const Block& g, const Block& b, const Block& wte) {
    const Block hf = layer_norm(shard::reshape(hb, {-1, cfg.d_model}), g, b);
    return shard::reshape(shard::matmul(hf, shard::transpose(wte)),
                          {hb.shape()[0], hb.shape()[1], cfg.vocab});
  };
  return shard::shard_map(mesh, {P(batch_axes(mesh), "model", None), specs[last], specs[last + 1], specs[0]},
                          P(batch_axes(mesh), "model", None), head)(
      residual_stream<float>(cfg, mesh, params, x), params[last], params[last + 1], params[0]);
}

double train_flops(const Config& c, double tokens) {
  const double C = static_cast<double>(c.d_model), L = static_cast<double>(c.layers);
  const double matrices = L * 12.0 * C * C + static_cast<double>(c.vocab) * C;
  return tokens * (6.0 * matrices + 12.0 * L * static_cast<double>(c.context) * C);
}

}  // namespace gpt
