// hone/profile/chrome_json.hpp: a trace sink that writes Chrome's trace-event JSON
// ({"traceEvents":[...]}; opens in the Perfetto UI and chrome://tracing), streamed: each drain
// appends its events to the file, and close() writes the closing brackets.
//
// Zones are B/E pairs on their thread (pid, tid), counters "C" events (one series per name, in
// the process), thread names "M" thread_name metadata, flows "s"/"f" events bound to the
// enclosing zone (category "flow"). A GPU stream's device zones (thread_info::device) are B/E
// pairs on a thread of their own: tid 2^30 + n, named "GPU 0 stream 13" by its thread_name. Times
// are microseconds of steady_clock with nanosecond digits.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

#include "hone/core/config.hpp"
#include "hone/io/file_io.hpp"
#include "hone/profile/collector.hpp"

HONE_NAMESPACE_BEGIN
namespace profile {

class chrome_json_writer final : public trace_sink {
 public:
  /// `rank` >= 0 (trace_options::rank): the events carry the rank as their pid, and the process
  /// is named "rank N (pid P)", so the files of several processes merge without clashing
  /// (hone/profile/merge.hpp). -1: the operating system's pid.
  explicit chrome_json_writer(const std::filesystem::path& path, int rank = -1)
      : file_(path, io::create_mode::truncate, io::write_hashing::off), rank_(rank) {
    buf_ = "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[";
  }

  void thread(const thread_info& t) override {
    if (rank_ >= 0 && !process_named_) {
      process_named_ = true;
      open_event();
      buf_ += "\"ph\":\"M\",\"name\":\"process_name\",\"pid\":";
      buf_ += std::to_string(rank_);
      buf_ += ",\"args\":{\"name\":";
      quote("rank " + std::to_string(rank_) + " (pid " + std::to_string(t.pid) + ")");
      buf_ += "}}";
    }
    if (t.name.empty()) return;
    open_event();
    buf_ += "\"ph\":\"M\",\"name\":\"thread_name\"";
    ids(t);
    buf_ += ",\"args\":{\"name\":";
    quote(t.name);
    buf_ += "}}";
  }

  void event(const thread_info& t, event_kind kind, const char* name, std::uint64_t ns,
             std::uint64_t arg) override {
    open_event();
    switch (kind) {
      case event_kind::begin:
        buf_ += "\"ph\":\"B\"";
        break;
      case event_kind::end:
        buf_ += "\"ph\":\"E\"";
        break;
      case event_kind::counter:
        buf_ += "\"ph\":\"C\"";
        break;
      case event_kind::flow_out:
        buf_ += "\"ph\":\"s\",\"cat\":\"flow\",\"id\":";
        buf_ += std::to_string(arg);
        break;
      case event_kind::flow_in:
        buf_ += "\"ph\":\"f\",\"bp\":\"e\",\"cat\":\"flow\",\"id\":";
        buf_ += std::to_string(arg);
        break;
    }
    buf_ += ",\"name\":";
    quote(name);
    ids(t);
    char ts[48];
    std::snprintf(ts, sizeof ts, ",\"ts\":%llu.%03u", static_cast<unsigned long long>(ns / 1000),
                  static_cast<unsigned>(ns % 1000));
    buf_ += ts;
    if (kind == event_kind::counter) {
      const double v = std::bit_cast<double>(arg);
      char val[48];
      if (std::isfinite(v)) {
        std::snprintf(val, sizeof val, ",\"args\":{\"value\":%.17g}", v);
      } else {
        std::snprintf(val, sizeof val, ",\"args\":{\"value\":null}");  // JSON has no inf/NaN
      }
      buf_ += val;
    }
    buf_ += '}';
    if (buf_.size() >= flush_bytes) flush();
  }

  void flush() override {
    if (!buf_.empty()) file_.write(buf_);
    buf_.clear();
  }

  /// Writes the end of the JSON document and closes the file.
  void close() {
    buf_ += "\n]}\n";
    flush();
    file_.close();
  }

 private:
  static constexpr std::size_t flush_bytes = std::size_t{1} << 20;

  void open_event() {
    buf_ += first_ ? "\n{" : ",\n{";
    first_ = false;
  }
  void ids(const thread_info& t) {
    buf_ += ",\"pid\":";
    buf_ += std::to_string(rank_ >= 0 ? static_cast<std::uint64_t>(rank_) : t.pid);
    buf_ += ",\"tid\":";
    buf_ += std::to_string(t.tid);
  }
  void quote(std::string_view s) {
    buf_ += '"';
    for (const char ch : s) {
      const auto u = static_cast<unsigned char>(ch);
      if (ch == '"' || ch == '\\') {
        buf_ += '\\';
        buf_ += ch;
      } else if (u < 0x20) {
        char esc[8];
        std::snprintf(esc, sizeof esc, "\\u%04x", u);
        buf_ += esc;
      } else {
        buf_ += ch;
      }
    }
    buf_ += '"';
  }

  io::output_file file_;
  int rank_;
  bool process_named_ = false;
  std::string buf_;
  bool first_ = true;
};

}  // namespace profile
HONE_NAMESPACE_END
