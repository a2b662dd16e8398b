// bench/xsimd.cpp (bench_xsimd): hone's hand-written SIMD loop against the same update written
// with xsimd (the C++ SIMD wrapper library, 8.1 as Debian 12 ships it), in one program, so that
// docs/install.md can say by measurement whether hone should depend on xsimd.
//
// Workloads xsimd_adamw_{1M,64M}_t{1,2}: one fp32 AdamW step over the model-like mixes of
// bench/support/workloads.hpp (1 Mi parameters: 5 tensors, 28 MiB, cache-resident in a large
// L3; 64 Mi: 300 tensors, memory-bound), in a oneTBB arena of 1 or 2 threads, 28 bytes per
// parameter. Rows:
//   hone            adamw_state::step: hone::for_each over the tensor lists with adamw_functor's
//                   vector form (core/detail/simd.hpp: AVX-512F, AVX or SSE2, chosen at
//                   compile time)
//   hone_loop       hone's loop over a chunk (detail::simd_apply_range) on the xsimd rows' route
//                   below: the control that tells the loop from the route around it
//   xsimd           the same AdamW update written with xsimd::batch<float> (xsimd's default
//                   architecture, also fixed at compile time: the best the flags enable)
//   xsimd_dispatch  the same kernel through xsimd::dispatch over arch_list<avx512f, avx2, sse2>:
//                   the best the CPU runs, chosen at run time; each architecture's kernel is this
//                   file compiled once more with -m<arch> and HONE_BENCH_XSIMD_ARCH=<arch>
//   xsimd_avx2      the AVX2 kernel of the dispatch list, called directly (CPUs with AVX2)
//   limit           hone_bench::limit<4, 3>: a streaming pass moving the same bytes (a limit
//                   only where its loop is vectorized: g++ 12 at -O2 leaves it scalar)
// The xsimd rows run through adamw_state::for_each_group, the public step minus its host loop,
// with hone::for_each's cut of the tensors into chunks on the same oneTBB arena: only the loop
// over a chunk differs. The xsimd kernel makes the same IEEE operations in the same order as
// adamw_coefficients::update, its products kept out of FMA contraction by the same empty asm
// statement (HONE_DETAIL_OPAQUE_FP), and its last partial vector goes through a zero-padded
// copy as hone's: before any benchmark runs, every xsimd variant this CPU runs takes three steps
// over the 1 Mi mix plus tensors of odd sizes, and the program aborts unless its weights and
// moments match hone's step bit for bit.
//
// Build without -march (the generic build: hone's loop is SSE2, xsimd's default architecture
// too, the dispatch picks the CPU's best) and with the bench preset's -march=native. Results:
// docs/benchmarks.md, "xsimd against hone's SIMD loop"; the decision: docs/install.md.
#include <cstddef>
#include <hone/core/detail/no_contract.hpp>
#include <hone/optim/adamw.hpp>
#include <xsimd/xsimd.hpp>

