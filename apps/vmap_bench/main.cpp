// vmap_bench: vmap against the hand-batched program and the loop over examples, in one run.
//   forward   a per-example forward of a 784-1024-1024-10 MLP (tanh, float32) over a batch of
//             --batch: vmap(f, {None, 0}) vs f written for the batch by hand (the matrix
//             products on the whole batch) vs a loop calling f on each example;
//   gradients per-example gradients of a 64-128-10 MLP's softmax cross-entropy:
//             vmap(grad(loss), {None, 0, 0}) vs the per-example gradients by hand (the forward on
//             the batch, the backward as einsum-style products: outer products per example) vs
//             a loop of grad(loss) over the examples.
// Each on one rank's Tensors (the per-device program vmap batches); the results of the three
// are checked equal. Medians of --repeats; speed ratios (time of the other / time of vmap).
// Also prints the machine's float32 GEMM rate on the forward's largest product (the ceiling
// the batched forward runs at) and which BLAS kernel ran.
//
//   mpirun -n 1 vmap_bench
//   mpirun -n 1 vmap_bench --batch 256 --repeats 10

#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "common/bench.hpp"
#include "common/cli.hpp"
#include "shard/shard.hpp"

namespace {

using shard::Tensor;

double seconds(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// a then b on odd repetitions, b then a on even ones: neither runs on the other's warm caches.
void alternate(int r, const std::function<void()>& a, const std::function<void()>& b) {
  (r % 2 ? a : b)();
  (r % 2 ? b : a)();
}

struct Mlp3 {
  Tensor<float> w1, b1, w2, b2, w3, b3;
};
struct Mlp2 {
  Tensor<float> w1, b1, w2, b2;
};

SHARD_TREE(Mlp3, w1, b1, w2, b2, w3, b3)
SHARD_TREE(Mlp2, w1, b1, w2, b2)

Tensor<float> normal(std::uint64_t seed, const shard::Shape& shape, float scale) {
  return shard::random::normal_box<float>(shard::random::key(seed), shape, shard::full_box(shape)) * scale;
}

/// The forward for one example x (784,) or, the same code, for a batch (B, 784).
Tensor<float> forward(const Mlp3& p, const Tensor<float>& x) {
  const auto h1 = tanh(matmul(x, p.w1) + p.b1);
  const auto h2 = tanh(matmul(h1, p.w2) + p.b2);
  return matmul(h2, p.w3) + p.b3;
}

Tensor<float> loss(const Mlp2& p, const Tensor<float>& x, const Tensor<std::int32_t>& label) {
  const auto h = tanh(matmul(x, p.w1) + p.b1);
  return shard::softmax_cross_entropy_with_integer_labels(matmul(h, p.w2) + p.b2, label);
}

/// Per-example gradients written by hand for the batch: the forward on the batch, the backward
/// with outer products per example (einsum "bi,bj->bij").
Mlp2 per_example_by_hand(const Mlp2& p, const Tensor<float>& x, const Tensor<std::int32_t>& labels) {
  using namespace shard;
  const auto h = tanh(matmul(x, p.w1) + p.b1);                            // (B, 128)
  const auto probs = softmax(matmul(h, p.w2) + p.b2, -1);                 // (B, 10)
  const auto dlogits = probs - one_hot<float>(labels, probs.shape()[1]);  // (B, 10)
  const auto dh = matmul(dlogits, transpose(p.w2)) * (1.0f - h * h);      // (B, 128)
  return Mlp2{expand_dims(x, 2) * expand_dims(dh, 1), dh, expand_dims(h, 2) * expand_dims(dlogits, 1),
              dlogits};
}

double max_rel_diff(const Tensor<float>& a, const Tensor<float>& b) {
  using namespace shard;
  return max(abs(astype<double>(a) - astype<double>(b))).item() /
         (max(abs(astype<double>(b))).item() + 1e-30);
}

}  // namespace

int main(int argc, char** argv) {
  return shard::apps::run_app(argc, argv, [&](shard::Runtime& rt) {
    namespace po = shard::apps::po;
    int repeats = 7;
    std::int64_t batch = 256;
    po::options_description options("vmap_bench options");
    shard::apps::add_common_options(options);
    options.add_options()("batch", po::value(&batch)->default_value(batch), "examples in the batch")(
        "repeats", po::value(&repeats)->default_value(repeats), "timed repetitions");
    po::variables_map vm;
    if (!shard::apps::parse_command_line(
            argc, argv, options, vm, rt,
            "Usage: mpirun -n 1 vmap_bench [options]\n"
            "Times vmap against the hand-batched program and the loop over examples."))
      return 0;
    shard::apps::check_at_least("batch", batch, 1);
    shard::apps::check_at_least("repeats", repeats, 1);
    using namespace shard;

    // ---- forward: 784-1024-1024-10
    const Mlp3 p3{normal(1, {784, 1024}, 0.03f), normal(2, {1024}, 0.1f),      normal(3, {1024, 1024}, 0.03f),
                  normal(4, {1024}, 0.1f),       normal(5, {1024, 10}, 0.03f), normal(6, {10}, 0.1f)};
    const Tensor<float> xs = normal(7, {batch, 784}, 1.0f);
    Tensor<float> yv, yh, yl;
    std::vector<double> tv, th, tl, tg;
    const auto vforward = vmap(forward, {None, 0});
    const Tensor<float> h = normal(8, {batch, 1024}, 1.0f);
    for (int r = 0; r < repeats; ++r) {
      alternate(
          r, [&] { tv.push_back(seconds([&] { yv = vforward(p3, xs); })); },
          [&] { th.push_back(seconds([&] { yh = forward(p3, xs); })); });
      tl.push_back(seconds([&] {
        std::vector<Tensor<float>> outs;
        for (std::int64_t b = 0; b < batch; ++b) outs.push_back(forward(p3, xs[b]));
        yl = stack(outs);
      }));
      // the ceiling: the largest product alone (B x 1024 x 1024)
      tg.push_back(seconds([&] { (void)matmul(h, p3.w2); }));
    }
    const double fv = apps::median(tv), fh = apps::median(th), fl = apps::median(tl), fg = apps::median(tg);
    const double flops = 2.0 * static_cast<double>(batch) * (784.0 * 1024 + 1024.0 * 1024 + 1024.0 * 10);
    const double same_f = std::max(max_rel_diff(yv, yh), max_rel_diff(yl, yh));

    // ---- per-example gradients: 64-128-10
    const Mlp2 p2{normal(11, {64, 128}, 0.1f), normal(12, {128}, 0.1f), normal(13, {128, 10}, 0.1f),
                  normal(14, {10}, 0.1f)};
    const Tensor<float> xg = normal(15, {batch, 64}, 1.0f);
    Tensor<std::int32_t> labels({batch});
    for (std::int64_t b = 0; b < batch; ++b) labels.flat(b) = static_cast<std::int32_t>((b * 7 + 3) % 10);
    Mlp2 gv, gh, gl;
    std::vector<double> sv, sh, sl;
    const auto vgrad = vmap(grad(loss), {None, 0, 0});
    for (int r = 0; r < repeats; ++r) {
      alternate(
          r, [&] { sv.push_back(seconds([&] { gv = vgrad(p2, xg, labels); })); },
          [&] { sh.push_back(seconds([&] { gh = per_example_by_hand(p2, xg, labels); })); });
      sl.push_back(seconds([&] {
        std::vector<Tensor<float>> w1, b1, w2, b2;
        for (std::int64_t b = 0; b < batch; ++b) {
          Mlp2 g = grad(loss)(p2, xg[b], labels[b]);
          w1.push_back(std::move(g.w1));
          b1.push_back(std::move(g.b1));
          w2.push_back(std::move(g.w2));
          b2.push_back(std::move(g.b2));
        }
        gl = Mlp2{stack(w1), stack(b1), stack(w2), stack(b2)};
      }));
    }
    const double gvt = apps::median(sv), ght = apps::median(sh), glt = apps::median(sl);
    double same_g = 0;
    for (auto [a, b, c] : {std::tuple{&gv.w1, &gh.w1, &gl.w1}, std::tuple{&gv.b1, &gh.b1, &gl.b1},
                           std::tuple{&gv.w2, &gh.w2, &gl.w2}, std::tuple{&gv.b2, &gh.b2, &gl.b2}})
      same_g = std::max({same_g, max_rel_diff(*a, *b), max_rel_diff(*c, *b)});

    std::string out = "vmap_bench: batch " + std::to_string(batch) + ", one device's Tensors, " +
                      shard::blas_summary() + ", median of " + std::to_string(repeats) + "\n";
    char line[320];
    std::snprintf(line, sizeof line, "%-34s %10s %10s %10s %12s %12s %9s\n", "program", "vmap_ms", "hand_ms",
                  "loop_ms", "hand/vmap", "loop/vmap", "results");
    out += line;
    std::snprintf(line, sizeof line, "%-34s %10.2f %10.2f %10.2f %12.2f %12.1f %9s\n",
                  "forward 784-1024-1024-10", fv * 1e3, fh * 1e3, fl * 1e3, fh / fv, fl / fv,
                  same_f < 1e-4 ? "same" : "DIFFERENT");
    out += line;
    std::snprintf(line, sizeof line, "%-34s %10.2f %10.2f %10.2f %12.2f %12.1f %9s\n",
                  "per-example grads 64-128-10", gvt * 1e3, ght * 1e3, glt * 1e3, ght / gvt, glt / gvt,
                  same_g < 1e-4 ? "same" : "DIFFERENT");
    out += line;
    std::snprintf(
        line, sizeof line,
        "goals: forward hand/vmap >= 0.9, loop/vmap >= 20; grads hand/vmap >= 0.9, loop/vmap >= 5\n"
        "ceiling: the forward's %.2f GFLOP run at %.1f GFLOP/s under vmap; its largest product alone "
        "(%lld x 1024 x 1024 sgemm) at %.1f GFLOP/s\n",
        flops * 1e-9, flops / fv * 1e-9, static_cast<long long>(batch),
        2.0 * static_cast<double>(batch) * 1024 * 1024 / fg * 1e-9);
    out += line;
    apps::print0(rt, out);
    return 0;
  });
}
