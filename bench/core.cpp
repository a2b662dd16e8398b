// bench/core.cpp (bench_core): the core module's CPU benchmarks.
//
// multi_tensor_axpy_64M: y += a * x over 64 Mi floats held in 300 separately allocated tensors of
// a model-like mix (bench/support/workloads.hpp), one hone::for_each over a tensor_lists per
// iteration (12 bytes per element: read x and y, write y). Its limit streams the same bytes
// (limit<2, 1>, one row per streaming kernel), on the same oneTBB threads, in the same run.
//
// for_each_adamw_64M: hone's own AdamW functor (adamw_functor<float>) run by hone::for_each over a
// tensor_lists of (param, grad, exp_avg, exp_avg_sq) whose 4 x 300 tensors are separately
// allocated, in the same model-like mix (64 Mi = 67.1 M parameters; 28 bytes per parameter: read
// p g m v, write p m v). Variant "hone_arena": the optimizer state's own step
// (adamw_state::step) over arenas of the same tensors. Limit: limit<4, 3>'s pass over 64 Mi
// elements, one row per streaming kernel (bench/support/limit.hpp).
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <hone/core/arena.hpp>
#include <hone/core/buffer.hpp>
#include <hone/core/multi_tensor.hpp>
#include <hone/optim/adamw.hpp>
#include <hone/optim/optimizer.hpp>
#include <vector>

#include "support/harness.hpp"
#include "support/limit.hpp"
#include "support/optim_data.hpp"
#include "support/workloads.hpp"

namespace {

struct axpy {
  float a;
  HONE_HOST_DEVICE void operator()(float& y, const float& x) const { y += a * x; }
};

/// The tensors of a multi-tensor workload: `Depth` lists of separately allocated host buffers
/// (as a model's parameters are), first-touched on the oneTBB workers.
template <std::size_t Depth>
class tensor_set {
 public:
  explicit tensor_set(const std::vector<std::size_t>& sizes) {
    for (auto& list : lists_) {
      list.reserve(sizes.size());
      for (std::size_t n : sizes) list.emplace_back(n);
    }
    for (std::size_t l = 0; l < Depth; ++l) {
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        float* p = lists_[l][t].data();
        const float base = 0.25f * static_cast<float>(l + 1);
        tbb::parallel_for(tbb::blocked_range<std::size_t>(0, sizes[t], std::size_t{1} << 16),
                          [p, base](const tbb::blocked_range<std::size_t>& r) {
                            for (std::size_t i = r.begin(); i != r.end(); ++i) {
                              p[i] = base + static_cast<float>(i % 1024) * (1.0f / 1024.0f);
                            }
                          });
      }
    }
    for (std::size_t n : sizes) total_ += n;
  }
  float* data(std::size_t list, std::size_t t) { return lists_[list][t].data(); }
  std::size_t size(std::size_t t) const { return lists_[0][t].size(); }
  std::size_t count() const { return lists_[0].size(); }
  std::size_t total() const { return total_; }

 private:
  std::array<std::vector<hone::buffer<float>>, Depth> lists_;
  std::size_t total_ = 0;
};

const std::vector<std::size_t>& axpy_sizes() {
  static const auto sizes = hone_bench::model_like_sizes(hone_bench::multi_tensor_total);
  return sizes;
}

// The data live for the whole program: repetitions (and --benchmark_enable_random_interleaving)
// re-enter the benchmark functions without paying allocation and first touch again.
tensor_set<2>& axpy_tensors() {
  static tensor_set<2> set(axpy_sizes());
  return set;
}
hone_bench::limit<2, 1>& axpy_limit() {
  static hone_bench::limit<2, 1> limit(hone_bench::multi_tensor_total);
  return limit;
}

void multi_tensor_axpy_hone(benchmark::State& state, hone::host_tuning tuning) {
  auto& set = axpy_tensors();
  hone::tensor_lists<float, const float> lists;
  for (std::size_t t = 0; t < set.count(); ++t)
    lists.add(set.size(t), set.data(0, t), set.data(1, t));
  const axpy op{1e-3f};
  hone::for_each(lists, op, tuning);  // warm-up: caches, TLB, oneTBB workers awake
  for (auto _ : state) {
    hone::for_each(lists, op, tuning);
    benchmark::ClobberMemory();
  }
  hone_bench::report_bytes(state, set.total() * 3 * sizeof(float));
  hone_bench::report_threads(state);
}

