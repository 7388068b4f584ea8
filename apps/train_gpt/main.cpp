// train_gpt: a GPT-style character (byte) language model on Debian's fortunes, trained with
// shard::value_and_grad and shard::optim::adamw over a ('data', 'model') mesh: the batch over
// 'data', Megatron tensor parallelism with sequence parallelism over 'model' (gpt.hpp).
//
//   mpirun -n 2 train_gpt                                   # data=2, the default 4-layer model
//   mpirun -n 4 train_gpt --mesh data=2,model=2 --steps 500 --checkpoint-dir ckpt
//   mpirun -n 2 train_gpt --mesh model=2 --checkpoint-dir ckpt --resume      # any mesh
//   mpirun -n 1 train_gpt --checkpoint-dir ckpt --sample --prompt "The " --temperature 0.8

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "common/cli.hpp"
#include "corpus.hpp"
#include "gpt.hpp"
#include "shard/shard.hpp"

namespace {

using gpt::Array;
using shard::None;
using shard::P;

struct Config {
  gpt::Config model;
  std::string mesh_text, data_dir = "/usr/share/games/fortunes", checkpoint_dir, dump_init, prompt = "The ";
  std::int64_t batch = 32, steps = 2000, warmup = 100, seed = 0, eval_every = 200, val_windows = 256,
               log_every = 10;
  std::int64_t checkpoint_every = 0, sample_tokens = 300, max_steps = 0;
  double lr = 1e-3, min_lr = 1e-4, weight_decay = 0.1, beta2 = 0.99, clip = 1.0, max_seconds = 0,
         temperature = 0;
  int keep = 2;
  std::int64_t trace_steps = 3;
  std::int64_t micro_batches = 1;  ///< --micro-batches: gradient accumulation over this many parts of a batch
  bool json = false, resume = false, sample = false, shard_state = false, comm_stats = false, jit = false,
       fsdp = false;
  std::vector<std::string> jit_off;  ///< --jit-off: fuse, cse, reuse, donate, propagate, schedule
};

/// The sum over ranks of `value` (each rank's counted once, at its first device). Collective.
double sum_over_ranks(const shard::Mesh& mesh, double value) {
  const auto& ids = mesh.device_ids();
  const auto local = mesh.local_device_ids();
  const int first_local = local.empty() ? -1 : *std::min_element(local.begin(), local.end());
  const shard::NamedSharding per_device(mesh, P(shard::SpecEntry(mesh.axis_names())));
  const auto parts =
      shard::generate<double>({static_cast<std::int64_t>(ids.size())}, per_device, [&](const shard::Box& bx) {
        shard::Tensor<double> t(bx.extent, 0.0);
        for (std::int64_t i = 0; i < bx.extent[0]; ++i)
          if (ids[static_cast<std::size_t>(bx.offset[0] + i)] == first_local) t.flat(i) = value;
        return t;
      });
  return shard::sum(parts).to_host().item();
}
/// Rank 0's `value` on every rank (the others pass 0). Collective.
double rank0_value(const shard::Mesh& mesh, double value) { return sum_over_ranks(mesh, value); }

/// The cores' SGEMM rate in all (GFLOP/s): each rank times float32 products of 512 x 1024 x
/// 1024 with its own OpenBLAS threads, all ranks at once; the sum over ranks. Collective.
shard::TimeSplit add(shard::TimeSplit a, const shard::TimeSplit& b) {
  a.products += b.products;
  a.attention += b.attention;
  a.communication += b.communication;
  a.optimizer += b.optimizer;
  return a;
}
shard::TimeSplit minus(shard::TimeSplit a, const shard::TimeSplit& b) {
  a.products -= b.products;
  a.attention -= b.attention;
  a.communication -= b.communication;
  a.optimizer -= b.optimizer;
  return a;
}

/// The GEMM rate (GFLOP/s summed over ranks) of T's block product on a 512 x 1024 x 1024 product:
/// float32's OpenBLAS sgemm, bfloat16's bf16_products_path().
template <typename T>
double measured_gemm_gflops(const shard::Mesh& mesh) {
  const std::int64_t m = 512, n = 1024, k = 1024;
  std::vector<T> a(static_cast<std::size_t>(m * k), T(0.5f)), b(static_cast<std::size_t>(k * n), T(0.25f)),
      c(static_cast<std::size_t>(m * n), T(0.0f));
  shard::gemm_acc(m, n, k, a.data(), k, b.data(), n, c.data(), n);  // warm-up
  int reps = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double s = 0;
  while (s < 0.3) {
    shard::gemm_acc(m, n, k, a.data(), k, b.data(), n, c.data(), n);
    ++reps;
    s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return sum_over_ranks(mesh, 2.0 * static_cast<double>(m * n * k) * reps / s / 1e9);
}

/// What this rank sent between two CommStats snapshots, as JSON: {"kind axes": [calls, bytes], ...}.
std::string comm_difference(const std::map<std::pair<std::string, std::string>, shard::CommRecord>& before,
                            const std::map<std::pair<std::string, std::string>, shard::CommRecord>& after) {
  std::string out = "{";
  for (const auto& [key, rec] : after) {
    const auto it = before.find(key);
    const std::int64_t calls = rec.calls - (it == before.end() ? 0 : it->second.calls);
    const std::int64_t bytes = rec.bytes - (it == before.end() ? 0 : it->second.bytes);
    if (calls == 0 && bytes == 0) continue;
    std::string axes;
    for (const char ch : key.second) axes += ch == '"' ? '\'' : ch;
    out += (out.size() > 1 ? ", \"" : "\"") + key.first + " " + axes + "\": [" + std::to_string(calls) +
           ", " + std::to_string(bytes) + "]";
  }
  return out + "}";
}

/// How many validation windows of --context tokens an evaluation reads (a multiple of --batch);
/// ValueError when the split holds fewer than one batch of them (checked before training too).
std::int64_t validation_windows(const Config& c, std::size_t val_bytes) {
  const std::int64_t T = c.model.context;
  const std::int64_t avail = (static_cast<std::int64_t>(val_bytes) - 1) / T;
  const std::int64_t windows = std::min(c.val_windows, avail) / c.batch * c.batch;
  if (windows < c.batch)
    shard::raise<shard::ValueError>("the validation split (", val_bytes, " bytes) holds fewer than --batch ",
                                    c.batch, " windows of ", T,
                                    " tokens (a larger --data-dir, or a smaller --batch or --context)");
  return windows;
}

/// The mean loss over the validation windows (non-overlapping, from the start of the split).
double validation_loss(const Config& c, const gpt::Model& m, const std::vector<std::uint8_t>& val,
                       const shard::NamedSharding& tokens) {
  const std::int64_t T = c.model.context;
  const std::int64_t windows = validation_windows(c, val.size());
  double total = 0;
  for (std::int64_t first = 0; first < windows; first += c.batch) {
    std::vector<std::int64_t> offsets;
    for (std::int64_t j = 0; j < c.batch; ++j) offsets.push_back((first + j) * T);
    const auto [x, y] = shard::data::token_windows(val, offsets, T, tokens);
    total += gpt::loss(c.model, m.mesh, m.params, x, y).to_host().item();
  }
  return total / static_cast<double>(windows / c.batch);
}

void save_checkpoint(const Config& c, const gpt::Model& m, const shard::optim::State<float>& st,
                     std::int64_t step) {
  if (!std::isfinite(shard::optim::global_norm(m.params)))
    shard::raise<shard::ValueError>("training diverged: the parameters hold NaN or infinite values at step ",
                                    step, "; no checkpoint written (lower --lr)");
  shard::CheckpointWriter w(c.checkpoint_dir, c.keep);
  const auto names = m.names();
  for (std::size_t i = 0; i < names.size(); ++i) w.add(names[i], m.params[i]);
  st.save(w);
  w.set("model", c.model.to_string());
  w.set("seed", std::to_string(c.seed));
  w.commit(step);
}

/// Loads the newest checkpoint's parameters (and the optimizer's state when `st`); returns its step.
std::int64_t load_checkpoint(const Config& c, gpt::Model& m, shard::optim::State<float>* st) {
  const std::string path = shard::latest_checkpoint(c.checkpoint_dir);
  if (path.empty()) shard::raise<shard::IoError>("no checkpoint in --checkpoint-dir ", c.checkpoint_dir);
  const shard::CheckpointManifest man = shard::read_manifest(path);
  const auto it = man.metadata.find("model");
  if (it == man.metadata.end() || it->second != c.model.to_string())
    shard::raise<shard::ValueError>(path, " holds the model ", it == man.metadata.end() ? "?" : it->second,
                                    ", this run has ", c.model.to_string(),
                                    " (give the same --layers, --d-model, "
                                    "--heads, --context)");
  const auto names = m.names();
  for (std::size_t i = 0; i < names.size(); ++i)
    m.params[i] =
        shard::load_checkpoint_array<float>(path, man, names[i], m.params[i].sharding(), m.params[i].shape());
  if (st) st->load(path, man);
  return man.step;
}

/// --sample: text generated from --prompt, one byte at a time (greedy at temperature 0).
int sample(shard::Runtime& rt, const Config& c, gpt::Model& m, int data) {
  const std::int64_t step = load_checkpoint(c, m, nullptr);
  const std::int64_t T = c.model.context;
  std::vector<std::int32_t> text(c.prompt.begin(), c.prompt.end());
  for (auto& t : text) t &= 0xff;
  if (text.empty()) text.push_back('\n');
  std::mt19937_64 rng(static_cast<std::uint64_t>(c.seed));  // the same draws on every rank
  const shard::NamedSharding tokens(m.mesh, P(gpt::batch_axes(m.mesh), "model"));
  for (std::int64_t n = 0; n < c.sample_tokens; ++n) {
    const std::int64_t start = std::max<std::int64_t>(0, static_cast<std::int64_t>(text.size()) - T);
    const std::int64_t len = static_cast<std::int64_t>(text.size()) - start;
    // Every 'data' row holds the window, padded on the right (causal: the padding is never seen).
    const auto x = shard::generate<std::int32_t>({data, T}, tokens, [&](const shard::Box& b) {
      shard::Tensor<std::int32_t> t(b.extent, 0);
      for (std::int64_t r = 0; r < b.extent[0]; ++r)
        for (std::int64_t j = 0; j < b.extent[1]; ++j)
          if (b.offset[1] + j < len) t(r, j) = text[static_cast<std::size_t>(start + b.offset[1] + j)];
      return t;
    });
    const Array z = gpt::logits(c.model, m.mesh, m.params, x);
    const shard::Tensor<float> row = z[{0, len - 1}].to_host();
    std::int32_t next = 0;
    if (c.temperature <= 0) {
      next = static_cast<std::int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
    } else {
      const float top = *std::max_element(row.begin(), row.end());
      std::vector<double> w(row.begin(), row.end());
      for (auto& v : w) v = std::exp((v - top) / c.temperature);
      next = static_cast<std::int32_t>(std::discrete_distribution<int>(w.begin(), w.end())(rng));
    }
    text.push_back(next);
  }
  std::string out(text.begin(), text.end());
  if (c.json) {
    std::string esc;
    for (const char ch : out) {
      if (ch == '"' || ch == '\\')
        esc += std::string("\\") + ch;
      else if (ch == '\n')
        esc += "\\n";
      else if (static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) >= 0x7f) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned char>(ch));
        esc += buf;
      } else
        esc += ch;
    }
    shard::apps::print0(rt, "{\"sample\": \"" + esc + "\", \"step\": " + std::to_string(step) +
                                ", \"temperature\": " + std::to_string(c.temperature) + "}\n");
  } else {
    shard::apps::print0(rt, "train_gpt: sample from " + shard::latest_checkpoint(c.checkpoint_dir) +
                                " (temperature " + std::to_string(c.temperature) + ")\n" + out + "\n");
  }
  return 0;
}

