#pragma once
// Helpers shared by the benchmark apps.

#include <string>
#include <vector>

namespace shard::apps {

/// The median of the values (the mean of the middle two for an even count; 0 when empty).
double median(std::vector<double> v);
/// Minor page faults of this process so far (getrusage).
long minor_faults();
/// "2x2" -> {2, 2}; empty text -> {device_count}. Throws ValueError on bad text ("2x", "0x2",
/// "2by2") or a shape whose sizes do not multiply to device_count (the same on every rank).
std::vector<int> mesh_shape_from(const std::string& text, int device_count);

}  // namespace shard::apps