// ---- for_each_adamw_64M ------------------------------------------------------------------------

/// The AdamW step the workload runs: step 10 of a run at lr 1e-3 (PyTorch's other defaults).
constexpr hone::adamw adamw_policy{};
constexpr hone::optimizer_step_args adamw_args{.step = 10, .lr = 1e-3f};

tensor_set<4>& adamw_tensors() {  // lists 0..3: param, grad, exp_avg, exp_avg_sq
  static tensor_set<4> set(axpy_sizes());
  return set;
}
hone_bench::limit<4, 3>& adamw_limit() {
  static hone_bench::limit<4, 3> limit(hone_bench::multi_tensor_total);
  return limit;
}

/// The same tensors as arenas, with the AdamW state of the optimizer's own step.
struct adamw_arenas {
  hone::arena_layout layout{sizeof(float)};
  hone::arena<float> master, grad;
  hone::adamw_state<> state;

  adamw_arenas()
      : layout(hone_bench::optim_layout(axpy_sizes())),
        master(layout),
        grad(layout),
        state(adamw_policy, layout) {
    auto& set = adamw_tensors();  // the values the separate tensors hold now
    float* arrays[4] = {master.all().data(), grad.all().data(), state.exp_avg().all().data(),
                        state.exp_avg_sq().all().data()};
    for (std::size_t l = 0; l < 4; ++l) {
      for (std::size_t t = 0; t < set.count(); ++t) {
        const float* from = set.data(l, t);
        float* to = arrays[l] + layout[t].offset;
        tbb::parallel_for(tbb::blocked_range<std::size_t>(0, set.size(t), std::size_t{1} << 16),
                          [from, to](const tbb::blocked_range<std::size_t>& r) {
                            for (std::size_t i = r.begin(); i != r.end(); ++i) to[i] = from[i];
                          });
      }
    }
  }
};
adamw_arenas& adamw_arena_data() {
  static adamw_arenas a;
  return a;
}

void for_each_adamw_hone(benchmark::State& state) {
  auto& set = adamw_tensors();
  hone::tensor_lists<float, const float, float, float> lists;
  for (std::size_t t = 0; t < set.count(); ++t) {
    lists.add(set.size(t), set.data(0, t), set.data(1, t), set.data(2, t), set.data(3, t));
  }
  const hone::adamw_functor<float> op{
      hone::adamw_coefficients::make(adamw_policy.beta1, adamw_policy.beta2, adamw_policy.eps,
                                     adamw_args, adamw_args.lr, adamw_policy.weight_decay)};
  hone::for_each(lists, op);  // warm-up
  for (auto _ : state) {
    hone::for_each(lists, op);
    benchmark::ClobberMemory();
  }
  hone_bench::report_bytes(state, set.total() * 7 * sizeof(float));
  hone_bench::report_threads(state);
}

void for_each_adamw_arena(benchmark::State& state) {
  auto& a = adamw_arena_data();
  a.state.step(adamw_policy, adamw_args, a.master.all().data(),
               static_cast<const float*>(a.grad.all().data()));  // warm-up
  for (auto _ : state) {
    a.state.step(adamw_policy, adamw_args, a.master.all().data(),
                 static_cast<const float*>(a.grad.all().data()));
    benchmark::ClobberMemory();
  }
  hone_bench::report_bytes(state, adamw_tensors().total() * 7 * sizeof(float));
  hone_bench::report_threads(state);
}

bool register_benchmarks() {
  hone_bench::add("multi_tensor_axpy_64M", "hone",
                  [](benchmark::State& s) { multi_tensor_axpy_hone(s, hone::host_tuning{}); });
  hone_bench::add_limits("multi_tensor_axpy_64M", [](hone_bench::stream_kernel k) {
    axpy_limit().run(k);
    return axpy_limit().bytes_per_pass();
  });
  hone_bench::add("for_each_adamw_64M", "hone", for_each_adamw_hone);
  hone_bench::add("for_each_adamw_64M", "hone_arena", for_each_adamw_arena);
  hone_bench::add_limits("for_each_adamw_64M", [](hone_bench::stream_kernel k) {
    adamw_limit().run(k);
    return adamw_limit().bytes_per_pass();
  });
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  return hone_bench::main(argc, argv,
                          {{"multi_tensor_axpy_64M", [] { return axpy_sizes(); }},
                           {"for_each_adamw_64M", [] { return axpy_sizes(); }}},
                          register_benchmarks);
}
