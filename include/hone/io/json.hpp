// hone/io/json.hpp: a small, strict JSON (RFC 8259) reader and writer for the files hone reads
// from disk: safetensors headers, state.json, the index of compressed tensor files, the state of
// a saved replay buffer.
//
// Strict where a lenient parser lets damage through: the input must be valid UTF-8 (no overlong
// forms, no encoded surrogates), strings may not hold raw control characters, a \u escape of a
// surrogate must be a valid pair, an object may not repeat a key (safetensors' serde reader keeps
// the last one silently), numbers follow the JSON grammar exactly, nesting is limited to 64 levels
// (no stack exhaustion on hostile input) and nothing but whitespace may follow the value.
// Numbers keep their text, so 64-bit offsets and float state round-trip exactly; accessors
// convert on demand (as_u64 rejects "8.0" and "1e3", as the safetensors reference does).
//
// Why not nlohmann/json: it accepts duplicate keys, recurses without a depth limit, and would be
// a new dependency for ~500 lines of code that the fuzz target covers.
//
// Parse errors, and accessors that find another kind of value, throw hone::io::format_error (a
// hone::checkpoint_error) whose message starts with the caller's context (a file name). Building
// a value that cannot be written (non-finite number, invalid UTF-8), or setting a member of a
// value that is not an object, is hone::config_error.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/io/error.hpp"

