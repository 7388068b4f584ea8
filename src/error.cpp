#include "shard/error.hpp"

#include <cmath>

#include <mpi.h>

#include <atomic>
#include <string>

namespace shard {

namespace detail {

namespace {
std::atomic<int> g_world_rank{-1};  // set once MPI is up, so device threads never call MPI here
}

void remember_world_rank(int rank) { g_world_rank.store(rank); }

std::string rank_prefix() {
  if (const int r = g_world_rank.load(); r >= 0) return "[rank " + std::to_string(r) + "] ";
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return "[rank ?] ";
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return "[rank " + std::to_string(rank) + "] ";
}

std::string error_message(const std::exception_ptr& err, const std::string& fallback) {
  try {
    std::rethrow_exception(err);
  } catch (const Error& e) {
    return e.message();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
  }
  return fallback;
}

void check_finite_in(const std::string& what, double v, double lo, double hi, bool lo_open, bool hi_open) {
  const bool ok = std::isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  if (!ok)
    throw ValueError(cat(what, " must be a finite number in ", lo_open ? "(" : "[", lo, ", ", hi, hi_open ? ")" : "]",
                         ", got ", v));
}

}  // namespace detail

Error::Error(const std::string& message)
    : std::runtime_error(detail::rank_prefix() + message), message_(message) {}

MpiError::MpiError(const std::string& routine, int code, const std::string& message)
    : Error(routine + " failed: " + message + " (MPI error code " + std::to_string(code) + ")"),
      routine_(routine),
      code_(code) {}

}  // namespace shard
