// train_mlp: a data x tensor parallel MLP on Fashion-MNIST (or JAX's synthetic regression
// set-up), with checkpoints that resume on any mesh.
//
//   mpirun -n 2 train_mlp --devices-per-rank 2 --mesh data=2,model=2
//   mpirun -n 4 train_mlp --dataset synthetic --layers 784,1024,1024,1024,10 --batch 1024
//   mpirun -n 2 train_mlp --checkpoint-dir ckpt --epochs 1 && mpirun -n 4 train_mlp --checkpoint-dir ckpt --resume

#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "common/cli.hpp"
#include "data.hpp"
#include "model.hpp"
#include "shard/shard.hpp"
#include "train_checkpoint.hpp"

namespace {

using train::Dataset;

/// This process's peak resident memory (getrusage), in MB.
double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

struct Config {
  std::string dataset = "fashion-mnist", data_dir = "/usr/share/datasets/fashion-mnist", mesh_text, layers_text;
  std::string checkpoint_dir, lr_schedule;
  std::int64_t batch = 0, samples = 8192, max_steps = 0, seed = 0, log_every = 0, checkpoint_every = 0;
  std::int64_t trace_steps = 3;
  int epochs = 0, keep = 2;
  bool json = false, resume = false, shard_optimizer_state = false, jit = false, fsdp = false;
  std::string grad_sync = "auto";  ///< auto, shared-memory or mpi
  std::string on_nan = "stop";     ///< stop or skip
  std::string overlap = "on";      ///< the gradients' sums behind the backward pass
  double bucket_mb = 1.0;          ///< their chunk size
  std::string grad_dtype = "float32";  ///< float32 or bfloat16 (sent as, summed in float32)
  train::Hyper hyper;
};

int run(shard::Runtime& rt, Config& c) {
  const auto [data, model] = shard::apps::parse_data_model_mesh(c.mesh_text, rt.device_count());
  const shard::Mesh mesh = shard::make_mesh({data, model}, {"data", "model"});
  const std::vector<train::Layer> layers = train::plan_layers(shard::apps::parse_int_list(c.layers_text, "layers", "784,1024,10", 1), model);
  if (c.batch % data != 0)
    shard::raise<shard::ValueError>("--batch ", c.batch, " is not divisible by data=", data,
                                    " (the batch is split evenly over the 'data' axis)");
  if (c.hyper.dtype != "float32" && c.hyper.dtype != "bfloat16")
    shard::raise<shard::ValueError>("--dtype ", c.hyper.dtype, ": expected float32 or bfloat16");
  const shard::random::Key root = shard::random::key(static_cast<std::uint64_t>(c.seed));
  const auto keys = shard::random::split(root, 3);  // parameters, shuffling, synthetic data
  Dataset train_set, test_set;
  if (c.hyper.classify) {
    train_set = train::read_fashion_mnist(c.data_dir, true);
    test_set = train::read_fashion_mnist(c.data_dir, false);
  } else {
    train_set = train::synthetic(keys[2], c.samples, layers.front().n_in, layers.back().n_out);
  }
  // Both sets must fit the model (a test set of other images would index past the weights)
  // and hold rows (an empty test set has no accuracy).
  for (const auto& [name, set] : {std::pair<const char*, const Dataset*>{"training", &train_set}, {"test", &test_set}}) {
    if (name == std::string("test") && !c.hyper.classify) continue;
    if (set->features != layers.front().n_in || set->outputs != layers.back().n_out)
      shard::raise<shard::ValueError>("--layers starts with ", layers.front().n_in, " and ends with ",
                                      layers.back().n_out, " but the ", name, " set has ", set->features,
                                      " inputs and ", set->outputs, " outputs");
    if (set->count < 1) shard::raise<shard::ValueError>("the ", name, " set has no rows");
  }
  const std::int64_t steps_per_epoch = train_set.count / c.batch;
  if (steps_per_epoch < 1)
    shard::raise<shard::ValueError>("--batch ", c.batch, " is larger than the ", train_set.count, " training rows");

  // Whether every 'data' group has its devices on separate ranks of one node (group-shared
  // memory over 'data').
  const bool shared_ok = data > 1 && shard::group_shared_available(mesh, "data");
  if (c.grad_sync == "shared-memory" && !shared_ok)
    shard::raise<shard::ValueError>("--grad-sync shared-memory needs data > 1, one device per rank and every 'data' "
                                    "group on one node (this mesh: data=", data, ", ", rt.devices_per_rank(),
                                    " devices per rank)");
  // There (--grad-sync auto or shared-memory) the step splits the optimizer state over 'data'
  // too: each weight gradient is then one psum_scatter through group-shared memory
  // (grad_sharding), each replica updates its rows, and an in-place all_gather completes the
  // parameters. The summary's grad_sync says which of the two was chosen.
  // --fsdp: the parameters and their state are split over 'data' themselves (no split state).
  const bool shared = c.grad_sync != "mpi" && shared_ok && !c.fsdp;
  const bool split_state = (c.shard_optimizer_state || shared) && !c.fsdp;
  train::Model m = train::init_model(layers, mesh, keys[0], c.hyper, split_state, c.fsdp);
  std::int64_t step = 0;
  if (!c.checkpoint_dir.empty()) shard::apps::prepare_directory(rt, c.checkpoint_dir, "checkpoint-dir");
  if (c.resume) step = train::resume(c.checkpoint_dir, m, c.hyper, c.seed, c.layers_text);
  const shard::NamedSharding rows(mesh, shard::P("data", shard::None));
  // Where the mesh put the devices: the hosts of each 'data' index ("node0|node1" means the
  // 'model' groups are inside hosts and 'data' crosses them).
  std::string placement;
  for (int d = 0; d < data; ++d) {
    std::string hosts;
    for (int j = 0; j < model; ++j) {
      const std::string& h = rt.devices()[static_cast<std::size_t>(mesh.device_ids()[d * model + j])].host;
      if (hosts.find(h) == std::string::npos) hosts += (hosts.empty() ? "" : "+") + h;
    }
    placement += (d ? "|" : "") + hosts;
  }
  const std::string grad_sync_text =
      data == 1 ? "none (data=1)"
      : m.fsdp  ? std::string(
                      "each parameter and its state split over 'data' (--fsdp): the products all_gather the "
                       "weights where they use them, autodiff's transposes return each gradient split")
               : (m.shard_state
                      ? std::string("psum_scatter of each weight gradient over 'data' (autodiff's "
                                    "transposes, grad_sharding), optimizer state split over 'data', "
                                    "all_gather of the new rows")
                      : std::string("psum of each weight gradient over 'data' (autodiff's transposes)")) +
                     (shared_ok ? " through group-shared memory" : "");
  if (!c.json)
    shard::apps::print0(rt, "train_mlp: " + std::to_string(rt.process_count()) + " ranks x " +
                                std::to_string(rt.devices_per_rank()) + " devices, " + mesh.to_string() + ", layers " +
                                c.layers_text + ", " + c.dataset + ", batch " + std::to_string(c.batch) + ", " +
                                c.hyper.optimizer + " lr " + std::to_string(c.hyper.lr) + " " + c.lr_schedule + "; " + shard::blas_summary() +
                                (c.hyper.dtype == "bfloat16" ? "; dtype bfloat16 (" + shard::MixedBfloat16::to_string() +
                                                                   "), products: " + shard::bf16_products_path()
                                                             : std::string()) +
                                (step > 0 ? "; resumed at step " + std::to_string(step) : "") + "\n" +
                                "mesh devices " + mesh.devices_string() + ", hosts by 'data' index: " + placement +
                                "; gradients over 'data': " + grad_sync_text + "\n");
  const std::int64_t last_step = c.max_steps > 0 ? std::min<std::int64_t>(c.max_steps, c.epochs * steps_per_epoch)
                                                 : c.epochs * steps_per_epoch;
  double total_train_s = 0;
  std::int64_t total_samples = 0, total_skipped = 0, total_steps = 0;
  // The time spent waiting for the gradients' sums (the part the backward pass did not hide).
  const double wait0 = shard::comm_stats().wait_seconds("psum");
  char line[512];
  shard::time_split_reset();
  const shard::apps::TracedSteps traced(rt, c.trace_steps);
  // --jit: the whole step as one program (traced at the first step); the learning rate is the
  // optimizer's schedule of its step count.
  std::unique_ptr<train::JitStep> jit_step;
  if (c.jit)
    jit_step = std::make_unique<train::JitStep>(c.hyper, m.shard_state, c.lr_schedule == "cosine",
                                                c.epochs * steps_per_epoch);
  while (step < last_step) {
    const int epoch = static_cast<int>(step / steps_per_epoch);
    const auto perm = shard::random::permutation(shard::random::fold_in(keys[1], static_cast<std::uint32_t>(epoch)),
                                                 train_set.count);
    const std::vector<std::int64_t> order(perm.begin(), perm.end());
    // Rank 0's progress: a bar redrawn in place on a terminal, plain lines otherwise.
    shard::ProgressBar progress("epoch " + std::to_string(epoch + 1), steps_per_epoch, "samples/s",
                                rt.process_index() == 0 && !c.json, c.log_every);
    double loss_sum = 0, epoch_s = 0;
    std::int64_t epoch_steps = 0, skipped = 0;
    const std::int64_t epoch_end = std::min<std::int64_t>((epoch + 1) * steps_per_epoch, last_step);
    for (; step < epoch_end; ++step) {
      const auto t0 = std::chrono::steady_clock::now();
      const std::int64_t first = (step % steps_per_epoch) * c.batch;
      const auto x = train::batch_inputs(train_set, order, first, c.batch, rows);
      const auto y = train::batch_labels(train_set, order, first, c.batch, rows);
      train::Hyper hs = c.hyper;  // cosine: lr * (1 + cos(pi * step / all steps)) / 2
      if (c.lr_schedule == "cosine")
        hs.lr = static_cast<float>(c.hyper.lr * 0.5 *
                                   (1.0 + std::cos(M_PI * static_cast<double>(step) /
                                                   static_cast<double>(c.epochs * steps_per_epoch))));
      traced.before(total_steps + epoch_steps);
      shard::time_split_enable(true);  // the split covers the training steps only
      const double loss = jit_step ? (*jit_step)(m, x, y) : train::train_step_autodiff(m, hs, x, y);
      shard::time_split_enable(false);
      traced.after(total_steps + epoch_steps + 1);
      epoch_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      ++epoch_steps;
      // Divergence: every rank sees the same loss. Stop before any further checkpoint (the
      // newest one was written from finite parameters), or count the skipped step.
      if (!std::isfinite(loss)) {
        if (c.on_nan == "stop")
          shard::raise<shard::ValueError>(
              "training diverged: the loss is ", loss, " at step ", step + 1, " (epoch ", epoch + 1, "); stopped",
              c.checkpoint_dir.empty() ? std::string() : ", keeping the checkpoints in " + c.checkpoint_dir,
              " (lower --lr, or --on-nan skip to skip such steps)");
        ++skipped;
        continue;
      }
      loss_sum += loss;
      if (c.json && c.log_every > 0 && (step + 1) % c.log_every == 0 && rt.process_index() == 0)
        std::printf("{\"step\": %lld, \"loss\": %.9g}\n", static_cast<long long>(step + 1), loss);
      std::snprintf(line, sizeof line, "loss %.4f", loss);
      progress.update(step % steps_per_epoch + 1, static_cast<double>(epoch_steps * c.batch) / epoch_s,
                      static_cast<double>(c.batch), line);
      if (!c.checkpoint_dir.empty() && c.checkpoint_every > 0 && (step + 1) % c.checkpoint_every == 0)
        train::save(c.checkpoint_dir, c.keep, m, c.hyper, step + 1, c.seed, c.layers_text);
    }
    progress.finish();
    total_train_s += epoch_s;
    total_samples += epoch_steps * c.batch;
    total_steps += epoch_steps;
    // Evaluation: the test set (Fashion-MNIST) or the training rows (synthetic), batch by batch.
    const Dataset& eval_set = c.hyper.classify ? test_set : train_set;
    std::vector<std::int64_t> eval_order(static_cast<std::size_t>(eval_set.count));
    for (std::int64_t i = 0; i < eval_set.count; ++i) eval_order[static_cast<std::size_t>(i)] = i;
    train::EvalResult ev;
    for (std::int64_t first = 0; first < eval_set.count; first += c.batch) {
      const auto xb = train::batch_inputs(eval_set, eval_order, first, c.batch, rows);
      const auto yb = train::batch_labels(eval_set, eval_order, first, c.batch, rows);
      const auto r = train::evaluate_autodiff(m, c.hyper, xb, yb);
      ev.loss_sum += r.loss_sum;
      ev.correct += r.correct;
      ev.count += r.count;
    }
    const double train_loss =
        epoch_steps > skipped ? loss_sum / static_cast<double>(epoch_steps - skipped) : std::nan("");
    total_skipped += skipped;
    if (skipped > 0 && !c.json)
      shard::apps::print0(rt, "epoch " + std::to_string(epoch + 1) + ": skipped " + std::to_string(skipped) +
                                  " steps whose loss or gradients were not finite (--on-nan skip)\n");
    const double sps = static_cast<double>(epoch_steps * c.batch) / epoch_s;
    if (c.json)
      std::snprintf(line, sizeof line,
                    "{\"epoch\": %d, \"step\": %lld, \"train_loss\": %.9g, \"test_loss\": %.9g, \"test_accuracy\": %.6f, "
                    "\"epoch_seconds\": %.3f, \"samples_per_second\": %.1f}\n",
                    epoch + 1, static_cast<long long>(step), train_loss, ev.loss_sum / ev.count,
                    c.hyper.classify ? ev.correct / ev.count : 0.0, epoch_s, sps);
    else
      std::snprintf(line, sizeof line,
                    "epoch %d: train loss %.4f, %s loss %.4f%s, %.2f s, %.0f samples/s\n", epoch + 1, train_loss,
                    c.hyper.classify ? "test" : "eval", ev.loss_sum / ev.count,
                    c.hyper.classify ? (", accuracy " + std::to_string(ev.correct / ev.count).substr(0, 6)).c_str() : "",
                    epoch_s, sps);
    shard::apps::print0(rt, line);
    if (!c.checkpoint_dir.empty() && (c.checkpoint_every == 0 || step == last_step))
      train::save(c.checkpoint_dir, c.keep, m, c.hyper, step, c.seed, c.layers_text);
  }
  const double sps = total_train_s > 0 ? static_cast<double>(total_samples) / total_train_s : 0;
  {  // Rank 0's split of a step (ms of wall time: what any of its threads spent in each category).
    const shard::TimeSplit t = shard::time_split();
    const double per = total_steps > 0 ? 1e3 / static_cast<double>(total_steps) : 0;
    const double step_ms = total_train_s * per, prod = t.products * per, comm = t.communication * per,
                 opt = t.optimizer * per, rest = std::max(0.0, step_ms - prod - comm - opt);
    if (c.json)
      std::snprintf(line, sizeof line,
                    "{\"time_split_ms\": {\"step\": %.3f, \"products\": %.3f, \"communication\": %.3f, "
                    "\"optimizer\": %.3f, \"elementwise_norms_rest\": %.3f}, \"dtype\": \"%s\", \"rank\": 0}\n",
                    step_ms, prod, comm, opt, rest, c.hyper.dtype.c_str());
    else
      std::snprintf(line, sizeof line,
                    "a step in %s, %.2f ms on rank 0: products %.2f ms (%.0f%%), communication %.2f (%.0f%%), "
                    "optimizer %.2f (%.0f%%), elementwise and the rest %.2f (%.0f%%)\n",
                    c.hyper.dtype.c_str(), step_ms, prod, 100 * prod / step_ms, comm, 100 * comm / step_ms, opt,
                    100 * opt / step_ms, rest, 100 * rest / step_ms);
    if (total_steps > 0) shard::apps::print0(rt, line);
  }
  const double wait_ms =
      total_steps > 0 ? 1e3 * (shard::comm_stats().wait_seconds("psum") - wait0) / static_cast<double>(total_steps) : 0;
  std::int64_t held = 0;  // bytes of the parameters and the optimizer state on this rank
  for (const auto* arrays : {&m.params, &m.state})
    for (const auto& a : *arrays)
      for (const auto& sh : a.addressable_shards())
        held += static_cast<std::int64_t>(sh.data.size() * sizeof(float));
  if (c.json) {
    std::snprintf(line, sizeof line,
                  "{\"summary\": true, \"param_state_bytes\": %lld, \"steps\": %lld, \"samples\": %lld, "
                  "\"train_seconds\": %.3f, "
                  "\"samples_per_second\": %.1f, \"mesh\": \"data=%d,model=%d\", \"ranks\": %d, "
                  "\"devices_per_rank\": %d, "
                  "\"peak_rss_mb\": %.1f, \"skipped_steps\": %lld, \"overlap\": \"%s\", \"bucket_mb\": %g, "
                  "\"grad_dtype\": \"%s\", \"grad_wait_ms_per_step\": %.3f, ",
                  static_cast<long long>(held), static_cast<long long>(step),
                  static_cast<long long>(total_samples), total_train_s, sps, data, model, rt.process_count(),
                  rt.devices_per_rank(), peak_rss_mb(), static_cast<long long>(total_skipped),
                  c.overlap.c_str(), c.bucket_mb, c.grad_dtype.c_str(), wait_ms);
    shard::apps::print0(rt, line + ("\"hosts_by_data\": \"" + placement + "\", \"grad_sync\": \"" +
                                    (data == 1 ? "none"
                                     : shared  ? "shared-memory"
                                               : "mpi") +
                                    "\", \"jit\": " + (c.jit ? "true" : "false") +
                                    ", \"fsdp\": " + (c.fsdp ? "true" : "false") + "}\n"));
  } else {
    std::snprintf(line, sizeof line,
                  "done: %lld steps, %.0f samples/s over %.2f s of training; waited %.3f ms per step for the "
                  "gradients' sums (overlap %s)\n",
                  static_cast<long long>(step), sps, total_train_s, wait_ms, c.overlap.c_str());
    shard::apps::print0(rt, line);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return shard::apps::run_app(argc, argv, [&](shard::Runtime& rt) {
    namespace po = shard::apps::po;
    Config c;
    std::string optimizer, lr;
    po::options_description options("train_mlp options");
    shard::apps::add_common_options(options);
    options.add_options()("mesh", po::value(&c.mesh_text)->default_value(""),
                          "data=D,model=M with D*M = devices (default: data = all)")(
        "dataset", po::value(&c.dataset)->default_value("fashion-mnist"), "fashion-mnist or synthetic")(
        "data-dir", po::value(&c.data_dir)->default_value(c.data_dir),
        "directory of the Fashion-MNIST IDX .gz files")(
        "layers", po::value(&c.layers_text)->default_value(""),
        "sizes n_0,...,n_L (default: 784,1024,1024,10; synthetic: 784,8192,8192,8192,10)")(
        "batch", po::value(&c.batch)->default_value(0), "global batch size (default: 256; synthetic: 8192)")(
        "epochs", po::value(&c.epochs)->default_value(0),
        "epochs (default: 12; synthetic: 30, one batch each)")(
        "max-steps", po::value(&c.max_steps)->default_value(0),
        "stop after this many steps in all (0: no limit)")(
        "trace-steps", po::value(&c.trace_steps)->default_value(c.trace_steps),
        "--trace: the training steps the timeline keeps (after the first)")(
        "samples", po::value(&c.samples)->default_value(8192), "synthetic: training rows")(
        "optimizer", po::value(&optimizer)->default_value(""), "adam or sgd (default: adam; synthetic: sgd)")(
        "lr", po::value(&lr)->default_value(""), "learning rate (default: adam 1e-3, sgd 1e-5)")(
        "lr-schedule", po::value(&c.lr_schedule)->default_value(""),
        "constant or cosine (decay to 0 over --epochs; default: cosine; synthetic: constant)")(
        "momentum", po::value(&c.hyper.momentum)->default_value(0.9f, "0.9"),
        "SGD momentum (synthetic default 0)")("weight-decay",
                                              po::value(&c.hyper.weight_decay)->default_value(0.0f, "0"),
                                              "L2 for SGD, decoupled (AdamW) for Adam")(
        "seed", po::value(&c.seed)->default_value(0), "random seed (parameters, shuffling, synthetic data)")(
        "dtype", po::value(&c.hyper.dtype)->default_value("float32"),
        "compute dtype: float32, or bfloat16 (float32 master weights, optimizer state and loss)")(
        "log-every", po::value(&c.log_every)->default_value(0),
        "steps between progress lines (0: ten per epoch)")(
        "checkpoint-dir", po::value(&c.checkpoint_dir)->default_value(""), "write checkpoints here")(
        "checkpoint-every", po::value(&c.checkpoint_every)->default_value(0),
        "steps between checkpoints (0: at every epoch end)")("keep", po::value(&c.keep)->default_value(2),
                                                             "checkpoints to keep")(
        "resume", "continue from the newest checkpoint in --checkpoint-dir (any mesh, any rank count)")(
        "shard-optimizer-state",
        "split the optimizer state over 'data' (ZeRO-1: psum_scatter the gradients, update "
        "this replica's rows, all_gather them); saves memory, slower on one host")(
        "grad-sync", po::value(&c.grad_sync)->default_value("auto"),
        "auto, shared-memory or mpi: how the gradients are reduced over 'data' (auto: when every 'data' "
        "group is "
        "on one node with one device per rank, split the optimizer state over 'data' and psum_scatter each "
        "weight "
        "gradient through group-shared memory; shared-memory: the same, an error when not available; mpi: no "
        "split state unless --shard-optimizer-state)")(
        "on-nan", po::value(&c.on_nan)->default_value("stop"),
        "stop or skip: when a step's loss (or, with skip, a gradient) is NaN or infinite, stop with an error "
        "(the checkpoints written so far are kept) or skip that step's update")(
        "overlap", po::value(&c.overlap)->default_value("on"),
        "on or off: reduce each gradient's chunks behind the rest of the backward pass "
        "(shard::gradient_reduction().overlap), or wait for each right after starting it")(
        "bucket-mb", po::value(&c.bucket_mb)->default_value(1.0, "1"),
        "MiB of a gradient reduced in one call (shard::gradient_reduction().bucket_bytes)")(
        "grad-dtype", po::value(&c.grad_dtype)->default_value("float32"),
        "float32 or bfloat16: how the gradients' chunks travel (bfloat16: half the bytes, summed in float32; "
        "shard::gradient_reduction().bfloat16)")(
        "fsdp",
        "split each parameter and its optimizer state over 'data' (ZeRO-3 / FSDP) on its first dim "
        "without a mesh axis; the step gathers the weights where it uses them (under --jit, each "
        "gather starts one layer ahead: JitOptions::schedule)")(
        "jit",
        "run each training step as one jitted program (value_and_grad and the optimizer's update; the "
        "learning rate follows the optimizer's step count)")(
        "json", "one JSON object per epoch (and per --log-every steps) and a summary, instead of text");
    po::variables_map vm;
    if (!shard::apps::parse_command_line(argc, argv, options, vm, rt,
                                         "Usage: mpirun -n N train_mlp [--mesh data=D,model=M] [--dataset ...]\n"
                                         "Trains a data x tensor parallel MLP."))
      return 0;
    c.json = vm.count("json") > 0;
    c.jit = vm.count("jit") > 0;
    c.resume = vm.count("resume") > 0;
    c.shard_optimizer_state = vm.count("shard-optimizer-state") > 0;
    c.fsdp = vm.count("fsdp") > 0;
    if (c.fsdp && (c.shard_optimizer_state || c.grad_sync == "shared-memory"))
      shard::raise<shard::ValueError>(
          "--fsdp splits the parameters and their state over 'data' itself: drop "
          "--shard-optimizer-state / --grad-sync shared-memory");
    using shard::apps::check_at_least;
    using shard::apps::check_choice;
    using shard::apps::check_finite_in;
    check_choice("on-nan", c.on_nan, {"stop", "skip"});
    c.hyper.skip_nonfinite = c.on_nan == "skip";
    check_choice("grad-sync", c.grad_sync, {"auto", "shared-memory", "mpi"});
    check_choice("overlap", c.overlap, {"on", "off"});
    check_finite_in("bucket-mb", c.bucket_mb, 1.0 / 1024, 1024);
    shard::gradient_reduction().overlap = c.overlap == "on";
    shard::gradient_reduction().bucket_bytes = static_cast<std::int64_t>(c.bucket_mb * 1024 * 1024);
    check_choice("grad-dtype", c.grad_dtype, {"float32", "bfloat16"});
    shard::gradient_reduction().bfloat16 = c.grad_dtype == "bfloat16";
    check_choice("dataset", c.dataset, {"fashion-mnist", "synthetic"});
    const bool synthetic = c.dataset == "synthetic";
    c.hyper.classify = !synthetic;
    if (c.layers_text.empty()) c.layers_text = synthetic ? "784,8192,8192,8192,10" : "784,1024,1024,10";
    if (c.batch == 0) c.batch = synthetic ? 8192 : 256;
    if (c.epochs == 0) c.epochs = synthetic ? 30 : 12;
    if (synthetic && vm["momentum"].defaulted()) c.hyper.momentum = 0.0f;
    c.hyper.optimizer = optimizer.empty() ? (synthetic ? "sgd" : "adam") : optimizer;
    check_choice("optimizer", c.hyper.optimizer, {"adam", "sgd"});
    c.hyper.lr = c.hyper.optimizer == "adam" ? 1e-3f : 1e-5f;
    if (!lr.empty()) c.hyper.lr = static_cast<float>(shard::apps::parse_finite(lr, "lr", "1e-3"));
    for (const auto& [flag, value, min] : {std::tuple<const char*, std::int64_t, std::int64_t>{"batch", c.batch, 1},
                                           {"epochs", c.epochs, 1},
                                           {"samples", c.samples, 1},
                                           {"keep", c.keep, 1},
                                           {"max-steps", c.max_steps, 0}, {"trace-steps", c.trace_steps, 1},
                                           {"checkpoint-every", c.checkpoint_every, 0},
                                           {"log-every", c.log_every, 0}})
      check_at_least(flag, value, min);
    check_finite_in("momentum", c.hyper.momentum, 0, 1);
    check_finite_in("weight-decay", c.hyper.weight_decay, 0, 1e6);
    if (!(c.hyper.lr > 0) || !std::isfinite(c.hyper.lr))  // a float: 1e39 parses as a double but not a float
      shard::raise<shard::ValueError>("--lr must be a finite number > 0, got ", lr);
    if (c.lr_schedule.empty()) c.lr_schedule = synthetic ? "constant" : "cosine";
    check_choice("lr-schedule", c.lr_schedule, {"constant", "cosine"});
    if (c.resume && c.checkpoint_dir.empty()) shard::raise<shard::ValueError>("--resume needs --checkpoint-dir");
    return run(rt, c);
  });
}
