#include "shard/train/progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace shard {

ProgressBar::ProgressBar(std::string label, std::int64_t total, std::string unit, bool enabled, std::int64_t every)
    : label_(std::move(label)), unit_(std::move(unit)), total_(std::max<std::int64_t>(total, 1)),
      every_(every > 0 ? every : std::max<std::int64_t>(1, total / 10)), enabled_(enabled),
      tty_(enabled && isatty(1) != 0) {}

namespace {
std::string clock_text(double s) {
  if (!(s >= 0) || s > 1e7) return "?";
  const auto t = static_cast<long long>(s + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%lld:%02lld", t / 60, t % 60);
  return buf;
}
}  // namespace

void ProgressBar::update(std::int64_t done, double rate, double per_step, const std::string& extra) {
  if (!enabled_) return;
  const double left = rate > 0 ? static_cast<double>(total_ - done) * per_step / rate : -1;
  if (tty_) {
    const auto now = std::chrono::steady_clock::now();
    if (done != total_ && now - last_ < std::chrono::milliseconds(200)) return;
    last_ = now;
    const int width = 30;
    const int filled = static_cast<int>(width * std::clamp<std::int64_t>(done, 0, total_) / total_);
    std::printf("\r%s [%s%s] %lld/%lld %s %.0f %s, %s left ", label_.c_str(), std::string(filled, '#').c_str(),
                std::string(width - filled, '.').c_str(), static_cast<long long>(done),
                static_cast<long long>(total_), extra.c_str(), rate, unit_.c_str(), clock_text(left).c_str());
  } else if (done % every_ == 0 || done == total_) {
    std::printf("%s %lld/%lld %s %.0f %s, %s left\n", label_.c_str(), static_cast<long long>(done),
                static_cast<long long>(total_), extra.c_str(), rate, unit_.c_str(), clock_text(left).c_str());
  }
  std::fflush(stdout);
}

void ProgressBar::finish() {
  if (enabled_ && tty_) {
    std::printf("\n");
    std::fflush(stdout);
  }
}

}  // namespace shard
