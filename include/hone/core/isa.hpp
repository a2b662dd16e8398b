// hone/core/isa.hpp: which instruction set hone's host loops run on, chosen once from the CPU at
// run time, and a way to force one (tests, benchmarks, a cluster with mixed nodes).
//
// The vector loops (the optimizer updates, hone::for_each with a functor's vector form, the
// unscale-accumulate pass) are compiled in the same header-only build for each x86-64 target
// below, whatever the user's flags, and each call runs the best one this CPU supports: a generic
// `-O2` build and a `-march=native` build run the same AVX-512 code on an AVX-512 machine. Every
// target gives the same bits as the scalar element loop (products never fuse with adds, IEEE sqrt
// and division, the same conversions), so the choice changes speed only.
//
//   isa::scalar  the element loop (the functors' `operator()`): the reference of the tests
//   isa::sse2    128-bit, the x86-64 baseline
//   isa::avx2    256-bit, AVX2 with F16C (fp16 conversions in hardware): x86-64-v3 CPUs
//   isa::avx512  512-bit, AVX-512 F/BW/DQ/VL: x86-64-v4 CPUs
//   isa::neon    128-bit on AArch64 (chosen at compile time: every AArch64 CPU has it)
//
// Run-time choice needs GCC or Clang on x86-64 and an optimized build (`__OPTIMIZE__`: the target
// loops rely on being inlined into one function per target); elsewhere (and with
// HONE_NO_ISA_DISPATCH defined) the target is the best one the compiler flags allow, and only it
// or isa::scalar can be chosen. HONE_NO_AVX512 leaves isa::avx512 out; HONE_NO_SIMD leaves only
// isa::scalar.
//
// The environment variable HONE_ISA (scalar, sse2, avx2, avx512, neon), read at the first call,
// forces a target for the whole process; force_isa() does it from code. Forcing a target this
// CPU or this build does not support is a config_error that names what is available.
#pragma once

#include <atomic>
#include <cstdlib>
#include <string>
#include <string_view>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"

#if !HONE_CUDA_COMPILER && (defined(__x86_64__) || defined(_M_X64)) && defined(__GNUC__)
#include <cpuid.h>
#endif

HONE_NAMESPACE_BEGIN

/// A target of hone's host vector loops (see the file comment).
enum class isa : int { scalar = 0, sse2 = 1, avx2 = 2, avx512 = 3, neon = 4 };

/// The target's name as HONE_ISA spells it.
constexpr std::string_view to_string(isa t) noexcept {
  switch (t) {
    case isa::scalar:
      return "scalar";
    case isa::sse2:
      return "sse2";
    case isa::avx2:
      return "avx2";
    case isa::avx512:
      return "avx512";
    case isa::neon:
      return "neon";
  }
  return "unknown";
}

