#include "shard/error.hpp"

#include <mpi.h>

#include <string>

namespace shard {

namespace detail {

std::string rank_prefix() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return "[rank ?] ";
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return "[rank " + std::to_string(rank) + "] ";
}

}  // namespace detail

Error::Error(const std::string& message)
    : std::runtime_error(detail::rank_prefix() + message), message_(message) {}

MpiError::MpiError(const std::string& routine, int code, const std::string& message)
    : Error(routine + " failed: " + message + " (MPI error code " + std::to_string(code) + ")"),
      routine_(routine),
      code_(code) {}

}  // namespace shard