namespace hone_bench_xsimd {

/// The AdamW update of adamw_coefficients::update over n elements, on xsimd::batch<float, Arch>.
/// Defined out of class and instantiated for the dispatched architectures in their own
/// translation units (xsimd's pattern for run-time dispatch).
struct adamw_kernel {
  template <class Arch>
  void operator()(Arch, const hone::adamw_coefficients& c, std::size_t n, float* p, const float* g,
                  float* m, float* v) const;
};

/// a * b, never fused into a following add (as hone's vfloat and sfloat products).
template <class B>
inline B mul(const B& a, const B& b) noexcept {
  B r = a * b;
  HONE_DETAIL_OPAQUE_FP(r.data);
  return r;
}

template <class Arch>
void adamw_kernel::operator()(Arch, const hone::adamw_coefficients& c, std::size_t n, float* p,
                              const float* g, float* m, float* v) const {
  using B = xsimd::batch<float, Arch>;
  constexpr std::size_t w = B::size;
  const B grad_scale(c.grad_scale), decay(c.decay), beta1(c.beta1), omb1(c.one_minus_beta1),
      beta2(c.beta2), omb2(c.one_minus_beta2), inv_bc2_sqrt(c.inv_bc2_sqrt), eps(c.eps),
      step_size(c.step_size);
  // adamw_coefficients::update, operation for operation.
  const auto update = [&](B& bp, const B& bg, B& bm, B& bv) {
    const B gs = mul(bg, grad_scale);
    bp = mul(bp, decay);
    bm = mul(beta1, bm) + mul(omb1, gs);
    bv = mul(beta2, bv) + mul(mul(omb2, gs), gs);
    const B denom = mul(xsimd::sqrt(bv), inv_bc2_sqrt) + eps;
    bp = bp - mul(step_size, bm) / denom;
  };
  std::size_t i = 0;
  for (; i + w <= n; i += w) {
    B bp = B::load_unaligned(p + i);
    B bm = B::load_unaligned(m + i);
    B bv = B::load_unaligned(v + i);
    update(bp, B::load_unaligned(g + i), bm, bv);
    bp.store_unaligned(p + i);
    bm.store_unaligned(m + i);
    bv.store_unaligned(v + i);
  }
  if (i < n) {  // the last partial vector through zero-padded copies (plain loops: no library
                // function is instantiated with this translation unit's instruction set)
    const std::size_t rest = n - i;
    alignas(64) float tp[w] = {}, tg[w] = {}, tm[w] = {}, tv[w] = {};
    for (std::size_t j = 0; j < rest; ++j) {
      tp[j] = p[i + j];
      tg[j] = g[i + j];
      tm[j] = m[i + j];
      tv[j] = v[i + j];
    }
    B bp = B::load_aligned(tp);
    B bm = B::load_aligned(tm);
    B bv = B::load_aligned(tv);
    update(bp, B::load_aligned(tg), bm, bv);
    bp.store_aligned(tp);
    bm.store_aligned(tm);
    bv.store_aligned(tv);
    for (std::size_t j = 0; j < rest; ++j) {
      p[i + j] = tp[j];
      m[i + j] = tm[j];
      v[i + j] = tv[j];
    }
  }
}

}  // namespace hone_bench_xsimd

#if defined(HONE_BENCH_XSIMD_ARCH)
// One architecture's kernel (this file compiled with -m<arch>).
template void hone_bench_xsimd::adamw_kernel::operator()<xsimd::HONE_BENCH_XSIMD_ARCH>(
    xsimd::HONE_BENCH_XSIMD_ARCH, const hone::adamw_coefficients&, std::size_t, float*,
    const float*, float*, float*) const;
#else
// ---- the program --------------------------------------------------------------------------------

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <hone/core/arena.hpp>
#include <hone/core/multi_tensor.hpp>
#include <hone/core/parallel.hpp>
#include <hone/optim/optimizer.hpp>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "support/harness.hpp"
#include "support/limit.hpp"
#include "support/optim_data.hpp"
#include "support/workloads.hpp"

#define HONE_BENCH_XSIMD_KERNEL(ARCH)                                                          \
  extern template void hone_bench_xsimd::adamw_kernel::operator()<xsimd::ARCH>(                \
      xsimd::ARCH, const hone::adamw_coefficients&, std::size_t, float*, const float*, float*, \
      float*) const
HONE_BENCH_XSIMD_KERNEL(sse2);
HONE_BENCH_XSIMD_KERNEL(avx2);
HONE_BENCH_XSIMD_KERNEL(avx512f);
#undef HONE_BENCH_XSIMD_KERNEL

