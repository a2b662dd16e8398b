// hone/profile/metrics.hpp: hone::profile::metrics_sink, scalars per step written by a background
// thread to a CSV file (hone/profile/csv_writer.hpp), a TensorBoard event file
// (hone/profile/tensorboard.hpp) and any user writer (hone/profile/metric_writer.hpp).
//
//   hone::profile::metrics_sink metrics({.csv = "run/metrics.csv", .tensorboard = "run/tb"});
//   for (...) {
//     const hone::step_report r = trainer.step(batch);
//     metrics.log(r);                                  // train/loss, train/grad_norm, train/lr,
//     ... metrics.scalar("eval/accuracy", step, acc); hone::profile::log_memory(metrics,
//     monitor.latest(), step);
//   }
//   metrics.close();                                   // or let the destructor close it
//
// scalar() copies the scalar into a bounded queue (queue_capacity entries) under a mutex and
// returns; the sink's thread takes the whole queue every flush_interval (or as soon as it is half
// full, or on flush()) and hands it to the writers. When the queue is full, scalar() waits for the
// thread to take it (stalls() counts those waits): nothing is dropped, as with PyTorch's
// SummaryWriter, whose queue put() blocks too. With the default 65536 entries and 1 s interval a
// step logging fewer than 32768 scalars per second never waits.
//
// What a crash loses: the scalars still queued, at most those of the last flush_interval (the
// thread writes the rest with write(), so they are in the operating system's cache and survive
// the process being killed); a power failure can also lose what the OS had not written to disk
// before close() (which fsyncs). An error of a writer (a full disk) stops the sink: the next
// scalar(), flush() or close() throws it.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/offload/memory_monitor.hpp"
#include "hone/profile/csv_writer.hpp"
#include "hone/profile/metric_writer.hpp"
#include "hone/profile/tensorboard.hpp"
#include "hone/train/policies.hpp"

HONE_NAMESPACE_BEGIN
namespace profile {

struct metrics_options {
  std::filesystem::path csv{};          ///< a CSV file (csv_writer); empty: none
  std::filesystem::path tensorboard{};  ///< a TensorBoard log directory; empty: none
  /// Scalars the queue holds before scalar() waits for the background thread.
  std::size_t queue_capacity = std::size_t{1} << 16;
  /// How often the background thread writes what was queued (it also writes as soon as the queue
  /// is half full, and on flush()).
  std::chrono::milliseconds flush_interval{1000};
};

class metrics_sink {
 public:
  /// Opens the CSV file and the TensorBoard event file that `opt` names (io_error naming the path
  /// when one cannot be created) and starts the background thread. `writers` are further
  /// destinations; the sink owns them and writes to each after the CSV and TensorBoard files.
  explicit metrics_sink(metrics_options opt,
                        std::vector<std::unique_ptr<metric_writer>> writers = {})
      : opt_(std::move(opt)) {
    HONE_REQUIRE(opt_.queue_capacity > 0,
                 "hone::profile::metrics_sink: queue_capacity must be at least 1");
    HONE_REQUIRE(opt_.flush_interval.count() > 0,
                 "hone::profile::metrics_sink: flush_interval must be positive (it bounds what "
                 "a crash loses); call flush() for sooner writes");
    if (!opt_.csv.empty()) {
      auto w = std::make_unique<csv_writer>(opt_.csv);
      csv_path_ = w->path();
      writers_.push_back(std::move(w));
    }
    if (!opt_.tensorboard.empty()) {
      auto w = std::make_unique<tensorboard_writer>(opt_.tensorboard);
      tensorboard_path_ = w->path();
      writers_.push_back(std::move(w));
    }
    for (auto& w : writers) {
      HONE_REQUIRE(w != nullptr, "hone::profile::metrics_sink: a writer passed in is null");
      writers_.push_back(std::move(w));
    }
    wake_at_ = std::max<std::size_t>(1, opt_.queue_capacity / 2);
    queue_.reserve(opt_.queue_capacity);
    thread_ = std::thread([this] { run(); });
  }

  /// Closes the sink; an error there is printed to stderr (call close() to see it thrown).
  ~metrics_sink() {
    try {
      close();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "hone::profile::metrics_sink: %s\n", e.what());
    }
  }
  metrics_sink(const metrics_sink&) = delete;
  metrics_sink& operator=(const metrics_sink&) = delete;

  /// Queues `value` under `tag` at `step`, stamped with the wall-clock time now. Thread-safe.
  /// Waits while the queue is full. Throws config_error for an empty tag or a closed sink, and a
  /// writer's error if the background thread failed.
  void scalar(std::string_view tag, std::int64_t step, double value) {
    HONE_REQUIRE(!tag.empty(),
                 "hone::profile::metrics_sink::scalar: the tag is empty; give the scalar a name "
                 "such as \"train/loss\"");
    const double wall = detail::wall_seconds();
    std::unique_lock lock(mu_);
    check_usable();
    if (queue_.size() >= opt_.queue_capacity) {
      ++stalls_;
      space_.wait(lock, [this] { return queue_.size() < opt_.queue_capacity || error_ || stop_; });
      check_usable();
    }
    queue_.push_back({std::string(tag), step, value, wall});
    ++logged_;
    if (queue_.size() == wake_at_) work_.notify_one();
  }

  /// Logs a trainer step's report at `step`: train/loss, train/grad_norm, train/lr,
  /// train/loss_scale and train/skipped (1 or 0).
  void log(const step_report& r, std::int64_t step) {
    scalar("train/loss", step, r.loss);
    scalar("train/grad_norm", step, r.grad_norm);
    scalar("train/lr", step, r.lr);
    scalar("train/loss_scale", step, r.loss_scale);
    scalar("train/skipped", step, r.skipped ? 1.0 : 0.0);
  }
  /// The same at r.step (the applied updates: a skipped step repeats the previous step number;
  /// pass your own step counter to log(r, step) to give each step its own).
  void log(const step_report& r) { log(r, static_cast<std::int64_t>(r.step)); }

