// hone/profile/detail/protobuf.hpp: the protobuf wire format, encoded by hand (varints, fixed
// 32- and 64-bit values, length-delimited strings and nested messages), for the Perfetto trace
// writer and the TensorBoard event writer.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "hone/core/config.hpp"

HONE_NAMESPACE_BEGIN
namespace profile::detail {

/// A growable byte buffer whose growth leaves the new bytes uninitialized (std::string's resize
/// would zero them).
class byte_buffer {
 public:
  [[nodiscard]] char* data() noexcept { return data_.get(); }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  [[nodiscard]] std::string_view view() const noexcept { return {data_.get(), size_}; }
  void clear() noexcept { size_ = 0; }
  /// Makes room for n more bytes past size() (capacity doubles), returning where they go.
  char* grow(std::size_t n) {
    if (size_ + n > cap_) {
      const std::size_t cap = std::max({2 * cap_, size_ + n, std::size_t{4096}});
      auto fresh = std::make_unique_for_overwrite<char[]>(cap);
      if (size_ != 0) std::memcpy(fresh.get(), data_.get(), size_);
      data_ = std::move(fresh);
      cap_ = cap;
    }
    return data_.get() + size_;
  }
  void set_size(std::size_t n) noexcept { size_ = n; }

 private:
  std::unique_ptr<char[]> data_;
  std::size_t size_ = 0;
  std::size_t cap_ = 0;
};

/// Appends protobuf fields to a byte_buffer. The writer makes room ahead of what it writes and
/// stores bytes through a pointer; finish() sets the buffer's size to what was written (call it
/// once, before the buffer is used again).
class proto_writer {
 public:
  explicit proto_writer(byte_buffer& out) noexcept : out_(&out), pos_(out.size()) {}

  void varint(std::uint64_t v) {
    char* p = room(10);
    while (v >= 0x80) {
      *p++ = static_cast<char>((v & 0x7f) | 0x80);
      v >>= 7;
    }
    *p++ = static_cast<char>(v);
    pos_ = static_cast<std::size_t>(p - out_->data());
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
  /// fixed64 (wire type 1), little-endian.
  void fixed64(std::uint32_t field, std::uint64_t v) {
    tag(field, 1);
    char* p = room(8);
    for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
    pos_ += 8;
  }
  /// double (wire type 1).
  void f64(std::uint32_t field, double v) { fixed64(field, std::bit_cast<std::uint64_t>(v)); }
  /// fixed32 (wire type 5), little-endian.
  void fixed32(std::uint32_t field, std::uint32_t v) {
    tag(field, 5);
    char* p = room(4);
    for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
    pos_ += 4;
  }
  /// float (wire type 5).
  void f32(std::uint32_t field, float v) { fixed32(field, std::bit_cast<std::uint32_t>(v)); }
  /// string/bytes (wire type 2).
  void bytes(std::uint32_t field, std::string_view s) {
    tag(field, 2);
    varint(s.size());
    char* p = room(s.size());
    if (!s.empty()) std::memcpy(p, s.data(), s.size());
    pos_ += s.size();
  }
  /// A nested message written by f(proto_writer&) (wire type 2), in place: its length is
  /// written afterwards into 4 reserved bytes as a redundant varint (continuation bits on the
  /// first three), which protobuf parsers accept and Perfetto's own protozero writer also emits.
  /// A message must stay under 2^28 bytes.
  template <class F>
  void message(std::uint32_t field, F&& f) {
    tag(field, 2);
    room(4);
    const std::size_t at = pos_;
    pos_ += 4;
    f(*this);
    const std::size_t n = pos_ - at - 4;
    char* p = out_->data() + at;
    for (int i = 0; i < 4; ++i) {
      const auto b = static_cast<unsigned char>((n >> (7 * i)) & 0x7f);
      p[i] = static_cast<char>(i < 3 ? (b | 0x80) : b);
    }
  }

  /// Sets the buffer's size to the bytes written.
  void finish() noexcept { out_->set_size(pos_); }

 private:
  /// Where the next n bytes go, with room for them.
  char* room(std::size_t n) {
    out_->set_size(pos_);
    return out_->grow(n);
  }

  byte_buffer* out_;
  std::size_t pos_;
};

}  // namespace profile::detail
HONE_NAMESPACE_END
