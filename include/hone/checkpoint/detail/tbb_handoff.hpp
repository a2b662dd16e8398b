// hone/checkpoint/detail/tbb_handoff.hpp: ThreadSanitizer annotations of oneTBB's hand-offs, for
// the parallel reader and writer of compressed tensor files. Internal.
#pragma once

#include <mutex>

#include "hone/core/config.hpp"

HONE_NAMESPACE_BEGIN
namespace checkpoint {
namespace detail {

#if defined(__SANITIZE_THREAD__)
#define HONE_DETAIL_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define HONE_DETAIL_TSAN 1
#endif
#endif

/// Makes oneTBB's hand-offs visible to ThreadSanitizer. Debian's libtbb is not built with TSan,
/// so the happens-before edges of its scheduler (a task's writes before the algorithm returns, a
/// pipeline token recycled to another worker) are invisible and TSan reports the later reads as
/// races. Under TSan, every task body calls enter() first and leave() last, and the caller calls
/// enter() after the algorithm: each is a lock/unlock of one mutex, so the mutex order carries
/// the edges TBB really provides. Without TSan both are empty.
struct tbb_handoff {
#if defined(HONE_DETAIL_TSAN)
  std::mutex m;
  void enter() {
    std::lock_guard lock(m);
  }
  void leave() {
    std::lock_guard lock(m);
  }
#else
  void enter() {}
  void leave() {}
#endif
};
}  // namespace detail
}  // namespace checkpoint
HONE_NAMESPACE_END
