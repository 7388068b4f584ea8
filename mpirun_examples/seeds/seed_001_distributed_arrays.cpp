// Seed 001, "Distributed arrays and automatic parallelization": the cells that need no grad
// (the training loops are autodiff's), op for op, the jitted functions with shard::jit, on 8 devices (e.g. mpirun -n 2
// seed_001_distributed_arrays --devices-per-rank 4). The tutorial's 8192 x 8192 arrays are
// --size N (512 by default); its MLP is --width W wide (256 by default, 8192 in the seed).
// Devices print as CPU k in this job's order, where the seed shows its TPUs' torus order.

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <tuple>

#include "shard/shard.hpp"

using namespace shard;

namespace {

double seconds_of(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// ---- the neural network of "Examples: neural networks"
using Params = std::vector<std::pair<ShardedArray<float>, ShardedArray<float>>>;

ShardedArray<float> predict(const Params& params, ShardedArray<float> inputs) {
  ShardedArray<float> outputs = inputs;
  for (const auto& [W, b] : params) {
    outputs = dot(inputs, W) + b;
    inputs = maximum(outputs, 0.f);
  }
  return outputs;
}

ShardedArray<float> loss(const Params& params, const std::pair<ShardedArray<float>, ShardedArray<float>>& batch) {
  const auto& [inputs, targets] = batch;
  const auto predictions = predict(params, inputs);
  return mean(sum(power(predictions - targets, 2), -1));
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t n = 512, width = 256, batch_size = 1024;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--size") == 0) n = std::atoll(argv[i + 1]);
    if (std::strcmp(argv[i], "--width") == 0) width = std::atoll(argv[i + 1]);
  }
  return guarded_main(argc, argv, [&](Runtime& rt) {
    const bool root = rt.process_index() == 0;
    auto say = [&](const std::string& s) {
      if (root) std::printf("%s\n", s.c_str());
    };
    if (rt.device_count() != 8)
      raise<ValueError>("seed 001 needs the tutorial's 8 devices; run e.g. mpirun -n 2 ", argv[0],
                        " --devices-per-rank 4");
    const std::vector<int> devices = make_mesh({8}, {"d"}).device_ids();  // mesh_utils.create_device_mesh((8,))

    say("## Intro and a quick example");
    PositionalSharding sharding(devices);
    // x = jax.random.normal(jax.random.key(0), (8192, 8192)): an array on one device (a host Tensor here)
    const Tensor<float> x = random::normal_box<float>(random::key(0), {n, n}, full_box({n, n}));
    ShardedArray<float> y = device_put(x, sharding.reshape({4, 2}));
    visualize(y);
    ShardedArray<float> z = sin(y);
    visualize(z);
    const Tensor<float> xs = x;
    say("jnp.sin(x) on one device: " + std::to_string(seconds_of([&] { (void)sin(xs); }) * 1e3) + " ms");
    say("jnp.sin(y) on 8 devices:  " + std::to_string(seconds_of([&] { (void)sin(y); }) * 1e3) + " ms");

    say("## Sharding basics, and the PositionalSharding subclass");
    ShardedArray<float> xd = device_put(x, sharding.reshape({8, 1}));
    visualize(xd);
    say(sharding.to_string());
    say(sharding.reshape({8, 1}).to_string());
    say(sharding.reshape({4, 2}).to_string());
    sharding = sharding.reshape({4, 2});
    say(sharding.to_string());
    visualize(device_put(x, sharding));
    sharding = sharding.reshape({1, 8});
    say(sharding.to_string());
    visualize(device_put(x, sharding));
    sharding = sharding.reshape({4, 2});
    say(sharding.replicate(0, true).to_string());
    visualize(device_put(x, sharding.replicate(0, true)));
    auto shape_text = [](const std::vector<int>& s) {
      std::string t = "(";
      for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
      return t + (s.size() == 1 ? ",)" : ")");
    };
    say(shape_text(sharding.replicate(0).shape()));
    say(shape_text(sharding.replicate(1).shape()));
    visualize(device_put(x, sharding.replicate(1)));

    say("## NamedSharding gives a way to express shardings with names");
    const Mesh mesh({4, 2}, {"a", "b"}, devices);  // Mesh(mesh_utils.create_device_mesh((4, 2)), ('a', 'b'))
    for (const auto& spec : {P("a", "b"), P("b", "a"), P("a", None), P(None, "b"), P(None, "a"),
                             P(SpecEntry{"a", "b"}, None)}) {
      say("mesh_sharding(" + spec.to_string() + "):");
      visualize(device_put(x, NamedSharding(mesh, spec)));
    }

    say("## Computation follows data sharding and is automatically parallelized");
    sharding = PositionalSharding(devices);
    ShardedArray<float> xp = device_put(x, sharding.reshape({4, 2}));
    say("input sharding:");
    visualize(xp);
    say("output sharding:");
    visualize(sin(xp));
    y = device_put(xp, sharding.reshape({4, 2}).replicate(1));
    z = device_put(xp, sharding.reshape({4, 2}).replicate(0));
    say("lhs sharding:");
    visualize(y);
    say("rhs sharding:");
    visualize(z);
    comm_stats().reset();
    const ShardedArray<float> w = dot(y, z);
    say("out sharding:");
    visualize(w);
    say("bytes sent by dot(y, z): " + std::to_string(comm_stats().total().bytes));
    // np.allclose(jnp.dot(x_single, x_single), jnp.dot(y, z)), with rtol 1e-5 taken relative to
    // the size of each element's terms (dot(|x|, |x|)): an element whose terms cancel differs
    // in its last bits with the order the BLAS kernel sums in (OpenBLAS's Haswell kernel
    // against its AVX-512 one), which an element-relative test would call a mismatch.
    const Tensor<float> single = dot(x, x);
    const Tensor<float> terms = dot(abs(x), abs(x));
    const Tensor<float> sharded = w.to_host();
    bool allclose = true;
    for (std::int64_t i = 0; i < single.size(); ++i)
      allclose = allclose && std::abs(single.flat(i) - sharded.flat(i)) <= 1e-8 + 1e-5 * terms.flat(i);
    say(allclose ? "True" : "False");
    say("jnp.dot(x_single, x_single): " + std::to_string(seconds_of([&] { (void)dot(x, x); }) * 1e3) + " ms");
    say("jnp.dot(y, z):               " + std::to_string(seconds_of([&] { (void)dot(y, z); }) * 1e3) + " ms");
    const ShardedArray<float> w_copy = w;  // jnp.copy(w)
    visualize(w_copy);

    say("## When explicit shardings disagree, JAX errors");
    const PositionalSharding sharding1(std::vector<int>(devices.begin(), devices.begin() + 4));
    const PositionalSharding sharding2(std::vector<int>(devices.begin() + 4, devices.end()));
    y = device_put(x, sharding1.reshape({2, 2}));
    z = device_put(x, sharding2.reshape({2, 2}));
    try {
      (void)(y + z);
      say("no error");
    } catch (const MeshMismatchError& e) {
      say(std::string("MeshMismatchError: ") + e.message());
    }
    std::vector<int> permuted;
    for (int i : {0, 1, 2, 3, 6, 7, 4, 5}) permuted.push_back(devices[static_cast<std::size_t>(i)]);
    y = device_put(x, PositionalSharding(devices).reshape({4, 2}));
    z = device_put(x, PositionalSharding(permuted).reshape({4, 2}));
    // JAX 0.4 refused another order of the same devices; Shard combines arrays over one set.
    const auto yz = y + z;
    say("y + z over the same devices in another order: no error, sharded like y:");
    visualize(yz);
    y = device_put(x, sharding1.reshape({2, 2}).replicate());
    y = device_put(x, PositionalSharding(devices).reshape({4, 2}));
    (void)(y + ones_like(y));
    (void)(y + arange<float>(static_cast<float>(y.size())).reshape(y.shape()));
    say("no error!");

    say("## Constraining shardings of intermediates");
    sharding = PositionalSharding(devices);
    ShardedArray<float> xc = device_put(x, sharding.reshape({4, 2}));
    // @jax.jit def f(x): x = x + 1; return jax.lax.with_sharding_constraint(x, sharding.reshape(2, 4))
    auto f = jit([&](const ShardedArray<float>& v) { return with_sharding_constraint(v + 1.f, sharding.reshape({2, 4})); });
    visualize(xc);
    visualize(f(xc));
    auto g = jit([&](const ShardedArray<float>& v) { return with_sharding_constraint(v + 1.f, sharding.replicate()); });
    visualize(xc);
    visualize(g(xc));

    say("## Examples: neural networks");
    const std::vector<std::int64_t> layer_sizes{784, width, width, width, 10};
    auto init_layer = [&](random::Key key, std::int64_t n_in, std::int64_t n_out) {
      const auto keys = random::split(key);
      const Tensor<float> W = random::normal_box<float>(keys[0], {n_in, n_out}, full_box({n_in, n_out})) /
                              std::sqrt(static_cast<float>(n_in));
      const Tensor<float> b = random::normal_box<float>(keys[1], {n_out}, full_box({n_out}));
      return std::make_pair(W, b);
    };
    auto keys = random::split(random::key(0), static_cast<int>(layer_sizes.size()));
    std::vector<std::pair<Tensor<float>, Tensor<float>>> host_params;
    for (std::size_t i = 0; i + 1 < layer_sizes.size(); ++i)
      host_params.push_back(init_layer(keys[i + 1], layer_sizes[i], layer_sizes[i + 1]));
    keys = random::split(keys[0], 3);
    const Tensor<float> inputs = random::normal_box<float>(keys[1], {batch_size, 784}, full_box({batch_size, 784}));
    const Tensor<float> targets = random::normal_box<float>(keys[2], {batch_size, 10}, full_box({batch_size, 10}));

    say("8-way batch data parallelism");
    sharding = PositionalSharding(devices).reshape({8, 1});
    const auto batch = std::make_pair(device_put(inputs, sharding), device_put(targets, sharding));
    Params params;
    for (const auto& [W, b] : host_params)
      params.emplace_back(device_put(W, sharding.replicate()), device_put(b, sharding.replicate()));
    const auto loss_jit = jit(loss);  // loss_jit = jax.jit(loss)
    const float loss_dp = loss_jit(params, batch).to_host().item();
    print(loss_jit(params, batch));

    say("4-way batch data parallelism and 2-way model tensor parallelism");
    sharding = sharding.reshape({4, 2});
    const auto batch2 = std::make_pair(device_put(batch.first, sharding.replicate(1)),
                                       device_put(batch.second, sharding.replicate(1)));
    visualize(batch2.first);
    visualize(batch2.second);
    Params p2;
    p2.emplace_back(device_put(params[0].first, sharding.replicate()), device_put(params[0].second, sharding.replicate()));
    p2.emplace_back(device_put(params[1].first, sharding.replicate(0)), device_put(params[1].second, sharding.replicate(0)));
    p2.emplace_back(device_put(params[2].first, sharding.replicate(0).transpose()),
                    device_put(params[2].second, sharding.replicate()));
    p2.emplace_back(device_put(params[3].first, sharding.replicate()), device_put(params[3].second, sharding.replicate()));
    visualize(p2[1].first);
    visualize(p2[2].first);
    const float loss_mp = loss_jit(p2, batch2).to_host().item();
    print(loss_jit(p2, batch2));
    say(std::string("same loss on both layouts: ") +
        (std::abs(loss_dp - loss_mp) <= 1e-5f * std::abs(loss_dp) ? "True" : "False"));

    say("## Sharp bits: generating random numbers");
    // f(key, x) = x + jax.random.uniform(key, x.shape), with jax_threefry_partitionable
    auto fr = jit([](random::Key key, const ShardedArray<std::int32_t>& v) {  // @jax.jit
      return v + random::uniform<float>(key, v.shape(), v.sharding());
    });
    const auto key42 = random::key(42);
    const auto xr = device_put(arange<std::int32_t>(24), PositionalSharding(devices));
    visualize(fr(key42, xr));
    say("Partitionable:");
    print(fr(key42, xr));
    return 0;
  });
}
