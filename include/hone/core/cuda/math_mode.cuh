// hone/core/cuda/math_mode.cuh: which single-precision rules the device code of a translation unit
// was compiled with. Include only from .cu files.
//
// Several hone kernels promise the host's bits (the GPU prioritized-replay tree, the optimizers'
// element-wise steps, the casts): that holds only for IEEE single precision on the device, nvcc's
// default. --use_fast_math (which implies the three below), -ftz=true (subnormal floats flushed
// to zero, in arithmetic, conversions and comparisons), -prec-div=false (approximate division and
// reciprocal) and -prec-sqrt=false (approximate square root) each change results.
//
// nvcc defines no preprocessor macro for any of these (__USE_FAST_MATH__ is NVRTC's only), so a
// header cannot refuse them with #error. The options reach the device compiler, which answers
// __nvvm_reflect("__CUDA_FTZ"), ("__CUDA_PREC_DIV") and ("__CUDA_PREC_SQRT") with constants (the
// mechanism libdevice uses to pick its own variants). hone therefore checks at run time:
// device_math_mode_of_build() launches a one-thread probe compiled in the calling translation unit
// and returns the three settings; require_ieee_device_math() throws a config_error with a sentence
// naming the options when they are not nvcc's defaults. hone's bit-exact GPU tests call it before
// comparing any bits, so a build with fast math fails them with that sentence instead of with a
// mismatch in the last bits.
//
// The probe is a kernel template, so with nvcc's default whole-program compilation every .cu file
// that calls device_math_mode_of_build() carries its own copy, but the host stub is shared: when
// .cu files of one program are compiled with different options, the answer comes from one of them.
// Compile every .cu file of a program that relies on hone's bit-exactness with the same options.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "hone/core/buffer.hpp"
#include "hone/core/config.hpp"
#include "hone/core/cuda/error.hpp"
#include "hone/core/cuda/space.hpp"
#include "hone/core/error.hpp"

extern "C" __device__ int __nvvm_reflect(const char*);

HONE_NAMESPACE_BEGIN

/// The single-precision rules of device code (see the top of this file).
struct device_math_mode {
  bool flush_denormals = false;  ///< -ftz=true: subnormal floats flushed to zero
  bool precise_div = true;       ///< -prec-div=true: IEEE round-to-nearest division, reciprocal
  bool precise_sqrt = true;      ///< -prec-sqrt=true: IEEE round-to-nearest square root

  /// nvcc's defaults: the rules under which hone's device results equal the host's bit for bit.
  [[nodiscard]] constexpr bool ieee() const noexcept {
    return !flush_denormals && precise_div && precise_sqrt;
  }
  /// The options that differ from the defaults, e.g. "-ftz=true -prec-div=false" ("" when none).
  [[nodiscard]] std::string options() const {
    std::string s;
    const auto add = [&s](const char* o) {
      if (!s.empty()) s += ' ';
      s += o;
    };
    if (flush_denormals) add("-ftz=true");
    if (!precise_div) add("-prec-div=false");
    if (!precise_sqrt) add("-prec-sqrt=false");
    return s;
  }
};

namespace detail {
/// The rules this device code is compiled under (folded to constants by the device compiler).
__device__ inline device_math_mode compiled_device_math_mode() {
  device_math_mode m;
  m.flush_denormals = __nvvm_reflect("__CUDA_FTZ") != 0;
  m.precise_div = __nvvm_reflect("__CUDA_PREC_DIV") != 0;
  m.precise_sqrt = __nvvm_reflect("__CUDA_PREC_SQRT") != 0;
  return m;
}

template <int = 0>
__global__ void device_math_mode_kernel(device_math_mode* out) {
  *out = compiled_device_math_mode();
}
}  // namespace detail

/// The single-precision rules of the device code of the calling .cu file, read on the current
/// device (one one-thread launch on `stream`, then a synchronization of `stream`).
inline device_math_mode device_math_mode_of_build(cudaStream_t stream = nullptr) {
  buffer<device_math_mode, cuda_space> d(1);
  detail::device_math_mode_kernel<<<1, 1, 0, stream>>>(d.data());
  check_last_launch("hone::device_math_mode_of_build (device_math_mode_kernel)");
  device_math_mode m;
  HONE_CUDA_CHECK(cudaMemcpyAsync(&m, d.data(), sizeof(m), cudaMemcpyDeviceToHost, stream));
  HONE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return m;
}

/// Throws config_error unless the device code of the calling .cu file follows IEEE single
/// precision (nvcc's defaults); `who` names what relies on it, e.g. a test that compares bits.
inline void require_ieee_device_math(const std::string& who, cudaStream_t stream = nullptr) {
  const device_math_mode m = device_math_mode_of_build(stream);
  if (m.ieee()) return;
  throw config_error(who +
                     " compares device results with the host's bit for bit, but the device "
                     "code was compiled with " +
                     m.options() +
                     " (--use_fast_math implies all three); compile it without --use_fast_math, "
                     "-ftz=true, -prec-div=false and -prec-sqrt=false");
}

HONE_NAMESPACE_END
