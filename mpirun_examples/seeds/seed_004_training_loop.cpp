// Seed 004's "Real-World Application: Distributed Training", op for op: a linear model trained
// with grad inside the per-device program and pmean over the devices, five steps on the
// tutorial's 8 devices (e.g. mpirun -n 2 seed_004_training_loop --devices-per-rank 4). The
// seed calls pmean under jax.jit with parameters sharded P('devices', None), which JAX only
// accepts inside shard_map with the parameters replicated; so does this port, the shard_map jitted. The same step
// in the global view (value_and_grad of the whole batch's loss) is printed beside it.

#include <cstdio>

#include "shard/shard.hpp"

using namespace shard;

// def loss_fn(params, x, y): preds = jnp.matmul(x, params); return jnp.mean((preds - y) ** 2)
template <typename X>
X loss_fn(const X& params, const X& x, const X& y) {
  return mean(square(matmul(x, params) - y));
}

int main(int argc, char** argv) {
  return guarded_main(argc, argv, [&](Runtime& rt) {
    if (rt.device_count() != 8) raise<ValueError>("the tutorial runs on 8 devices: mpirun -n 2 ", argv[0], " --devices-per-rank 4");
    const Mesh mesh = make_mesh({8}, {"devices"});  // mesh_1d
    const float learning_rate = 0.01f;

    // def distributed_training_step(params, batch, mesh, learning_rate=0.01)
    // @jax.jit def sharded_update(params, x, y): the per-device program is a shard_map (one equation
    // of the jitted program)
    auto sharded_update = jit(shard_map(mesh, {P(), P("devices"), P("devices")}, {P(), P()},
                                    [&](const Tensor<float>& params, const Tensor<float>& x, const Tensor<float>& y) {
                                      // Compute local gradients, then average them across devices
                                      Tensor<float> grads = grad(loss_fn<Tensor<float>>)(params, x, y);
                                      grads = pmean(grads, "devices");
                                      const Tensor<float> new_params = params - learning_rate * grads;
                                      // Compute loss (just for monitoring)
                                      const Tensor<float> avg_loss = pmean(loss_fn(params, x, y), "devices");
                                      return std::make_tuple(new_params, avg_loss);
                                    }));
    const auto global_step = jit(value_and_grad(loss_fn<ShardedArray<float>>));

    // model_params = create_model(rng_key): jnp.ones((1000, 100))
    random::Key rng_key = random::key(42);
    const NamedSharding replicated(mesh, P()), rows(mesh, P("devices"));
    ShardedArray<float> model_params = ones<float>({1000, 100}, replicated);
    ShardedArray<float> global_params = model_params;  // the same training in the global view
    for (int step = 0; step < 5; ++step) {
      // rng_key, subkey = jax.random.split(rng_key); batch = create_batch(subkey)
      const auto keys = random::split(rng_key);
      rng_key = keys[0];
      const auto x = random::normal<float>(keys[1], {32, 1000}, rows);
      const auto y = random::normal<float>(keys[1], {32, 100}, rows);
      auto [new_params, loss] = sharded_update(model_params, x, y);
      model_params = std::move(new_params);

      const auto [global_loss, g] = global_step(global_params, x, y);
      global_params = global_params - learning_rate * g;
      const float l = loss.to_host().item(), lg = global_loss.to_host().item();  // collective
      if (rt.process_index() == 0) std::printf("Step %d, Loss: %.6f (global view: %.6f)\n", step, l, lg);
    }
    const float diff = max(abs(model_params - global_params)).to_host().item();
    if (rt.process_index() == 0)
      std::printf("shard_map and global-view parameters agree: %s\n", diff <= 1e-4f ? "True" : "False");
    if (rt.process_index() == 0)
      std::printf("traced once each: %s\n", sharded_update.trace_count() == 1 && global_step.trace_count() == 1 ? "True" : "False");
    return 0;
  });
}
