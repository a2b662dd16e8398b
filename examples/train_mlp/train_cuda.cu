// examples/train_mlp/train_cuda.cu: the CUDA path of train_mlp, the one .cu file of the example.
// It instantiates hone::trainer for the device MLP of mlp_cuda.cuh (hone/train/cuda/trainer.cuh
// specializes the trainer for models whose parameters are hone::device_span views) with the CPU
// path's policies, and hands it to main.cpp through cuda_trainer.hpp's plain C++ interface.
#include <cuda_runtime.h>

#include <cstdio>
#include <hone/core/cuda/error.hpp>
#include <hone/precision/policies.hpp>
#include <hone/train/accumulate.hpp>
#include <hone/train/cuda/trainer.cuh>
#include <hone/train/trainer.hpp>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cuda_trainer.hpp"
#include "mlp_cuda.cuh"

namespace train_mlp::cuda {

int device_count() noexcept {
  return hone::cuda_device_count();
}

std::string device_description() {
  int device = 0;
  HONE_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp p{};
  HONE_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  char text[320];
  std::snprintf(text, sizeof(text), "cuda:%d, %s (sm_%d%d, %.1f GiB)", device, p.name, p.major,
                p.minor, static_cast<double>(p.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
  return text;
}

namespace {

template <class Precision>
class trainer_on_device final : public device_trainer {
  using working_type = typename Precision::working_type;
  using model_type = mlp<working_type>;
  using trainer_type = hone::trainer<model_type, Precision, hone::accumulate::by_count, hone::adamw,
                                     hone::clip_grad_norm, hone::one_cycle>;
  static_assert(hone::trainable<model_type, batch>);
  static_assert(std::is_same_v<typename trainer_type::space_type, hone::cuda_space>,
                "the device MLP's parameters are device_span views: the CUDA trainer runs it");

 public:
  trainer_on_device(const layer_sizes& sizes, std::uint64_t seed, Precision precision,
                    hone::adamw optimizer, hone::clip_grad_norm clipping, hone::one_cycle schedule)
      : model_(sizes[0], sizes[1], sizes[3], seed),
        trainer_(model_, std::move(precision), hone::accumulate::by_count{}, optimizer, clipping,
                 schedule),
        host_master_(trainer_.layout().total(), 0.0f) {
    hone::require(sizes[1] == sizes[2], "train_mlp::cuda: both hidden layers have one width");
    download_master_weights();
  }

  hone::step_report step(std::span<const batch> micro_batches) override {
    return trainer_.step(micro_batches);
  }
  evaluation evaluate(const split& data, std::size_t features) override {
    return model_.evaluate(data, features);
  }
  [[nodiscard]] const hone::arena_layout& layout() const override { return trainer_.layout(); }
  void set_param_groups(std::vector<hone::param_group> groups) override {
    trainer_.set_param_groups(std::move(groups));
  }
  [[nodiscard]] std::span<float> host_master_weights() override { return host_master_; }
  void download_master_weights() override {
    const auto m = trainer_.master_weights();
    const cudaStream_t s = trainer_.exec().stream;
    HONE_CUDA_CHECK(
        cudaMemcpyAsync(host_master_.data(), m.data(), m.size_bytes(), cudaMemcpyDeviceToHost, s));
    HONE_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  void upload_master_weights() override {
    const auto m = trainer_.master_weights();
    const cudaStream_t s = trainer_.exec().stream;
    HONE_CUDA_CHECK(
        cudaMemcpyAsync(m.data(), host_master_.data(), m.size_bytes(), cudaMemcpyHostToDevice, s));
    trainer_.publish_weights();  // stream-ordered after the copy (nothing to do when zero copy)
    HONE_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  [[nodiscard]] float loss_scale() const override { return trainer_.scaler().scale(); }
  [[nodiscard]] std::uint64_t steps_done() const override { return trainer_.steps_done(); }
  [[nodiscard]] bool zero_copy() const override { return trainer_.zero_copy(); }

 private:
  model_type model_;
  trainer_type trainer_;
  std::vector<float> host_master_;
};

}  // namespace

template <class Precision>
std::unique_ptr<device_trainer> make_trainer(const layer_sizes& sizes, std::uint64_t seed,
                                             Precision precision, hone::adamw optimizer,
                                             hone::clip_grad_norm clipping,
                                             hone::one_cycle schedule) {
  return std::make_unique<trainer_on_device<Precision>>(sizes, seed, std::move(precision),
                                                        optimizer, clipping, schedule);
}

template <class T>
gradients forward_backward_once(const layer_sizes& sizes, std::uint64_t seed, const batch& b,
                                float loss_scale) {
  hone::require(sizes[1] == sizes[2], "train_mlp::cuda: both hidden layers have one width");
  mlp<T> model(sizes[0], sizes[1], sizes[3], seed);
  gradients g;
  g.loss = model.forward_backward(b, loss_scale);
  for (std::size_t i = 0; i < model.layout().size(); ++i)
    g.per_parameter.push_back(model.gradient(i));
  return g;
}

template std::unique_ptr<device_trainer> make_trainer<hone::fp32>(const layer_sizes&, std::uint64_t,
                                                                  hone::fp32, hone::adamw,
                                                                  hone::clip_grad_norm,
                                                                  hone::one_cycle);
template std::unique_ptr<device_trainer> make_trainer<hone::bf16_mixed>(
    const layer_sizes&, std::uint64_t, hone::bf16_mixed, hone::adamw, hone::clip_grad_norm,
    hone::one_cycle);
template std::unique_ptr<device_trainer> make_trainer<hone::fp16_mixed<>>(
    const layer_sizes&, std::uint64_t, hone::fp16_mixed<>, hone::adamw, hone::clip_grad_norm,
    hone::one_cycle);
template gradients forward_backward_once<float>(const layer_sizes&, std::uint64_t, const batch&,
                                                float);
template gradients forward_backward_once<hone::bfloat16>(const layer_sizes&, std::uint64_t,
                                                         const batch&, float);
template gradients forward_backward_once<hone::half>(const layer_sizes&, std::uint64_t,
                                                     const batch&, float);

}  // namespace train_mlp::cuda
