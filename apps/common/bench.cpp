#include "common/bench.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <sstream>

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
  std::vector<int> shape;
  std::stringstream ss(text);
  for (std::string t; std::getline(ss, t, 'x');) {
    std::size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(t, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != t.size() || v < 1) raise<ValueError>("bad --mesh '", text, "': write the shape like 4x2");
    shape.push_back(v);
  }
  if (shape.empty()) shape = {device_count};
  return shape;
}

}  // namespace shard::apps
