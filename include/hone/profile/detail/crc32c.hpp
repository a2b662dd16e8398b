// hone/profile/detail/crc32c.hpp: CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), table
// driven one byte at a time, and TensorFlow's masked form of it, which TFRecord framing (the
// TensorBoard event files of hone/profile/tensorboard.hpp) stores after each length and payload.
// The records hone writes are tens of bytes, so a byte-wise table (a few hundred MB/s) costs less
// than the write() that follows; no SSE4.2 path.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "hone/core/config.hpp"

HONE_NAMESPACE_BEGIN
namespace profile::detail {

inline constexpr std::array<std::uint32_t, 256> crc32c_table = [] {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1U) != 0 ? (c >> 1) ^ 0x82F63B78U : c >> 1;
    t[i] = c;
  }
  return t;
}();

/// CRC-32C of `bytes`, continuing from `crc` (the CRC of the bytes before; 0 to start).
constexpr std::uint32_t crc32c(std::string_view bytes, std::uint32_t crc = 0) noexcept {
  crc = ~crc;
  for (const char ch : bytes) {
    crc = crc32c_table[(crc ^ static_cast<unsigned char>(ch)) & 0xffU] ^ (crc >> 8);
  }
  return ~crc;
}

/// TensorFlow's mask (tensorflow/core/lib/hash/crc32c.h): rotate right by 15 bits, add a constant,
/// so that a CRC stored inside CRC-covered data does not weaken the outer CRC.
constexpr std::uint32_t mask_crc32c(std::uint32_t crc) noexcept {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8U;
}

constexpr std::uint32_t masked_crc32c(std::string_view bytes) noexcept {
  return mask_crc32c(crc32c(bytes));
}

static_assert(crc32c("123456789") == 0xE3069283U, "CRC-32C check value");

}  // namespace profile::detail
HONE_NAMESPACE_END
