// bench/core.cpp (bench_core): the core module's CPU benchmarks.
//
// multi_tensor_axpy_64M: y += a * x over 64 Mi floats held in 300 separately allocated tensors of
// a model-like mix (bench/support/workloads.hpp), one hone::for_each over a tensor_lists per
// iteration (12 bytes per element: read x and y, write y). Its limit streams the same bytes over
// one contiguous allocation (limit<2, 1>), on the same oneTBB threads, in the same run.
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <array>
#include <cstddef>
#include <hone/core/buffer.hpp>
#include <hone/core/multi_tensor.hpp>
#include <vector>

#include "support/harness.hpp"
#include "support/limit.hpp"
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

void multi_tensor_axpy_limit(benchmark::State& state) {
  auto& limit = axpy_limit();
  limit.run();
  for (auto _ : state) {
    limit.run();
    benchmark::ClobberMemory();
  }
  hone_bench::report_bytes(state, limit.bytes_per_pass());
  hone_bench::report_threads(state);
}

bool register_benchmarks() {
  hone_bench::add("multi_tensor_axpy_64M", "hone",
                  [](benchmark::State& s) { multi_tensor_axpy_hone(s, hone::host_tuning{}); });
  hone_bench::add("multi_tensor_axpy_64M", "limit", multi_tensor_axpy_limit);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  return hone_bench::main(argc, argv, {{"multi_tensor_axpy_64M", [] { return axpy_sizes(); }}},
                          register_benchmarks);
}
