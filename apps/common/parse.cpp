#include "common/parse.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

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

namespace {

/// "a=2,b=3": the size of each axis of `names` (0 where left out); ValueError naming `example` for
/// another name, a size below 1, a missing '=' or a trailing comma, and for an axis given twice.
std::vector<int> axis_sizes(const std::string& text, const std::vector<std::string>& names,
                            const char* example) {
  std::vector<int> sizes(names.size(), 0);
  if (!text.empty() && text.back() == ',')
    shard::raise<shard::ValueError>("bad --mesh '", text, "': write it like ", example);
  std::stringstream ss(text);
  for (std::string t; std::getline(ss, t, ',');) {
    const auto eq = t.find('=');
    int v = 0;
    std::size_t used = 0;
    try {
      v = eq == std::string::npos ? 0 : std::stoi(t.substr(eq + 1), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    const auto at = std::find(names.begin(), names.end(), t.substr(0, eq));
    if (eq == std::string::npos || used != t.size() - eq - 1 || v < 1 || at == names.end())
      shard::raise<shard::ValueError>("bad --mesh '", text, "': write it like ", example);
    int& axis = sizes[static_cast<std::size_t>(at - names.begin())];
    if (axis != 0) shard::raise<shard::ValueError>("bad --mesh '", text, "': '", *at, "' is given twice");
    axis = v;
  }
  return sizes;
}

[[noreturn]] void raise_not_the_devices(const std::string& text, int devices) {
  shard::raise<shard::ValueError>("--mesh '", text, "' does not multiply to the ", devices,
                                  " devices of this job (ranks x --devices-per-rank)");
}

}  // namespace

std::pair<int, int> parse_data_model_mesh(const std::string& text, int devices) {
  const std::vector<int> sizes = axis_sizes(text, {"data", "model"}, "data=4,model=2");
  int data = sizes[0], model = sizes[1];
  if (data == 0 && model == 0) data = devices;
  if (data == 0) data = model > 0 && devices % model == 0 ? devices / model : -1;
  if (model == 0) model = devices % data == 0 ? devices / data : -1;
  if (data < 1 || model < 1 || static_cast<long long>(data) * model != devices)
    raise_not_the_devices(text, devices);
  return {data, model};
}

std::pair<std::vector<std::string>, std::vector<int>> parse_training_mesh(const std::string& text,
                                                                          int devices) {
  if (text.find("replica") == std::string::npos && text.find("fsdp") == std::string::npos) {
    const auto [data, model] = parse_data_model_mesh(text, devices);
    return {{"data", "model"}, {data, model}};
  }
  const std::vector<std::string> names{"replica", "fsdp", "model"};
  std::vector<int> sizes = axis_sizes(text, names, "replica=2,fsdp=2,model=1");
  if (sizes[2] == 0) sizes[2] = 1;
  for (const std::size_t rest : {std::size_t{0}, std::size_t{1}})
    if (sizes[rest] == 0) {
      const long long others = static_cast<long long>(sizes[1 - rest]) * sizes[2];
      sizes[rest] = others > 0 && devices % others == 0 ? static_cast<int>(devices / others) : -1;
    }
  if (sizes[0] < 1 || sizes[1] < 1 || static_cast<long long>(sizes[0]) * sizes[1] * sizes[2] != devices)
    raise_not_the_devices(text, devices);
  return {names, sizes};
}

}  // namespace shard::apps
