#include <cstdio>
#include <shard/shard.hpp>
using shard::None;
using shard::P;

int main(int argc, char** argv) {
  return shard::guarded_main(argc, argv, [](shard::Runtime& rt) {
    shard::Mesh mesh = shard::make_mesh({2, 2}, {"data", "model"});  // -n 2 --devices-per-rank 2
    auto x = shard::device_put(shard::Tensor<float>({512, 256}, 0.5f),
                               shard::NamedSharding(mesh, P("data", None)));
    auto w = shard::device_put(shard::Tensor<float>({256, 128}, 0.01f),
                               shard::NamedSharding(mesh, P(None, "model")));
    auto loss = [&](const shard::ShardedArray<float>& w_) {
      return shard::mean(shard::square(shard::matmul(x, w_)));
    };
    auto [value, dw] = shard::value_and_grad(loss)(w);  // dw sharded like w: P(None, 'model')
    // Manual SPMD, as jax's shard_map: each device sums its block's rows, then the blocks over 'model'.
    auto rows =
        shard::shard_map(mesh, P("data", "model"), P("data", None), [](const shard::Tensor<float>& b) {
          return shard::psum(shard::sum(b, {1}, true), "model");
        })(shard::matmul(x, w));
    if (rt.process_index() == 0)  // item(): a local read, no communication
      std::printf("loss %g, row sums %s %s\n", value.item(), shard::to_string(rows.shape()).c_str(),
                  rows.spec().to_string().c_str());
    shard::visualize(dw);  // rank 0 draws the layout
    return 0;
  });
}
