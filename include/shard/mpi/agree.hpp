#pragma once
/// \file Turning an error that only some ranks see into the same error on every rank.

#include <exception>
#include <string>

#include "shard/mpi/communicator.hpp"

namespace shard::mpi {

/// Collective over `comm`: if any rank passes a non-null exception, every rank throws.
/// The lowest failing rank's message is broadcast; a failing rank rethrows its own exception,
/// the others throw the same shard::Error subclass with "rank R failed: <message>".
void raise_if_any(const Communicator& comm, std::exception_ptr local);

/// The second half of raise_if_any, for callers that learned `first` (the lowest failing rank)
/// from an agreement of their own: broadcasts its message and throws on every rank.
[[noreturn]] void raise_failure_of(const Communicator& comm, int first, std::exception_ptr local);

/// A small integer naming the shard::Error subclass of `e` (0 for others), and an exception of
/// that subclass carrying `message`: how an error travels from one rank to the others.
int error_kind(const std::exception& e);
[[noreturn]] void throw_error_of_kind(int kind, const std::string& message);

/// For ranks that failed and wait for the others to fail too: joins a nonblocking barrier on
/// `comm` and polls it for at most `seconds`. True if every rank of `comm` joined in time;
/// never throws (an MPI error gives false).
bool barrier_within(MPI_Comm comm, double seconds);

/// Runs `fn` and agrees on its outcome over `comm` (see raise_if_any).
template <typename F>
void agreed(const Communicator& comm, F&& fn) {
  std::exception_ptr err;
  try {
    fn();
  } catch (...) {
    err = std::current_exception();
  }
  raise_if_any(comm, err);
}

}  // namespace shard::mpi
