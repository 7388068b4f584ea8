#include "shard/mpi/communicator.hpp"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "shard/error.hpp"

namespace shard::mpi {

void check(int rc, const char* routine) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  throw MpiError(routine, rc, std::string(text, static_cast<std::size_t>(len)));
}

bool is_active() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

Communicator Communicator::attach(MPI_Comm comm) { return Communicator(comm, false); }
Communicator Communicator::adopt(MPI_Comm comm) { return Communicator(comm, true); }

Communicator::Communicator(Communicator&& other) noexcept
    : comm_(std::exchange(other.comm_, MPI_COMM_NULL)), owned_(std::exchange(other.owned_, false)) {}

Communicator& Communicator::operator=(Communicator&& other) noexcept {
  if (this != &other) {
    reset();
    comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
    owned_ = std::exchange(other.owned_, false);
  }
  return *this;
}

Communicator::~Communicator() { reset(); }

void Communicator::reset() noexcept {
  // Never throws: a communicator outliving MPI_Finalize is simply dropped.
  if (owned_ && comm_ != MPI_COMM_NULL && is_active()) MPI_Comm_free(&comm_);
  comm_ = MPI_COMM_NULL;
  owned_ = false;
}

int Communicator::rank() const {
  int r = -1;
  check(MPI_Comm_rank(comm_, &r), "MPI_Comm_rank");
  return r;
}

int Communicator::size() const {
  int s = 0;
  check(MPI_Comm_size(comm_, &s), "MPI_Comm_size");
  return s;
}

namespace {
Communicator adopt_with_errors_return(MPI_Comm comm) {
  Communicator c = Communicator::adopt(comm);
  if (!c.is_null()) check(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  return c;
}
}  // namespace

Communicator Communicator::dup() const {
  MPI_Comm out = MPI_COMM_NULL;
  check(MPI_Comm_dup(comm_, &out), "MPI_Comm_dup");
  return adopt_with_errors_return(out);
}

Communicator Communicator::split(int color, int key) const {
  MPI_Comm out = MPI_COMM_NULL;
  check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &out), "MPI_Comm_split");
  return adopt_with_errors_return(out);
}

Communicator Communicator::split_shared() const {
  MPI_Comm out = MPI_COMM_NULL;
  check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank(), MPI_INFO_NULL, &out),
        "MPI_Comm_split_type");
  return adopt_with_errors_return(out);
}

void Communicator::barrier() const { check(MPI_Barrier(comm_), "MPI_Barrier"); }

void Communicator::gather_texts(const std::string& mine, int root,
                                const std::function<void(int, const std::string&)>& sink) const {
  const int n = size(), me = rank();
  const auto length = static_cast<std::int64_t>(mine.size());
  std::vector<std::int64_t> lengths(me == root ? static_cast<std::size_t>(n) : 0);
  check(MPI_Gather(&length, 1, MPI_INT64_T, lengths.data(), 1, MPI_INT64_T, root, comm_), "MPI_Gather");
  constexpr std::int64_t kPiece = std::int64_t{1} << 30;  // under MPI's int count
  if (me != root) {
    for (std::int64_t at = 0; at < length; at += kPiece)
      check(MPI_Send(mine.data() + at, static_cast<int>(std::min(kPiece, length - at)), MPI_CHAR, root, 0, comm_),
            "MPI_Send");
    return;
  }
  std::string text;
  for (int r = 0; r < n; ++r) {
    if (r == me) {
      sink(r, mine);
      continue;
    }
    text.resize(static_cast<std::size_t>(lengths[static_cast<std::size_t>(r)]));
    for (std::int64_t at = 0; at < static_cast<std::int64_t>(text.size()); at += kPiece)
      check(MPI_Recv(text.data() + at, static_cast<int>(std::min(kPiece, static_cast<std::int64_t>(text.size()) - at)),
                     MPI_CHAR, r, 0, comm_, MPI_STATUS_IGNORE),
            "MPI_Recv");
    sink(r, text);
  }
}

}  // namespace shard::mpi