int run(shard::Runtime& rt, Config& c) {
  // --mesh data=D,model=M, or the hybrid replica=R,fsdp=F,model=M (FSDP over 'fsdp' inside a host,
  // data parallel over 'replica' across hosts: make_mesh keeps the last axes within a host).
  const auto [names, sizes] = shard::apps::parse_training_mesh(c.mesh_text, rt.device_count());
  const shard::Mesh mesh = shard::make_mesh(sizes, names);
  const bool hybrid = mesh.has_axis("replica");
  if (hybrid) c.fsdp = true;  // a hybrid mesh splits the parameters over 'fsdp'
  std::string mesh_sizes;     // "data=2,model=1" (the JSON summary's)
  for (std::size_t i = 0; i < names.size(); ++i)
    mesh_sizes += (i ? "," : "") + names[i] + "=" + std::to_string(sizes[i]);
  const int model = mesh.axis_size("model");
  const int data = static_cast<int>(mesh.size()) / model;  // the batch's parts: 'data', or replica x fsdp
  c.model.check(data, model, c.batch);
  if (c.batch % (c.micro_batches * data) != 0)
    shard::raise<shard::ValueError>("--batch ", c.batch, " is not divisible by --micro-batches ",
                                    c.micro_batches, " x data=", data,
                                    " (each micro-batch is split evenly over 'data')");
  gpt::Corpus corpus;
  shard::mpi::agreed(rt.world(), [&] { corpus = gpt::read_fortunes(c.data_dir); });
  const auto n_train = static_cast<std::int64_t>(corpus.train.size());
  if (n_train <= c.model.context)
    shard::raise<shard::ValueError>("--context ", c.model.context, " is longer than the training split");
  if (!c.sample) (void)validation_windows(c, corpus.validation.size());  // before training, not after it
  if (!c.sample && !c.checkpoint_dir.empty())
    shard::apps::prepare_directory(rt, c.checkpoint_dir, "checkpoint-dir");
  // The bytes of arrays this rank holds for the parameters and the optimizer's state (the library's
  // counter of live array bytes, before and after making them).
  const std::int64_t live_before = shard::tensor_memory_stats().live_bytes;
  gpt::Model m = gpt::init(c.model, mesh, shard::random::key(static_cast<std::uint64_t>(c.seed)), c.fsdp);
  if (c.sample) return sample(rt, c, m, data);
  if (!c.dump_init.empty()) {  // the initial parameters, for benchmarks/torch_gpt.py --init-npy
    if (rt.process_index() == 0) ::mkdir(c.dump_init.c_str(), 0755);
    const auto names = m.names();
    for (std::size_t i = 0; i < names.size(); ++i)
      shard::io::save_npy(m.params[i], c.dump_init + "/" + names[i] + ".npy");
  }
  auto opt = shard::optim::adamw(shard::optim::warmup_cosine_decay(0.0, c.lr, c.warmup, c.steps, c.min_lr),
                                 c.weight_decay, 0.9, c.beta2, 1e-8)
                 .mask_weight_decay([](const shard::Shape& s) { return s.size() >= 2; });
  if (c.clip > 0) opt.clip_by_global_norm(c.clip);
  if (c.shard_state || c.fsdp) opt.shard_state_over(gpt::fsdp_axis(mesh));
  auto state = opt.init(m.params);
  const std::int64_t state_bytes = shard::tensor_memory_stats().live_bytes - live_before;
  std::int64_t step = 0;
  if (c.resume) step = load_checkpoint(c, m, &state);
  const shard::NamedSharding tokens(mesh, P(gpt::batch_axes(mesh), "model"));
  const double peak = measured_gemm_gflops<float>(mesh);
  const bool bf16 = c.model.dtype == "bfloat16";
  const double peak_bf16 = bf16 ? measured_gemm_gflops<shard::bfloat16>(mesh) : 0;
  if (!c.json) {
    std::ostringstream s;
    s << "train_gpt: " << rt.process_count() << " ranks x " << rt.devices_per_rank() << " devices, "
      << mesh.to_string() << ", " << c.model.to_string() << " (" << m.parameter_count()
      << " parameters), batch " << c.batch << " x " << c.model.context << " tokens, adamw lr " << c.lr
      << " (warm-up " << c.warmup << ", cosine to " << c.min_lr << ")"
      << (step > 0 ? ", resumed at step " + std::to_string(step) : std::string()) << "\n"
      << "data: " << corpus.files << " files, " << corpus.fortunes << " fortunes: " << corpus.train.size()
      << " training and " << corpus.validation.size() << " validation bytes from " << c.data_dir << "\n"
      << shard::blas_summary() << "; measured SGEMM " << peak << " GFLOP/s in all\n";
    if (bf16)
      s << "dtype bfloat16 (" << shard::MixedBfloat16::to_string()
        << "); bfloat16 products: " << shard::bf16_products_path() << ", measured " << peak_bf16
        << " GFLOP/s in all\n";
    shard::apps::print0(rt, s.str());
  }
  char line[1024];
  std::int64_t val_step = -1;
  auto print_val = [&](std::int64_t at) {
    val_step = at;
    const double v = validation_loss(c, m, corpus.validation, tokens);
    if (c.json)
      std::snprintf(line, sizeof line, "{\"step\": %lld, \"val_loss\": %.6f}\n", static_cast<long long>(at),
                    v);
    else
      std::snprintf(line, sizeof line, "step %lld: validation loss %.4f\n", static_cast<long long>(at), v);
    shard::apps::print0(rt, line);
    return v;
  };
  double val = c.eval_every > 0 ? print_val(step) : std::nan("");
  const double tokens_per_step = static_cast<double>(c.batch * c.model.context);
  const std::int64_t last = c.max_steps > 0 ? std::min(c.max_steps, c.steps) : c.steps;
  shard::ProgressBar bar("train_gpt", last, "tok/s", rt.process_index() == 0 && !c.json,
                         c.log_every > 0 ? c.log_every * 10 : 0);
  double train_s = 0, first_s = 0, last_loss = std::nan("");
  std::string step_comm;  // --comm-stats: what this rank sent during the first step
  std::int64_t trained = 0;
  const auto started = std::chrono::steady_clock::now();
  shard::time_split_enable(true);  // where a step's time goes (printed at the end)
  shard::time_split_reset();
  shard::TimeSplit split_outside;  // what validation inside the loop spent: not the steps'
  const shard::apps::TracedSteps traced(rt, c.trace_steps);
  // --jit: value_and_grad and the optimizer's update in one jitted step; the parameters and the
  // optimizer's state are donated (their buffers are reused by the step's results).
  // The loss and the gradients of a step from its micro-batches (one: value_and_grad over the batch;
  // --micro-batches k: their mean, shard::accumulate_value_and_grad, the parameters' sums over
  // 'data' made once, during the last micro-batch's backward pass).
  const auto loss_and_grads = [&](const std::vector<Array>& p, const std::vector<gpt::Tokens>& xs,
                                  const std::vector<gpt::Tokens>& ys) {
    const auto f = [&](const std::vector<Array>& q, const gpt::Tokens& x, const gpt::Tokens& y) {
      return gpt::loss(c.model, mesh, q, x, y);
    };
    if (xs.size() == 1) return shard::value_and_grad(f, opt.grad_sharding())(p, xs[0], ys[0]);
    return shard::accumulate_value_and_grad(
        f, static_cast<int>(xs.size()),
        [&](int i) {
          return std::make_tuple(xs[static_cast<std::size_t>(i)], ys[static_cast<std::size_t>(i)]);
        },
        opt.grad_sharding())(p);
  };
  auto jit_step = shard::jit(
      [&](const std::vector<Array>& p, const shard::optim::State<float>& s0,
          const std::vector<gpt::Tokens>& xs, const std::vector<gpt::Tokens>& ys) {
        auto [value, grads] = loss_and_grads(p, xs, ys);
        std::vector<Array> params = p;
        shard::optim::State<float> s = s0;
        opt.update(params, grads, s);
        return std::make_tuple(params, s, value);
      },
      [&] {
        shard::JitOptions o{.donate_argnums = {0, 1}};  // --jit-off: the optimizations switched off
        for (const std::string& off : c.jit_off) {
          if (off == "fuse") o.fuse = false;
          if (off == "cse") o.cse = false;
          if (off == "reuse") o.reuse_buffers = false;
          if (off == "donate") o.donate_argnums = {};
          if (off == "propagate") o.propagate = false;
          if (off == "schedule") o.schedule = false;
        }
        return o;
      }());
  // The most array bytes a step held above what it started with (the parameters, the optimizer's
  // state): its activations and gradients at their peak (the library's live-bytes counter).
  std::int64_t step_peak = 0;
  while (step < last) {
    traced.before(trained);
    const std::int64_t live_at_start = shard::tensor_memory_stats().live_bytes;
    shard::reset_tensor_memory_peak();
    const auto t0 = std::chrono::steady_clock::now();
    const auto offsets = shard::data::random_window_offsets(static_cast<std::uint64_t>(c.seed), step, c.batch,
                                                            n_train, c.model.context);
    // The batch's windows as --micro-batches parts, each laid out over the mesh as a whole batch is.
    std::vector<gpt::Tokens> xs, ys;
    const std::int64_t part = c.batch / c.micro_batches;
    for (std::int64_t i = 0; i < c.micro_batches; ++i) {
      const std::vector<std::int64_t> some(offsets.begin() + i * part, offsets.begin() + (i + 1) * part);
      auto [x, y] = shard::data::token_windows(corpus.train, some, c.model.context, tokens);
      xs.push_back(std::move(x));
      ys.push_back(std::move(y));
    }
    const auto before = shard::comm_stats().entries();
    const double lr = opt.config().lr(state.step.item());
    if (c.jit) {
      // The whole step as one program, traced at the first call (--jit).
      auto [p, s, value] = jit_step(m.params, state, xs, ys);
      m.params = std::move(p);
      state = std::move(s);
      last_loss = value.to_host().item();
    } else {
      auto [value, grads] = loss_and_grads(m.params, xs, ys);
      last_loss = value.to_host().item();
      if (std::isfinite(last_loss)) opt.update(m.params, grads, state);
    }
    if (!std::isfinite(last_loss))
      shard::raise<shard::ValueError>("training diverged: the loss is ", last_loss, " at step ", step + 1,
                                      " (lower --lr)");
    step_peak = std::max(step_peak, shard::tensor_memory_stats().peak_bytes - live_at_start);
    if (c.comm_stats && trained == 0) step_comm = comm_difference(before, shard::comm_stats().entries());
    ++step;
    ++trained;
    const double step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    train_s += step_s;
    if (trained == 1) first_s = step_s;
    traced.after(trained);
    const double tps = static_cast<double>(trained) * tokens_per_step / train_s;
    if (c.json && c.log_every > 0 && step % c.log_every == 0) {
      std::snprintf(line, sizeof line,
                    "{\"step\": %lld, \"loss\": %.6f, \"lr\": %.6g, \"tokens_per_second\": %.1f}\n",
                    static_cast<long long>(step), last_loss, lr, tps);
      shard::apps::print0(rt, line);
    }
    std::snprintf(line, sizeof line, "loss %.4f", last_loss);
    bar.update(step, tps, tokens_per_step, line);
    // --max-seconds: rank 0's clock decides, and every rank hears it every step (a rank's own
    // clock would let ranks stop at different steps and issue different collectives).
    const bool out_of_time =
        c.max_seconds > 0 &&
        rank0_value(
            mesh, rt.process_index() == 0 &&
                          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() >
                              c.max_seconds
                      ? 1.0
                      : 0.0) > 0;
    if ((c.eval_every > 0 && step % c.eval_every == 0 && step < last) || out_of_time) {
      bar.finish();
      const shard::TimeSplit kept = shard::time_split();
      val = print_val(step);
      split_outside = add(split_outside, minus(shard::time_split(), kept));
    }
    if (!c.checkpoint_dir.empty() && c.checkpoint_every > 0 && step % c.checkpoint_every == 0)
      save_checkpoint(c, m, state, step);
    if (out_of_time) break;
  }
  bar.finish();
  if (val_step != step) val = print_val(step);
  if (!c.checkpoint_dir.empty() && (c.checkpoint_every <= 0 || step % c.checkpoint_every != 0))
    save_checkpoint(c, m, state, step);
  const shard::TimeSplit split = minus(shard::time_split(), split_outside);
  shard::time_split_enable(false);
  const double tps = train_s > 0 ? static_cast<double>(trained) * tokens_per_step / train_s : 0;
  // Without the first step (jit traces it; eager warms its caches): the rate of the steps after.
  const double steady_tps = trained > 1 && train_s > first_s
                                ? static_cast<double>(trained - 1) * tokens_per_step / (train_s - first_s)
                                : tps;
  const double mfu = peak > 0 ? gpt::train_flops(c.model, tps) / 1e9 / peak : 0;
  const double mfu_bf16 = peak_bf16 > 0 ? gpt::train_flops(c.model, tps) / 1e9 / peak_bf16 : 0;
  // Rank 0's split of a step (ms of wall time: what any of its threads spent in each category).
  const double per = trained > 0 ? 1e3 / static_cast<double>(trained) : 0;
  const double step_ms = train_s * per, prod_ms = split.products * per, attn_ms = split.attention * per,
               comm_ms = split.communication * per, opt_ms = split.optimizer * per;
  const double rest_ms = std::max(0.0, step_ms - prod_ms - attn_ms - comm_ms - opt_ms);
  if (c.comm_stats) {
    if (c.json)
      shard::apps::print0(rt, "{\"comm_per_step\": " + step_comm + ", \"rank\": 0}\n");
    else
      shard::apps::print0(rt, "sent by rank 0 in one step (calls, bytes): " + step_comm + "\n");
  }
  if (c.json)
    std::snprintf(
        line, sizeof line,
        "{\"time_split_ms\": {\"step\": %.2f, \"products\": %.2f, \"attention\": %.2f, \"communication\": "
        "%.2f, \"optimizer\": %.2f, \"elementwise_norms_rest\": %.2f}, \"dtype\": \"%s\", \"rank\": 0}\n",
        step_ms, prod_ms, attn_ms, comm_ms, opt_ms, rest_ms, c.model.dtype.c_str());
  else
    std::snprintf(
        line, sizeof line,
        "a step in %s, %.1f ms on rank 0: products %.1f ms (%.0f%%), attention %.1f (%.0f%%), communication "
        "%.1f (%.0f%%), optimizer %.1f (%.0f%%), elementwise, norms and the rest %.1f (%.0f%%)\n",
        c.model.dtype.c_str(), step_ms, prod_ms, 100 * prod_ms / step_ms, attn_ms, 100 * attn_ms / step_ms,
        comm_ms, 100 * comm_ms / step_ms, opt_ms, 100 * opt_ms / step_ms, rest_ms, 100 * rest_ms / step_ms);
  if (trained > 0) shard::apps::print0(rt, line);
  if (c.json)
    std::snprintf(
        line, sizeof line,
        "{\"summary\": true, \"framework\": \"shard\", \"ranks\": %d, \"devices_per_rank\": %d, \"mesh\": "
        "\"%s\", \"steps\": %lld, \"tokens_per_second\": %.1f, \"train_seconds\": %.3f, "
        "\"final_loss\": %.6f, \"final_val_loss\": %.6f, \"params\": %lld, \"mfu\": %.4f, \"sgemm_gflops\": "
        "%.1f, "
        "\"dtype\": \"%s\", \"mfu_bf16\": %.4f, \"bf16_gemm_gflops\": %.1f, "
        "\"tokens_per_second_after_first\": %.1f, \"first_step_seconds\": %.3f, \"param_state_bytes\": %lld, "
        "\"jit\": %s, \"fsdp\": %s, \"remat\": \"%s\", \"micro_batches\": %lld, \"step_peak_bytes\": %lld}\n",
        rt.process_count(), rt.devices_per_rank(), mesh_sizes.c_str(), static_cast<long long>(step), tps,
        train_s, last_loss, val, static_cast<long long>(m.parameter_count()), mfu, peak,
        c.model.dtype.c_str(), mfu_bf16, peak_bf16, steady_tps, first_s, static_cast<long long>(state_bytes),
        c.jit ? "true" : "false", c.fsdp ? "true" : "false", c.model.remat.c_str(),
        static_cast<long long>(c.micro_batches), static_cast<long long>(step_peak));
  else
    std::snprintf(line, sizeof line,
                  "done: %lld steps, %.0f tokens/s over %.1f s of training, validation loss %.4f; model FLOP "
                  "utilisation %.1f%% of the measured SGEMM rate (%.1f GFLOP/s)%s\n",
                  static_cast<long long>(step), tps, train_s, val, 100 * mfu, peak,
                  bf16 ? (", " + std::to_string(static_cast<int>(std::lround(100 * mfu_bf16))) +
                          "% of the measured bfloat16 GEMM rate (" +
                          std::to_string(static_cast<int>(peak_bf16)) + " GFLOP/s)")
                             .c_str()
                       : "");
  shard::apps::print0(rt, line);
  if (!c.json) {
    std::snprintf(
        line, sizeof line,
        "parameters and optimizer state: %.2f MB on rank 0%s%s; a step's peak above them (activations "
        "and gradients): %.2f MB (--remat %s, --micro-batches %lld)\n",
        static_cast<double>(state_bytes) / 1e6, c.fsdp ? " (--fsdp)" : "", c.jit ? "; steps jitted" : "",
        static_cast<double>(step_peak) / 1e6, c.model.remat.c_str(), static_cast<long long>(c.micro_batches));
    shard::apps::print0(rt, line);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return shard::apps::run_app(argc, argv, [&](shard::Runtime& rt) {
    namespace po = shard::apps::po;
    Config c;
    std::string jit_off;
    po::options_description options("train_gpt options");
    shard::apps::add_common_options(options);
    options.add_options()(
        "mesh", po::value(&c.mesh_text)->default_value(""),
        "data=D,model=M with D*M = devices (default: data = all), or the hybrid "
        "replica=R,fsdp=F,model=M (parameters split over 'fsdp' inside a host, the batch over "
        "replica x fsdp; implies --fsdp)")("data-dir", po::value(&c.data_dir)->default_value(c.data_dir),
                                           "the fortunes' directory (Debian's fortunes)")(
        "layers", po::value(&c.model.layers)->default_value(c.model.layers), "transformer blocks")(
        "d-model", po::value(&c.model.d_model)->default_value(c.model.d_model),
        "width of the residual stream")("heads", po::value(&c.model.heads)->default_value(c.model.heads),
                                        "attention heads (divisible by model)")(
        "context", po::value(&c.model.context)->default_value(c.model.context),
        "tokens per sequence (divisible by model)")("batch", po::value(&c.batch)->default_value(c.batch),
                                                    "sequences per step (divisible by data)")(
        "steps", po::value(&c.steps)->default_value(c.steps), "optimizer steps in all (the cosine's length)")(
        "lr", po::value(&c.lr)->default_value(c.lr), "peak learning rate")(
        "min-lr", po::value(&c.min_lr)->default_value(c.min_lr), "learning rate at the end of the cosine")(
        "warmup", po::value(&c.warmup)->default_value(c.warmup), "linear warm-up steps from 0")(
        "weight-decay", po::value(&c.weight_decay)->default_value(c.weight_decay),
        "AdamW's decay of matrices and embeddings")("beta2", po::value(&c.beta2)->default_value(c.beta2),
                                                    "AdamW's second-moment decay")(
        "clip", po::value(&c.clip)->default_value(c.clip),
        "clip the gradients' global norm to this (0: off)")("seed", po::value(&c.seed)->default_value(c.seed),
                                                            "parameters' and batches' seed")(
        "eval-every", po::value(&c.eval_every)->default_value(c.eval_every),
        "steps between validation losses (also at the start; 0: at the end only)")(
        "val-windows", po::value(&c.val_windows)->default_value(c.val_windows),
        "validation windows of --context tokens")(
        "log-every", po::value(&c.log_every)->default_value(c.log_every), "steps between --json loss rows")(
        "max-steps", po::value(&c.max_steps)->default_value(0),
        "stop after this many steps in all (0: --steps; the schedule still spans --steps)")(
        "max-seconds", po::value(&c.max_seconds)->default_value(0, "0"),
        "stop training after this long (0: no limit)")(
        "checkpoint-dir", po::value(&c.checkpoint_dir)->default_value(""),
        "write checkpoints here (and --resume, --sample read them)")(
        "checkpoint-every", po::value(&c.checkpoint_every)->default_value(0),
        "steps between checkpoints (0: at the end only)")("keep", po::value(&c.keep)->default_value(2),
                                                          "checkpoints to keep")(
        "resume", "continue from the newest checkpoint in --checkpoint-dir (any mesh, any rank count)")(
        "shard-optimizer-state", "split AdamW's moments over 'data' (ZeRO-1)")(
        "sample", "print text generated by the newest checkpoint in --checkpoint-dir instead of training")(
        "prompt", po::value(&c.prompt)->default_value(c.prompt), "--sample: the text to continue")(
        "sample-tokens", po::value(&c.sample_tokens)->default_value(c.sample_tokens),
        "--sample: bytes to generate")("temperature", po::value(&c.temperature)->default_value(0, "0"),
                                       "--sample: 0 greedy, else softmax(logits / t)")(
        "dump-init", po::value(&c.dump_init)->default_value(""),
        "write the initial parameters as DIR/<name>.npy")(
        "comm-stats",
        "print what rank 0 sent in one training step, per collective and mesh axes (CommStats)")(
        "trace-steps", po::value(&c.trace_steps)->default_value(c.trace_steps),
        "--trace: the training steps the timeline keeps (after the first)")(
        "dtype", po::value(&c.model.dtype)->default_value(c.model.dtype),
        "compute dtype: float32, or bfloat16 (float32 master weights, optimizer state and loss)")(
        "fsdp",
        "split each parameter and its optimizer state over 'data' (ZeRO-3 / FSDP): the loss all_gathers each "
        "weight where it is used and the gradients come back split")(
        "jit", "run each training step as one jitted program (value_and_grad and the optimizer's update)")(
        "remat", po::value(&c.model.remat)->default_value(c.model.remat),
        "rematerialization of the blocks in the backward pass (shard::checkpoint): none, blocks (keep only "
        "each "
        "block's input, run the block again) or dots (keep its products' outputs too)")(
        "micro-batches", po::value(&c.micro_batches)->default_value(c.micro_batches),
        "gradient accumulation: each step's batch in this many micro-batches, their gradients summed before "
        "one update (shard::accumulate_value_and_grad)")(
        "jit-off", po::value(&jit_off)->default_value(""),
        "with --jit, optimizations to switch off (a comma-separated list of fuse, cse, reuse, donate, "
        "propagate, schedule: "
        "shard::JitOptions)")("json",
                              "one JSON object per line (losses, validation, summary) instead of text");
    po::variables_map vm;
    if (!shard::apps::parse_command_line(
            argc, argv, options, vm, rt,
            "Usage: mpirun -n N train_gpt [--mesh data=D,model=M] [--steps S] ...\n"
            "Trains a byte-level GPT on Debian's fortunes."))
      return 0;
    c.json = vm.count("json") > 0;
    c.resume = vm.count("resume") > 0;
    c.sample = vm.count("sample") > 0;
    c.shard_state = vm.count("shard-optimizer-state") > 0;
    c.comm_stats = vm.count("comm-stats") > 0;
    c.jit = vm.count("jit") > 0;
    for (std::size_t at = 0; at < jit_off.size();) {
      const std::size_t comma = std::min(jit_off.find(',', at), jit_off.size());
      c.jit_off.push_back(jit_off.substr(at, comma - at));
      shard::apps::check_choice("jit-off", c.jit_off.back(),
                                {"fuse", "cse", "reuse", "donate", "propagate", "schedule"});
      at = comma + 1;
    }
    if (!c.jit_off.empty() && !c.jit) shard::raise<shard::ValueError>("--jit-off needs --jit");
    c.fsdp = vm.count("fsdp") > 0;
    using shard::apps::check_at_least;
    using shard::apps::check_finite_in;
    for (const auto& [flag, v, lo] :
         {std::tuple<const char*, std::int64_t, std::int64_t>{"layers", c.model.layers, 1},
          {"d-model", c.model.d_model, 1},
          {"heads", c.model.heads, 1},
          {"context", c.model.context, 1},
          {"batch", c.batch, 1},
          {"steps", c.steps, 1},
          {"warmup", c.warmup, 0},
          {"seed", c.seed, 0},
          {"eval-every", c.eval_every, 0},
          {"val-windows", c.val_windows, 1},
          {"log-every", c.log_every, 0},
          {"checkpoint-every", c.checkpoint_every, 0},
          {"keep", c.keep, 1},
          {"max-steps", c.max_steps, 0},
          {"sample-tokens", c.sample_tokens, 0},
          {"trace-steps", c.trace_steps, 1},
          {"micro-batches", c.micro_batches, 1}})
      check_at_least(flag, v, lo);
    check_finite_in("lr", c.lr, 1e-12, 10);
    check_finite_in("min-lr", c.min_lr, 0, 10);
    check_finite_in("weight-decay", c.weight_decay, 0, 1e3);
    check_finite_in("beta2", c.beta2, 0, 0.999999);
    check_finite_in("clip", c.clip, 0, 1e30);
    check_finite_in("max-seconds", c.max_seconds, 0, 1e9);
    check_finite_in("temperature", c.temperature, 0, 100);
    if (c.warmup >= c.steps)
      shard::raise<shard::ValueError>("--warmup ", c.warmup, " must be less than --steps ", c.steps,
                                      " (the cosine decays over the steps after the warm-up)");
    if ((c.resume || c.sample) && c.checkpoint_dir.empty())
      shard::raise<shard::ValueError>("--", c.resume ? "resume" : "sample", " needs --checkpoint-dir");
    return run(rt, c);
  });
}
