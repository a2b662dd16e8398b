// examples/common/progress.hpp: a one-line progress bar on a terminal, plain lines otherwise.
//
//   hone_examples::progress bar(total_steps);           // a bar if stdout is a terminal
//   bar.update(done, "loss 0.1234");                    // redrawn at most ~20 times a second
//   bar.note("step 25  loss 0.1234  val 95.2%");        // a full line (kept on a terminal too)
//   bar.finish();
//
// On a terminal update() redraws "[#####.....]  312/600  <status>" in place and note() prints
// above it; when stdout is a file or a pipe, update() prints nothing and note() prints its line,
// so logs stay readable.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#if defined(_WIN32)
#include <io.h>
#else
#include <unistd.h>
#endif

namespace hone_examples {

/// Whether standard output is a terminal.
inline bool stdout_is_terminal() noexcept {
#if defined(_WIN32)
  return _isatty(_fileno(stdout)) != 0;
#else
  return isatty(STDOUT_FILENO) != 0;
#endif
}

class progress {
 public:
  explicit progress(std::uint64_t total, bool terminal = stdout_is_terminal())
      : total_(total == 0 ? 1 : total), terminal_(terminal) {}

  [[nodiscard]] bool terminal() const noexcept { return terminal_; }

  /// Progress `done` of total with a short status text; on a terminal only.
  void update(std::uint64_t done, std::string_view status) {
    if (!terminal_) return;
    done_ = done;
    status_ = status;
    const auto now = std::chrono::steady_clock::now();
    if (drawn_ && done < total_ && now - last_draw_ < std::chrono::milliseconds(50)) return;
    last_draw_ = now;
    draw();
  }

  /// A full line of text (on a terminal, printed above the bar, which is then redrawn with the
  /// latest update()).
  void note(std::string_view line) {
    if (terminal_ && drawn_) std::fputs("\r\033[K", stdout);
    std::fwrite(line.data(), 1, line.size(), stdout);
    std::fputc('\n', stdout);
    if (terminal_ && drawn_) draw();
    std::fflush(stdout);
  }

  /// Ends the bar's line.
  void finish() {
    if (terminal_ && drawn_) {
      std::fputc('\n', stdout);
      std::fflush(stdout);
      drawn_ = false;
    }
  }

 private:
  void draw() {
    constexpr std::uint64_t width = 30;
    const std::uint64_t filled = done_ >= total_ ? width : done_ * width / total_;
    std::string bar = "\r\033[K[";
    bar.append(filled, '#');
    bar.append(width - filled, '.');
    bar += "] ";
    bar += std::to_string(done_) + "/" + std::to_string(total_) + "  ";
    bar += status_;
    std::fputs(bar.c_str(), stdout);
    std::fflush(stdout);
    drawn_ = true;
  }

  std::uint64_t total_;
  bool terminal_;
  bool drawn_ = false;
  std::uint64_t done_ = 0;
  std::string status_;
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace hone_examples
