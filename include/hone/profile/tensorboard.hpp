// hone/profile/tensorboard.hpp: hone::profile::tensorboard_writer, scalars to a TensorBoard event
// file `<log dir>/events.out.tfevents.<10-digit Unix time>.<host>.<pid>.<n>` (TensorFlow's name,
// with PyTorch SummaryWriter's pid and per-process counter so two writers never share a file;
// TensorBoard reads every file whose name holds "tfevents").
//
// The file is a sequence of TFRecords: uint64 length (little-endian), the masked CRC-32C of those
// 8 bytes, the payload, the masked CRC-32C of the payload (hone/profile/detail/crc32c.hpp). Each
// payload is a `tensorboard.Event` protobuf (tensorboard/compat/proto/event.proto and
// summary.proto in the tensorboard pip package; field numbers in tensorboard_fields), encoded by
// hand with hone/profile/detail/protobuf.hpp: the first event carries file_version
// "brain.Event:2", each later one a Summary with one Value {tag, simple_value}, as SummaryWriter's
// add_scalar writes. simple_value is a float: a double value is rounded to float32 (TensorBoard
// stores nothing wider for a scalar).
//
// Each batch is framed in memory and written with one write(); close() fsyncs.
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

#include "hone/core/config.hpp"
#include "hone/io/file_io.hpp"
#include "hone/profile/detail/crc32c.hpp"
#include "hone/profile/detail/protobuf.hpp"
#include "hone/profile/metric_writer.hpp"

HONE_NAMESPACE_BEGIN
namespace profile {

/// Field numbers of tensorboard.Event, tensorboard.Summary and tensorboard.Summary.Value
/// (tensorboard 2.21, tensorboard/compat/proto/event.proto and summary.proto).
struct tensorboard_fields {
  static constexpr std::uint32_t event_wall_time = 1;     // double
  static constexpr std::uint32_t event_step = 2;          // int64
  static constexpr std::uint32_t event_file_version = 3;  // string
  static constexpr std::uint32_t event_summary = 5;       // Summary
  static constexpr std::uint32_t summary_value = 1;       // repeated Summary.Value
  static constexpr std::uint32_t value_tag = 1;           // string
  static constexpr std::uint32_t value_simple_value = 2;  // float
};

namespace detail {

/// Appends one TFRecord holding `payload` to `out`.
inline void append_tfrecord(byte_buffer& out, std::string_view payload) {
  const std::uint64_t n = payload.size();
  char head[12];
  for (int i = 0; i < 8; ++i) head[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  const std::uint32_t head_crc = masked_crc32c(std::string_view(head, 8));
  const std::uint32_t body_crc = masked_crc32c(payload);
  for (int i = 0; i < 4; ++i) head[8 + i] = static_cast<char>((head_crc >> (8 * i)) & 0xff);
  char* p = out.grow(12 + payload.size() + 4);
  std::memcpy(p, head, 12);
  if (!payload.empty()) std::memcpy(p + 12, payload.data(), payload.size());
  p += 12 + payload.size();
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((body_crc >> (8 * i)) & 0xff);
  out.set_size(out.size() + 12 + payload.size() + 4);
}

/// Encodes the Event of one scalar into `out` (replacing its content).
inline void encode_scalar_event(byte_buffer& out, const scalar_event& e) {
  using f = tensorboard_fields;
  out.clear();
  proto_writer w(out);
  w.f64(f::event_wall_time, e.wall_time);
  w.sint(f::event_step, e.step);
  w.message(f::event_summary, [&](proto_writer& s) {
    s.message(f::summary_value, [&](proto_writer& v) {
      v.bytes(f::value_tag, e.tag);
      v.f32(f::value_simple_value, static_cast<float>(e.value));
    });
  });
  w.finish();
}

/// Encodes the first Event of a file (file_version "brain.Event:2") into `out`.
inline void encode_file_version_event(byte_buffer& out, double wall_time) {
  using f = tensorboard_fields;
  out.clear();
  proto_writer w(out);
  w.f64(f::event_wall_time, wall_time);
  w.sint(f::event_step, 0);
  w.bytes(f::event_file_version, "brain.Event:2");
  w.finish();
}

inline double wall_seconds() noexcept {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// `events.out.tfevents.<10-digit time>.<host>.<pid>.<n>`.
inline std::string tfevents_file_name(double wall_time) {
  static std::atomic<unsigned> counter{0};
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') {
    std::snprintf(host, sizeof host, "localhost");
  }
  char name[400];
  std::snprintf(name, sizeof name, "events.out.tfevents.%010lld.%s.%ld.%u",
                static_cast<long long>(wall_time), host, static_cast<long>(::getpid()),
                counter.fetch_add(1, std::memory_order_relaxed));
  return name;
}

}  // namespace detail

class tensorboard_writer final : public metric_writer {
 public:
  /// Creates `log_dir` if missing and a new event file in it, and writes the file_version event.
  /// io_error naming the path if the directory or the file cannot be created.
  explicit tensorboard_writer(const std::filesystem::path& log_dir)
      : file_((detail::create_metrics_directory(log_dir),
               log_dir / detail::tfevents_file_name(detail::wall_seconds())),
              io::create_mode::exclusive, io::write_hashing::off) {
    detail::encode_file_version_event(event_, detail::wall_seconds());
    detail::append_tfrecord(records_, event_.view());
    file_.write(records_.view());
    records_.clear();
  }

  void write(std::span<const scalar_event> events) override {
    records_.clear();
    for (const scalar_event& e : events) {
      detail::encode_scalar_event(event_, e);
      detail::append_tfrecord(records_, event_.view());
    }
    if (!records_.empty()) file_.write(records_.view());
  }
  void flush() override {}
  void close() override {
    if (!file_.is_open()) return;
    file_.sync();
    (void)file_.close();
  }

  /// The event file's path.
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return file_.path(); }

 private:
  io::output_file file_;
  detail::byte_buffer event_;
  detail::byte_buffer records_;
};

}  // namespace profile
HONE_NAMESPACE_END
