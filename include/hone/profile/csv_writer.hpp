// hone/profile/csv_writer.hpp: hone::profile::csv_writer, scalars to a CSV file, one row per
// scalar (long format: tags may appear at any step, so their columns are not known up front):
//
//   step,tag,value,wall_time
//   1,train/loss,0.6931471805599453,1764240000.123456
//
// A tag holding a comma, a double quote, a CR or a LF is quoted as RFC 4180 says (in double quotes,
// each inner quote doubled); lines end with LF (RFC 4180 names CRLF; Python's csv module, pandas
// and spreadsheets read both). Values are the shortest decimal that reads back as the same double
// (std::to_chars), "nan", "-nan", "inf" or "-inf" for the non-finite ones (Python's float() reads
// each); wall_time is seconds since the Unix epoch. pandas: pd.read_csv(path).pivot_table(
// index="step", columns="tag", values="value") gives one column per tag.
//
// Each batch is formatted in memory and written with one write() (nothing stays buffered in the
// process after write() returns); close() fsyncs. The parent directory is created if missing.
#pragma once

#include <charconv>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "hone/core/config.hpp"
#include "hone/io/file_io.hpp"
#include "hone/profile/metric_writer.hpp"

HONE_NAMESPACE_BEGIN
namespace profile {

namespace detail {

/// Appends `field` to `out`, quoted as RFC 4180 says when it holds ',', '"', CR or LF.
inline void append_csv_field(std::string& out, std::string_view field) {
  if (field.find_first_of(",\"\r\n") == std::string_view::npos) {
    out += field;
    return;
  }
  out += '"';
  for (const char c : field) {
    if (c == '"') out += '"';
    out += c;
  }
  out += '"';
}

/// Appends the shortest decimal form of v that reads back as v ("nan", "inf", "-inf" as such).
template <class T>
void append_number(std::string& out, T v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

}  // namespace detail

class csv_writer final : public metric_writer {
 public:
  /// Creates (or empties) the file at `path`, its parent directory if missing, and writes the
  /// header. io_error naming the path if either cannot be created.
  explicit csv_writer(std::filesystem::path path)
      : file_((detail::create_metrics_directory(path.parent_path()), std::move(path)),
              io::create_mode::truncate, io::write_hashing::off) {
    file_.write(std::string_view("step,tag,value,wall_time\n"));
  }

  void write(std::span<const scalar_event> events) override {
    text_.clear();
    for (const scalar_event& e : events) {
      detail::append_number(text_, e.step);
      text_ += ',';
      detail::append_csv_field(text_, e.tag);
      text_ += ',';
      detail::append_number(text_, e.value);
      text_ += ',';
      detail::append_number(text_, e.wall_time);
      text_ += '\n';
    }
    if (!text_.empty()) file_.write(std::string_view(text_));
  }
  void flush() override {}
  void close() override {
    if (!file_.is_open()) return;
    file_.sync();
    (void)file_.close();
  }

  [[nodiscard]] const std::filesystem::path& path() const noexcept { return file_.path(); }

 private:
  io::output_file file_;
  std::string text_;
};

}  // namespace profile
HONE_NAMESPACE_END
