// examples/train_mlp/cuda_trainer.hpp: the CUDA path of train_mlp as seen from plain C++ (no CUDA
// headers), so that main.cpp stays a host file compiled by g++ or clang. Built only with
// HONE_ENABLE_CUDA (CMake then defines TRAIN_MLP_WITH_CUDA=1 and links train_mlp_cuda).
//
// The device model (mlp_cuda.cuh: cuBLAS GEMMs and small kernels) and its hone::trainer (the CUDA
// implementation from hone/train/cuda/trainer.cuh) must be instantiated in a .cu file:
// train_cuda.cu holds them behind the small interface below, for each precision policy
// (hone::fp32, hone::bf16_mixed, hone::fp16_mixed<>). The virtual calls are per step and per
// validation, never per element.
#pragma once

#include <cstddef>
#include <cstdint>
#include <hone/core/arena.hpp>
#include <hone/optim/adamw.hpp>
#include <hone/optim/clipping.hpp>
#include <hone/optim/param_group.hpp>
#include <hone/schedule/one_cycle.hpp>
#include <hone/train/trainer.hpp>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dataset.hpp"
#include "mlp_common.hpp"

namespace train_mlp::cuda {

/// Number of visible CUDA devices (0 without a device or a driver: not an error).
int device_count() noexcept;
/// "NVIDIA H200 (sm_90, 139.8 GiB)": the name of the current device.
std::string device_description();

/// train_cuda.cu's mlp<working type> and its hone::trainer, composed with the policies given to
/// make_trainer and hone::accumulate::by_count.
class device_trainer {
 public:
  device_trainer() = default;
  device_trainer(const device_trainer&) = delete;
  device_trainer& operator=(const device_trainer&) = delete;
  virtual ~device_trainer() = default;

  /// hone::trainer::step over the micro-batches of one step (copied to the device).
  virtual hone::step_report step(std::span<const batch> micro_batches) = 0;
  /// The model's loss and accuracy on a split, with the current working weights.
  virtual evaluation evaluate(const split& data, std::size_t features) = 0;
  /// The trainer's fp32 layout of the parameters (for hone::make_param_groups).
  [[nodiscard]] virtual const hone::arena_layout& layout() const = 0;
  virtual void set_param_groups(std::vector<hone::param_group> groups) = 0;
  /// A host copy of the fp32 master weights (fixed address, layout()'s size); it changes only in
  /// download_master_weights() and is what a hone::best_weights_keeper can track.
  [[nodiscard]] virtual std::span<float> host_master_weights() = 0;
  /// Copies the device's master weights into host_master_weights().
  virtual void download_master_weights() = 0;
  /// Copies host_master_weights() into the device's master weights and casts them into the
  /// model's working weights (after best_weights_keeper::restore()).
  virtual void upload_master_weights() = 0;
  /// The loss scale the next step runs with.
  [[nodiscard]] virtual float loss_scale() const = 0;
  [[nodiscard]] virtual std::uint64_t steps_done() const = 0;
  /// Whether the master weights are the model's own weights (fp32: zero copy).
  [[nodiscard]] virtual bool zero_copy() const = 0;
};

/// The CUDA MLP with widths `sizes`, the CPU model's initial weights for `seed`, trained by
/// hone::trainer(model, precision, hone::accumulate::by_count{}, optimizer, clipping, schedule).
/// Instantiated in train_cuda.cu for hone::fp32, hone::bf16_mixed and hone::fp16_mixed<>.
template <class Precision>
std::unique_ptr<device_trainer> make_trainer(const layer_sizes& sizes, std::uint64_t seed,
                                             Precision precision, hone::adamw optimizer,
                                             hone::clip_grad_norm clipping,
                                             hone::one_cycle schedule);

/// One forward_backward of a fresh CUDA MLP (weights from `seed`) on `b`: the returned loss and,
/// per parameter (layout order), the working gradients of loss * loss_scale as float. For tests
/// against the CPU model; instantiated for float, hone::bfloat16 and hone::half.
struct gradients {
  float loss = 0.0f;
  std::vector<std::vector<float>> per_parameter;
};
template <class T>
gradients forward_backward_once(const layer_sizes& sizes, std::uint64_t seed, const batch& b,
                                float loss_scale);

}  // namespace train_mlp::cuda
