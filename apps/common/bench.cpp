#include "common/bench.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <cctype>
#include <cstdint>

#include "shard/error.hpp"

namespace shard::apps {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

std::vector<int> mesh_shape_from(const std::string& text, int device_count) {
  if (text.empty()) return {device_count};
  std::vector<int> shape;
  std::int64_t devices = 1;
  for (std::size_t begin = 0;;) {  // every 'x'-separated piece, empty ones too ("2x", "x2", "2xx2")
    const std::size_t end = std::min(text.find('x', begin), text.size());
    const std::string t = text.substr(begin, end - begin);
    std::size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(t, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (t.empty() || used != t.size() || v < 1 || !std::isdigit(static_cast<unsigned char>(t[0])))
      raise<ValueError>("bad --mesh '", text, "': write the shape like 4x2 (positive integers joined by 'x')");
    shape.push_back(v);
    devices = std::min<std::int64_t>(devices * v, std::int64_t{1} << 40);
    if (end == text.size()) break;
    begin = end + 1;
  }
  if (devices != device_count)
    raise<ValueError>("--mesh ", text, " has ", devices, " devices, but the job has ", device_count,
                      " (ranks x devices per rank); use a mesh whose sizes multiply to ", device_count);
  return shape;
}

}  // namespace shard::apps
