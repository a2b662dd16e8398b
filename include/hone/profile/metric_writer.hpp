// hone/profile/metric_writer.hpp: what a metrics sink hands its writers. hone::profile::
// metrics_sink (hone/profile/metrics.hpp) queues scalars and passes them in batches, on its
// background thread, to each metric_writer: csv_writer (hone/profile/csv_writer.hpp) and
// tensorboard_writer (hone/profile/tensorboard.hpp) are the ready-made ones; a user's own writer
// (a database, a socket) derives from metric_writer and is handed to the sink's constructor.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <system_error>

#include "hone/core/config.hpp"
#include "hone/io/file_io.hpp"

HONE_NAMESPACE_BEGIN
namespace profile {

/// One scalar: its tag, the step it belongs to, its value, and when it was logged (seconds since
/// the Unix epoch, system_clock, as TensorBoard's wall_time).
struct scalar_event {
  std::string tag;
  std::int64_t step = 0;
  double value = 0.0;
  double wall_time = 0.0;
};

/// A destination of scalars. The sink calls write() with each batch (in the order the scalars were
/// logged), flush() when asked to (metrics_sink::flush), and close() once at the end, all from its
/// background thread, never two at a time. An exception thrown by any of them stops the sink:
/// the next call of the sink on the user's side rethrows it.
class metric_writer {
 public:
  virtual ~metric_writer() = default;
  virtual void write(std::span<const scalar_event> events) = 0;
  /// Hands what write() may have kept in memory to the operating system.
  virtual void flush() = 0;
  /// Flushes, makes the data durable (fsync) and closes.
  virtual void close() = 0;
};

namespace detail {

/// Creates `dir` and its parents (no-op for an empty path or an existing directory); io_error
/// naming the directory if it cannot.
inline void create_metrics_directory(const std::filesystem::path& dir) {
  if (dir.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    throw io_error("hone::profile: cannot create the metrics directory '" + dir.string() +
                   "': " + ec.message() + "; pass a directory that can be created and written");
  }
}

}  // namespace detail
}  // namespace profile
HONE_NAMESPACE_END
