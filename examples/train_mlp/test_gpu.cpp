// examples/train_mlp/test_gpu.cpp (label gpu): the CUDA MLP (mlp_cuda.cuh, through
// cuda_trainer.hpp) against its CPU twin, the xtensor MLP of mlp.hpp, from the same initial
// weights and on the same spiral samples:
//  - one forward_backward in fp32, bf16 and fp16: the loss and every parameter's gradient (of
//    loss * loss_scale) agree within a relative L2 tolerance per precision (fp32: GEMM summation
//    order only; bf16/fp16: the GPU also rounds activations and deltas to the working type), the
//    gradients are not zero, and fc3.bias's gradient sums to zero (softmax rows sum to one);
//  - five steps of hone::trainer with the example's policies (AdamW, clipping, OneCycle, three
//    micro-batches by count), CPU trainer vs CUDA trainer in fp32 and bf16: each step's loss and
//    gradient norm agree, the weights moved, the master weights end up equal (up to AdamW's sign
//    sensitivity for gradients near zero, see master_weights_agree), and the validation loss and
//    accuracy agree.
// Exits 77 (skipped) when no CUDA device is present.
#define BOOST_TEST_MODULE train_mlp_gpu
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <hone/optim/adamw.hpp>
#include <hone/optim/clipping.hpp>
#include <hone/optim/param_group.hpp>
#include <hone/precision/policies.hpp>
#include <hone/schedule/one_cycle.hpp>
#include <hone/train/accumulate.hpp>
#include <hone/train/trainer.hpp>
#include <span>
#include <vector>

#include "../../tests/support/gpu.hpp"
#include "cuda_trainer.hpp"
#include "mlp.hpp"

namespace {
struct gpu_fixture {
  gpu_fixture() { hone::test::skip_without_gpu(); }
};

constexpr std::size_t hidden = 24;
constexpr std::uint64_t seed = 7;

const train_mlp::dataset& spiral() {
  static const train_mlp::dataset d = train_mlp::make_spiral({});
  return d;
}

train_mlp::layer_sizes sizes() {
  return {spiral().features, hidden, hidden, spiral().classes};
}

/// Training samples [first, first + n) as a batch.
train_mlp::batch samples(std::size_t first, std::size_t n) {
  const auto& d = spiral();
  return {std::span<const float>(d.train.x).subspan(first * d.features, n * d.features),
          std::span<const std::int32_t>(d.train.y).subspan(first, n)};
}

double norm(const std::vector<float>& v) {
  double s = 0.0;
  for (const float x : v) s += static_cast<double>(x) * static_cast<double>(x);
  return std::sqrt(s);
}

double distance(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    s += d * d;
  }
  return std::sqrt(s);
}

template <class T>
void check_gradients(float loss_scale, double tolerance) {
  const train_mlp::batch b = samples(100, 37);
  train_mlp::mlp<T> cpu(sizes()[0], hidden, sizes()[3], seed);
  const float cpu_loss = cpu.forward_backward(b, loss_scale);
  const train_mlp::cuda::gradients gpu =
      train_mlp::cuda::forward_backward_once<T>(sizes(), seed, b, loss_scale);
  BOOST_TEST(std::isfinite(cpu_loss));
  BOOST_TEST(gpu.loss == cpu_loss, boost::test_tools::tolerance(static_cast<float>(tolerance)));
  const auto params = cpu.parameters();
  BOOST_TEST_REQUIRE(gpu.per_parameter.size() == params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    BOOST_TEST_CONTEXT("parameter " << params[i].name) {
      std::vector<float> expected;
      for (const T g : params[i].grad) expected.push_back(static_cast<float>(g));
      BOOST_TEST_REQUIRE(gpu.per_parameter[i].size() == expected.size());
      BOOST_TEST(norm(expected) > 0.0);
      BOOST_TEST(distance(gpu.per_parameter[i], expected) <= tolerance * norm(expected));
    }
  }
  // fc3.bias: sum over classes of (softmax - onehot) is zero for every sample.
  double bias_sum = 0.0, bias_abs = 0.0;
  for (const float g : gpu.per_parameter.back()) {
    bias_sum += g;
    bias_abs += std::fabs(g);
  }
  BOOST_TEST(std::fabs(bias_sum) <= 2.0 * tolerance * bias_abs + 1e-6);
}

/// Master weights of two trainers that took the same AdamW steps: AdamW's first updates are
/// close to lr * sign(gradient), so a gradient within rounding of zero may move a weight the
/// other way on the other device. Almost every weight must agree to `close`; the few others by
/// at most two full updates.
bool master_weights_agree(std::span<const float> a, std::span<const float> b, double close,
                          double lr_sum) {
  BOOST_TEST_REQUIRE(a.size() == b.size());
  std::size_t far = 0;
  double worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    worst = std::max(worst, d);
    if (d > close) ++far;
  }
  BOOST_TEST_MESSAGE("master weights: " << far << " of " << a.size() << " differ by more than "
                                        << close << ", worst " << worst);
  return far * 100 <= a.size() && worst <= 2.5 * lr_sum;
}