  /// Waits until every scalar logged before the call is written by every writer and flushed to
  /// the operating system. Rethrows a writer's error.
  void flush() {
    std::unique_lock lock(mu_);
    check_usable();
    const std::uint64_t ticket = ++flush_requested_;
    work_.notify_one();
    done_.wait(lock, [&] { return flush_done_ >= ticket || error_; });
    rethrow_locked(true);
  }

  /// Writes what is queued, closes the writers (fsync) and stops the thread. Idempotent; rethrows
  /// a writer's error unless a call before already did.
  void close() {
    {
      const std::lock_guard lock(mu_);
      if (closed_) return;
      closed_ = true;
      stop_ = true;
    }
    work_.notify_one();
    space_.notify_all();
    if (thread_.joinable()) thread_.join();
    const std::lock_guard lock(mu_);
    rethrow_locked(false);
  }

  /// Scalars logged and scalars written by every writer so far.
  [[nodiscard]] std::uint64_t logged() const {
    const std::lock_guard lock(mu_);
    return logged_;
  }
  [[nodiscard]] std::uint64_t written() const {
    const std::lock_guard lock(mu_);
    return written_;
  }
  /// How many times scalar() found the queue full and waited.
  [[nodiscard]] std::uint64_t stalls() const {
    const std::lock_guard lock(mu_);
    return stalls_;
  }
  /// The CSV file and the TensorBoard event file (empty when not written).
  [[nodiscard]] const std::filesystem::path& csv_path() const noexcept { return csv_path_; }
  [[nodiscard]] const std::filesystem::path& tensorboard_path() const noexcept {
    return tensorboard_path_;
  }

 private:
  void check_usable() {
    rethrow_locked(true);
    HONE_REQUIRE(!closed_,
                 "hone::profile::metrics_sink: the sink is closed; log scalars before close()");
  }
  /// Throws the writer's error the first time; later, with `again`, an error saying so.
  void rethrow_locked(bool again) {
    if (error_ && !error_thrown_) {
      error_thrown_ = true;
      std::rethrow_exception(error_);
    }
    if (error_ && again) {
      throw error(
          "hone::profile::metrics_sink: a writer failed earlier (reported once); the "
          "sink writes nothing more: open a new one");
    }
  }

  void run() {
    std::vector<scalar_event> batch;
    batch.reserve(opt_.queue_capacity);
    std::unique_lock lock(mu_);
    for (;;) {
      work_.wait_for(lock, opt_.flush_interval, [this] {
        return stop_ || flush_requested_ > flush_done_ || queue_.size() >= wake_at_;
      });
      const bool stopping = stop_;
      const std::uint64_t ticket = flush_requested_;
      const bool flushing = ticket > flush_done_;
      batch.swap(queue_);
      space_.notify_all();
      lock.unlock();
      std::exception_ptr err;
      try {
        if (!batch.empty()) {
          for (auto& w : writers_) w->write(batch);
        }
        if (flushing || stopping) {
          for (auto& w : writers_) w->flush();
        }
        if (stopping) {
          for (auto& w : writers_) w->close();
        }
      } catch (...) {
        err = std::current_exception();
      }
      const std::size_t n = batch.size();
      batch.clear();
      lock.lock();
      if (err) {
        error_ = err;
        queue_.clear();
        done_.notify_all();
        space_.notify_all();
        break;
      }
      written_ += n;
      flush_done_ = ticket;
      done_.notify_all();
      if (stopping) break;
    }
    // A failed writer: close every writer quietly (their own errors are not reported over the
    // first one).
    if (error_) {
      lock.unlock();
      close_writers_quietly();
    }
  }

  void close_writers_quietly() noexcept {
    for (auto& w : writers_) {
      try {
        w->close();
      } catch (...) {
      }
    }
  }

  metrics_options opt_;
  std::vector<std::unique_ptr<metric_writer>> writers_;
  std::filesystem::path csv_path_;
  std::filesystem::path tensorboard_path_;
  std::size_t wake_at_ = 1;

  mutable std::mutex mu_;
  std::condition_variable work_;   // the thread: work to do
  std::condition_variable space_;  // scalar(): the queue has room
  std::condition_variable done_;   // flush(): a flush finished
  std::vector<scalar_event> queue_;
  std::uint64_t logged_ = 0;
  std::uint64_t written_ = 0;
  std::uint64_t stalls_ = 0;
  std::uint64_t flush_requested_ = 0;
  std::uint64_t flush_done_ = 0;
  std::exception_ptr error_;
  bool error_thrown_ = false;
  bool stop_ = false;
  bool closed_ = false;
  std::thread thread_;
};

/// Logs a memory_monitor reading (hone/offload/memory_monitor.hpp: latest() or peak()) at `step`:
/// memory/host_rss_mib and, when the sample has a device, memory/device_used_mib and
/// memory/device_total_mib, in MiB (TensorBoard keeps float32: about 7 significant digits, 1 KiB
/// at 16 GiB).
inline void log_memory(metrics_sink& sink, const offload::memory_sample& s, std::int64_t step) {
  constexpr double mib = 1024.0 * 1024.0;
  sink.scalar("memory/host_rss_mib", step, static_cast<double>(s.host_rss) / mib);
  if (s.device_total > 0) {
    sink.scalar("memory/device_used_mib", step, static_cast<double>(s.device_used) / mib);
    sink.scalar("memory/device_total_mib", step, static_cast<double>(s.device_total) / mib);
  }
}

}  // namespace profile
HONE_NAMESPACE_END
