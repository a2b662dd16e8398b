// hone/profile/zone.hpp: scoped zones, counters, flows and thread names.
//
//   HONE_ZONE("load_batch");              // a zone from here to the end of the scope
//   HONE_COUNTER("queue_depth", q.size()); // a counter's value now
//   HONE_FLOW_BEGIN("batch", id);          // an arrow to the zone that calls HONE_FLOW_END
//   hone::profile::set_thread_name("loader");
//   hone::profile::set_enabled(true);      // recording is off until switched on
//
// Each thread records into its own buffer (hone/profile/detail/buffer.hpp: fixed-size chunks, no
// lock per event, bounded memory); a trace (hone/profile/trace.hpp) collects them into a file.
// A zone's name must have static storage duration (the buffers keep the pointer, not a copy):
// HONE_ZONE only accepts a string literal; hone::profile::zone takes any such pointer.
//
// Switched at run time by set_enabled (a zone while disabled costs one relaxed load and a
// branch, and nothing at its end). Compiled out by defining HONE_PROFILE_DISABLED for the whole
// program (every translation unit, as with NDEBUG): HONE_ZONE, HONE_ZONE_NAMED, HONE_COUNTER,
// HONE_FLOW_BEGIN and HONE_FLOW_END then expand to `static_cast<void>(0)`, evaluate nothing (not
// even their arguments), and leave no code; the functions and classes below stay, so code that
// calls them directly still compiles.
#pragma once

#include <atomic>
#include <bit>
#include <cstdint>
#include <string>
#include <string_view>

#include "hone/core/config.hpp"
#include "hone/profile/detail/buffer.hpp"

// NVTX (docs/profile.md, "NVTX"): with HONE_PROFILE_NVTX defined for the whole program, every zone
// is also an NVTX range in the domain "hone", so Nsight Systems shows hone's zones (and the
// trainer's phases) on its timeline beside the CUDA work. NVTX3 is header-only and ships with the
// CUDA toolkit (CMake: link CUDA::nvtx3 for its include directory); without a tool attached a
// range costs a call through a null-checked function pointer.
#if defined(HONE_PROFILE_NVTX) && !defined(HONE_PROFILE_DISABLED)
#include <nvtx3/nvToolsExt.h>
#define HONE_PROFILE_WITH_NVTX 1
#else
#define HONE_PROFILE_WITH_NVTX 0
#endif

