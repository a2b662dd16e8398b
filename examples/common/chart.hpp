// examples/common/chart.hpp: line charts drawn into a hone_examples::image (see png.hpp), with
// axes, "nice" ticks, tick labels, a title and a legend, and text in a built-in 3x5 pixel font.
//
//   hone_examples::image img(1000, 420, hone_examples::chart_palette());
//   hone_examples::chart c{.title = "loss", .x_label = "step"};
//   c.lines.push_back({.label = "train", .x = steps, .y = losses, .colour = hone_examples::blue});
//   hone_examples::draw_chart(img, {.left = 0, .top = 0, .width = 500, .height = 420}, c);
//   hone_examples::write_png("loss.png", img);
//
// Text is drawn in capitals (lower case is shown as upper case); the font has digits, A-Z and
// . , - + % : / ( ) = _ and space. Non-finite points are left out (the line breaks there).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "png.hpp"

namespace hone_examples {

// ---- palette -------------------------------------------------------------------------------
inline constexpr std::uint8_t white = 0, black = 1, light_grey = 2, grey = 3, blue = 4,
                              light_blue = 5, orange = 6, red = 7, green = 8;

/// The palette the colour constants above index.
inline std::vector<rgb> chart_palette() {
  return {{255, 255, 255}, {20, 20, 20},   {225, 225, 225}, {120, 120, 120}, {31, 90, 180},
          {160, 190, 230}, {230, 120, 20}, {200, 30, 30},   {40, 150, 60}};
}

// ---- text ----------------------------------------------------------------------------------
/// The 3x5 glyph of `c`: 15 bits, row by row from the top, the most significant bit of each
/// 3-bit row on the left. Unknown characters are blank.
constexpr std::uint16_t glyph(char c) noexcept {
  if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  switch (c) {
    case '0':
      return 0b111'101'101'101'111;
    case '1':
      return 0b010'110'010'010'111;
    case '2':
      return 0b111'001'111'100'111;
    case '3':
      return 0b111'001'111'001'111;
    case '4':
      return 0b101'101'111'001'001;
    case '5':
      return 0b111'100'111'001'111;
    case '6':
      return 0b111'100'111'101'111;
    case '7':
      return 0b111'001'010'010'010;
    case '8':
      return 0b111'101'111'101'111;
    case '9':
      return 0b111'101'111'001'111;
    case 'A':
      return 0b010'101'111'101'101;
    case 'B':
      return 0b110'101'110'101'110;
    case 'C':
      return 0b011'100'100'100'011;
    case 'D':
      return 0b110'101'101'101'110;
    case 'E':
      return 0b111'100'110'100'111;
    case 'F':
      return 0b111'100'110'100'100;
    case 'G':
      return 0b011'100'101'101'011;
    case 'H':
      return 0b101'101'111'101'101;
    case 'I':
      return 0b111'010'010'010'111;
    case 'J':
      return 0b001'001'001'101'010;
    case 'K':
      return 0b101'101'110'101'101;
    case 'L':
      return 0b100'100'100'100'111;
    case 'M':
      return 0b101'111'111'101'101;
    case 'N':
      return 0b110'101'101'101'101;
    case 'O':
      return 0b010'101'101'101'010;
    case 'P':
      return 0b110'101'110'100'100;
    case 'Q':
      return 0b010'101'101'110'011;
    case 'R':
      return 0b110'101'110'101'101;
    case 'S':
      return 0b011'100'010'001'110;
    case 'T':
      return 0b111'010'010'010'010;
    case 'U':
      return 0b101'101'101'101'111;
    case 'V':
      return 0b101'101'101'101'010;
    case 'W':
      return 0b101'101'111'111'101;
    case 'X':
      return 0b101'101'010'101'101;
    case 'Y':
      return 0b101'101'010'010'010;
    case 'Z':
      return 0b111'001'010'100'111;
    case '.':
      return 0b000'000'000'000'010;
    case ',':
      return 0b000'000'000'010'100;
    case '-':
      return 0b000'000'111'000'000;
    case '+':
      return 0b000'010'111'010'000;
    case '%':
      return 0b100'001'010'100'001;
    case ':':
      return 0b000'010'000'010'000;
    case '/':
      return 0b001'001'010'100'100;
    case '(':
      return 0b001'010'010'010'001;
    case ')':
      return 0b100'010'010'010'100;
    case '=':
      return 0b000'111'000'111'000;
    case '_':
      return 0b000'000'000'000'111;
    default:
      return 0;
  }
}

/// Width in pixels of `text` drawn at `scale` (each glyph 3 wide plus 1 of spacing).
inline int text_width(std::string_view text, int scale) noexcept {
  return text.empty() ? 0 : static_cast<int>(text.size()) * 4 * scale - scale;
}
/// Height in pixels of a line of text at `scale`.
inline int text_height(int scale) noexcept {
  return 5 * scale;
}

/// Draws `text` with its top-left corner at (x, y), each font pixel a scale x scale square.
inline void draw_text(image& img, int x, int y, std::string_view text, std::uint8_t colour,
                      int scale = 2) {
  for (const char c : text) {
    const std::uint16_t g = glyph(c);
    for (int row = 0; row < 5; ++row) {
      for (int col = 0; col < 3; ++col) {
        if (((g >> (14 - (row * 3 + col))) & 1u) != 0) {
          img.fill(x + col * scale, y + row * scale, x + (col + 1) * scale, y + (row + 1) * scale,
                   colour);
        }
      }
    }
    x += 4 * scale;
  }
}

// ---- lines ---------------------------------------------------------------------------------
/// A rectangle of the image: [left, left + width) x [top, top + height).
struct rect {
  int left = 0, top = 0, width = 0, height = 0;
  [[nodiscard]] bool contains(int x, int y) const noexcept {
    return x >= left && y >= top && x < left + width && y < top + height;
  }
};

/// Draws a line (Bresenham) `thickness` pixels wide, clipped to `clip`.
inline void draw_line(image& img, int x0, int y0, int x1, int y1, std::uint8_t colour,
                      int thickness, const rect& clip) {
  const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0);
  const int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
  const int lo = -(thickness - 1) / 2, hi = thickness / 2;
  int err = dx + dy;
  for (;;) {
    for (int oy = lo; oy <= hi; ++oy) {
      for (int ox = lo; ox <= hi; ++ox) {
        if (clip.contains(x0 + ox, y0 + oy)) img.set(x0 + ox, y0 + oy, colour);
      }
    }
    if (x0 == x1 && y0 == y1) break;
    const int e2 = 2 * err;
    if (e2 >= dy) {
      err += dy;
      x0 += sx;
    }
    if (e2 <= dx) {
      err += dx;
      y0 += sy;
    }
  }
}

