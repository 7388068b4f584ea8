// The .npy header format (numpy's format.py, version 1.0 written, 1.0-3.0 read): pure string
// code, no MPI, so the parser can be fuzzed on its own (fuzz/fuzz_npy_header.cpp).

#include <charconv>
#include <cstdint>
#include <map>
#include <string>

#include "shard/error.hpp"
#include "shard/io/io.hpp"

namespace shard::io {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicLen = 6;
constexpr std::size_t kAlign = 64;                 // numpy's ARRAY_ALIGN
constexpr std::size_t kGrowthDigits = 21;          // numpy's GROWTH_AXIS_MAX_DIGITS

/// Python's repr of a shape tuple: "()", "(5,)", "(3, 4)".
std::string shape_repr(const Shape& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

[[noreturn]] void bad_npy(const std::string& path, const std::string& what) {
  raise<IoError>("'", path, "' is not a valid .npy file: ", what);
}

class DictParser {
 public:
  DictParser(const std::string& text, const std::string& path) : s_(text), path_(path) {}

  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool accept(char c) {
    skip_space();
    if (i_ < s_.size() && s_[i_] == c) return ++i_, true;
    return false;
  }
  void expect(char c) {
    if (!accept(c)) fail(std::string("expected '") + c + "'");
  }
  bool at_end() {
    skip_space();
    return i_ == s_.size();
  }
  std::string string() {
    skip_space();
    if (i_ >= s_.size() || (s_[i_] != '\'' && s_[i_] != '"')) fail("expected a quoted string");
    const char q = s_[i_++];
    const std::size_t end = s_.find(q, i_);
    if (end == std::string::npos) fail("unterminated string");
    std::string out = s_.substr(i_, end - i_);
    i_ = end + 1;
    return out;
  }
  bool boolean() {
    skip_space();
    for (const auto& [word, value] : {std::pair<const char*, bool>{"True", true}, {"False", false}})
      if (s_.compare(i_, std::strlen(word), word) == 0) return i_ += std::strlen(word), value;
    fail("expected True or False");
  }
  Shape tuple() {
    expect('(');
    Shape shape;
    while (!accept(')')) {
      skip_space();
      std::int64_t v = -1;
      const auto [end, ec] = std::from_chars(s_.data() + i_, s_.data() + s_.size(), v);
      if (ec != std::errc() || v < 0) fail("expected a non-negative integer dimension");
      i_ = static_cast<std::size_t>(end - s_.data());
      shape.push_back(v);
      if (!accept(',')) {
        expect(')');
        break;
      }
    }
    return shape;
  }
  [[noreturn]] void fail(const std::string& what) const {
    raise<IoError>("'", path_, "' is not a valid .npy file: ", what, " at offset ", i_,
                   " of its header dict ", s_.substr(0, 120));
  }

 private:
  const std::string& s_;
  const std::string& path_;
  std::size_t i_ = 0;
};

}  // namespace

std::string npy_header(const std::string& descr, const Shape& shape) {
  std::string dict =
      "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape_repr(shape) + ", }";
  // numpy leaves room to grow the first dim in place (format.py, _write_array_header).
  if (!shape.empty()) {
    const std::size_t digits = std::to_string(shape[0]).size();
    if (digits < kGrowthDigits) dict.append(kGrowthDigits - digits, ' ');
  }
  const std::size_t hlen = dict.size() + 1;  // + the final '\n'
  // numpy's padding is never zero: a header that is already aligned gets 64 more spaces.
  const std::size_t pad = kAlign - (kMagicLen + 4 + hlen) % kAlign;
  if (hlen + pad > 0xffff)
    raise<ValueError>("npy_header: the header of shape ", to_string(shape),
                      " does not fit .npy format 1.0 (more than 65535 bytes)");
  std::string out(kMagic, kMagicLen);
  out += '\x01';
  out += '\x00';
  out += static_cast<char>((hlen + pad) & 0xff);
  out += static_cast<char>((hlen + pad) >> 8);
  out += dict;
  out.append(pad, ' ');
  out += '\n';
  return out;
}

NpyHeader parse_npy_header(const std::string& bytes, const std::string& path) {
  if (bytes.size() < 10 || bytes.compare(0, kMagicLen, kMagic, kMagicLen) != 0)
    bad_npy(path, "it does not start with the magic \\x93NUMPY");
  const int major = static_cast<unsigned char>(bytes[6]);
  const int minor = static_cast<unsigned char>(bytes[7]);
  if (major < 1 || major > 3 || minor != 0)
    bad_npy(path, "unsupported format version " + std::to_string(major) + "." + std::to_string(minor));
  const std::size_t prefix = major == 1 ? 10 : 12;
  if (bytes.size() < prefix) bad_npy(path, "the header is cut short");
  std::uint64_t hlen = 0;
  for (std::size_t i = prefix - 1; i >= 8; --i) hlen = (hlen << 8) | static_cast<unsigned char>(bytes[i]);
  if (bytes.size() < prefix + hlen)
    bad_npy(path, "the header length " + std::to_string(hlen) + " runs past the end of the file");
  const std::string dict = bytes.substr(prefix, hlen);
  NpyHeader h;
  h.data_offset = static_cast<std::int64_t>(prefix + hlen);
  DictParser p(dict, path);
  p.expect('{');
  std::map<std::string, bool> seen;
  while (!p.accept('}')) {
    const std::string key = p.string();
    p.expect(':');
    if (key == "descr")
      h.descr = p.string();
    else if (key == "fortran_order")
      h.fortran_order = p.boolean();
    else if (key == "shape")
      h.shape = p.tuple();
    else
      p.fail("unexpected key '" + key + "'");
    if (seen[key]) p.fail("key '" + key + "' appears twice");
    seen[key] = true;
    if (!p.accept(',')) {
      p.expect('}');
      break;
    }
  }
  if (!p.at_end()) p.fail("text after the closing '}'");
  if (seen.size() != 3) p.fail("the header needs the keys 'descr', 'fortran_order' and 'shape'");
  return h;
}

}  // namespace shard::io
