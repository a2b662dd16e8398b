// hone-info: prints what this build of hone sees (version, ABI, threads, memory alignment).
// Paste its output into bug reports.
#include <oneapi/tbb/info.h>
#include <oneapi/tbb/version.h>

#include <cstdio>
#include <hone/hone.hpp>
#include <thread>

#define HONE_STR2(x) #x
#define HONE_STR(x) HONE_STR2(x)

int main() {
  std::printf("hone %d.%d.%d (abi %s)\n", hone::version.major, hone::version.minor,
              hone::version.patch, HONE_STR(HONE_ABI_NAMESPACE));
  std::printf("oneTBB %s, default concurrency %d, hardware threads %u\n", TBB_VERSION_STRING,
              tbb::info::default_concurrency(), std::thread::hardware_concurrency());
  std::printf("host alignment %zu bytes, default grain %zu elements\n", hone::host_alignment,
              hone::host_tuning{}.grain);
  std::printf("compiler: %s\n", __VERSION__);
  std::printf("pinned host memory: %s\n",
              hone::space_traits<hone::pinned_host_space>::pinned() ? "yes (CUDA)" : "no");
  return 0;
}