namespace {

using hone_bench_xsimd::adamw_kernel;
using dispatch_archs = xsimd::arch_list<xsimd::avx512f, xsimd::avx2, xsimd::sse2>;
using lists_t = hone::tensor_lists<float, const float, float, float>;

constexpr float lr = 1e-3f;

/// The kernel for one architecture fixed at compile time.
template <class Arch>
struct arch_kernel {
  void operator()(const hone::adamw_coefficients& c, std::size_t n, float* p, const float* g,
                  float* m, float* v) const {
    adamw_kernel{}(Arch{}, c, n, p, g, m, v);
  }
};

/// hone's own loop over a chunk (detail::simd_apply_range with adamw_functor's vector form): the
/// control row, hone's kernel on the xsimd rows' route, out of line as the xsimd kernels are.
struct hone_kernel {
  [[gnu::noinline]] void operator()(const hone::adamw_coefficients& c, std::size_t n, float* p,
                                    const float* g, float* m, float* v) const {
    hone::detail::simd_apply_range(hone::adamw_functor<float>{c}, 0, n,
                                   std::tuple<float*, const float*, float*, float*>(p, g, m, v),
                                   std::index_sequence_for<float, float, float, float>{});
  }
};

/// The kernel through xsimd::dispatch (the architecture read from the CPU once, when built).
struct dispatch_kernel {
  void operator()(const hone::adamw_coefficients& c, std::size_t n, float* p, const float* g,
                  float* m, float* v) const {
    static auto dispatched = xsimd::dispatch<dispatch_archs>(adamw_kernel{});
    dispatched(c, n, p, g, m, v);
  }
};

/// `kernel` over the tensor lists, cut into chunks and spread over oneTBB's threads as
/// hone::for_each cuts them (core/multi_tensor.hpp).
template <class Kernel>
void run_lists(const lists_t& lists, const hone::adamw_coefficients& c, Kernel kernel) {
  const auto chunks = hone::detail::make_chunks(lists, hone::host_tuning{}.grain);
  const auto one = [&](const hone::detail::chunk& ch) {
    const auto& ptrs = lists.at(ch.tensor);
    kernel(c, ch.end - ch.begin, std::get<0>(ptrs) + ch.begin, std::get<1>(ptrs) + ch.begin,
           std::get<2>(ptrs) + ch.begin, std::get<3>(ptrs) + ch.begin);
  };
  if (chunks.size() == 1) {
    one(chunks[0]);
    return;
  }
  hone::detail::parallel_ranges(chunks.size(), 1, [&](std::size_t begin, std::size_t end) {
    for (std::size_t k = begin; k != end; ++k) one(chunks[k]);
  });
}

/// fp32 master weights, gradients and AdamW state in hone arenas laid out for a mix of sizes.
struct model {
  hone::arena_layout layout;
  std::size_t params = 0;
  hone::arena<float> master;
  hone::arena<float> grad;
  hone::adamw policy{};
  hone::optimizer_state_t<hone::adamw> state;
  std::uint64_t steps = 0;

  explicit model(const std::vector<std::size_t>& sizes)
      : layout(hone_bench::optim_layout(sizes)),
        master(layout),
        grad(layout),
        state(policy, layout) {
    for (std::size_t n : sizes) params += n;
  }
  explicit model(std::size_t total) : model(hone_bench::optim_mix(total)) {
    fill(master.all(), 0.5f);
    fill(grad.all(), 0.25f);
  }
  static void fill(std::span<float> a, float base) {  // first touch on oneTBB's threads
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, a.size(), hone::host_tuning{}.grain),
                      [a, base](const tbb::blocked_range<std::size_t>& r) {
                        for (std::size_t i = r.begin(); i != r.end(); ++i) {
                          a[i] = base + static_cast<float>(i % 1024) * (1.0f / 1024.0f);
                        }
                      });
  }
  float* p() { return master.all().data(); }
  const float* g() const { return grad.all().data(); }

  /// One step the public way: adamw_state::step (hone's own loop).
  void hone_step() { state.step(policy, {.step = ++steps, .lr = lr}, p(), g()); }

  /// One step with `kernel` as the loop over a chunk: adamw_state::for_each_group (checks,
  /// groups, tensor lists, coefficients: what step does around its loop), then run_lists.
  template <class Kernel>
  void kernel_step(Kernel kernel) {
    state.for_each_group(policy, {.step = ++steps, .lr = lr}, p(), g(), {},
                         [&](const auto& lists, const auto& op) {
                           if constexpr (std::is_same_v<std::decay_t<decltype(lists)>, lists_t>) {
                             run_lists(lists, op.c, kernel);
                           } else {  // amsgrad: this model's policy never has it
                             std::fprintf(stderr, "bench_xsimd: unexpected amsgrad lists\n");
                             std::abort();
                           }
                         });
  }
};

