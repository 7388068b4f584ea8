// Seed 003, "Parallel computing": the convolution example, written once for one example, batched
// with vmap, composed with jit, and run across devices with pmap.
// Needs at least 3 devices, e.g. mpirun -n 3 seed_003_pmap.

#include <cstdio>

#include "shard/shard.hpp"

using namespace shard;

int main(int argc, char** argv) {
  return guarded_main(argc, argv, [&](Runtime&) {
    // x = jnp.arange(5); w = jnp.array([2., 3., 4.])
    const Tensor<std::int32_t> x = arange<std::int32_t>(5);
    const Tensor<float> w({3}, std::vector<float>{2.f, 3.f, 4.f});
    // def convolve(x, w): output = [jnp.dot(x[i-1:i+2], w) for i in range(1, len(x)-1)]; return jnp.array(output)
    auto convolve = [](const Tensor<std::int32_t>& xv, const Tensor<float>& wv) {
      std::vector<Tensor<float>> output;
      for (std::int64_t i = 1; i < xv.shape()[0] - 1; ++i) output.push_back(dot(xv[{Slice(i - 1, i + 2)}], wv));
      return stack(output);
    };
    print(convolve(x, w));
    // xs = jnp.stack([x, x, x]); ws = jnp.stack([w, w, w])
    const Tensor<std::int32_t> xs = stack<std::int32_t>({x, x, x});
    const Tensor<float> ws = stack<float>({w, w, w});
    // vconvolve = jax.vmap(convolve); vconvolve(xs, ws)
    const auto vconvolve = vmap(convolve);
    print(vconvolve(xs, ws));
    // vconvolve_jit = jax.jit(vconvolve); vconvolve_jit(xs, ws)
    const auto vconvolve_jit = jit(vconvolve);
    print(vconvolve_jit(xs, ws));
    // jax.pmap(convolve)(xs, ws)
    print(pmap(convolve)(xs, ws));
    return 0;
  });
}
