#pragma once
// The MLP of train_mlp, data x tensor (Megatron) parallel on a ('data', 'model') mesh.
//
// Weights pair up from the first layer: column-parallel W P(None, 'model') (b P('model')),
// then row-parallel W P('model', None) (b replicated), so the hidden activations between the
// two stay split over 'model' and each pair needs one psum over 'model' forward (after the
// row-parallel product) and one backward (the input gradient of the column-parallel layer).
// An unpaired last layer is replicated. The batch is split over 'data'.
//
// With the optimizer state split over 'data' (ZeRO-1: --shard-optimizer-state, or by default
// when the 'data' groups are on one node with one device per rank, see main.cpp) each state
// array adds 'data' to its first dim's axes when the device's block rows divide by the 'data'
// size, so each 'data' replica updates only its share of every such parameter (shard::optim's
// shard_state_over: its rows of the gradient arrive by one psum_scatter, and the new rows are
// all_gathered); the few arrays that do not divide (e.g. a bias of 10 over data=4) are psummed
// and updated whole on every replica. Without it every gradient is psummed over 'data' and
// every replica updates its whole blocks.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shard/shard.hpp"

namespace train {

enum class Kind { kColumn, kRow, kReplicated };

struct Layer {
  std::int64_t n_in = 0, n_out = 0;
  Kind kind = Kind::kReplicated;
};

/// The layers for `sizes` (n_0, ..., n_L) with `model`-way tensor parallelism; ValueError when
/// a column-parallel layer's width is not divisible by `model`.
std::vector<Layer> plan_layers(const std::vector<std::int64_t>& sizes, int model);

shard::PartitionSpec weight_spec(Kind k);
shard::PartitionSpec bias_spec(Kind k);

struct Hyper {
  std::string optimizer = "adam";  ///< "adam" or "sgd" (with momentum)
  float lr = 1e-3f, momentum = 0.9f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  bool classify = true;  ///< softmax cross-entropy; otherwise mean squared error (sum over outputs)
  bool skip_nonfinite = false;  ///< --on-nan skip: a step whose loss or gradients are not finite changes nothing
  std::string dtype = "float32";  ///< --dtype: the forward's compute dtype (float32 or bfloat16)
};

/// Parameters and optimizer state as sharded arrays: params = W0, b0, W1, b1, ...; state =
/// one array per parameter (SGD momentum) or two (Adam m, then v), sharded like it and, where
/// it divides, over 'data' too (see the top of this file).
struct Model {
  std::vector<Layer> layers;
  int data = 1, model = 1;    ///< the mesh's axis sizes
  bool shard_state = false;   ///< optimizer state split over 'data' (ZeRO-1)
  /// --fsdp (ZeRO-3): each parameter (and its state) split over 'data' too, on its first dim that
  /// has no mesh axis and divides; the step's products gather the weights where they use them.
  bool fsdp = false;
  std::vector<shard::ShardedArray<float>> params, state;
  std::int64_t step = 0;  ///< optimizer steps taken (Adam's bias correction)

  std::vector<std::string> param_names() const;  ///< "W0", "b0", ...
  std::vector<std::string> state_names(const Hyper& h) const;
  std::vector<shard::PartitionSpec> param_specs() const;
  /// Whether parameter p's optimizer state is split over 'data' (its block rows divide).
  bool state_split(std::size_t p) const;
  std::vector<shard::PartitionSpec> state_specs(const Hyper& h) const;
  std::vector<shard::Shape> param_shapes() const;
};

/// Initialises the parameters from `key` (identical values on any mesh): classification uses
/// He-normal weights and zero biases; regression the tutorial's W ~ N(0,1)/sqrt(n_in), b ~ N(0,1).
Model init_model(const std::vector<Layer>& layers, const shard::Mesh& mesh, shard::random::Key key, const Hyper& h,
                 bool shard_state = false, bool fsdp = false);

struct EvalResult {
  double loss_sum = 0, correct = 0, count = 0;
};

/// One optimizer step written with autodiff (model_autodiff.cpp): the forward pass on global
/// arrays, shard::value_and_grad for the gradients, shard::optim for the update (the model's
/// state arrays are the optimizer's). x: [B, n_0] and y: labels [B, 1] or targets [B, n_L],
/// both P('data', None). Returns the mean loss over the batch. Collective over all ranks.
double train_step_autodiff(Model& m, const Hyper& h, const shard::ShardedArray<float>& x,
                           const shard::ShardedArray<float>& y);

/// The same step as one jitted program (--jit): value_and_grad and the optimizer's update traced
/// at the first call and replayed after (a new trace only for a new batch shape), the parameters
/// and the optimizer's state donated. The learning rate is the optimizer's schedule of its step
/// count (the cosine of --lr-schedule over `total_steps`), as optax's: the same as the eager
/// step's unless --on-nan skip skipped steps. Collective over all ranks.
class JitStep {
 public:
  JitStep(const Hyper& h, bool shard_state, bool cosine, std::int64_t total_steps);
  ~JitStep();
  JitStep(const JitStep&) = delete;
  JitStep& operator=(const JitStep&) = delete;
  /// Returns the mean loss over the batch (NaN when --on-nan skip left the model unchanged).
  double operator()(Model& m, const shard::ShardedArray<float>& x, const shard::ShardedArray<float>& y);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The forward pass only: summed loss, correct predictions and rows (labels < 0 are padding
/// and do not count). Collective over all ranks.
EvalResult evaluate_autodiff(const Model& m, const Hyper& h, const shard::ShardedArray<float>& x,
                             const shard::ShardedArray<float>& y);

}  // namespace train