// ---- ticks ---------------------------------------------------------------------------------
/// A "nice" tick spacing (1, 2 or 5 times a power of ten) giving about `target` intervals.
inline double nice_tick_step(double range, int target) {
  if (!(range > 0) || !std::isfinite(range)) return 1.0;
  const double raw = range / target;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / magnitude;
  return (f < 1.5 ? 1.0 : f < 3.0 ? 2.0 : f < 7.0 ? 5.0 : 10.0) * magnitude;
}

/// A tick label with as many decimals as the spacing `step` needs ("0.25", "100").
inline std::string tick_label(double value, double step) {
  const int decimals = std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9)));
  if (std::abs(value) < step * 1e-6) value = 0.0;  // no "-0.0"
  char text[32];
  std::snprintf(text, sizeof(text), "%.*f", decimals, value);
  return text;
}

// ---- charts --------------------------------------------------------------------------------
struct series {
  std::string label = {};
  std::vector<double> x = {}, y = {};
  std::uint8_t colour = blue;
  int thickness = 2;
  bool markers = false;  // a small square at each point
};

struct chart {
  std::string title = {};
  std::string x_label = {};
  std::vector<series> lines = {};
  /// Fixed x-axis limits; unset: from the data.
  std::optional<double> x_min = std::nullopt, x_max = std::nullopt;
  /// Fixed y-axis limits; unset: from the data (rounded out to ticks).
  std::optional<double> y_min = std::nullopt, y_max = std::nullopt;
  /// x positions flagged with a short vertical mark above the x axis (e.g. skipped steps).
  std::vector<double> marks = {};
  std::string marks_label = {};
  std::uint8_t marks_colour = red;
};

