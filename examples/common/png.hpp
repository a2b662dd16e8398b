// examples/common/png.hpp: a small, dependency-free PNG writer for the examples' plots.
//
//   hone_examples::image img(640, 480, {{255, 255, 255}, {0, 0, 0}});  // palette: white, black
//   img.set(10, 20, 1);                                                // x, y, palette index
//   hone_examples::write_png("out/plot.png", img);
//
// The image is an indexed-colour picture (PNG colour type 3, one PLTE chunk, 1, 2, 4 or 8 bits
// per pixel: the fewest the palette needs). The pixel data are wrapped in a zlib stream made of
// "stored" (uncompressed) deflate blocks, so no zlib is needed: CRC-32 (of each chunk) and
// Adler-32 (of the zlib stream) are computed here. Files are larger than compressed PNGs would be
// (half a byte per pixel with a 16-colour palette), which is fine for a plot.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace hone_examples {

struct rgb {
  std::uint8_t r = 0, g = 0, b = 0;
};

/// A width x height picture of palette indices (at most 256 colours).
class image {
 public:
  image(int width, int height, std::vector<rgb> palette, std::uint8_t background = 0)
      : width_(width), height_(height), palette_(std::move(palette)) {
    if (width <= 0 || height <= 0) throw std::invalid_argument("image: size must be positive");
    if (palette_.empty() || palette_.size() > 256) {
      throw std::invalid_argument("image: the palette needs 1 to 256 colours");
    }
    pixels_.assign(static_cast<std::size_t>(width) * static_cast<std::size_t>(height), background);
  }

  [[nodiscard]] int width() const noexcept { return width_; }
  [[nodiscard]] int height() const noexcept { return height_; }
  [[nodiscard]] const std::vector<rgb>& palette() const noexcept { return palette_; }

  /// Sets pixel (x, y) (x to the right, y down) to palette index `colour`; outside: ignored.
  void set(int x, int y, std::uint8_t colour) noexcept {
    if (x >= 0 && y >= 0 && x < width_ && y < height_) pixels_[index(x, y)] = colour;
  }
  [[nodiscard]] std::uint8_t at(int x, int y) const { return pixels_.at(index(x, y)); }
  /// Fills the rectangle [x0, x1) x [y0, y1) (clipped to the image).
  void fill(int x0, int y0, int x1, int y1, std::uint8_t colour) noexcept {
    for (int y = y0; y < y1; ++y) {
      for (int x = x0; x < x1; ++x) set(x, y, colour);
    }
  }

 private:
  [[nodiscard]] std::size_t index(int x, int y) const noexcept {
    return static_cast<std::size_t>(y) * static_cast<std::size_t>(width_) +
           static_cast<std::size_t>(x);
  }
  int width_, height_;
  std::vector<rgb> palette_;
  std::vector<std::uint8_t> pixels_;
};

namespace detail {
inline const std::array<std::uint32_t, 256>& crc32_table() {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t n = 0; n < 256; ++n) {
      std::uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1u) != 0 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[n] = c;
    }
    return t;
  }();
  return table;
}

inline void put_u32_be(std::vector<std::uint8_t>& out, std::uint32_t v) {
  out.push_back(static_cast<std::uint8_t>(v >> 24));
  out.push_back(static_cast<std::uint8_t>(v >> 16));
  out.push_back(static_cast<std::uint8_t>(v >> 8));
  out.push_back(static_cast<std::uint8_t>(v));
}
}  // namespace detail

