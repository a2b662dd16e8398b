// bench/profile_disabled.cpp: the zone loop of bench/profile.cpp compiled with
// HONE_PROFILE_DISABLED (this file only: it includes hone/profile/zone.hpp alone, whose
// declarations do not depend on the macro), for the "compiled_out" rows.
#include <benchmark/benchmark.h>

#include <hone/profile/zone.hpp>

#if !defined(HONE_PROFILE_DISABLED)
#error "bench/profile_disabled.cpp is compiled with HONE_PROFILE_DISABLED (bench/CMakeLists.txt)"
#endif

namespace hone_bench_profile {
void zone_loop_compiled_out(benchmark::State& state) {
  std::uint64_t i = 0;
  for (auto _ : state) {
    HONE_ZONE("zone");
    benchmark::DoNotOptimize(++i);
  }
}
}  // namespace hone_bench_profile
