#pragma once
// Two 2-D meshes over all devices, for tests that move arrays between meshes: 'a' over every
// device, then 'a' x 'b' = n/2 x 2 (or 1 x n when n is odd).

#include <vector>

#include "mpi_test.hpp"

namespace shard::testing {

inline std::vector<Mesh> two_meshes() {
  const int n = runtime().device_count();
  std::vector<Mesh> out{make_mesh({n, 1}, {"a", "b"})};
  if (n % 2 == 0)
    out.push_back(make_mesh({n / 2, 2}, {"a", "b"}));
  else
    out.push_back(make_mesh({1, n}, {"a", "b"}));
  return out;
}

}  // namespace shard::testing