namespace detail {

// Which targets this translation unit compiles vector loops for (core/detail/simd.hpp keeps
// these in step).
#if !HONE_CUDA_COMPILER && !defined(HONE_NO_SIMD) && !defined(HONE_OPTIM_NO_SIMD)
#if (defined(__x86_64__) || defined(_M_X64))
#define HONE_ISA_X86 1
#if defined(__GNUC__) && defined(__OPTIMIZE__) && !defined(HONE_NO_ISA_DISPATCH)
#define HONE_ISA_DISPATCH 1
#endif
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define HONE_ISA_NEON 1
#endif
#endif

#if !defined(HONE_NO_AVX512) && !defined(HONE_OPTIM_NO_AVX512)
inline constexpr bool avx512_allowed = true;
#else
inline constexpr bool avx512_allowed = false;
#endif

/// The best target the compiler flags of this translation unit allow without run-time dispatch.
constexpr isa compiled_isa() noexcept {
#if defined(HONE_ISA_X86)
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
  if (avx512_allowed) return isa::avx512;
#endif
#if defined(__AVX2__) && defined(__F16C__)
  return isa::avx2;
#else
  return isa::sse2;
#endif
#elif defined(HONE_ISA_NEON)
  return isa::neon;
#else
  return isa::scalar;
#endif
}

/// Whether this CPU can run target `t` (and the build compiled it).
inline bool cpu_supports(isa t) noexcept {
  if (t == isa::scalar) return true;
#if defined(HONE_ISA_DISPATCH)
  switch (t) {
    case isa::sse2:
      return true;  // the x86-64 baseline
    case isa::avx2: {
      // __builtin_cpu_supports checks that the OS saves the AVX state; F16C from CPUID
      // (leaf 1, ECX bit 29), which Clang's builtin does not name.
      unsigned a = 0, b = 0, c = 0, d = 0;
      const bool f16c = __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & (1u << 29)) != 0;
      return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    case isa::avx512:
      return avx512_allowed && cpu_supports(isa::avx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vl");
    default:
      return false;
  }
#else
  // No run-time choice: the compiled target and, on x86, the targets below it.
  const isa c = compiled_isa();
  if (c == isa::neon || c == isa::scalar) return t == c;
  return t != isa::neon && static_cast<int>(t) <= static_cast<int>(c);
#endif
}

/// The best target this CPU and build support.
inline isa best_supported_isa() noexcept {
#if defined(HONE_ISA_DISPATCH)
  if (cpu_supports(isa::avx512)) return isa::avx512;
  if (cpu_supports(isa::avx2)) return isa::avx2;
  return isa::sse2;
#else
  return compiled_isa();
#endif
}

/// A sentence naming the targets this CPU and build support.
inline std::string supported_isa_list() {
  std::string s;
  for (isa t : {isa::scalar, isa::sse2, isa::avx2, isa::avx512, isa::neon}) {
    if (!cpu_supports(t)) continue;
    if (!s.empty()) s += ", ";
    s += to_string(t);
  }
  return s;
}

/// The chosen target (-1: not chosen yet). One per program (an inline function's static).
inline std::atomic<int>& isa_slot() noexcept {
  static std::atomic<int> slot{-1};
  return slot;
}

inline isa parse_isa(std::string_view name, const char* where) {
  for (isa t : {isa::scalar, isa::sse2, isa::avx2, isa::avx512, isa::neon}) {
    if (name == to_string(t)) return t;
  }
  throw config_error(std::string("hone: ") + where + " names the instruction set \"" +
                     std::string(name) +
                     "\", which hone does not know; use one of scalar, sse2, avx2, avx512, neon "
                     "(this CPU and build support: " +
                     supported_isa_list() + ")");
}

[[noreturn]] inline void unsupported_isa(isa t, const char* where) {
  throw config_error(
      std::string("hone: ") + where + " asks for the instruction set " + std::string(to_string(t)) +
      ", which this CPU or this build does not support; it supports: " + supported_isa_list());
}

/// The first choice: HONE_ISA when set, else the best supported target.
inline isa initial_isa() {
  const char* env = std::getenv("HONE_ISA");
  if (env == nullptr || *env == '\0') return best_supported_isa();
  const isa t = parse_isa(env, "the environment variable HONE_ISA");
  if (!cpu_supports(t)) unsupported_isa(t, "the environment variable HONE_ISA");
  return t;
}

}  // namespace detail

/// The target hone's host vector loops run on now: HONE_ISA or force_isa() when set, else the best
/// one this CPU and build support. Throws config_error when HONE_ISA names an unknown or
/// unsupported target.
inline isa active_isa() {
  const int v = detail::isa_slot().load(std::memory_order_relaxed);
  if (v >= 0) return static_cast<isa>(v);
  const isa t = detail::initial_isa();
  int expected = -1;
  detail::isa_slot().compare_exchange_strong(expected, static_cast<int>(t),
                                             std::memory_order_relaxed);
  return static_cast<isa>(detail::isa_slot().load(std::memory_order_relaxed));
}

/// Whether this CPU and build can run target `t`.
inline bool isa_supported(isa t) noexcept {
  return detail::cpu_supports(t);
}

/// The best target this CPU and build support (what active_isa() is unless forced).
inline isa best_isa() noexcept {
  return detail::best_supported_isa();
}

/// Makes every later host loop of the process run on target `t` (config_error if this CPU or build
/// cannot run it). Meant for tests and benchmarks: set it while no hone loop runs.
inline void force_isa(isa t) {
  if (!detail::cpu_supports(t)) detail::unsupported_isa(t, "force_isa");
  detail::isa_slot().store(static_cast<int>(t), std::memory_order_relaxed);
}

/// force_isa(t) for a scope; the previous choice comes back at its end.
class scoped_isa {
 public:
  explicit scoped_isa(isa t) : previous_(active_isa()) { force_isa(t); }
  ~scoped_isa() {
    detail::isa_slot().store(static_cast<int>(previous_), std::memory_order_relaxed);
  }
  scoped_isa(const scoped_isa&) = delete;
  scoped_isa& operator=(const scoped_isa&) = delete;

 private:
  isa previous_;
};

HONE_NAMESPACE_END
