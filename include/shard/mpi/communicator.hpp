#pragma once
/// \file Thin RAII over MPI communicators and the checks every MPI call goes through.

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "shard/error.hpp"

namespace shard::mpi {

/// Throws shard::MpiError naming the routine, the rank and MPI's error string if rc != MPI_SUCCESS.
void check(int rc, const char* routine);

/// The library's one guard of MPI's int counts and displacements: n as an int, or an E
/// (ValueError unless given) "<what...>: <n> <counted> exceed MPI's int count limit
/// (2147483647)". `counted` says what n counts and where ("elements in one MPI call"); the
/// `what` pieces name the operation and are concatenated only when raising.
template <typename E = ValueError, typename... What>
int int_count(std::int64_t n, const char* counted, const What&... what) {
  constexpr std::int64_t kLimit = std::numeric_limits<int>::max();
  if (n < 0) raise<E>(what..., ": a negative count (", n, " ", counted, ")");
  if (n > kLimit) raise<E>(what..., ": ", n, " ", counted, " exceed MPI's int count limit (", kLimit, ")");
  return static_cast<int>(n);
}

/// True between MPI_Init and MPI_Finalize.
bool is_active();

/// The MPI datatype of a C++ arithmetic type (or of a storage class such as shard::bfloat16).
template <typename T>
MPI_Datatype datatype() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, bool>) return MPI_CXX_BOOL;
  else if constexpr (std::is_same_v<U, float>) return MPI_FLOAT;
  else if constexpr (std::is_same_v<U, double>) return MPI_DOUBLE;
  else if constexpr (std::is_same_v<U, std::int32_t>) return MPI_INT32_T;
  else if constexpr (std::is_same_v<U, std::int64_t>) return MPI_INT64_T;
  else if constexpr (std::is_same_v<U, std::uint64_t>) return MPI_UINT64_T;
  else if constexpr (std::is_same_v<U, std::uint8_t>) return MPI_UINT8_T;
  else if constexpr (std::is_same_v<U, std::uint16_t>) return MPI_UINT16_T;
  // A class that names its storage (shard::bfloat16: std::uint16_t) moves as those bits; MPI
  // never reduces it (the collectives widen bfloat16 to float32 for sums).
  else if constexpr (requires { typename U::storage_type; }) return datatype<typename U::storage_type>();
  else if constexpr (std::is_same_v<U, char>) return MPI_CHAR;
  else static_assert(sizeof(U) == 0, "no MPI datatype for this type");
}

/// A move-only communicator: owning (freed in the destructor, never throws) or attached
/// (a world communicator it must not free).
class Communicator {
 public:
  Communicator() = default;
  /// Attaches to `comm` without taking ownership.
  static Communicator attach(MPI_Comm comm);
  /// Takes ownership of `comm` (freed with MPI_Comm_free unless it is MPI_COMM_NULL).
  static Communicator adopt(MPI_Comm comm);

  Communicator(Communicator&& other) noexcept;
  Communicator& operator=(Communicator&& other) noexcept;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  ~Communicator();

  MPI_Comm get() const { return comm_; }
  bool is_null() const { return comm_ == MPI_COMM_NULL; }
  int rank() const;
  int size() const;

  /// Collective over this communicator: MPI_Comm_dup, with MPI_ERRORS_RETURN set.
  Communicator dup() const;
  /// Collective over this communicator: MPI_Comm_split (color < 0 gives a null communicator).
  Communicator split(int color, int key) const;
  /// Collective over this communicator: MPI_Comm_split_type(MPI_COMM_TYPE_SHARED).
  Communicator split_shared() const;

  /// Collective: MPI_Barrier.
  void barrier() const;
  /// Collective: allreduce of one value with `op`.
  template <typename T>
  T allreduce(T value, MPI_Op op) const {
    T out{};
    check(MPI_Allreduce(&value, &out, 1, datatype<T>(), op, comm_), "MPI_Allreduce");
    return out;
  }
  /// Collective: every rank's `mine` (the same count on every rank), concatenated in rank order,
  /// on every rank.
  template <typename T>
  std::vector<T> allgather(const std::vector<T>& mine) const {
    const int n = int_count(static_cast<std::int64_t>(mine.size()), "elements in one MPI call", "MPI_Allgather");
    std::vector<T> out(mine.size() * static_cast<std::size_t>(size()));
    check(MPI_Allgather(mine.data(), n, datatype<T>(), out.data(), n, datatype<T>(), comm_), "MPI_Allgather");
    return out;
  }
  /// Collective: `root`'s value on every rank.
  template <typename T>
  T broadcast(T value, int root) const {
    check(MPI_Bcast(&value, 1, datatype<T>(), root, comm_), "MPI_Bcast");
    return value;
  }
  /// Collective: `root` receives every rank's text in rank order (its own too) and hands each to
  /// `sink(rank, text)` as it arrives (one rank's text in memory at a time); the others send theirs.
  void gather_texts(const std::string& mine, int root, const std::function<void(int, const std::string&)>& sink) const;
  /// Collective: true on every rank iff `flag` is true on any rank.
  bool any(bool flag) const { return allreduce<int>(flag ? 1 : 0, MPI_MAX) != 0; }

 private:
  explicit Communicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {}
  void reset() noexcept;

  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owned_ = false;
};

}  // namespace shard::mpi
