// Seed 000, "Parallelism": the notebook's cells that need no jit, op for op, on 8 devices
// (e.g. mpirun -n 2 seed_000_parallelism --devices-per-rank 4). The tutorial's 4096 x 4096
// matrices are --size N (256 by default) so the cells run in seconds.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "shard/shard.hpp"

using namespace shard;

int main(int argc, char** argv) {
  std::int64_t n = 256;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--size") == 0) n = std::atoll(argv[i + 1]);
  return guarded_main(argc, argv, [&](Runtime& rt) {
    const bool root = rt.process_index() == 0;
    auto say = [&](const std::string& s) {
      if (root) std::printf("%s\n", s.c_str());
    };
    if (rt.device_count() != 8)
      raise<ValueError>("seed 000 maps over the tutorial's 8 devices; run e.g. mpirun -n 2 ", argv[0],
                        " --devices-per-rank 4");

    say("### Numpy baseline");
    // x = np.ones((8, 4096, 4096)); np.matmul(x, x).shape
    const Tensor<double> x = ones<double>({8, n, n});
    say(to_string(matmul(x, x).shape()));
    auto t0 = std::chrono::steady_clock::now();
    (void)matmul(x, x);
    const double numpy_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    say("np.matmul(x, x): " + std::to_string(numpy_s * 1e3) + " ms on one process");

    say("### Jax acceleration");
    // jax.devices()
    std::string devs = "[";
    for (const auto& d : rt.devices())
      devs += (d.id ? ",\n " : "") + device_label(d.id) + " (process_index=" + std::to_string(d.process_index) + ")";
    say(devs + "]");
    // x = jnp.ones((8, 4096, 4096)); jnp.matmul(x, x).shape
    const Tensor<float> xj = ones<float>({8, n, n});
    say(to_string(matmul(xj, xj).shape()));

    say("### PMAP");
    // xd = pmap(lambda x: jnp.ones((4096, 4096)))(np.arange(8)); print(xd.shape); print(type(xd))
    const auto xd = pmap([&](const Tensor<std::int64_t>&) { return ones<float>({n, n}); })(arange<std::int64_t>(8));
    say(to_string(xd.shape()));
    say(std::string("ShardedArray<") + xd.dtype() + "> sharded " + xd.spec().to_string() + " over " +
        xd.mesh().to_string());
    // yd = pmap(jnp.matmul)(xd, xd); print(yd.shape)
    const auto yd = pmap([](const Tensor<float>& a, const Tensor<float>& b) { return matmul(a, b); })(xd, xd);
    say(to_string(yd.shape()));
    // yd[0]
    print(yd[0]);
    t0 = std::chrono::steady_clock::now();
    (void)pmap([](const Tensor<float>& a, const Tensor<float>& b) { return matmul(a, b); })(xd, xd);
    const double pmap_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    say("pmap(jnp.matmul)(xd, xd): " + std::to_string(pmap_s * 1e3) + " ms on " + std::to_string(rt.device_count()) +
        " devices");

    say("### Collective operations");
    // def normalize(x): return x / lax.psum(x, axis_name='p')
    // y_n = pmap(normalize, axis_name='p')(jnp.arange(8)); print(y_n.shape); print(y_n); print(y_n.sum())
    auto normalize = [](const Tensor<std::int32_t>& v) { return v / psum(v, "p"); };
    const auto y_n = pmap(normalize, "p")(arange<std::int32_t>(8));
    say(to_string(y_n.shape()));
    print(y_n);
    print(y_n.sum());
    // JAX printed 0.10714287 and 0.21428573: XLA turns the division by the psum into a
    // multiplication by its reciprocal. The same arithmetic gives the seed's digits exactly.
    say("as XLA computes it, x * (1 / psum(x)):");
    print(pmap([](const Tensor<std::int32_t>& v) { return v * (1.0f / psum(v, "p")); }, "p")(arange<std::int32_t>(8)));
    // x = np.ones(8); pmap(lambda x: jax.lax.psum(x, axis_name='i'), axis_name='i')(x)
    const Tensor<double> ones8 = ones<double>({8});
    print(ones8);
    print(pmap([](const Tensor<double>& v) { return psum(v, "i"); }, "i")(ones8));
    return 0;
  });
}
