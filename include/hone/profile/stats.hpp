// hone/profile/stats.hpp: duration statistics with bounded memory (count, total, mean, min, max
// exact; p50/p95/p99 from a log-linear histogram, within 1/32 of the true value), and the summary
// table that prints them.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "hone/core/config.hpp"

HONE_NAMESPACE_BEGIN
namespace profile {

/// Statistics of a series of durations in any integral unit (ticks or nanoseconds): 16 buckets per
/// power of two (976 buckets, 7.6 KiB), so a quantile is known to within 1/32 of its value.
class duration_stats {
 public:
  static constexpr unsigned sub_bits = 4;
  static constexpr unsigned sub = 1u << sub_bits;
  static constexpr unsigned bucket_count = sub + (64 - sub_bits) * sub;

  void add(std::uint64_t v) noexcept {
    ++count_;
    total_ += v;
    min_ = std::min(min_, v);
    max_ = std::max(max_, v);
    ++buckets_[bucket_of(v)];
  }

  [[nodiscard]] std::uint64_t count() const noexcept { return count_; }
  [[nodiscard]] std::uint64_t total() const noexcept { return total_; }
  [[nodiscard]] std::uint64_t min() const noexcept { return count_ ? min_ : 0; }
  [[nodiscard]] std::uint64_t max() const noexcept { return max_; }
  [[nodiscard]] double mean() const noexcept {
    return count_ ? static_cast<double>(total_) / static_cast<double>(count_) : 0.0;
  }

  /// The q-quantile (0 <= q <= 1) by the nearest-rank rule: the midpoint of the bucket holding
  /// the ceil(q * count)-th smallest value, clamped to [min, max]; 0 when empty.
  [[nodiscard]] double quantile(double q) const noexcept {
    if (count_ == 0) return 0.0;
    const double want = std::max(1.0, std::ceil(q * static_cast<double>(count_)));
    std::uint64_t seen = 0;
    for (unsigned b = 0; b < bucket_count; ++b) {
      seen += buckets_[b];
      if (static_cast<double>(seen) >= want) {
        const double mid = (static_cast<double>(lower(b)) + static_cast<double>(upper(b))) / 2.0;
        return std::clamp(mid, static_cast<double>(min_), static_cast<double>(max_));
      }
    }
    return static_cast<double>(max_);
  }

  /// Adds another series' statistics to these.
  void merge(const duration_stats& o) noexcept {
    count_ += o.count_;
    total_ += o.total_;
    min_ = std::min(min_, o.min_);
    max_ = std::max(max_, o.max_);
    for (unsigned b = 0; b < bucket_count; ++b) buckets_[b] += o.buckets_[b];
  }

  static constexpr unsigned bucket_of(std::uint64_t v) noexcept {
    if (v < sub) return static_cast<unsigned>(v);
    const unsigned e = 63u - static_cast<unsigned>(std::countl_zero(v));  // e >= sub_bits
    const auto m = static_cast<unsigned>((v >> (e - sub_bits)) & (sub - 1));
    return sub + (e - sub_bits) * sub + m;
  }
  /// The smallest value of bucket b, and one past its largest.
  static constexpr std::uint64_t lower(unsigned b) noexcept {
    if (b < sub) return b;
    const unsigned e = (b - sub) / sub + sub_bits;
    const std::uint64_t m = (b - sub) % sub;
    return (std::uint64_t{1} << e) + (m << (e - sub_bits));
  }
  static constexpr std::uint64_t upper(unsigned b) noexcept {
    if (b < sub) return b + 1;
    const unsigned e = (b - sub) / sub + sub_bits;
    return lower(b) + (std::uint64_t{1} << (e - sub_bits));
  }

 private:
  std::uint64_t count_ = 0;
  std::uint64_t total_ = 0;
  std::uint64_t min_ = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t max_ = 0;
  std::array<std::uint64_t, bucket_count> buckets_{};
};

/// One row of a summary: a zone's or phase's statistics in nanoseconds.
struct summary_row {
  std::string name;
  std::uint64_t count = 0;
  double total_ns = 0;
  double mean_ns = 0;
  double p50_ns = 0;
  double p95_ns = 0;
  double p99_ns = 0;
  double max_ns = 0;
};

/// A row from statistics kept in a unit `ns_per_unit` nanoseconds long.
inline summary_row make_row(std::string name, const duration_stats& s, double ns_per_unit = 1.0) {
  return {std::move(name),
          s.count(),
          static_cast<double>(s.total()) * ns_per_unit,
          s.mean() * ns_per_unit,
          s.quantile(0.50) * ns_per_unit,
          s.quantile(0.95) * ns_per_unit,
          s.quantile(0.99) * ns_per_unit,
          static_cast<double>(s.max()) * ns_per_unit};
}

namespace detail {
/// A duration with a unit that keeps 3-4 significant digits: "812 ns", "12.4 us", "3.05 ms".
inline std::string format_duration(double ns) {
  char buf[32];
  if (ns < 1e3) {
    std::snprintf(buf, sizeof buf, "%.0f ns", ns);
  } else if (ns < 1e6) {
    std::snprintf(buf, sizeof buf, "%.3g us", ns / 1e3);
  } else if (ns < 1e9) {
    std::snprintf(buf, sizeof buf, "%.3g ms", ns / 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "%.4g s", ns / 1e9);
  }
  return buf;
}
}  // namespace detail

/// Prints rows as a table: name, count, total, mean, p50, p95, p99, max.
inline void print_summary(std::ostream& os, const std::vector<summary_row>& rows) {
  std::size_t w = 4;
  for (const auto& r : rows) w = std::max(w, r.name.size());
  char line[256];
  std::snprintf(line, sizeof line, "%-*s %10s %10s %10s %10s %10s %10s %10s\n", static_cast<int>(w),
                "zone", "count", "total", "mean", "p50", "p95", "p99", "max");
  os << line;
  for (const auto& r : rows) {
    std::snprintf(
        line, sizeof line, "%-*s %10llu %10s %10s %10s %10s %10s %10s\n", static_cast<int>(w),
        r.name.c_str(), static_cast<unsigned long long>(r.count),
        detail::format_duration(r.total_ns).c_str(), detail::format_duration(r.mean_ns).c_str(),
        detail::format_duration(r.p50_ns).c_str(), detail::format_duration(r.p95_ns).c_str(),
        detail::format_duration(r.p99_ns).c_str(), detail::format_duration(r.max_ns).c_str());
    os << line;
  }
}

}  // namespace profile
HONE_NAMESPACE_END
