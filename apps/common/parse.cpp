#include "common/parse.hpp"

#include <cmath>
#include <cerrno>
#include <cstdlib>
#include <exception>
#include <sstream>

#include "shard/error.hpp"

namespace shard::apps {

std::vector<std::int64_t> parse_int_list(const std::string& text, const std::string& flag, const std::string& example,
                                         std::int64_t min) {
  std::vector<std::int64_t> out;
  std::stringstream ss(text);
  for (std::string t; std::getline(ss, t, ',');) {
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(t, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (t.empty() || used != t.size() || v < min)
      raise<ValueError>("bad --", flag, " '", text, "': write sizes like ", example);
    out.push_back(v);
  }
  return out;
}

void check_choice(const std::string& flag, const std::string& value, std::initializer_list<const char*> choices) {
  std::string list;
  std::size_t i = 0;
  for (const char* c : choices) {
    if (value == c) return;
    list += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + std::string(c);
    ++i;
  }
  raise<ValueError>("--", flag, " '", value, "': choose ", list);
}

void check_at_least(const std::string& flag, std::int64_t value, std::int64_t min, const std::string& note) {
  if (value < min) raise<ValueError>("--", flag, " must be >= ", min, note.empty() ? "" : " " + note, ", got ", value);
}

void check_finite_in(const std::string& flag, double value, double lo, double hi) {
  if (!std::isfinite(value) || value < lo || value > hi)
    raise<ValueError>("--", flag, " must be a finite number in [", lo, ", ", hi, "], got ", value);
}

double parse_finite(const std::string& text, const std::string& flag, const std::string& example) {
  const char* v = text.c_str();
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(v, &end);
  if (text.empty() || end == v || *end != '\0' || errno == ERANGE || !std::isfinite(x))
    raise<ValueError>("bad --", flag, " '", text, "': write a number like ", example);
  return x;
}

}  // namespace shard::apps
