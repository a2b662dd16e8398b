// Conan test_package: compiles against the packaged headers, links the dependencies hone's
// targets carry (oneTBB, zstd; xtensor, CUDA runtime, MPI, NCCL for the components; the static
// library for hone::compiled) and runs.
#include <hone/hone.hpp>

#include <oneapi/tbb/version.h>
#include <zstd.h>

#include <cmath>
#include <cstdio>
#include <string>

#if defined(HONE_WITH_XTENSOR)
#include <hone/xtensor/adapt.hpp>
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

int main() {
  std::string components;
#if defined(HONE_WITH_CUDA)
  int cuda_runtime = 0;
  if (cudaRuntimeGetVersion(&cuda_runtime) != cudaSuccess) return 1;
  components += " cuda";
#endif
#if defined(HONE_WITH_MPI)
  int mpi_major = 0;
  int mpi_minor = 0;
  if (MPI_Get_version(&mpi_major, &mpi_minor) != MPI_SUCCESS) return 1;
  components += " mpi";
#endif
#if defined(HONE_WITH_NCCL)
  int nccl_version = 0;
  if (ncclGetVersion(&nccl_version) != ncclSuccess) return 1;
  components += " nccl";
#endif
#if defined(HONE_WITH_XTENSOR)
  // An arena slot as a 2 x 2 xtensor view: a write through it lands in the arena.
  hone::arena_layout layout(sizeof(float));
  layout.add("w", 4);
  hone::arena<float> arena(layout);
  hone::xtensor::adapt(arena, "w", {2, 2})(1, 0) = 3.0f;
  if (arena.view("w")[2] != 3.0f) return 1;
  components += " xtensor";
#endif
#if defined(HONE_SEPARATE_COMPILATION)
  // hone::compiled: the AdamW host step over float gradients is the library's (declared extern
  // template in the headers), so this links only against the packaged libhone_compiled.a. One
  // step from p = 1 with g = 0.5 and fresh moments moves p by lr * g / (|g| + eps) (the
  // bias-corrected moments are g and g * g), i.e. to 0.9 for lr = 0.1.
  hone::arena_layout adam_layout(sizeof(float));
  adam_layout.add("p", 3);
  hone::adamw_state<> adam(hone::adamw{.weight_decay = 0.0f}, adam_layout);
  float p[3] = {1.0f, 1.0f, 1.0f};
  const float g[3] = {0.5f, 0.5f, 0.5f};
  adam.step(hone::adamw{.weight_decay = 0.0f}, {.step = 1, .lr = 0.1f}, p, g);
  if (std::fabs(p[2] - 0.9f) > 1e-6f) return 1;
  components += " compiled";
#endif
  try {
    throw hone::config_error("test_package");
  } catch (const hone::error& e) {
    std::printf("hone %d.%d.%d (tbb %s, zstd %s) components:%s\n", hone::version.major,
                hone::version.minor, hone::version.patch, TBB_runtime_version(),
                ZSTD_versionString(), components.empty() ? " none" : components.c_str());
  }
  return 0;
}