HONE_NAMESPACE_BEGIN
namespace io::json {

enum class kind : std::uint8_t { null, boolean, number, string, array, object };

[[nodiscard]] constexpr std::string_view kind_name(kind k) noexcept {
  switch (k) {
    case kind::null:
      return "null";
    case kind::boolean:
      return "a boolean";
    case kind::number:
      return "a number";
    case kind::string:
      return "a string";
    case kind::array:
      return "an array";
    case kind::object:
      return "an object";
  }
  return "?";
}

namespace detail {

/// Length of the valid UTF-8 sequence starting at s[i], or 0 if it is invalid (RFC 3629: no
/// overlong forms, no surrogates U+D800..U+DFFF, nothing above U+10FFFF).
inline std::size_t utf8_sequence_length(std::string_view s, std::size_t i) noexcept {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  const auto cont = [&](std::size_t k, unsigned lo = 0x80, unsigned hi = 0xbf) {
    return k < s.size() && b(k) >= lo && b(k) <= hi;
  };
  if (c >= 0xc2 && c <= 0xdf) return cont(i + 1) ? 2 : 0;
  if (c == 0xe0) return cont(i + 1, 0xa0) && cont(i + 2) ? 3 : 0;
  if ((c >= 0xe1 && c <= 0xec) || c == 0xee || c == 0xef) return cont(i + 1) && cont(i + 2) ? 3 : 0;
  if (c == 0xed) return cont(i + 1, 0x80, 0x9f) && cont(i + 2) ? 3 : 0;
  if (c == 0xf0) return cont(i + 1, 0x90) && cont(i + 2) && cont(i + 3) ? 4 : 0;
  if (c >= 0xf1 && c <= 0xf3) return cont(i + 1) && cont(i + 2) && cont(i + 3) ? 4 : 0;
  if (c == 0xf4) return cont(i + 1, 0x80, 0x8f) && cont(i + 2) && cont(i + 3) ? 4 : 0;
  return 0;
}

inline void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

/// Whether `text` is a number by JSON's grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
inline bool is_json_number(std::string_view t) noexcept {
  std::size_t i = 0;
  const auto digit = [&](std::size_t k) { return k < t.size() && t[k] >= '0' && t[k] <= '9'; };
  if (i < t.size() && t[i] == '-') ++i;
  if (!digit(i)) return false;
  if (t[i] == '0') {
    ++i;
  } else {
    while (digit(i)) ++i;
  }
  if (i < t.size() && t[i] == '.') {
    ++i;
    if (!digit(i)) return false;
    while (digit(i)) ++i;
  }
  if (i < t.size() && (t[i] == 'e' || t[i] == 'E')) {
    ++i;
    if (i < t.size() && (t[i] == '+' || t[i] == '-')) ++i;
    if (!digit(i)) return false;
    while (digit(i)) ++i;
  }
  return i == t.size();
}

}  // namespace detail

/// Whether `s` is valid UTF-8.
[[nodiscard]] inline bool is_valid_utf8(std::string_view s) noexcept {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = detail::utf8_sequence_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

/// A JSON value. Objects keep their members in order (the order they were parsed or set).
class value {
 public:
  using array_type = std::vector<value>;
  using member = std::pair<std::string, value>;
  using object_type = std::vector<member>;

  value() noexcept = default;
  value(std::nullptr_t) noexcept {}                           // NOLINT: implicit, as a JSON literal
  value(bool b) noexcept : kind_(kind::boolean), bool_(b) {}  // NOLINT
  value(std::string s) : kind_(kind::string), text_(std::move(s)) {}  // NOLINT
  value(std::string_view s) : kind_(kind::string), text_(s) {}        // NOLINT
  value(const char* s) : kind_(kind::string), text_(s) {}             // NOLINT
  template <std::integral T>
  requires(!std::same_as<T, bool> && !std::same_as<T, char>) value(T v)
      : kind_(kind::number), text_(std::to_string(v)) {}  // NOLINT
  /// A finite double, written in its shortest round-trip form; config_error if not finite.
  value(double v) : kind_(kind::number), text_(format_floating(v)) {}  // NOLINT
  /// A finite float, written in its shortest form that reads back as the same float.
  value(float v) : kind_(kind::number), text_(format_floating(v)) {}    // NOLINT
  value(array_type a) : kind_(kind::array), array_(std::move(a)) {}     // NOLINT
  value(object_type o) : kind_(kind::object), object_(std::move(o)) {}  // NOLINT

  [[nodiscard]] static value array() { return value(array_type{}); }
  [[nodiscard]] static value object() { return value(object_type{}); }
  /// A number given by its JSON text (config_error if `text` is not a JSON number).
  [[nodiscard]] static value number_text(std::string_view text) {
    HONE_REQUIRE(detail::is_json_number(text),
                 "hone::json: '" + std::string(text) + "' is not a JSON number");
    value v;
    v.kind_ = kind::number;
    v.text_ = text;
    return v;
  }

  [[nodiscard]] kind type() const noexcept { return kind_; }
  [[nodiscard]] bool is_null() const noexcept { return kind_ == kind::null; }
  [[nodiscard]] bool is_bool() const noexcept { return kind_ == kind::boolean; }
  [[nodiscard]] bool is_number() const noexcept { return kind_ == kind::number; }
  [[nodiscard]] bool is_string() const noexcept { return kind_ == kind::string; }
  [[nodiscard]] bool is_array() const noexcept { return kind_ == kind::array; }
  [[nodiscard]] bool is_object() const noexcept { return kind_ == kind::object; }

  // Accessors: format_error ("expected a string, found a number") on a kind mismatch or a
  // number that does not fit; callers that know the file add it to the message.
  [[nodiscard]] bool as_bool() const {
    expect(kind::boolean);
    return bool_;
  }
  [[nodiscard]] const std::string& as_string() const {
    expect(kind::string);
    return text_;
  }
  /// The text of a number exactly as written.
  [[nodiscard]] const std::string& number_text() const {
    expect(kind::number);
    return text_;
  }
  /// A non-negative integer written without fraction or exponent that fits 64 bits.
  [[nodiscard]] std::uint64_t as_u64() const {
    expect(kind::number);
    std::uint64_t v = 0;
    const auto [p, ec] = std::from_chars(text_.data(), text_.data() + text_.size(), v);
    if (ec != std::errc() || p != text_.data() + text_.size()) {
      throw format_error("expected a non-negative integer below 2^64, found " + text_);
    }
    return v;
  }
  /// An integer written without fraction or exponent that fits a signed 64-bit integer.
  [[nodiscard]] std::int64_t as_i64() const {
    expect(kind::number);
    std::int64_t v = 0;
    const auto [p, ec] = std::from_chars(text_.data(), text_.data() + text_.size(), v);
    if (ec != std::errc() || p != text_.data() + text_.size()) {
      throw format_error("expected a 64-bit signed integer, found " + text_);
    }
    return v;
  }
  /// The nearest double; format_error if the magnitude overflows.
  [[nodiscard]] double as_double() const { return parse_floating<double>(); }
  /// The nearest float (read directly, not through double); format_error on overflow.
  [[nodiscard]] float as_float() const { return parse_floating<float>(); }

  [[nodiscard]] const array_type& as_array() const {
    expect(kind::array);
    return array_;
  }
  [[nodiscard]] array_type& as_array() {
    expect(kind::array);
    return array_;
  }
  [[nodiscard]] const object_type& as_object() const {
    expect(kind::object);
    return object_;
  }
  [[nodiscard]] object_type& as_object() {
    expect(kind::object);
    return object_;
  }

  /// The member called `key` of an object, or nullptr (also when this is not an object).
  [[nodiscard]] const value* find(std::string_view key) const noexcept {
    if (kind_ != kind::object) return nullptr;
    for (const auto& [k, v] : object_) {
      if (k == key) return &v;
    }
    return nullptr;
  }
  /// The member called `key`; format_error naming it when absent.
  [[nodiscard]] const value& at(std::string_view key) const {
    expect(kind::object);
    if (const value* v = find(key)) return *v;
    throw format_error("missing field \"" + std::string(key) + "\"");
  }
  /// Sets member `key` of an object (replacing an existing one, else appending); returns it.
  value& set(std::string key, value v) {
    expect_mutable(kind::object);
    for (auto& [k, old] : object_) {
      if (k == key) {
        old = std::move(v);
        return old;
      }
    }
    object_.emplace_back(std::move(key), std::move(v));
    return object_.back().second;
  }
  /// Appends to an array.
  value& push_back(value v) {
    expect_mutable(kind::array);
    array_.push_back(std::move(v));
    return array_.back();
  }
  [[nodiscard]] std::size_t size() const noexcept {
    return kind_ == kind::array ? array_.size() : kind_ == kind::object ? object_.size() : 0;
  }

  /// Compact JSON (indent < 0) or pretty-printed with `indent` spaces per level. Strings must be
  /// valid UTF-8 (config_error otherwise).
  [[nodiscard]] std::string dump(int indent = -1) const {
    std::string out;
    dump_to(out, indent, 0);
    return out;
  }
  void dump_to(std::string& out, int indent = -1, int level = 0) const;

  friend bool operator==(const value& a, const value& b) {
    if (a.kind_ != b.kind_) return false;
    switch (a.kind_) {
      case kind::null:
        return true;
      case kind::boolean:
        return a.bool_ == b.bool_;
      case kind::number:
      case kind::string:
        return a.text_ == b.text_;
      case kind::array:
        return a.array_ == b.array_;
      case kind::object:
        return a.object_ == b.object_;
    }
    return false;
  }

 private:
  friend class parser;

  void expect(kind k) const {
    if (kind_ != k) {
      throw format_error("expected " + std::string(kind_name(k)) + ", found " +
                         std::string(kind_name(kind_)));
    }
  }
  void expect_mutable(kind k) const {
    if (kind_ != k) {
      throw config_error("hone::json: this value is " + std::string(kind_name(kind_)) + ", not " +
                         std::string(kind_name(k)));
    }
  }
  template <class F>
  static std::string format_floating(F v) {
    HONE_REQUIRE(std::isfinite(v), "hone::json: JSON has no representation of NaN or infinity");
    char buf[64];
    const auto [p, ec] = std::to_chars(buf, buf + sizeof buf, v);
    std::string s(buf, p);
    // to_chars may print an integer-valued number as "1e+16" (valid JSON) or "100" (valid
    // too); both read back exactly.
    return s;
  }
  template <class F>
  F parse_floating() const {
    expect(kind::number);
    F v{};
    const auto [p, ec] = std::from_chars(text_.data(), text_.data() + text_.size(), v);
    if (ec != std::errc() || p != text_.data() + text_.size()) {
      throw format_error("the number " + text_ + " is out of the range of a " +
                         (sizeof(F) == 4 ? "float" : "double"));
    }
    return v;
  }

  kind kind_ = kind::null;
  bool bool_ = false;
  std::string text_;  // string value, or a number's text
  array_type array_;
  object_type object_;
};

namespace detail {
inline void dump_string(std::string& out, std::string_view s) {
  if (!is_valid_utf8(s)) {
    throw config_error(
        "hone::json: a string to write is not valid UTF-8 (JSON text, and so safetensors "
        "headers and state.json, must be UTF-8)");
  }
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += "0123456789abcdef"[c >> 4];
          out += "0123456789abcdef"[c & 0xf];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}
inline void newline(std::string& out, int indent, int level) {
  if (indent < 0) return;
  out += '\n';
  out.append(static_cast<std::size_t>(indent) * static_cast<std::size_t>(level), ' ');
}
}  // namespace detail

/// Writes `s` as a JSON string literal (quoted, escaped) to `out`.
inline void write_string(std::string& out, std::string_view s) {
  detail::dump_string(out, s);
}

inline void value::dump_to(std::string& out, int indent, int level) const {
  switch (kind_) {
    case kind::null:
      out += "null";
      return;
    case kind::boolean:
      out += bool_ ? "true" : "false";
      return;
    case kind::number:
      out += text_;
      return;
    case kind::string:
      detail::dump_string(out, text_);
      return;
    case kind::array:
      out += '[';
      for (std::size_t i = 0; i < array_.size(); ++i) {
        if (i != 0) out += ',';
        detail::newline(out, indent, level + 1);
        array_[i].dump_to(out, indent, level + 1);
      }
      if (!array_.empty()) detail::newline(out, indent, level);
      out += ']';
      return;
    case kind::object:
      out += '{';
      for (std::size_t i = 0; i < object_.size(); ++i) {
        if (i != 0) out += ',';
        detail::newline(out, indent, level + 1);
        detail::dump_string(out, object_[i].first);
        out += indent < 0 ? ":" : ": ";
        object_[i].second.dump_to(out, indent, level + 1);
      }
      if (!object_.empty()) detail::newline(out, indent, level);
      out += '}';
      return;
  }
}

/// Limits of parse().
struct parse_limits {
  int max_depth = 64;  // nesting of arrays and objects
};

/// The recursive-descent parser behind parse(). Not for direct use.
class parser {
 public:
  parser(std::string_view text, std::string_view context, parse_limits limits)
      : s_(text), context_(context), limits_(limits) {}

  value run() {
    skip_ws();
    value v = parse_value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected characters after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(std::string_view what) const {
    std::string msg = "hone: ";
    if (!context_.empty()) {
      msg += "'";
      msg += context_;
      msg += "': ";
    }
    msg += "invalid JSON at byte " + std::to_string(pos_) + ": " + std::string(what);
    throw format_error(msg);
  }
  void skip_ws() noexcept {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool consume(char c) noexcept {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) fail("unknown literal (expected a JSON value)");
    pos_ += word.size();
  }

  value parse_value(int depth) {
    if (pos_ >= s_.size()) fail("unexpected end of text (expected a value)");
    const char c = s_[pos_];
    switch (c) {
      case '{':
        return parse_object(depth + 1);
      case '[':
        return parse_array(depth + 1);
      case '"':
        return value(parse_string());
      case 't':
        literal("true");
        return value(true);
      case 'f':
        literal("false");
        return value(false);
      case 'n':
        literal("null");
        return value();
      default:
        if (c == '-' || (c >= '0' && c <= '9')) return parse_number();
        fail("unexpected character (expected a value)");
    }
  }

  value parse_number() {
    const std::size_t start = pos_;
    const auto digit = [&] { return pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9'; };
    consume('-');
    if (!digit()) fail("a number needs a digit after '-'");
    if (s_[pos_] == '0') {
      ++pos_;
      if (digit()) fail("a number may not have leading zeros");
    } else {
      while (digit()) ++pos_;
    }
    if (consume('.')) {
      if (!digit()) fail("a number needs digits after '.'");
      while (digit()) ++pos_;
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (!consume('+')) consume('-');
      if (!digit()) fail("a number needs digits in its exponent");
      while (digit()) ++pos_;
    }
    value v;
    v.kind_ = kind::number;
    v.text_ = s_.substr(start, pos_ - start);
    return v;
  }

  unsigned hex4() {
    if (s_.size() - pos_ < 4) fail("truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= static_cast<unsigned>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        v |= static_cast<unsigned>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        v |= static_cast<unsigned>(c - 'A' + 10);
      } else {
        --pos_;
        fail("invalid hexadecimal digit in a \\u escape");
      }
    }
    return v;
  }

  std::string parse_string() {
    ++pos_;  // opening quote
    std::string out;
    for (;;) {
      if (pos_ >= s_.size()) fail("unterminated string");
      const auto c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c < 0x20) fail("raw control character in a string (it must be escaped)");
      if (c == '\\') {
        ++pos_;
        if (pos_ >= s_.size()) fail("unterminated escape");
        const char e = s_[pos_++];
        switch (e) {
          case '"':
            out += '"';
            break;
          case '\\':
            out += '\\';
            break;
          case '/':
            out += '/';
            break;
          case 'b':
            out += '\b';
            break;
          case 'f':
            out += '\f';
            break;
          case 'n':
            out += '\n';
            break;
          case 'r':
            out += '\r';
            break;
          case 't':
            out += '\t';
            break;
          case 'u': {
            std::uint32_t cp = hex4();
            if (cp >= 0xd800 && cp <= 0xdbff) {
              if (s_.substr(pos_, 2) != "\\u")
                fail("a high surrogate escape must be followed by a low one");
              pos_ += 2;
              const unsigned lo = hex4();
              if (lo < 0xdc00 || lo > 0xdfff)
                fail("a high surrogate escape must be followed by a low one");
              cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            } else if (cp >= 0xdc00 && cp <= 0xdfff) {
              fail("a lone low surrogate escape");
            }
            detail::append_utf8(out, cp);
            break;
          }
          default:
            --pos_;
            fail("invalid escape character");
        }
        continue;
      }
      const std::size_t n = detail::utf8_sequence_length(s_, pos_);
      if (n == 0) fail("invalid UTF-8");
      out.append(s_.substr(pos_, n));
      pos_ += n;
    }
  }

  value parse_array(int depth) {
    if (depth > limits_.max_depth) fail("nested too deeply");
    ++pos_;
    value v = value::array();
    skip_ws();
    if (consume(']')) return v;
    for (;;) {
      skip_ws();
      v.array_.push_back(parse_value(depth));
      skip_ws();
      if (consume(']')) return v;
      if (!consume(',')) fail("expected ',' or ']' in an array");
    }
  }

  value parse_object(int depth) {
    if (depth > limits_.max_depth) fail("nested too deeply");
    ++pos_;
    value v = value::object();
    skip_ws();
    if (consume('}')) return v;
    for (;;) {
      skip_ws();
      if (pos_ >= s_.size() || s_[pos_] != '"') fail("expected a string key in an object");
      std::string key = parse_string();
      skip_ws();
      if (!consume(':')) fail("expected ':' after an object key");
      skip_ws();
      value member = parse_value(depth);
      v.object_.emplace_back(std::move(key), std::move(member));
      skip_ws();
      if (consume('}')) break;
      if (!consume(',')) fail("expected ',' or '}' in an object");
    }
    check_unique_keys(v.object_);
    return v;
  }

  void check_unique_keys(const value::object_type& members) {
    if (members.size() < 2) return;
    std::vector<std::string_view> keys;
    keys.reserve(members.size());
    for (const auto& m : members) keys.push_back(m.first);
    std::sort(keys.begin(), keys.end());
    const auto dup = std::adjacent_find(keys.begin(), keys.end());
    if (dup != keys.end()) {
      fail("duplicate key \"" + io::escaped(*dup, 200) + "\" in an object");
    }
  }

  std::string_view s_;
  std::string_view context_;
  parse_limits limits_;
  std::size_t pos_ = 0;
};

/// Parses a complete JSON text (leading and trailing whitespace allowed). `context` (a file name,
/// "model.safetensors header") starts every error message.
[[nodiscard]] inline value parse(std::string_view text, std::string_view context = {},
                                 parse_limits limits = {}) {
  return parser(text, context, limits).run();
}

}  // namespace io::json
HONE_NAMESPACE_END