model& data(std::size_t total) {
  return hone_bench::optim_model<model>(total);
}

// ---- the bit-for-bit check ----------------------------------------------------------------------

/// Values that exercise the update: weights in [-1, 1), gradients in [-2, 2) with exact zeros,
/// first moments in [-0.1, 0.1), second moments in [0, 0.01).
void fill_varied(model& d) {
  std::uint64_t s = 0x2545F4914F6CDD1Dull;
  const auto next = [&s] {  // in [0, 1)
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(s >> 40) * (1.0f / 16777216.0f);
  };
  const auto fill = [&](std::span<float> a, float lo, float hi, bool zeros) {
    for (float& x : a) x = zeros && next() < 0.05f ? 0.0f : lo + (hi - lo) * next();
  };
  fill(d.master.all(), -1.0f, 1.0f, false);
  fill(d.grad.all(), -2.0f, 2.0f, true);
  fill(d.state.exp_avg().all(), -0.1f, 0.1f, false);
  fill(d.state.exp_avg_sq().all(), 0.0f, 0.01f, false);
}

/// The 1 Mi mix plus tensors of odd sizes (tails of every length under a 16-float vector).
std::vector<std::size_t> check_sizes() {
  std::vector<std::size_t> sizes = hone_bench::optim_mix(hone_bench::optim_1M);
  for (std::size_t n : {1, 2, 3, 5, 7, 9, 11, 13, 15, 17, 31, 33, 1000, 65537}) sizes.push_back(n);
  return sizes;
}

/// Index of the first element whose bits differ, or a.size() when none does.
std::size_t first_difference(std::span<const float> a, std::span<const float> b) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return i;
  }
  return a.size();
}

/// Three steps of `kernel` against three of hone's step from the same values; aborts on any
/// difference in the weights or moments.
template <class Kernel>
void check_bits(const char* name, Kernel kernel) {
  const auto sizes = check_sizes();
  model ref(sizes);
  model got(sizes);
  fill_varied(ref);
  fill_varied(got);
  for (int k = 0; k < 3; ++k) {
    ref.hone_step();
    got.kernel_step(kernel);
  }
  const std::pair<const char*, std::pair<std::span<const float>, std::span<const float>>> arrays[] =
      {{"weights", {ref.master.all(), got.master.all()}},
       {"exp_avg", {ref.state.exp_avg().all(), got.state.exp_avg().all()}},
       {"exp_avg_sq", {ref.state.exp_avg_sq().all(), got.state.exp_avg_sq().all()}}};
  for (const auto& [what, ab] : arrays) {
    const std::size_t i = first_difference(ab.first, ab.second);
    if (i != ab.first.size()) {
      std::fprintf(stderr,
                   "bench_xsimd: the %s kernel's %s differ from hone's step at element %zu "
                   "(%.9g vs %.9g): the kernel no longer makes the same operations as "
                   "adamw_coefficients::update\n",
                   name, what, i, static_cast<double>(ab.second[i]),
                   static_cast<double>(ab.first[i]));
      std::abort();
    }
  }
}

const char* hone_simd_name() {
  // The target hone's loops run on (chosen at run time; HONE_ISA forces one).
  static const std::string name(hone::to_string(hone::active_isa()));
  return name.c_str();
}

/// The architecture xsimd::dispatch picks on this CPU from dispatch_archs.
const char* dispatch_name() {
  const unsigned best = xsimd::available_architectures().best;
  if (xsimd::avx512f::version() <= best) return xsimd::avx512f::name();
  if (xsimd::avx2::version() <= best) return xsimd::avx2::name();
  return xsimd::sse2::name();
}

bool has_avx2() {
  return xsimd::available_architectures().avx2 != 0;
}

// ---- benchmarks ---------------------------------------------------------------------------------

