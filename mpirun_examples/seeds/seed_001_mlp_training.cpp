// Seed 001's MLP regression trained as the tutorial's jax.jit(jax.grad(loss)) loop: 30 SGD
// steps of size 1e-5 with 8-way batch data parallelism, then 4-way data x 2-way model (tensor)
// parallelism, and on one device; the losses agree. Layers 784, W, W, W, 10 (--width W, 256;
// the seed: 8192) and --batch B (1024; the seed: 8192). E.g. mpirun -n 2 seed_001_mlp_training
// --devices-per-rank 4.

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "shard/shard.hpp"

using namespace shard;
using Array = ShardedArray<float>;

// def predict(params, inputs) / def loss(params, batch): params = [W1, b1, W2, b2, ...]
Array predict(const std::vector<Array>& params, Array inputs) {
  Array outputs = inputs;
  for (std::size_t i = 0; i < params.size(); i += 2) {
    outputs = dot(inputs, params[i]) + params[i + 1];
    inputs = maximum(outputs, 0.f);
  }
  return outputs;
}
Array loss(const std::vector<Array>& params, const Array& inputs, const Array& targets) {
  return mean(sum(square(predict(params, inputs) - targets), -1));
}

/// loss_jit = jax.jit(loss); gradfun = jax.jit(jax.grad(loss)); then 30 steps of
/// params = [W - step_size * dW for ...]; returns the losses before and after.
std::pair<float, float> train(std::vector<Array> params, const Array& inputs, const Array& targets) {
  const auto loss_jit = jit(loss);
  const auto gradfun = jit(grad(loss));
  const float step_size = 1e-5f;
  const float before = loss_jit(params, inputs, targets).to_host().item();
  for (int step = 0; step < 30; ++step) {
    const std::vector<Array> grads = gradfun(params, inputs, targets);
    for (std::size_t i = 0; i < params.size(); ++i) params[i] = params[i] - step_size * grads[i];
  }
  if (gradfun.trace_count() != 1) raise<ValueError>("gradfun traced ", gradfun.trace_count(), " times");
  return {before, loss_jit(params, inputs, targets).to_host().item()};
}

int main(int argc, char** argv) {
  std::int64_t width = 256, batch = 1024;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--width") == 0) width = std::atoll(argv[i + 1]);
    if (std::strcmp(argv[i], "--batch") == 0) batch = std::atoll(argv[i + 1]);
  }
  return guarded_main(argc, argv, [&](Runtime& rt) {
    if (rt.device_count() != 8) raise<ValueError>("the tutorial runs on 8 devices: mpirun -n 2 ", argv[0], " --devices-per-rank 4");
    // init_model(jax.random.key(0), layer_sizes, batch_size)
    const std::vector<std::int64_t> sizes{784, width, width, width, 10};
    auto keys = random::split(random::key(0), static_cast<int>(sizes.size()));
    std::vector<Tensor<float>> host;
    for (std::size_t i = 0; i + 1 < sizes.size(); ++i) {
      const auto k = random::split(keys[i + 1]);
      host.push_back(random::normal_box<float>(k[0], {sizes[i], sizes[i + 1]}, full_box({sizes[i], sizes[i + 1]})) /
                     std::sqrt(static_cast<float>(sizes[i])));
      host.push_back(random::normal_box<float>(k[1], {sizes[i + 1]}, full_box({sizes[i + 1]})));
    }
    keys = random::split(keys[0], 3);
    const Tensor<float> x = random::normal_box<float>(keys[1], {batch, 784}, full_box({batch, 784}));
    const Tensor<float> y = random::normal_box<float>(keys[2], {batch, 10}, full_box({batch, 10}));
    const std::vector<int> devices = make_mesh({8}, {"d"}).device_ids();
    auto say = [&](const std::string& s) {
      if (rt.process_index() == 0) std::printf("%s\n", s.c_str());
    };
    auto report = [&](const char* what, std::pair<float, float> l) {
      char line[160];
      std::snprintf(line, sizeof line, "%s: loss %.6f, after 30 steps %.6f", what, l.first, l.second);
      say(line);
      return l;
    };

    // 8-way batch data parallelism: sharding = PositionalSharding(jax.devices()).reshape(8, 1)
    PositionalSharding sharding = PositionalSharding(devices).reshape({8, 1});
    std::vector<Array> params;
    for (const auto& p : host) params.push_back(device_put(p, sharding.replicate()));
    const auto dp = report("8-way batch data parallelism", train(params, device_put(x, sharding), device_put(y, sharding)));

    // 4-way batch data parallelism and 2-way model tensor parallelism
    sharding = sharding.reshape({4, 2});
    const std::vector<PositionalSharding> layouts{sharding.replicate(),  sharding.replicate(),
                                                  sharding.replicate(0), sharding.replicate(0),
                                                  sharding.replicate(0).transpose(), sharding.replicate(),
                                                  sharding.replicate(), sharding.replicate()};
    std::vector<Array> p42;
    for (std::size_t i = 0; i < host.size(); ++i) p42.push_back(device_put(host[i], layouts[i]));
    const auto mp = report("4-way data x 2-way model parallelism",
                           train(p42, device_put(x, sharding.replicate(1)), device_put(y, sharding.replicate(1))));

    // One device: batch_single = jax.device_put(batch, jax.devices()[0])
    const NamedSharding one(Mesh({1}, {"d"}, {devices[0]}), P());
    std::vector<Array> p1;
    for (const auto& p : host) p1.push_back(device_put(p, one));
    const auto single = report("1 device", train(p1, device_put(x, one), device_put(y, one)));

    auto close = [](float a, float b) { return std::abs(a - b) <= 1e-5f * std::abs(b); };
    say(std::string("same losses on all three: ") +
        (close(dp.second, single.second) && close(mp.second, single.second) && close(dp.first, single.first) ? "True"
                                                                                                             : "False"));
    say(std::string("the loss went down: ") + (single.second < single.first ? "True" : "False"));
    return 0;
  });
}