HONE_NAMESPACE_BEGIN
namespace profile {

namespace detail {
inline std::atomic<bool> enabled_flag{false};

#if HONE_PROFILE_WITH_NVTX
/// hone's NVTX domain, created on first use.
inline nvtxDomainHandle_t nvtx_domain() noexcept {
  static const nvtxDomainHandle_t d = nvtxDomainCreateA("hone");
  return d;
}
inline void nvtx_push(const char* name) noexcept {
  nvtxEventAttributes_t a{};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.messageType = NVTX_MESSAGE_TYPE_ASCII;
  a.message.ascii = name;
  nvtxDomainRangePushEx(nvtx_domain(), &a);
}
inline void nvtx_pop() noexcept {
  nvtxDomainRangePop(nvtx_domain());
}
#endif
}  // namespace detail

/// Whether zones, counters and flows are being recorded (one relaxed load).
HONE_FORCEINLINE bool enabled() noexcept {
  return detail::enabled_flag.load(std::memory_order_relaxed);
}

/// Switches recording on or off for every thread. Zones open when it is switched off still
/// record their end, so every recorded zone is closed.
inline void set_enabled(bool on) noexcept {
  detail::enabled_flag.store(on, std::memory_order_relaxed);
}

/// Caps the memory all threads' buffers may hold together (rounded down to whole 32 KiB chunks,
/// at least one). Events recorded while the cap is reached are dropped and counted
/// (hone::profile::trace::dropped_events). Default: 16 MiB.
inline void set_buffer_limit(std::size_t bytes) {
  detail::thread_buffer::pool().set_limit(bytes);
}
[[nodiscard]] inline std::size_t buffer_limit() {
  return detail::thread_buffer::pool().limit_bytes();
}

/// Names the calling thread in traces (shown on its track). May be called at any time, also
/// while recording is off; a later call renames the thread.
inline void set_thread_name(std::string_view name) {
  detail::thread_buffer* b = detail::this_thread_buffer();
  if (b == nullptr) return;
  {
    const std::lock_guard lock(b->name_mu);
    b->name.assign(name);
  }
  b->name_version.fetch_add(1, std::memory_order_release);
}

/// Begins a zone on the calling thread; end it with end_zone() on the same thread, innermost
/// first. For zones that cannot be a scope (a step observer's phases); HONE_ZONE is the usual
/// form. Returns whether the begin was recorded (pass it to end_zone). With HONE_PROFILE_NVTX
/// it also pushes an NVTX range, whether hone's recording is on or not (end_zone pops it).
HONE_FORCEINLINE bool begin_zone(const char* name) noexcept {
#if HONE_PROFILE_WITH_NVTX
  detail::nvtx_push(name);
#endif
  if (!enabled()) return false;
  detail::record(event_kind::begin, name, 0);
  return true;
}
/// Ends the zone begun by begin_zone(name) when `begun` (its result) is true (and pops its NVTX
/// range in any case, with HONE_PROFILE_NVTX).
HONE_FORCEINLINE void end_zone(const char* name, bool begun = true) noexcept {
  if (begun) detail::record(event_kind::end, name, 0);
#if HONE_PROFILE_WITH_NVTX
  detail::nvtx_pop();
#endif
}

/// Records a counter's value (a track of its own in traces, one per name).
HONE_FORCEINLINE void counter(const char* name, double value) noexcept {
  if (enabled()) detail::record(event_kind::counter, name, std::bit_cast<std::uint64_t>(value));
}

/// Starts flow `id` inside the calling thread's innermost open zone; flow_end(name, id) in a
/// zone of any thread ends it, and the trace draws an arrow between the two zones (a batch made
/// by the loader thread and consumed by the step). Ids must be unique among the flows in flight.
HONE_FORCEINLINE void flow_begin(const char* name, std::uint64_t id) noexcept {
  if (enabled()) detail::record(event_kind::flow_out, name, id);
}
/// Ends flow `id` inside the calling thread's innermost open zone.
HONE_FORCEINLINE void flow_end(const char* name, std::uint64_t id) noexcept {
  if (enabled()) detail::record(event_kind::flow_in, name, id);
}

/// A zone from construction to destruction on the calling thread.
class zone {
 public:
  explicit zone(const char* name) noexcept : name_(name), begun_(begin_zone(name)) {}
  ~zone() { end_zone(name_, begun_); }
  zone(const zone&) = delete;
  zone& operator=(const zone&) = delete;

 private:
  const char* name_;
  bool begun_;
};

}  // namespace profile
HONE_NAMESPACE_END

#define HONE_PROFILE_CONCAT_(a, b) a##b
#define HONE_PROFILE_CONCAT(a, b) HONE_PROFILE_CONCAT_(a, b)

#if defined(HONE_PROFILE_DISABLED)
#define HONE_ZONE(name) static_cast<void>(0)
#define HONE_ZONE_NAMED(var, name) static_cast<void>(0)
#define HONE_COUNTER(name, value) static_cast<void>(0)
#define HONE_FLOW_BEGIN(name, id) static_cast<void>(0)
#define HONE_FLOW_END(name, id) static_cast<void>(0)
#else
/// A zone named by a string literal, to the end of the enclosing scope.
#define HONE_ZONE(name) \
  const ::hone::profile::zone HONE_PROFILE_CONCAT(hone_profile_zone_, __LINE__)("" name "")
/// HONE_ZONE with a chosen variable name (two zones on one line, or a zone to end early by scope).
#define HONE_ZONE_NAMED(var, name) const ::hone::profile::zone var("" name "")
/// A counter's value; `name` a string literal.
#define HONE_COUNTER(name, value) ::hone::profile::counter("" name "", static_cast<double>(value))
/// Flow `id` starts / ends in the innermost open zone; `name` a string literal.
#define HONE_FLOW_BEGIN(name, id) \
  ::hone::profile::flow_begin("" name "", static_cast<std::uint64_t>(id))
#define HONE_FLOW_END(name, id) \
  ::hone::profile::flow_end("" name "", static_cast<std::uint64_t>(id))
#endif
