#include "shard/sharding/partition_spec.hpp"

#include <cctype>
#include <sstream>

#include "shard/error.hpp"

namespace shard {

namespace {

/// An axis name in quotes: single quotes as Python prints them, double quotes when the name holds
/// a single quote (a name parsed from either kind of quotes prints back to the same name).
std::string quoted(const std::string& name) {
  const char q = name.find('\'') == std::string::npos ? '\'' : '"';
  return q + name + q;
}

}  // namespace

std::string SpecEntry::to_string() const {
  if (axes_.empty()) return "None";
  if (axes_.size() == 1) return quoted(axes_[0]);
  std::string s = "(";
  for (std::size_t i = 0; i < axes_.size(); ++i) s += (i ? "," : "") + quoted(axes_[i]);
  return s + ")";
}

const SpecEntry& PartitionSpec::operator[](int dim) const {
  static const SpecEntry kNone;
  return dim >= 0 && dim < size() ? entries_[dim] : kNone;
}

std::vector<std::string> PartitionSpec::axes() const {
  std::vector<std::string> out;
  for (const auto& e : entries_) out.insert(out.end(), e.axes().begin(), e.axes().end());
  return out;
}

bool PartitionSpec::operator==(const PartitionSpec& other) const {
  const int n = std::max(size(), other.size());
  for (int i = 0; i < n; ++i)
    if (!((*this)[i] == other[i])) return false;
  return true;
}

std::string PartitionSpec::to_string() const {
  std::string s = "P(";
  for (int i = 0; i < size(); ++i) s += (i ? ", " : "") + entries_[i].to_string();
  return s + ")";
}

namespace {

/// Recursive-descent parser over the small grammar of printed specs.
class SpecParser {
 public:
  explicit SpecParser(const std::string& text) : t_(text) {}

  PartitionSpec parse() {
    skip();
    bool wrapped = false;
    for (const char* prefix : {"PartitionSpec", "P"}) {
      const std::string p = prefix;
      if (t_.compare(i_, p.size(), p) == 0) {
        std::size_t j = i_ + p.size();
        while (j < t_.size() && std::isspace(static_cast<unsigned char>(t_[j]))) ++j;
        if (j < t_.size() && t_[j] == '(') {
          i_ = j;
          break;
        }
      }
    }
    skip();
    std::vector<SpecEntry> entries;
    if (peek() == '(') {
      ++i_;
      wrapped = true;
    }
    skip();
    const char close = wrapped ? ')' : '\0';
    if (peek() != close) {
      while (true) {
        entries.push_back(entry());
        skip();
        if (peek() == ',') {
          ++i_;
          skip();
          if (peek() == close) break;  // trailing comma
          continue;
        }
        break;
      }
    }
    if (wrapped) expect(')');
    skip();
    if (i_ != t_.size()) fail("unexpected text");
    return PartitionSpec(std::move(entries));
  }

 private:
  char peek() const { return i_ < t_.size() ? t_[i_] : '\0'; }
  void skip() {
    while (i_ < t_.size() && std::isspace(static_cast<unsigned char>(t_[i_]))) ++i_;
  }
  [[noreturn]] void fail(const std::string& what) const {
    raise<ValueError>("cannot parse PartitionSpec \"", t_, "\": ", what, " at position ", i_,
                      "; write it like P('a', None, ('b','c'))");
  }
  void expect(char c) {
    skip();
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++i_;
  }
  std::string name() {
    skip();
    const char q = peek();
    if (q == '\'' || q == '"') {
      const std::size_t end = t_.find(q, i_ + 1);
      if (end == std::string::npos) fail("unterminated quote");
      std::string n = t_.substr(i_ + 1, end - i_ - 1);
      if (n.empty()) fail("empty axis name");
      i_ = end + 1;
      return n;
    }
    const std::size_t start = i_;
    while (i_ < t_.size() && (std::isalnum(static_cast<unsigned char>(t_[i_])) || t_[i_] == '_' || t_[i_] == '-'))
      ++i_;
    if (i_ == start) fail("expected an axis name, None or a tuple");
    return t_.substr(start, i_ - start);
  }
  SpecEntry entry() {
    skip();
    if (peek() == '(') {
      ++i_;
      std::vector<std::string> axes;
      skip();
      while (peek() != ')') {
        const bool quoted = peek() == '\'' || peek() == '"';
        const std::string n = name();
        if (!quoted && n == "None") fail("None inside a tuple");
        axes.push_back(n);
        skip();
        if (peek() == ',') ++i_;
        else if (peek() != ')') fail("expected ',' or ')' in a tuple");
        skip();
      }
      ++i_;
      return SpecEntry(std::move(axes));
    }
    const bool quoted = peek() == '\'' || peek() == '"';
    std::string n = name();
    if (!quoted && n == "None") return SpecEntry(None);
    return SpecEntry(std::move(n));
  }

  const std::string& t_;
  std::size_t i_ = 0;
};

}  // namespace

PartitionSpec PartitionSpec::parse(const std::string& text) { return SpecParser(text).parse(); }

}  // namespace shard
