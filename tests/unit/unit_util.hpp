#pragma once
// Helpers shared by the single-process unit tests.

#include <gtest/gtest.h>

#include <exception>
#include <numeric>
#include <string>
#include <vector>

namespace shard::unit {

/// Device ids 0..n-1.
inline std::vector<int> iota_ids(int n) {
  std::vector<int> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

/// Runs `f`, expects it to throw E, and returns the message (empty, with a test failure, if
/// it threw something else or nothing).
template <typename E, typename F>
std::string thrown_message(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no exception thrown";
  return "";
}

}  // namespace shard::unit
