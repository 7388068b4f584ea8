// Seed 002, "Parallelization across devices": its code cells (two normal arrays and their
// vdot, over 8 devices) and the distributed computing patterns it names, each as the pmap or
// collective that JAX uses for it. The seed's 10,000,000 x 3 arrays are --rows R (1,000,000
// by default). Run on 8 devices: mpirun -n 2 seed_002_collectives --devices-per-rank 4.

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "shard/shard.hpp"

using namespace shard;

int main(int argc, char** argv) {
  std::int64_t rows = 1'000'000;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--rows") == 0) rows = std::atoll(argv[i + 1]);
  return guarded_main(argc, argv, [&](Runtime& rt) {
    auto say = [&](const std::string& s) {
      if (rt.process_index() == 0) std::printf("%s\n", s.c_str());
    };
    const int n = rt.device_count();
    const Mesh mesh = make_mesh({n}, {"i"});
    const NamedSharding rows_split(mesh, P("i"));

    // rng_key = jax.random.PRNGKey(1234); v1 = jax.random.normal(rng_key, shape=(10_000_000, 3)); v2 = ...
    const auto rng_key = random::key(1234);
    const auto v1 = random::normal<float>(rng_key, {rows, 3}, rows_split);
    const auto v2 = random::normal<float>(rng_key, {rows, 3}, rows_split);
    // def dot(v1, v2): return jnp.vdot(v1, v2)
    auto dot_fn = [](const ShardedArray<float>& a, const ShardedArray<float>& b) { return vdot(a, b); };
    const auto d = dot_fn(v1, v2);
    say("vdot(v1, v2) = " + to_string(d) + " for " + std::to_string(rows) + " x 3 normals (about " +
        std::to_string(3 * rows) + ": the same key twice, so a sum of squares)");
    const double per_element = static_cast<double>(d.to_host().item()) / static_cast<double>(3 * rows);
    say(std::string("mean square within 1% of 1: ") + (std::abs(per_element - 1.0) < 0.01 ? "True" : "False"));

    say("## Distributed computing patterns");
    const Tensor<float> x = arange<float>(static_cast<float>(n)) + 1.f;  // one value per device
    const Tensor<float> w({3}, std::vector<float>{2.f, 3.f, 4.f});
    say("Broadcast: None in in_axes gives every device the whole argument");
    print(pmap([](const Tensor<float>& v, const Tensor<float>& b) { return v * b; }, "i", {0, None})(x, w));
    say("Scatter: mapping an axis with pmap gives device i the slice x[i]");
    print(pmap([](const Tensor<float>& v) { return v * 10.f; }, "i")(x));
    say("All-reduce: psum, pmax, pmin, pmean");
    print(pmap([](const Tensor<float>& v) { return psum(v, "i"); }, "i")(x));
    print(pmap([](const Tensor<float>& v) { return pmax(v, "i"); }, "i")(x));
    print(pmap([](const Tensor<float>& v) { return pmin(v, "i"); }, "i")(x));
    print(pmap([](const Tensor<float>& v) { return pmean(v, "i"); }, "i")(x));
    say("All-gather: every device gets every device's value");
    print(pmap([](const Tensor<float>& v) { return all_gather(v, "i"); }, "i")(x));
    say("All-to-all: device i sends element j of its row to device j");
    const Tensor<float> grid = arange<float>(static_cast<float>(n * n)).reshape({n, n});
    print(pmap([](const Tensor<float>& row) { return all_to_all(row, "i", 0, 0, true); }, "i")(grid));
    return 0;
  });
}