/// Draws `c` into the `area` of `img`: title and legend on top, y tick labels on the left, x tick
/// labels and x label below, grid lines at the ticks.
inline void draw_chart(image& img, const rect& area, const chart& c) {
  constexpr int scale = 2;
  const int th = text_height(scale);
  // Data ranges.
  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin;
  double ymin = xmin, ymax = -xmin;
  for (const series& s : c.lines) {
    for (std::size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      xmin = std::min(xmin, s.x[i]);
      xmax = std::max(xmax, s.x[i]);
      ymin = std::min(ymin, s.y[i]);
      ymax = std::max(ymax, s.y[i]);
    }
  }
  if (!std::isfinite(xmin)) xmin = 0, xmax = 1, ymin = 0, ymax = 1;  // no data
  if (c.x_min) xmin = *c.x_min;
  if (c.x_max) xmax = *c.x_max;
  if (c.y_min) ymin = *c.y_min;
  if (c.y_max) ymax = *c.y_max;
  if (xmax <= xmin) xmax = xmin + 1;
  if (ymax <= ymin) ymax = ymin + 1;
  const double ystep = nice_tick_step(ymax - ymin, 5);
  if (!c.y_min) ymin = std::floor(ymin / ystep) * ystep;
  if (!c.y_max) ymax = std::ceil(ymax / ystep) * ystep;
  const double xstep = nice_tick_step(xmax - xmin, 6);

  // Layout: y labels decide the left margin.
  std::vector<std::pair<double, std::string>> yticks;
  int label_w = 0;
  for (double v = std::ceil(ymin / ystep - 1e-9) * ystep; v <= ymax + ystep * 1e-9; v += ystep) {
    yticks.emplace_back(v, tick_label(v, ystep));
    label_w = std::max(label_w, text_width(yticks.back().second, scale));
  }
  const rect plot{.left = area.left + label_w + 14,
                  .top = area.top + th + 16,
                  .width = area.width - (label_w + 14) - 24,  // room for the last x label
                  .height = area.height - (th + 16) - (2 * th + 20)};
  if (plot.width < 10 || plot.height < 10) return;  // too small to draw anything useful
  const int bottom = plot.top + plot.height - 1, right = plot.left + plot.width - 1;
  auto px = [&](double x) {
    return plot.left + static_cast<int>(std::lround((x - xmin) / (xmax - xmin) * (plot.width - 1)));
  };
  auto py = [&](double y) {
    return bottom - static_cast<int>(std::lround((y - ymin) / (ymax - ymin) * (plot.height - 1)));
  };

  // Title (left) and legend (right) above the plot.
  draw_text(img, plot.left, area.top + 6, c.title, black, scale);
  int lx = right;
  auto legend_entry = [&](const std::string& label, std::uint8_t colour, bool as_mark) {
    lx -= text_width(label, scale);
    draw_text(img, lx, area.top + 6, label, black, scale);
    lx -= 22;
    const int ly = area.top + 6 + th / 2;
    if (as_mark) {
      draw_line(img, lx + 8, ly - 5, lx + 8, ly + 5, colour, 2, area);
    } else {
      draw_line(img, lx, ly, lx + 16, ly, colour, 3, area);
    }
    lx -= 14;
  };
  if (!c.marks.empty() && !c.marks_label.empty()) legend_entry(c.marks_label, c.marks_colour, true);
  for (auto it = c.lines.rbegin(); it != c.lines.rend(); ++it) {
    legend_entry(it->label, it->colour, false);
  }

  // Grid, ticks and tick labels.
  for (const auto& [v, label] : yticks) {
    const int y = py(v);
    draw_line(img, plot.left, y, right, y, light_grey, 1, plot);
    draw_line(img, plot.left - 5, y, plot.left - 1, y, black, 1, area);
    draw_text(img, plot.left - 9 - text_width(label, scale), y - th / 2, label, black, scale);
  }
  for (double v = std::ceil(xmin / xstep - 1e-9) * xstep; v <= xmax + xstep * 1e-9; v += xstep) {
    const int x = px(v);
    const std::string label = tick_label(v, xstep);
    draw_line(img, x, plot.top, x, bottom, light_grey, 1, plot);
    draw_line(img, x, bottom + 1, x, bottom + 5, black, 1, area);
    draw_text(img, x - text_width(label, scale) / 2, bottom + 9, label, black, scale);
  }
  draw_text(img, plot.left + (plot.width - text_width(c.x_label, scale)) / 2, bottom + th + 18,
            c.x_label, black, scale);

  // Data, then the axes on top.
  for (const series& s : c.lines) {
    bool have_prev = false;
    int x0 = 0, y0 = 0;
    for (std::size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) {
        have_prev = false;
        continue;
      }
      const int x = px(s.x[i]), y = py(s.y[i]);
      if (have_prev) draw_line(img, x0, y0, x, y, s.colour, s.thickness, plot);
      if (s.markers) img.fill(std::max(x - 2, plot.left), y - 2, x + 3, y + 3, s.colour);
      x0 = x;
      y0 = y;
      have_prev = true;
    }
  }
  for (const double m : c.marks) {
    if (std::isfinite(m))
      draw_line(img, px(m), bottom - 12, px(m), bottom, c.marks_colour, 2, plot);
  }
  draw_line(img, plot.left - 1, plot.top, plot.left - 1, bottom + 1, black, 1, area);
  draw_line(img, plot.left - 1, bottom + 1, right, bottom + 1, black, 1, area);
}

}  // namespace hone_examples
