// Checked reads of Shard's environment variables (shard/runtime/detail/env.hpp).

#include "shard/runtime/detail/env.hpp"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

#include "shard/error.hpp"

namespace shard::detail {

namespace {

const char* value_of(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

}  // namespace

std::optional<bool> env_flag(const char* name) {
  const char* v = value_of(name);
  if (!v) return std::nullopt;
  std::string t = v;
  for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (t == "1" || t == "on" || t == "true" || t == "yes") return true;
  if (t == "0" || t == "off" || t == "false" || t == "no") return false;
  raise<RuntimeError>(name, " must be 1 or 0 (on/off, true/false, yes/no), got '", v, "'");
}

std::optional<double> env_seconds(const char* name, double max_seconds) {
  const char* v = value_of(name);
  if (!v) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double t = std::strtod(v, &end);
  if (end == v || *end != '\0' || errno == ERANGE || !std::isfinite(t) || t < 0 || t > max_seconds)
    raise<RuntimeError>(name, " must be a number of seconds in [0, ", max_seconds, "], got '", v, "'");
  return t;
}

long parse_integer(const std::string& text, const std::string& what, long min, long max) {
  const char* v = text.c_str();
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(v, &end, 10);
  if (text.empty() || end == v || *end != '\0' || errno == ERANGE || n < min || n > max)
    raise<RuntimeError>(what, " must be an integer in [", min, ", ", max, "], got '", text, "'");
  return n;
}

std::optional<long> env_integer(const char* name, long min, long max) {
  const char* v = value_of(name);
  if (!v) return std::nullopt;
  return parse_integer(v, name, min, max);
}

}  // namespace shard::detail
