// pinned_host_space is one type with one definition in every translation unit: memory allocated
// in a file compiled without the CUDA runtime (test_pinned_odr_host.cpp) and freed in this .cu
// file, or the reverse, is freed by the function that allocated it. A definition that changed
// with HONE_HAS_CUDA_RUNTIME (as hone's once did) fails the first case: the host file would call
// its memory pageable while this file's is page-locked, and the linker would keep one of the two
// allocate/deallocate pairs for both files. The first two cases run without a GPU; the last needs
// one (it reports why it did not run otherwise, and fails on any CUDA error but "no device").
#define BOOST_TEST_MODULE hone_pinned_odr
#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <cstdint>
#include <hone/core/buffer.hpp>
#include <hone/core/cuda/error.hpp>
#include <hone/core/space.hpp>
#include <new>
#include <string>
#include <vector>

#include "../support/gpu.hpp"
#include "test_pinned_odr.hpp"

static_assert(HONE_HAS_CUDA_RUNTIME,
              "test_pinned_odr.cu must be compiled with the CUDA runtime (nvcc, hone::cuda); its "
              "host half is the file without it.");

namespace {
using traits = hone::space_traits<hone::pinned_host_space>;
using hone::detail::pinned_host_backend;

int fake_allocations = 0;
int fake_frees = 0;
void* fake_allocate(std::size_t bytes) {
  ++fake_allocations;
  return ::operator new (bytes, std::align_val_t{hone::host_alignment});
}
void fake_deallocate(void* p) noexcept {
  ++fake_frees;
  ::operator delete (p, std::align_val_t{hone::host_alignment});
}
constexpr pinned_host_backend fake_backend{&fake_allocate, &fake_deallocate, false, "counting"};

/// Puts the CUDA backend back however a case ends.
struct restore_cuda_backend {
  ~restore_cuda_backend() {
    hone::detail::install_pinned_host_backend(hone::detail::cuda_pinned_backend);
  }
};

bool aligned(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % hone::host_alignment == 0;
}
}  // namespace

BOOST_AUTO_TEST_CASE(a_cuda_file_makes_pinned_memory_page_locked_in_every_file) {
  // This file's static initialization installed the CUDA backend; the host file sees it too.
  BOOST_TEST(traits::pinned());
  BOOST_TEST(pinned_odr::host::pinned() == traits::pinned());
  BOOST_TEST(std::string(pinned_odr::host::name()) == traits::name);
  BOOST_TEST(&traits::backend() == &hone::detail::cuda_pinned_backend);
}

BOOST_AUTO_TEST_CASE(each_allocation_is_freed_by_the_backend_that_made_it) {
  restore_cuda_backend restore;
  hone::detail::install_pinned_host_backend(fake_backend);
  void* from_host = pinned_odr::host::allocate(100);  // made by the counting backend
  BOOST_TEST(fake_allocations == 1);
  BOOST_TEST(aligned(from_host));
  BOOST_TEST(&traits::backend_of(from_host) == &fake_backend);
  BOOST_TEST(!pinned_odr::host::page_locked(from_host));

  hone::detail::install_pinned_host_backend(hone::detail::pageable_pinned_backend);
  void* from_cuda_file = traits::allocate(100);  // made by the pageable backend
  BOOST_TEST(fake_allocations == 1);
  BOOST_TEST(aligned(from_cuda_file));
  BOOST_TEST(&traits::backend_of(from_cuda_file) == &hone::detail::pageable_pinned_backend);

  // Freed in the other file, after the backend changed: each goes back to its own backend.
  traits::deallocate(from_host, 100);
  BOOST_TEST(fake_frees == 1);
  pinned_odr::host::deallocate(from_cuda_file, 100);
  BOOST_TEST(fake_frees == 1);

  // buffer<T, pinned_host_space> goes through the same functions.
  hone::detail::install_pinned_host_backend(fake_backend);
  {
    hone::buffer<float, hone::pinned_host_space> b(1000, 1.5f);
    BOOST_TEST(fake_allocations == 2);
    BOOST_TEST(b.data()[999] == 1.5f);
  }
  BOOST_TEST(fake_frees == 2);
}

BOOST_AUTO_TEST_CASE(pinned_memory_from_a_host_file_is_page_locked_on_a_gpu) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  switch (hone::test::gpu_test_disposition(status, count, hone::test::cuda_driver_installed())) {
    case 77:
      BOOST_TEST_MESSAGE("no CUDA device: the page-locked exchange was not run");
      (void)cudaGetLastError();
      return;
    case 1:
      BOOST_FAIL(std::string("CUDA error before the page-locked exchange: ") +
                 cudaGetErrorName(status));
      return;
    default:
      break;
  }
  constexpr std::size_t n = 1 << 20;
  void* from_host = pinned_odr::host::allocate(n * sizeof(float));
  void* from_cuda_file = traits::allocate(n * sizeof(float));
  for (void* p : {from_host, from_cuda_file}) {
    BOOST_TEST(pinned_odr::host::page_locked(p));
    BOOST_TEST(traits::page_locked(p));
    BOOST_TEST(aligned(p));
    cudaPointerAttributes attr{};
    HONE_CUDA_CHECK(cudaPointerGetAttributes(&attr, p));
    BOOST_TEST((attr.type == cudaMemoryTypeHost));  // memory the CUDA runtime page-locked
  }
  // A round trip through the device, the copies asynchronous from and to page-locked memory.
  auto* src = static_cast<float*>(from_host);
  auto* dst = static_cast<float*>(from_cuda_file);
  for (std::size_t i = 0; i < n; ++i) src[i] = static_cast<float>(i);
  float* device = nullptr;
  HONE_CUDA_CHECK(cudaMalloc(&device, n * sizeof(float)));
  HONE_CUDA_CHECK(cudaMemcpyAsync(device, src, n * sizeof(float), cudaMemcpyHostToDevice));
  HONE_CUDA_CHECK(cudaMemcpyAsync(dst, device, n * sizeof(float), cudaMemcpyDeviceToHost));
  HONE_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  HONE_CUDA_CHECK(cudaFree(device));
  BOOST_TEST(std::vector<float>(dst, dst + n) == std::vector<float>(src, src + n));
  // Each freed by the other file.
  traits::deallocate(from_host, n * sizeof(float));
  pinned_odr::host::deallocate(from_cuda_file, n * sizeof(float));
}
