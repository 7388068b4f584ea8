#pragma once
// A small JSON reader and writer for checkpoint manifests (private to the library).
// Numbers keep their text, so 64-bit integers round-trip exactly; strings are UTF-8.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace shard::detail::json {

struct Member;

struct Value {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  std::string text;             ///< a string's contents or a number's literal
  std::vector<Value> items;     ///< array elements
  std::vector<Member> members;  ///< object members, in file order

  /// The member `key` of an object, or null if absent (or not an object).
  const Value* find(const std::string& key) const;
};

/// An object member (a struct, not std::pair: a pair of a still-incomplete Value is not portable).
struct Member {
  std::string key;
  Value value;
};

/// Parses a whole JSON document; throws ValueError naming `what` and the line of the problem.
Value parse(const std::string& text, const std::string& what);

/// `s` as a JSON string literal (quotes and escapes included).
std::string quote(const std::string& s);

/// `s` for an error message: control bytes (a NUL would end the message, an escape sequence
/// would reach the terminal) as \xNN.
std::string printable(const std::string& s);

/// Whether `t` is a number by JSON's grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
bool is_json_number(const std::string& t);

}  // namespace shard::detail::json
