#include "shard/mpi/agree.hpp"

#include <chrono>
#include <climits>
#include <string>
#include <thread>
#include <vector>

#include "shard/error.hpp"

namespace shard::mpi {

namespace {
enum Kind : int {
  kGeneric = 0,
  kSharding,
  kShape,
  kValue,
  kMesh,
  kMpi,
  kRuntime,
  kIo,
  kAllocation,
  kMismatch
};
}  // namespace

int error_kind(const std::exception& e) {
  if (dynamic_cast<const CollectiveMismatchError*>(&e)) return kMismatch;  // before its base ValueError
  if (dynamic_cast<const ShardingError*>(&e)) return kSharding;
  if (dynamic_cast<const ShapeError*>(&e)) return kShape;
  if (dynamic_cast<const ValueError*>(&e)) return kValue;
  if (dynamic_cast<const MeshMismatchError*>(&e)) return kMesh;
  if (dynamic_cast<const MpiError*>(&e)) return kMpi;
  if (dynamic_cast<const RuntimeError*>(&e)) return kRuntime;
  if (dynamic_cast<const IoError*>(&e)) return kIo;
  if (dynamic_cast<const AllocationError*>(&e)) return kAllocation;
  return kGeneric;
}

void throw_error_of_kind(int kind, const std::string& msg) {
  switch (kind) {
    case kSharding:
      throw ShardingError(msg);
    case kShape:
      throw ShapeError(msg);
    case kValue:
      throw ValueError(msg);
    case kMesh:
      throw MeshMismatchError(msg);
    case kRuntime:
      throw RuntimeError(msg);
    case kIo:
      throw IoError(msg);
    case kAllocation:
      throw AllocationError(msg);
    case kMismatch:
      throw CollectiveMismatchError(msg);
    default:
      throw Error(msg);
  }
}

void raise_if_any(const Communicator& comm, std::exception_ptr local) {
  const int first = comm.allreduce<int>(local ? comm.rank() : INT_MAX, MPI_MIN);
  if (first == INT_MAX) return;
  raise_failure_of(comm, first, local);
}

void raise_failure_of(const Communicator& comm, int first, std::exception_ptr local) {
  // The lowest failing rank tells the others what happened.
  const int me = comm.rank();
  int header[2] = {0, 0};  // kind, message length
  std::string msg;
  if (me == first) {
    try {
      std::rethrow_exception(local);
    } catch (const Error& e) {
      msg = e.message();
      header[0] = error_kind(e);
    } catch (const std::exception& e) {
      msg = e.what();
    } catch (...) {
      msg = "unknown exception";
    }
    header[1] = static_cast<int>(msg.size());
  }
  check(MPI_Bcast(header, 2, MPI_INT, first, comm.get()), "MPI_Bcast");
  msg.resize(static_cast<std::size_t>(header[1]));
  check(MPI_Bcast(msg.data(), header[1], MPI_CHAR, first, comm.get()), "MPI_Bcast");
  if (local) std::rethrow_exception(local);
  throw_error_of_kind(header[0], "rank " + std::to_string(first) + " failed: " + msg);
}

bool barrier_within(MPI_Comm comm, double seconds) {
  MPI_Request all = MPI_REQUEST_NULL;
  if (MPI_Ibarrier(comm, &all) != MPI_SUCCESS) return false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int done = 0;
  while (MPI_Test(&all, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return done != 0;
}

}  // namespace shard::mpi
