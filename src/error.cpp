#include "shard/error.hpp"

#include <cmath>

#include <mpi.h>

#include <atomic>
#include <string>
#include <string_view>

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

namespace {

/// The directory holding `file` ("" when it has none), with its trailing slash.
std::string_view directory_of(std::string_view file) {
  const auto slash = file.find_last_of('/');
  return slash == std::string_view::npos ? std::string_view{} : file.substr(0, slash + 1);
}

/// Shard's own source tree as this file was compiled: <root>/src/ and <root>/include/shard/.
bool in_library_build(std::string_view file) {
  static const std::string src(directory_of(__FILE__));  // <root>/src/
  static const std::string root = src.size() >= 4 ? src.substr(0, src.size() - 4) : std::string();
  static const std::string include = root + "include/shard/";
  return (!src.empty() && file.starts_with(src)) || file.starts_with(include);
}

bool is_user_file(const shard::source_location& where, std::string_view header) {
  const std::string_view file = where.file_name();
  if (where.line() == 0 || file.empty()) return false;
  const std::string_view headers = directory_of(header);  // <include>/shard/ as the caller's TU saw it
  if (!headers.empty() && file.starts_with(headers)) return false;
  if (file.starts_with("/usr/include/") || file.starts_with("/usr/lib/")) return false;  // std::make_shared, emplace...
  return !in_library_build(file);
}

std::string site_text(const shard::source_location& where, const char* api) {
  std::string s = cat(where.file_name(), ":", where.line());
  if (api && *api) s += cat(", in shard::", api);
  return s;
}

}  // namespace

bool CallScope::from_user() const { return is_user_file(where_, header_); }

std::string user_call_site(const shard::source_location& where) {
  const CallScope* top = CallScope::innermost();
  if (is_user_file(where, top ? top->header_name() : "")) return site_text(where, nullptr);
  for (const CallScope* s = top; s; s = s->previous())
    if (s->from_user()) return site_text(s->where(), s->api());
  return {};
}

void check_finite_in(const std::string& what, double v, double lo, double hi, bool lo_open, bool hi_open) {
  const bool ok = std::isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  if (!ok)
    throw ValueError(cat(what, " must be a finite number in ", lo_open ? "(" : "[", lo, ", ", hi, hi_open ? ")" : "]",
                         ", got ", v));
}

}  // namespace detail

namespace {
/// " (at main.cpp:42, in shard::matmul)" for a message that does not name that place yet.
std::string with_call_site(const std::string& message) {
  const std::string site = detail::user_call_site();
  if (site.empty()) return message;
  const std::string place = site.substr(0, site.find(','));
  if (message.find(place) != std::string::npos) return message;  // already there (an agreed message)
  return message + " (at " + site + ")";
}
}  // namespace

Error::Error(const std::string& message)
    : std::runtime_error(message), message_(with_call_site(message)), what_(detail::rank_prefix() + message_) {}

namespace detail {
std::exception_ptr copy_exception(const std::exception_ptr& err) {
  if (!err) return err;
  try {
    std::rethrow_exception(err);
  } catch (const Error& e) {
    return e.copy();
  } catch (...) {
    return err;
  }
}
}  // namespace detail

void Error::add_context(const std::string& line) {
  message_ += "\n  " + line;
  what_ += "\n  " + line;
}

MpiError::MpiError(const std::string& routine, int code, const std::string& message)
    : Error(routine + " failed: " + message + " (MPI error code " + std::to_string(code) + ")"),
      routine_(routine),
      code_(code) {}

}  // namespace shard
