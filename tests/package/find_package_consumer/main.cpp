// A consumer of hone: compiles against the headers, links what hone's targets carry (oneTBB, zstd,
// and xtensor, the CUDA runtime, MPI and NCCL for the components it asked for) and prints what it
// got.
#include <hone/hone.hpp>

#include <oneapi/tbb/parallel_reduce.h>
#include <oneapi/tbb/version.h>
#include <zstd.h>

#include <cstddef>
#include <cstdio>
#include <string>

#if defined(HONE_WITH_XTENSOR)
#include <hone/xtensor/adapt.hpp>
#include <xtensor/xtensor_config.hpp>
#endif
#if defined(HONE_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif
#if defined(HONE_WITH_MPI)
#include <mpi.h>
#endif
#if defined(HONE_WITH_NCCL)
#include <nccl.h>
#endif
#include <cmath>

int main() {
  std::string components;
#if defined(HONE_WITH_CUDA)
  int cuda_runtime = 0;
  if (cudaRuntimeGetVersion(&cuda_runtime) != cudaSuccess) return 2;
  components += " cuda";
#endif
#if defined(HONE_WITH_MPI)
  int mpi_major = 0;
  int mpi_minor = 0;
  if (MPI_Get_version(&mpi_major, &mpi_minor) != MPI_SUCCESS) return 3;
  components += " mpi";
#endif
#if defined(HONE_WITH_NCCL)
  int nccl_version = 0;
  if (ncclGetVersion(&nccl_version) != ncclSuccess) return 4;
  components += " nccl";
#endif
#if defined(HONE_WITH_XTENSOR)
  // An arena slot seen as a 2 x 3 xtensor: a write through the view lands in the arena.
  hone::arena_layout layout(sizeof(float));
  layout.add("w", 6);
  hone::arena<float> arena(layout);
  auto w = hone::xtensor::adapt(arena, "w", {2, 3});
  w(1, 2) = 7.0f;
  if (arena.view("w")[5] != 7.0f || w.shape()[0] != 2 || w.shape()[1] != 3) return 8;
  components += " xtensor " + std::to_string(XTENSOR_VERSION_MAJOR) + "." +
                std::to_string(XTENSOR_VERSION_MINOR);
#endif

#if defined(HONE_SEPARATE_COMPILATION)
  // hone::compiled: the AdamW host step is the library's (declared extern template in the
  // headers). One step from p = 1 with g = 0.5 and fresh moments moves p by lr * g / (|g| + eps)
  // (bias-corrected moments g and g * g), i.e. to 0.9 for lr = 0.1.
  hone::arena_layout adam_layout(sizeof(float));
  adam_layout.add("p", 3);
  hone::adamw_state<> adam(hone::adamw{.weight_decay = 0.0f}, adam_layout);
  float p[3] = {1.0f, 1.0f, 1.0f};
  const float g[3] = {0.5f, 0.5f, 0.5f};
  adam.step(hone::adamw{.weight_decay = 0.0f}, {.step = 1, .lr = 0.1f}, p, g);
  if (std::fabs(p[2] - 0.9f) > 1e-6f) return 9;
  components += " compiled";
#endif

  // oneTBB and zstd are linked through hone::hone.
  const std::size_t n = 1000;
  const std::size_t sum = tbb::parallel_reduce(
      tbb::blocked_range<std::size_t>(0, n), std::size_t{0},
      [](const tbb::blocked_range<std::size_t>& r, std::size_t acc) {
        for (std::size_t i = r.begin(); i != r.end(); ++i) acc += i;
        return acc;
      },
      [](std::size_t a, std::size_t b) { return a + b; });
  if (sum != n * (n - 1) / 2) return 5;
  if (ZSTD_compressBound(n) < n) return 6;

  try {
    hone::require(false, "consumer check");
  } catch (const hone::error& e) {
    if (std::string(e.what()) != "consumer check") return 7;
  }

  std::printf("hone %d.%d.%d consumer OK (tbb %s, zstd %s) components:%s\n", hone::version.major,
              hone::version.minor, hone::version.patch, TBB_runtime_version(), ZSTD_versionString(),
              components.empty() ? " none" : components.c_str());
  return 0;
}
