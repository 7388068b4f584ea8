#pragma once
/// \file A training progress bar (tqdm's): done/total, a rate, the time left and the caller's
/// figures (loss, ...). Redrawn in place at most 5 times a second on a terminal; a plain line
/// every `every` steps (and at the end) when stdout is a file or a pipe. Prints only where
/// it is enabled (rank 0, typically): nothing here communicates.
///
///   // given: const std::int64_t steps = 100; double tokens_per_s = 0, seconds_per_step = 0;
///   shard::ProgressBar bar("train", steps, "tok/s", rt.process_index() == 0);
///   for (std::int64_t step = 0; step < steps; ++step)
///     bar.update(step + 1, tokens_per_s, seconds_per_step, "loss 1.234");
///   bar.finish();

#include <chrono>
#include <cstdint>
#include <string>

namespace shard {

class ProgressBar {
 public:
  /// `total` steps of work; `unit` names the rate update() is given (e.g. "tok/s"); `every`:
  /// steps between plain lines (0: about ten lines in all).
  ProgressBar(std::string label, std::int64_t total, std::string unit, bool enabled, std::int64_t every = 0);
  /// `done` steps finished (1..total) at `rate` units per second, that many per step
  /// (`per_step`, for the time left); `extra` is shown after the counts.
  void update(std::int64_t done, double rate, double per_step, const std::string& extra = "");
  /// Ends the bar's line on a terminal.
  void finish();
  bool enabled() const { return enabled_; }

 private:
  std::string label_, unit_;
  std::int64_t total_, every_;
  bool enabled_, tty_;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace shard
