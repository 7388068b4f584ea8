#pragma once
/// \file Typed exceptions. Every message starts with "[rank r] " (the MPI rank that raised
/// it, or "[rank ?]" before MPI is up) and names what is wrong and how to fix it.

#include <cstdint>
#include <exception>
#include <source_location>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace shard {

/// std::source_location where the standard library has it; otherwise (clang 14 on libstdc++
/// 12, whose <source_location> needs a builtin that compiler lacks) the same interface from the
/// compilers' __builtin_FILE / __builtin_LINE / __builtin_FUNCTION, so the library builds there
/// too. Every public call that names its caller's line takes one, defaulted to current().
#if defined(__cpp_lib_source_location)
using source_location = std::source_location;
#else
class source_location {
 public:
  static constexpr source_location current(const char* file = __builtin_FILE(),
                                           const char* function = __builtin_FUNCTION(),
                                           std::uint_least32_t line = __builtin_LINE()) noexcept {
    source_location s;
    s.file_ = file;
    s.function_ = function;
    s.line_ = line;
    return s;
  }
  constexpr source_location() noexcept = default;
  constexpr const char* file_name() const noexcept { return file_; }
  constexpr const char* function_name() const noexcept { return function_; }
  constexpr std::uint_least32_t line() const noexcept { return line_; }
  constexpr std::uint_least32_t column() const noexcept { return 0; }

 private:
  const char* file_ = "";
  const char* function_ = "";
  std::uint_least32_t line_ = 0;
};
#endif

/// Base of every exception Shard throws. A message raised while a public call made from the
/// user's code is in progress ends with that call's place: "... (at main.cpp:42, in
/// shard::matmul)" (detail::CallScope; the innermost call whose source file is not Shard's).
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message);
  /// The message without the "[rank r] " prefix that what() carries.
  const std::string& message() const { return message_; }
  const char* what() const noexcept override { return what_.c_str(); }
  /// Appends a line of context to the message (shard_map adds the body's device and shapes to
  /// an error raised inside a body before rethrowing it).
  void add_context(const std::string& line);
  /// A copy of this exception with its dynamic type. A failure shared by the devices of a rank
  /// (a collective that failed for all of them) is rethrown on each device thread as its own
  /// copy, so each can add its own context without racing the others.
  virtual std::exception_ptr copy() const { return std::make_exception_ptr(*this); }

 private:
  std::string message_;
  std::string what_;
};

/// A spec, mesh or sharding that cannot describe a layout (unknown axis, axis used twice...).
class ShardingError : public Error {
 public:
  using Error::Error;
  std::exception_ptr copy() const override { return std::make_exception_ptr(*this); }
};
/// Array shapes that do not fit the operation (mismatch, indivisible, out of range dim).
class ShapeError : public Error {
 public:
  using Error::Error;
  std::exception_ptr copy() const override { return std::make_exception_ptr(*this); }
};
/// A bad argument value that is neither a sharding nor a shape problem.
class ValueError : public Error {
 public:
  using Error::Error;
  std::exception_ptr copy() const override { return std::make_exception_ptr(*this); }
};
/// Arrays placed on different meshes (or the same devices in another order).
class MeshMismatchError : public Error {
 public:
  using Error::Error;
  std::exception_ptr copy() const override { return std::make_exception_ptr(*this); }
};
/// An MPI routine returned an error code.
class MpiError : public Error {
 public:
  MpiError(const std::string& routine, int code, const std::string& message);
  const std::string& routine() const { return routine_; }
  int code() const { return code_; }
  std::exception_ptr copy() const override { return std::make_exception_ptr(*this); }

 private:
  std::string routine_;
  int code_;
};
/// Runtime set-up problems (MPI thread level, devices per rank, no runtime alive).
class RuntimeError : public Error {
 public:
  using Error::Error;
  std::exception_ptr copy() const override { return std::make_exception_ptr(*this); }
};
/// Memory for an array could not be allocated (names the shape and the bytes asked for).
class AllocationError : public Error {
 public:
  using Error::Error;
  std::exception_ptr copy() const override { return std::make_exception_ptr(*this); }
};
/// File input/output problems (agreed across ranks before being thrown).
class IoError : public Error {
 public:
  using Error::Error;
  std::exception_ptr copy() const override { return std::make_exception_ptr(*this); }
};
/// Ranks issued different collectives (found by SHARD_CHECK_COLLECTIVES); raised on every rank.
class CollectiveMismatchError : public ValueError {
 public:
  using ValueError::ValueError;
  std::exception_ptr copy() const override { return std::make_exception_ptr(*this); }
};

namespace detail {

/// One public call in progress on this thread: what the user called and where (a
/// source_location defaulted at the user's call). Scopes nest; an error message names the
/// innermost one made from a file outside Shard's headers and sources (an op called inside an
/// optimizer names the optimizer's call; one called in a shard_map body names the body's line).
/// Costs two thread-local stores; operators (a + b) cannot take a location and leave the
/// enclosing scope in place.
class CallScope {
 public:
  CallScope(const char* api, const shard::source_location& where) noexcept
      : api_(api), where_(where), header_(shard::source_location::current().file_name()), previous_(top()) {
    top() = this;
  }
  ~CallScope() { top() = previous_; }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

  const char* api() const { return api_; }
  const shard::source_location& where() const { return where_; }
  const CallScope* previous() const { return previous_; }
  const char* header_name() const { return header_; }
  /// Whether the call was made from the user's code (not from Shard's own headers or sources).
  bool from_user() const;
  /// The innermost scope of this thread (null when none).
  static const CallScope* innermost() { return top(); }

 private:
  static const CallScope*& top() {
    thread_local const CallScope* t = nullptr;
    return t;
  }
  const char* api_;
  shard::source_location where_;
  const char* header_;  // this header's path as the including translation unit sees it
  const CallScope* previous_;
};

/// "main.cpp:42, in shard::matmul" for the innermost user call in progress on this thread
/// (`where` first when it is itself in user code), or "" when there is none. The user's file
/// as its compiler named it; never a path of Shard's build.
std::string user_call_site(const shard::source_location& where = {});

/// The "[rank r] " prefix for messages of this process (MPI world rank; "?" before init).
std::string rank_prefix();
/// Called by the Runtime once MPI is initialised (and with -1 at finalisation).
void remember_world_rank(int rank);

/// Concatenates the streamable arguments into one string.
template <typename... Args>
std::string cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

/// The message of a caught exception: Error::message() (no rank prefix), what() for other
/// std::exceptions, `fallback` for anything else (throw 42).
std::string error_message(const std::exception_ptr& err, const std::string& fallback);

/// A copy of a caught exception for another thread: Error::copy() for Shard's errors (their
/// dynamic type kept), the same pointer for others (nothing in Shard mutates them).
std::exception_ptr copy_exception(const std::exception_ptr& err);

/// An API argument that must be a finite number in [lo, hi] (an open end with `lo_open` /
/// `hi_open`): ValueError "<what> must be a finite number in [lo, hi], got v" otherwise. The
/// library's one check of float arguments (optimizer hyperparameters, schedules, ...).
void check_finite_in(const std::string& what, double v, double lo, double hi, bool lo_open = false,
                     bool hi_open = false);

}  // namespace detail

/// Throws E with the rank prefix and the concatenated arguments as message.
template <typename E, typename... Args>
[[noreturn]] void raise(Args&&... args) {
  throw E(detail::cat(std::forward<Args>(args)...));
}

}  // namespace shard