/// CRC-32 (ISO-HDLC, as PNG and zip use), continuing from `crc` (0 to start).
inline std::uint32_t crc32(std::span<const std::uint8_t> data, std::uint32_t crc = 0) {
  const auto& table = detail::crc32_table();
  crc = ~crc;
  for (const std::uint8_t byte : data) crc = table[(crc ^ byte) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

/// Adler-32 (the zlib stream checksum), continuing from `adler` (1 to start).
inline std::uint32_t adler32(std::span<const std::uint8_t> data, std::uint32_t adler = 1) {
  constexpr std::uint32_t mod = 65521;
  std::uint32_t a = adler & 0xFFFFu, b = adler >> 16;
  std::size_t i = 0;
  while (i < data.size()) {
    // 5552 bytes is the most that can be summed before b may exceed 2^32 (zlib's NMAX).
    const std::size_t end = std::min(data.size(), i + 5552);
    for (; i < end; ++i) {
      a += data[i];
      b += a;
    }
    a %= mod;
    b %= mod;
  }
  return (b << 16) | a;
}

/// A zlib stream (RFC 1950) holding `data` in stored deflate blocks (RFC 1951, BTYPE 00).
inline std::vector<std::uint8_t> zlib_stored(std::span<const std::uint8_t> data) {
  std::vector<std::uint8_t> out;
  out.reserve(data.size() + data.size() / 65535 * 5 + 16);
  out.push_back(0x78);  // CMF: deflate, 32 KiB window
  out.push_back(0x01);  // FLG: no dictionary, fastest; (0x78 * 256 + 0x01) % 31 == 0
  std::size_t pos = 0;
  do {
    const std::size_t len = std::min<std::size_t>(65535, data.size() - pos);
    const bool last = pos + len == data.size();
    out.push_back(last ? 0x01 : 0x00);  // BFINAL, BTYPE = 00 (stored), padded to a byte
    const auto n = static_cast<std::uint16_t>(len);
    const auto nn = static_cast<std::uint16_t>(~n);
    out.push_back(static_cast<std::uint8_t>(n & 0xFFu));  // LEN, little endian
    out.push_back(static_cast<std::uint8_t>(n >> 8));
    out.push_back(static_cast<std::uint8_t>(nn & 0xFFu));  // NLEN = ~LEN
    out.push_back(static_cast<std::uint8_t>(nn >> 8));
    out.insert(out.end(), data.begin() + static_cast<std::ptrdiff_t>(pos),
               data.begin() + static_cast<std::ptrdiff_t>(pos + len));
    pos += len;
  } while (pos < data.size());
  detail::put_u32_be(out, adler32(data));
  return out;
}

/// The bytes of a PNG file holding `img`.
inline std::vector<std::uint8_t> encode_png(const image& img) {
  std::vector<std::uint8_t> out = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  auto chunk = [&out](const char(&type)[5], const std::vector<std::uint8_t>& body) {
    detail::put_u32_be(out, static_cast<std::uint32_t>(body.size()));
    const std::size_t start = out.size();
    out.insert(out.end(), type, type + 4);
    out.insert(out.end(), body.begin(), body.end());
    detail::put_u32_be(out, crc32(std::span<const std::uint8_t>(out).subspan(start)));
  };

  // The smallest bit depth the palette fits in (1, 2, 4 or 8 bits per pixel).
  const std::size_t colours = img.palette().size();
  const int depth = colours <= 2 ? 1 : colours <= 4 ? 2 : colours <= 16 ? 4 : 8;

  std::vector<std::uint8_t> header;
  detail::put_u32_be(header, static_cast<std::uint32_t>(img.width()));
  detail::put_u32_be(header, static_cast<std::uint32_t>(img.height()));
  // bit depth, colour type 3 (indexed), deflate, filter method 0, no interlace
  header.insert(header.end(), {static_cast<std::uint8_t>(depth), 3, 0, 0, 0});
  chunk("IHDR", header);

  std::vector<std::uint8_t> plte;
  for (const rgb& c : img.palette()) plte.insert(plte.end(), {c.r, c.g, c.b});
  chunk("PLTE", plte);

  // Each scanline: filter type 0 (none), then the indices packed most significant bits first.
  const auto w = static_cast<std::size_t>(img.width());
  const std::size_t line_bytes = (w * static_cast<std::size_t>(depth) + 7) / 8;
  std::vector<std::uint8_t> raw(static_cast<std::size_t>(img.height()) * (line_bytes + 1), 0);
  for (int y = 0; y < img.height(); ++y) {
    std::uint8_t* line = raw.data() + static_cast<std::size_t>(y) * (line_bytes + 1) + 1;
    for (int x = 0; x < img.width(); ++x) {
      const std::size_t bit = static_cast<std::size_t>(x) * static_cast<std::size_t>(depth);
      const int shift = 8 - depth - static_cast<int>(bit % 8);
      line[bit / 8] = static_cast<std::uint8_t>(line[bit / 8] | (img.at(x, y) << shift));
    }
  }
  chunk("IDAT", zlib_stored(raw));
  chunk("IEND", {});
  return out;
}

/// Writes `bytes` to `path` atomically: into `path`.tmp first, then renamed over `path`.
/// Throws std::runtime_error naming the file when it cannot.
inline void write_file_atomically(const std::filesystem::path& path,
                                  std::span<const std::uint8_t> bytes) {
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw std::runtime_error("cannot open '" + tmp.string() + "' for writing");
    f.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
    f.flush();
    if (!f) throw std::runtime_error("cannot write '" + tmp.string() + "'");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    const std::string why = ec.message();
    std::filesystem::remove(tmp, ec);
    throw std::runtime_error("cannot rename '" + tmp.string() + "' to '" + path.string() +
                             "': " + why);
  }
}

inline void write_png(const std::filesystem::path& path, const image& img) {
  const std::vector<std::uint8_t> bytes = encode_png(img);
  write_file_atomically(path, bytes);
}

}  // namespace hone_examples
