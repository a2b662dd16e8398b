// tests/support/sanitizers.hpp: whether the test is built with ThreadSanitizer (g++ defines
// __SANITIZE_THREAD__, clang answers __has_feature(thread_sanitizer)), so stress tests can scale
// their iteration counts to its 5-15x slowdown.
#pragma once

namespace hone_test {
#if defined(__SANITIZE_THREAD__)
inline constexpr bool under_tsan = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool under_tsan = true;
#else
inline constexpr bool under_tsan = false;
#endif
#else
inline constexpr bool under_tsan = false;
#endif
}  // namespace hone_test
