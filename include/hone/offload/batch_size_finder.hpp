// hone/offload/batch_size_finder.hpp: the largest batch size that fits in memory.
//
// The user's callable runs one trial (typically a forward/backward at that batch size) and
// either returns or throws. Out-of-memory failures (hone::allocation_error, std::bad_alloc, or a
// hone::cuda_error carrying cudaErrorMemoryAllocation) count as "does not fit"; any other
// exception propagates unchanged. The search doubles from `start` until a trial fails or `max` is
// reached, then binary-searches between the last success and the first failure:
// about 2 * log2(answer) + 2 trials.
//
//   auto r = hone::offload::find_batch_size([&](std::size_t b) { model.try_step(b); },
//                                           {.start = 8, .max = 4096});
//   // r.batch_size: the largest size that fitted (0 when even `start` did not); r.trials: the log
//
// Between trials the callable should release what the failed trial allocated (RAII does this when
// the exception unwinds); for CUDA, a caching allocator should also be emptied.
#pragma once

#include <cstddef>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"

HONE_NAMESPACE_BEGIN
namespace offload {

/// cudaErrorMemoryAllocation, so this header needs no CUDA headers.
inline constexpr int cuda_out_of_memory_code = 2;

struct batch_size_options {
  /// First size tried (>= 1).
  std::size_t start = 1;
  /// Largest size tried (>= start).
  std::size_t max = std::size_t{1} << 20;
};

struct batch_trial {
  std::size_t batch_size;
  bool fits;
  std::string error;  // the out-of-memory message when it did not fit
};

struct batch_size_result {
  std::size_t batch_size = 0;  // the largest size that fitted; 0 when none did
  std::vector<batch_trial> trials;
};

/// Runs try_batch(size) for the sizes of the search (see above) and returns the largest that fits.
/// Throws config_error for start == 0 or max < start; exceptions other than out-of-memory
/// propagate from the trial that threw them.
template <class F>
batch_size_result find_batch_size(F&& try_batch, batch_size_options options = {}) {
  static_assert(std::is_invocable_v<F&, std::size_t>,
                "hone::offload::find_batch_size: the callable must take the batch size "
                "(std::size_t)");
  HONE_REQUIRE(options.start >= 1, "hone::offload::find_batch_size: start must be at least 1");
  HONE_REQUIRE(options.max >= options.start,
               "hone::offload::find_batch_size: max (" + std::to_string(options.max) +
                   ") must be at least start (" + std::to_string(options.start) + ")");
  batch_size_result result;
  auto fits = [&](std::size_t b) {
    std::string message;
    try {
      try_batch(b);
      result.trials.push_back({b, true, {}});
      return true;
    } catch (const allocation_error& e) {
      message = e.what();
    } catch (const cuda_error& e) {
      if (e.code() != cuda_out_of_memory_code) throw;
      message = e.what();
    } catch (const std::bad_alloc& e) {
      message = e.what();
    }
    result.trials.push_back({b, false, std::move(message)});
    return false;
  };

  // Doubling: `good` fits (0: nothing yet), `bad` does not (when `failed`).
  std::size_t good = 0;
  std::size_t bad = 0;
  bool failed = false;
  for (std::size_t b = options.start;;) {
    if (!fits(b)) {
      bad = b;
      failed = true;
      break;
    }
    good = b;
    if (b == options.max) break;
    b = b > options.max / 2 ? options.max : b * 2;
  }
  if (failed) {
    // Binary search in (good, bad): below start (good == 0) too, down to 1.
    std::size_t lo = good;  // fits (or 0)
    std::size_t hi = bad;   // does not fit
    while (hi - lo > 1) {
      const std::size_t mid = lo + (hi - lo) / 2;
      if (fits(mid)) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    good = lo;
  }
  result.batch_size = good;
  return result;
}

}  // namespace offload
HONE_NAMESPACE_END
