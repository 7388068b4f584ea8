#pragma once
// CheckOn: the collective consistency check (SHARD_CHECK_COLLECTIVES) on for one test.

#include "shard/comm/detail/collective_guard.hpp"

namespace shard::testing {

/// Turns the check on for one test (every rank does the same), restoring the setting after.
class CheckOn {
 public:
  CheckOn() : check_(detail::collective_check_on()), timeout_(detail::collective_timeout()) {
    detail::set_collective_guard(true, timeout_);
  }
  ~CheckOn() { detail::set_collective_guard(check_, timeout_); }
  CheckOn(const CheckOn&) = delete;
  CheckOn& operator=(const CheckOn&) = delete;

 private:
  bool check_;
  double timeout_;
};

}  // namespace shard::testing
