// What a move costs, for jit's propagation (jit/cost_model.hpp).

#include "shard/jit/cost_model.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>

#include "shard/error.hpp"

namespace shard {

CostModel default_cost_model() {
  // collectives_bench --cost-model, 2 ranks (one per core) of the 2-core reference VM, float64,
  // sizes 8 B .. 16 MiB, 2026-11-28 (docs/performance.md, "jit: what propagation moves").
  CostModel m;
  m.psum = {1.69, 1.79e-4};
  m.all_gather = {1.92, 2.16e-4};
  m.all_to_all = {1.94, 1.92e-4};
  m.exchange = {2.2, 1.3e-4};
  return m;
}

namespace {

double number(const std::string& text, const std::string& entry) {
  const char* v = text.c_str();
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(v, &end);
  if (text.empty() || end == v || *end != '\0' || errno == ERANGE || !std::isfinite(x) || x < 0)
    raise<ValueError>("cost model: '", entry, "': '", text,
                      "' is not a number >= 0 (write kind=latency_us+us_per_byte, e.g. psum=1.2+0.00033)");
  return x;
}

}  // namespace

CostModel CostModel::parse(const std::string& text, const CostModel& base) {
  CostModel m = base;
  std::stringstream in(text);
  std::string entry;
  while (std::getline(in, entry, ',')) {
    if (entry.empty()) continue;
    const auto eq = entry.find('=');
    const auto plus = entry.find('+', eq == std::string::npos ? 0 : eq + 1);
    if (eq == std::string::npos || plus == std::string::npos)
      raise<ValueError>(
          "cost model: '", entry,
          "' is not kind=latency_us+us_per_byte (kinds: psum, all_gather, all_to_all, exchange)");
    const std::string kind = entry.substr(0, eq);
    CollectiveCost c{number(entry.substr(eq + 1, plus - eq - 1), entry),
                     number(entry.substr(plus + 1), entry)};
    if (kind == "psum")
      m.psum = c;
    else if (kind == "all_gather")
      m.all_gather = c;
    else if (kind == "all_to_all")
      m.all_to_all = c;
    else if (kind == "exchange")
      m.exchange = c;
    else
      raise<ValueError>("cost model: unknown kind '", kind, "' in '", entry,
                        "' (kinds: psum, all_gather, all_to_all, exchange)");
  }
  return m;
}

std::string CostModel::to_string() const {
  std::ostringstream os;
  os.precision(3);
  auto one = [&](const char* kind, const CollectiveCost& c, const char* sep) {
    os << kind << "=" << c.latency_us << "+" << c.us_per_byte << sep;
  };
  one("psum", psum, ",");
  one("all_gather", all_gather, ",");
  one("all_to_all", all_to_all, ",");
  one("exchange", exchange, "");
  return os.str();
}

const CostModel& CostModel::current() {
  static const CostModel model = [] {
    const char* v = std::getenv("SHARD_COST_MODEL");
    if (!v || !*v) return default_cost_model();
    try {
      return parse(v, default_cost_model());
    } catch (const ValueError& e) {
      raise<ValueError>("SHARD_COST_MODEL: ", e.what());
    }
  }();
  return model;
}

}  // namespace shard
