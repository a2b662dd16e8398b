// hone/profile/detail/protobuf.hpp: the protobuf wire format, encoded by hand (varints, fixed
// 64-bit values, length-delimited strings and nested messages), for the Perfetto trace writer.
#pragma once

#include <bit>
#include <cstdint>
#include <string>
#include <string_view>

#include "hone/core/config.hpp"

HONE_NAMESPACE_BEGIN
namespace profile::detail {

/// Appends protobuf fields to a string.
class proto_writer {
 public:
  explicit proto_writer(std::string& out) noexcept : out_(&out) {}

  void varint(std::uint64_t v) {
    while (v >= 0x80) {
      out_->push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    out_->push_back(static_cast<char>(v));
  }
  void tag(std::uint32_t field, std::uint32_t wire_type) {
    varint((std::uint64_t{field} << 3) | wire_type);
  }
  /// uint32/uint64/bool/enum (wire type 0).
  void uint(std::uint32_t field, std::uint64_t v) {
    tag(field, 0);
    varint(v);
  }
  /// int32/int64 (wire type 0; negative values take ten bytes, as protobuf specifies).
  void sint(std::uint32_t field, std::int64_t v) { uint(field, static_cast<std::uint64_t>(v)); }
  /// fixed64 (wire type 1).
  void fixed64(std::uint32_t field, std::uint64_t v) {
    tag(field, 1);
    for (int i = 0; i < 8; ++i) out_->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  /// double (wire type 1).
  void f64(std::uint32_t field, double v) { fixed64(field, std::bit_cast<std::uint64_t>(v)); }
  /// string/bytes (wire type 2).
  void bytes(std::uint32_t field, std::string_view s) {
    tag(field, 2);
    varint(s.size());
    out_->append(s);
  }
  /// A nested message written by f(proto_writer&) (wire type 2).
  template <class F>
  void message(std::uint32_t field, F&& f) {
    std::string inner;
    proto_writer w(inner);
    f(w);
    bytes(field, inner);
  }

 private:
  std::string* out_;
};

}  // namespace profile::detail
HONE_NAMESPACE_END
