#pragma once
// train_gpt's model: a decoder-only transformer (GPT-2's layout: learned positions, pre-LayerNorm
// blocks of causal multi-head attention and a GELU MLP, a final LayerNorm, the output tied to
// the token embedding), written forward-only with Shard's ops inside shard_maps over a
// ('data', 'model') mesh (one for the embeddings, one per block, one for the loss);
// shard::value_and_grad supplies the backward pass.
//
// Parallelism (Megatron-LM with sequence parallelism, Korthikanti et al. 2022):
//   - the batch is split over 'data', the sequence over 'model' between the blocks: the
//     residual stream, the LayerNorms, the embeddings and the loss work on (B/d, T/m) tokens;
//   - each block all_gathers its LayerNorm's output over 'model' along the sequence, runs its
//     heads (attention) or its hidden columns (MLP) on the whole sequence with the weights
//     split over 'model' (wq, wk, wv, w1 by columns; wo, w2 by rows), and psum_scatters the
//     partial products back to the sequence split: one all_gather and one psum_scatter per
//     sub-block forward, their transposes (psum_scatter, all_gather) backward;
//   - replicated parameters (embeddings, LayerNorms, output biases) are invariant, so their
//     gradients get one psum over the axes their uses vary over (autodiff's pvary transpose);
//     the split weights get one psum over 'data'.
// The per-step losses are the same on every mesh (to float rounding) and on one device.

#include <cstdint>
#include <string>
#include <vector>

#include "shard/shard.hpp"

namespace gpt {

using Array = shard::ShardedArray<float>;
using Tokens = shard::ShardedArray<std::int32_t>;

struct Config {
  std::int64_t vocab = 256, layers = 4, d_model = 192, heads = 6, context = 128;
  /// The compute dtype: "float32", or "bfloat16" (float32 master parameters and optimizer state,
  /// each cast to bfloat16 once per step; the logits and the loss in float32: shard::MixedBfloat16).
  std::string dtype = "float32";
  /// Rematerialization (shard::checkpoint) of each block in the backward pass: "none" (every
  /// block's activations kept), "blocks" (only each block's input kept; the block runs again) or
  /// "dots" (the block's products' outputs kept too; the rest runs again).
  std::string remat = "none";
  /// "layers=4,d_model=192,heads=6,context=128,vocab=256": what a checkpoint records.
  std::string to_string() const;
  /// Throws ValueError naming the flag when the sizes do not fit together or the mesh.
  void check(int data, int model, std::int64_t batch) const;
};

/// The parameters, in a fixed order (names() gives theirs), each laid out as the model uses it.
struct Model {
  Config cfg;
  shard::Mesh mesh;
  std::vector<Array> params;

  std::vector<std::string> names() const;
  std::int64_t parameter_count() const;
};

/// Names, shapes and partition specs of the parameters for `cfg`.
struct ParamInfo {
  std::string name;
  shard::Shape shape;
  shard::PartitionSpec spec;
  float init_std;  ///< normal(0, std) (0: zeros; ones for LayerNorm gains, marked by a name ending "_g")
};
std::vector<ParamInfo> param_info(const Config& cfg);

/// The mesh axes the batch is split over: ('replica', 'fsdp') on a hybrid mesh (one with a
/// 'replica' axis: --mesh replica=R,fsdp=F,model=M), else 'data'.
shard::SpecEntry batch_axes(const shard::Mesh& mesh);
/// The axis FSDP splits the parameters over: 'fsdp' on a hybrid mesh, else 'data'. On a hybrid
/// mesh 'fsdp' lies within a host and 'replica' across hosts (make_mesh's placement), so the
/// all_gathers stay inside a host and only the gradients' sums cross between hosts.
std::string fsdp_axis(const shard::Mesh& mesh);

/// --fsdp (ZeRO-3): a parameter's layout at rest, its model spec with fsdp_axis(mesh) added on its
/// first dim that has no axis and whose size divides by that axis' size (unchanged when none does). Each
/// block's shard_map takes the model specs, so each call all_gathers the block's weights over
/// 'data' where they are used (under jit, started during the block before), and the gradient
/// comes back in the layout at rest (its sum over 'data' scattered).
shard::PartitionSpec fsdp_spec(const ParamInfo& info, const shard::Mesh& mesh);

/// GPT-2's initialisation from `key`: normal(0, 0.02) weights (0.02 / sqrt(2 layers) for the
/// projections into the residual stream), zero biases, unit LayerNorm gains. The values do not
/// depend on the mesh.
/// `fsdp`: each parameter laid out by fsdp_spec (over the mesh's fsdp_axis).
Model init(const Config& cfg, const shard::Mesh& mesh, shard::random::Key key, bool fsdp = false);

/// The mean next-token cross-entropy (nats) of tokens x (B, T) against targets y, both laid
/// out P('data', 'model'); a replicated 0-d array. Differentiable in `params`.
Array loss(const Config& cfg, const shard::Mesh& mesh, const std::vector<Array>& params, const Tokens& x,
           const Tokens& y);

/// The logits (B, T, vocab) of tokens x laid out P('data', 'model'), laid out P('data', 'model', None).
Array logits(const Config& cfg, const shard::Mesh& mesh, const std::vector<Array>& params, const Tokens& x);

/// Floating-point operations of one training step on `tokens` tokens (forward and backward: 6
/// per parameter and token for the matrices, plus attention's 12 L T d per token).
double train_flops(const Config& cfg, double tokens);

}  // namespace gpt
