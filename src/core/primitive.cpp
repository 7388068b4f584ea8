// Factor-form sharding rules (core/primitive.hpp): parsing and applying one to operand shapes.

#include "shard/core/primitive.hpp"

#include <algorithm>
#include <cctype>

#include "shard/error.hpp"

namespace shard {

namespace {

std::string trimmed(std::string_view s) {
  std::string out;
  for (char c : s)
    if (!std::isspace(static_cast<unsigned char>(c))) out += c;
  return out;
}

}  // namespace

std::string located(const char* op, const shard::source_location&) {
  // The user's line is added by the Error itself (detail::CallScope): never a library path here.
  return op;
}

FactorRule::FactorRule(std::string_view text) : text_(text) {
  const std::string t = trimmed(text);
  const auto arrow = t.find("->");
  if (arrow == std::string::npos)
    raise<ValueError>("sharding rule '", text_, "': expected 'operands->result'");
  auto term = [&](std::string_view s, bool result) {
    Term out;
    if (s.substr(0, 3) == "...") {
      out.ellipsis = true;
      s.remove_prefix(3);
    }
    for (char c : s) {
      if (c == '1' && result) {  // a size-1 dim of the result (keepdims)
        out.letters += c;
        continue;
      }
      if (!std::isalpha(static_cast<unsigned char>(c)))
        raise<ValueError>("sharding rule '", text_, "': '", std::string(1, c), "' is not a factor letter");
      if (out.letters.find(c) != std::string::npos)
        raise<ValueError>("sharding rule '", text_, "': factor '", std::string(1, c), "' twice in one term");
      out.letters += c;
    }
    return out;
  };
  std::string_view lhs = std::string_view(t).substr(0, arrow);
  while (true) {
    const auto comma = lhs.find(',');
    operands_.push_back(term(lhs.substr(0, comma), false));
    if (comma == std::string_view::npos) break;
    lhs.remove_prefix(comma + 1);
  }
  result_ = term(std::string_view(t).substr(arrow + 2), true);
  for (char c : result_.letters)
    if (c != '1' && std::none_of(operands_.begin(), operands_.end(),
                                 [&](const Term& o) { return o.letters.find(c) != std::string::npos; }))
      raise<ValueError>("sharding rule '", text_, "': result factor '", std::string(1, c),
                        "' is in no operand");
  if (result_.ellipsis &&
      std::none_of(operands_.begin(), operands_.end(), [](const Term& o) { return o.ellipsis; }))
    raise<ValueError>("sharding rule '", text_, "': '...' in the result but in no operand");
  elementwise_ = result_.ellipsis && result_.letters.empty() &&
                 std::all_of(operands_.begin(), operands_.end(),
                             [](const Term& o) { return o.ellipsis && o.letters.empty(); });
}

bool FactorRule::Factors::has_reduced() const {
  return std::find(reduced.begin(), reduced.end(), true) != reduced.end();
}

FactorRule::Factors FactorRule::expand(const std::vector<const Shape*>& shapes, const char* op,
                                       const shard::source_location& where) const {
  if (shapes.size() != operands_.size())
    raise<ValueError>(located(op, where), ": takes ", operands_.size(), " operands (rule '", text_,
                      "'), got ", shapes.size());
  Factors f;
  // The ellipsis dims: numpy broadcasting of each operand's leading dims, right-aligned.
  Shape batch;
  std::vector<int> lead(shapes.size(), 0);
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    const int named = static_cast<int>(operands_[k].letters.size());
    const int rank = static_cast<int>(shapes[k]->size());
    if (operands_[k].ellipsis ? rank < named : rank != named)
      raise<ShapeError>(located(op, where), ": operand ", k, " has shape ", to_string(*shapes[k]),
                        " but the rule '", text_, "' wants ", operands_[k].ellipsis ? "at least " : "", named,
                        " dims");
    lead[k] = rank - named;
    if (lead[k] > static_cast<int>(batch.size())) batch.insert(batch.begin(), lead[k] - batch.size(), 1);
    for (int d = 0; d < lead[k]; ++d) {
      const std::int64_t n = (*shapes[k])[d];
      std::int64_t& b = batch[batch.size() - lead[k] + d];
      if (n != 1 && b != 1 && n != b)
        raise<ShapeError>(located(op, where), ": operands could not be broadcast together with shapes ",
                          to_string(*shapes[0]), " and ", to_string(*shapes[k]));
      if (n != 1) b = n;
    }
  }
  const int nb = static_cast<int>(batch.size());
  for (std::int64_t n : batch) {
    f.sizes.push_back(n);
    f.reduced.push_back(!result_.ellipsis);
  }
  std::string letters;  // factor nb + i is letters[i]
  auto letter_factor = [&](char c) {
    auto pos = letters.find(c);
    if (pos == std::string::npos) {
      letters += c;
      f.sizes.push_back(-1);
      f.reduced.push_back(result_.letters.find(c) == std::string::npos);
      pos = letters.size() - 1;
    }
    return nb + static_cast<int>(pos);
  };
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    std::vector<int> ids;
    for (int d = 0; d < lead[k]; ++d) {
      const int factor = nb - lead[k] + d;
      ids.push_back((*shapes[k])[d] == 1 && f.sizes[factor] != 1 ? -1 : factor);
    }
    for (std::size_t i = 0; i < operands_[k].letters.size(); ++i) {
      const int factor = letter_factor(operands_[k].letters[i]);
      const std::int64_t n = (*shapes[k])[lead[k] + static_cast<int>(i)];
      if (f.sizes[factor] >= 0 && f.sizes[factor] != n)
        raise<ShapeError>(located(op, where), ": factor '", std::string(1, operands_[k].letters[i]),
                          "' of rule '", text_, "' has size ", f.sizes[factor], " in one operand and ", n,
                          " in operand ", k);
      f.sizes[factor] = n;
      ids.push_back(factor);
    }
    f.operands.push_back(std::move(ids));
  }
  if (result_.ellipsis)
    for (int d = 0; d < nb; ++d) {
      f.result.push_back(d);
      f.result_shape.push_back(batch[d]);
    }
  for (char c : result_.letters) {
    if (c == '1') {
      f.result.push_back(-1);
      f.result_shape.push_back(1);
      continue;
    }
    const int factor = letter_factor(c);
    f.result.push_back(factor);
    f.result_shape.push_back(f.sizes[factor]);
  }
  return f;
}

}  // namespace shard