template <class Precision>
void check_trainer_steps(Precision precision, double tolerance, double close) {
  using T = typename Precision::working_type;
  const hone::adamw optimizer{.weight_decay = 0.01f};
  const hone::clip_grad_norm clipping{.max_norm = 1.0f};
  const hone::one_cycle schedule{.max_lr = 0.05, .total_steps = 400};
  const auto groups = [](const hone::arena_layout& layout) {
    return hone::make_param_groups(layout,
                                   {{.match = hone::is_no_decay_name, .weight_decay = 0.0f}});
  };
  train_mlp::mlp<T> cpu_model(sizes()[0], hidden, sizes()[3], seed);
  hone::trainer cpu(cpu_model, precision, hone::accumulate::by_count{}, optimizer, clipping,
                    schedule);
  cpu.set_param_groups(groups(cpu.layout()));
  const auto gpu =
      train_mlp::cuda::make_trainer(sizes(), seed, precision, optimizer, clipping, schedule);
  gpu->set_param_groups(groups(gpu->layout()));
  BOOST_TEST(gpu->layout().total() == cpu.layout().total());
  BOOST_TEST(gpu->zero_copy() == cpu.zero_copy());

  const std::vector<float> initial(cpu.master_weights().begin(), cpu.master_weights().end());
  gpu->download_master_weights();
  BOOST_TEST(distance(std::vector<float>(gpu->host_master_weights().begin(),
                                         gpu->host_master_weights().end()),
                      initial) == 0.0);  // the same start, bit for bit

  double lr_sum = 0.0;
  for (std::size_t s = 0; s < 5; ++s) {
    // 48 samples in micro-batches of 17, 16 and 15 (weighted by count).
    const std::vector<train_mlp::batch> micro{samples(48 * s, 17), samples(48 * s + 17, 16),
                                              samples(48 * s + 33, 15)};
    const hone::step_report rc = cpu.step(std::span<const train_mlp::batch>(micro));
    const hone::step_report rg = gpu->step(std::span<const train_mlp::batch>(micro));
    BOOST_TEST_CONTEXT("step " << s) {
      BOOST_TEST(!rc.skipped);
      BOOST_TEST(rg.skipped == rc.skipped);
      BOOST_TEST(rg.lr == rc.lr);
      BOOST_TEST(rg.step == rc.step);
      BOOST_TEST(rg.loss == rc.loss, boost::test_tools::tolerance(static_cast<float>(tolerance)));
      BOOST_TEST(rg.grad_norm == rc.grad_norm, boost::test_tools::tolerance(tolerance));
    }
    lr_sum += static_cast<double>(rc.lr);
  }
  gpu->download_master_weights();
  const std::span<const float> gm = gpu->host_master_weights();
  BOOST_TEST(distance(std::vector<float>(gm.begin(), gm.end()), initial) > 0.0);
  BOOST_TEST(master_weights_agree(gm, cpu.master_weights(), close, lr_sum));

  const train_mlp::evaluation ec = cpu_model.evaluate(spiral().validation, spiral().features);
  const train_mlp::evaluation eg = gpu->evaluate(spiral().validation, spiral().features);
  BOOST_TEST(eg.loss == ec.loss, boost::test_tools::tolerance(tolerance));
  BOOST_TEST(std::fabs(eg.accuracy - ec.accuracy) <= 0.005);
}
}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(gpu_fixture);

BOOST_AUTO_TEST_CASE(fp32_gradients_match_the_cpu_model) {
  check_gradients<float>(1.0f, 1e-4);
}

BOOST_AUTO_TEST_CASE(bf16_gradients_match_the_cpu_model) {
  // 5e-2: on an H200 (2026-11-27) fc1.bias differed by 3.1% of its norm (3e-2 failed). A bias
  // gradient is a sum over the batch of bf16-rounded deltas that largely cancel, so its relative
  // error is many times bf16's 2^-8; the other parameters stayed within 3e-2.
  check_gradients<hone::bfloat16>(1.0f, 5e-2);
}

BOOST_AUTO_TEST_CASE(fp16_gradients_match_the_cpu_model) {
  check_gradients<hone::half>(1024.0f, 5e-3);
}

BOOST_AUTO_TEST_CASE(fp32_trainer_steps_match_the_cpu_trainer) {
  check_trainer_steps(hone::fp32{}, 1e-4, 1e-5);
}

BOOST_AUTO_TEST_CASE(bf16_trainer_steps_match_the_cpu_trainer) {
  check_trainer_steps(hone::bf16_mixed{}, 3e-2, 1e-3);
}