tbb::task_arena& arena_of(int threads) {
  static tbb::task_arena one(1);
  static tbb::task_arena two(2);
  return threads == 1 ? one : two;
}

/// Runs `step` on a oneTBB arena of `threads` threads, once untimed, then once per iteration.
template <class Step>
void run_on(benchmark::State& state, int threads, std::size_t bytes, Step step) {
  arena_of(threads).execute([&] {
    step();  // warm-up
    for (auto _ : state) {
      step();
      benchmark::ClobberMemory();
    }
    hone_bench::report_bytes(state, bytes);
    state.counters["threads"] = static_cast<double>(tbb::this_task_arena::max_concurrency());
  });
}

template <std::size_t Total>
void add_workload(const std::string& name, int threads) {
  using hone_bench::add;
  const auto bytes = [] { return data(Total).params * 28; };
  add(name, "hone",
      [=](benchmark::State& s) { run_on(s, threads, bytes(), [] { data(Total).hone_step(); }); });
  add(name, "hone_loop", [=](benchmark::State& s) {
    run_on(s, threads, bytes(), [] { data(Total).kernel_step(hone_kernel{}); });
  });
  add(name, "xsimd", [=](benchmark::State& s) {
    run_on(s, threads, bytes(),
           [] { data(Total).kernel_step(arch_kernel<xsimd::default_arch>{}); });
  });
  add(name, "xsimd_dispatch", [=](benchmark::State& s) {
    run_on(s, threads, bytes(), [] { data(Total).kernel_step(dispatch_kernel{}); });
  });
  if (has_avx2()) {
    add(name, "xsimd_avx2", [=](benchmark::State& s) {
      run_on(s, threads, bytes(), [] { data(Total).kernel_step(arch_kernel<xsimd::avx2>{}); });
    });
  }
  add(name, "limit", [=](benchmark::State& s) {
    auto& lim = hone_bench::optim_limit<hone_bench::limit<4, 3>, model, Total>();
    run_on(s, threads, lim.bytes_per_pass(), [&lim] { lim.run(hone_bench::stream_kernel::plain); });
  });
}

bool prepare() {
  check_bits("hone_loop", hone_kernel{});
  check_bits("xsimd (default architecture)", arch_kernel<xsimd::default_arch>{});
  check_bits("xsimd_dispatch", dispatch_kernel{});
  check_bits("xsimd sse2", arch_kernel<xsimd::sse2>{});
  if (has_avx2()) check_bits("xsimd avx2", arch_kernel<xsimd::avx2>{});
  if (xsimd::available_architectures().avx512f != 0) {
    check_bits("xsimd avx512f", arch_kernel<xsimd::avx512f>{});
  }
  benchmark::AddCustomContext("hone_simd", hone_simd_name());
  benchmark::AddCustomContext("xsimd_version", std::to_string(XSIMD_VERSION_MAJOR) + "." +
                                                   std::to_string(XSIMD_VERSION_MINOR) + "." +
                                                   std::to_string(XSIMD_VERSION_PATCH));
  benchmark::AddCustomContext("xsimd_default_arch", xsimd::default_arch::name());
  benchmark::AddCustomContext("xsimd_dispatch_arch", dispatch_name());
  for (int threads : {1, 2}) {
    const std::string t = "_t" + std::to_string(threads);
    add_workload<hone_bench::optim_1M>("xsimd_adamw_1M" + t, threads);
    add_workload<hone_bench::optim_64M>("xsimd_adamw_64M" + t, threads);
  }
  return true;
}

std::vector<hone_bench::workload_mix> mixes() {
  std::vector<hone_bench::workload_mix> m;
  for (const char* t : {"_t1", "_t2"}) {
    m.push_back({std::string("xsimd_adamw_1M") + t, hone_bench::optim_sizes(hone_bench::optim_1M)});
    m.push_back(
        {std::string("xsimd_adamw_64M") + t, hone_bench::optim_sizes(hone_bench::optim_64M)});
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  return hone_bench::main(argc, argv, mixes(), prepare);
}
#endif  // HONE_BENCH_XSIMD_ARCH
