// bench/optim.cpp (bench_optim): the training core's CPU benchmarks: the optimizer steps, the
// unscale pass, the whole optimizer step of an fp16 run and the trainer's overhead.
//
// Every workload runs on a model-like mix of tensor sizes (bench/support/workloads.hpp; 5 tensors
// at 1 Mi parameters, 50 at 16 Mi, 300 at 64 Mi) laid out in hone arenas (one allocation per
// array, each tensor at a 64-byte aligned offset), and reports the bytes it must move per
// iteration, counted over the parameters (padding excluded), in bytes per parameter:
//
//   adamw_fp32_{1M,16M,64M}  AdamW step, fp32 master and grads: read p g m v, write p m v     28
//   adamw_bf16grad_64M       the same with bf16 grads (2 bytes read)                            26
//   unscale_check_64M        unscale + inf check, fp32 grads -> fp32 master grads
//                            (unscale_accumulate_into, first micro-batch; sum of squares)        8
//   unscale_check_fp16_64M   the same from fp16 working grads (hone's fp16 path): 2 + 4          6
//   sgd_momentum_64M         SGD with momentum: read p g b, write p b                           20
//   adamw8bit_64M            8-bit AdamW (block 256): p and g fp32, each moment one byte per
//                            element plus the block absmax; slots under 4096 elements keep fp32
//                            moments. Also reports its state bytes against fp32 AdamW's.       ~16
//   full_step_64M            the whole optimizer step of an fp16 run: one read pass over the
//                            grads for the global norm and the inf check (clip_grad_norm), then
//                            AdamW with grad_scale = unscale * clip coefficient                 32
//   full_step_fp16grad_64M   the same with fp16 gradients (a norm pass reading 2 bytes, AdamW
//                            reading 2-byte gradients); the torch peer runs its fp32-gradient
//                            sequence (AMP keeps fp32 gradients)                               28
//   trainer_overhead         hone::trainer (fp32, AdamW, clip_grad_norm) over a 16 Mi model
//                            whose forward_backward copies precomputed gradients ("hone"),
//                            and the same library calls written by hand ("hand"): the copy 8,
//                            the norm pass 4, AdamW reading the model's gradients 28           40
//   trainer_{fp16,bf16}_64M  hone::trainer (fp16_mixed / bf16_mixed, AdamW, clip_grad_norm) over
//                            a 64 Mi model whose gradients sit in its 2-byte gradient tensors
//                            (forward_backward leaves them): the norm pass reads them (2), AdamW
//                            reads them (2) and p m v (24 read and written) and writes the
//                            working weights (2); the torch peer runs its AMP sequence           30
//
// Each has a limit in the same run that moves the same bytes (bench/support/limit.hpp, plus the
// mixed-width and read-only limits below), on the same oneTBB threads. docs/benchmarks.md
// describes the torch peer (bench/peers/torch_optim.py) and the results.
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/parallel_reduce.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <hone/core/arena.hpp>
#include <hone/core/bfloat16.hpp>
#include <hone/core/buffer.hpp>
#include <hone/core/half.hpp>
#include <hone/core/multi_tensor.hpp>
#include <hone/core/parallel.hpp>
#include <hone/optim/adamw.hpp>
#include <hone/optim/adamw_8bit.hpp>
#include <hone/optim/clipping.hpp>
#include <hone/optim/optimizer.hpp>
#include <hone/optim/sgd.hpp>
#include <hone/precision/unscale.hpp>
#include <hone/schedule/constant.hpp>
#include <hone/train/trainer.hpp>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "support/fixed_grad_model.hpp"
#include "support/harness.hpp"
#include "support/limit.hpp"
#include "support/optim_data.hpp"
#include "support/workloads.hpp"

namespace {

// ---- limits this program needs beyond limit.hpp -----------------------------------------------

/// Arrays of a mixed-width limit: `Narrow` (1 or 2 byte) arrays only read, read and written in
/// place, or only written, and 4-byte arrays only read, read and written in place, or only
/// written.
template <class Narrow, std::size_t NRO, std::size_t NRW, std::size_t WRO, std::size_t WRW,
          std::size_t WWO, std::size_t NWO>
struct mixed_arrays {
  std::array<const Narrow*, NRO> nro;
  std::array<Narrow*, NRW> nrw;
  std::array<const std::uint32_t*, WRO> wro;
  std::array<std::uint32_t*, WRW> wrw;
  std::array<std::uint32_t*, WWO> wwo;
  std::array<Narrow*, NWO> nwo;
};

// The element loop of limit.hpp's stream_range with two element widths: every loaded word (the
// narrow ones zero-extended) is OR-ed into the value every output stores, one OR per word.
template <class Narrow, std::size_t NRO, std::size_t NRW, std::size_t WRO, std::size_t WRW,
          std::size_t WWO, std::size_t NWO>
inline __attribute__((always_inline)) void mixed_body(
    const mixed_arrays<Narrow, NRO, NRW, WRO, WRW, WWO, NWO>& a, std::uint32_t mask,
    std::size_t begin, std::size_t end) {
  const auto nro = a.nro;
  const auto nrw = a.nrw;
  const auto wro = a.wro;
  const auto wrw = a.wrw;
  const auto wwo = a.wwo;
  const auto nwo = a.nwo;
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC ivdep
#elif defined(__clang__)
#pragma clang loop vectorize(assume_safety)
#endif
  for (std::size_t i = begin; i < end; ++i) {
    std::uint32_t r = mask;
    if constexpr (NRO > 0) {
      HONE_BENCH_UNROLL
      for (std::size_t k = 0; k < NRO; ++k) r |= nro[k][i];
    }
    if constexpr (WRO > 0) {
      HONE_BENCH_UNROLL
      for (std::size_t k = 0; k < WRO; ++k) r |= wro[k][i];
    }
    std::uint32_t all = r;
    if constexpr (NRW > 0) {
      HONE_BENCH_UNROLL
      for (std::size_t k = 0; k < NRW; ++k) {
        const Narrow v = nrw[k][i];
        all |= v;
        nrw[k][i] = static_cast<Narrow>(v | r);
      }
    }
    if constexpr (WRW > 0) {
      HONE_BENCH_UNROLL
      for (std::size_t k = 0; k < WRW; ++k) {
        const std::uint32_t v = wrw[k][i];
        all |= v;
        wrw[k][i] = v | r;
      }
    }
    if constexpr (WWO > 0) {
      HONE_BENCH_UNROLL
      for (std::size_t k = 0; k < WWO; ++k) wwo[k][i] = all;
    }
    if constexpr (NWO > 0) {
      HONE_BENCH_UNROLL
      for (std::size_t k = 0; k < NWO; ++k) nwo[k][i] = static_cast<Narrow>(all);
    }
  }
}

/// mixed_body compiled for the best target of this CPU (limit.hpp's run_best).
template <class Narrow, std::size_t NRO, std::size_t NRW, std::size_t WRO, std::size_t WRW,
          std::size_t WWO, std::size_t NWO>
void mixed_range(const mixed_arrays<Narrow, NRO, NRW, WRO, WRW, WWO, NWO>& a, std::uint32_t mask,
                 std::size_t begin, std::size_t end) {
  hone_bench::detail::run_best([&]() __attribute__((always_inline)) {
    mixed_body(a, mask, begin, end);
  });
}

/// hone_bench::stream_limit with two element widths, for workloads whose arrays differ in size
/// (bf16 gradients next to fp32 weights, 8-bit moment codes): `NarrowRO` arrays of `Narrow` only
/// read, `NarrowRW` read and written in place, `NarrowWO` only written; `WideRO`, `WideRW`,
/// `WideWO` arrays of 4-byte words likewise. Each array has `n` elements. Kernels (limit.hpp's
/// stream_kernel): plain, the narrow arrays in one allocation and the wide ones in another,
/// consecutive arrays staggered by hone_bench::stream_stagger_bytes as stream_limit's; arena, each
/// array a separate allocation. No non-temporal kernel (its vectors would mix element widths). Same
/// cut over oneTBB threads as stream_limit.
template <class Narrow, std::size_t NarrowRO, std::size_t NarrowRW, std::size_t WideRO,
          std::size_t WideRW, std::size_t WideWO = 0, std::size_t NarrowWO = 0>
class mixed_limit {
  static_assert(sizeof(Narrow) == 1 || sizeof(Narrow) == 2, "narrow arrays hold 1 or 2 bytes");
  static constexpr std::size_t narrow_arrays = NarrowRO + NarrowRW + NarrowWO;
  static constexpr std::size_t wide_arrays = WideRO + WideRW + WideWO;
  using arrays_t = mixed_arrays<Narrow, NarrowRO, NarrowRW, WideRO, WideRW, WideWO, NarrowWO>;

  template <class U>
  static constexpr std::size_t pitch(std::size_t n) {
    return (n + 64 / sizeof(U) - 1) / (64 / sizeof(U)) * (64 / sizeof(U)) +
           hone_bench::stream_stagger_bytes / sizeof(U);
  }

 public:
  /// The kernels this limit has.
  static std::vector<hone_bench::stream_kernel> kernels() {
    return {hone_bench::stream_kernel::plain, hone_bench::stream_kernel::arena};
  }

  explicit mixed_limit(std::size_t n, hone_bench::limit_tuning tuning = {})
      : n_(n),
        tuning_(tuning),
        narrow_(pitch<Narrow>(n) * narrow_arrays),
        wide_(pitch<std::uint32_t>(n) * wide_arrays) {
    Narrow* nb = narrow_.data();
    std::uint32_t* wb = wide_.data();
    for (std::size_t k = 0; k < narrow_arrays; ++k)
      place_narrow(staggered_, k, nb + k * pitch<Narrow>(n));
    for (std::size_t k = 0; k < wide_arrays; ++k) {
      place_wide(staggered_, k, wb + k * pitch<std::uint32_t>(n));
    }
    hone_bench::detail::first_touch(nb, narrow_.size(), tuning_.grain, 0);
    hone_bench::detail::first_touch(wb, wide_.size(), tuning_.grain, 0);
    run();
  }

  void run(hone_bench::stream_kernel kernel = hone_bench::stream_kernel::plain) {
    const std::uint32_t mask = mask_;
    if (kernel == hone_bench::stream_kernel::arena && arena_narrow_.empty()) make_arena();
    const auto& a = kernel == hone_bench::stream_kernel::arena ? arena_ : staggered_;
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n_, tuning_.grain),
                      [&a, mask](const tbb::blocked_range<std::size_t>& r) {
                        mixed_range(a, mask, r.begin(), r.end());
                      });
  }

  [[nodiscard]] std::size_t bytes_per_pass() const noexcept {
    return n_ * (sizeof(Narrow) * (NarrowRO + 2 * NarrowRW + NarrowWO) +
                 4 * (WideRO + 2 * WideRW + WideWO));
  }

 private:
  static void place_narrow(arrays_t& a, std::size_t k, Narrow* p) {
    if (k < NarrowRO) {
      a.nro[k] = p;
    } else if (k < NarrowRO + NarrowRW) {
      a.nrw[k - NarrowRO] = p;
    } else {
      a.nwo[k - NarrowRO - NarrowRW] = p;
    }
  }
  static void place_wide(arrays_t& a, std::size_t k, std::uint32_t* p) {
    if (k < WideRO) {
      a.wro[k] = p;
    } else if (k < WideRO + WideRW) {
      a.wrw[k - WideRO] = p;
    } else {
      a.wwo[k - WideRO - WideRW] = p;
    }
  }
  void make_arena() {
    for (std::size_t k = 0; k < narrow_arrays; ++k) {
      arena_narrow_.emplace_back(n_);
      hone_bench::detail::first_touch(arena_narrow_.back().data(), n_, tuning_.grain, k * n_);
      place_narrow(arena_, k, arena_narrow_.back().data());
    }
    for (std::size_t k = 0; k < wide_arrays; ++k) {
      arena_wide_.emplace_back(n_);
      hone_bench::detail::first_touch(arena_wide_.back().data(), n_, tuning_.grain, k * n_);
      place_wide(arena_, k, arena_wide_.back().data());
    }
  }

  std::size_t n_;
  hone_bench::limit_tuning tuning_;
  hone::buffer<Narrow> narrow_;
  hone::buffer<std::uint32_t> wide_;
  arrays_t staggered_{};
  std::vector<hone::buffer<Narrow>> arena_narrow_;
  std::vector<hone::buffer<std::uint32_t>> arena_wide_;
  arrays_t arena_{};
  inline static volatile std::uint32_t mask_ = 0;
};

template <class W>
std::uint32_t or_range(const W* p, std::size_t begin, std::size_t end) {
  std::uint32_t out = 0;
  hone_bench::detail::run_best([&]() __attribute__((always_inline)) {
    W acc = 0;
    for (std::size_t i = begin; i < end; ++i) acc |= p[i];
    out = acc;
  });
  return out;
}

/// The limit of a pass that only reads (a norm, an inf check): n words of W (4 bytes, or 2 for
/// fp16 gradients) OR-reduced over oneTBB threads, the result stored to a volatile, so no load can
/// be dropped.
template <class W>
class basic_read_limit {
 public:
  explicit basic_read_limit(std::size_t n, hone_bench::limit_tuning tuning = {})
      : n_(n), tuning_(tuning), storage_(n) {
    W* p = storage_.data();
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, tuning_.grain),
                      [p](const tbb::blocked_range<std::size_t>& r) {
                        for (std::size_t i = r.begin(); i != r.end(); ++i)
                          p[i] = static_cast<W>(i * 2654435761u);
                      });
    run();
  }

  void run() {
    const W* p = storage_.data();
    sink_ = tbb::parallel_reduce(
        tbb::blocked_range<std::size_t>(0, n_, tuning_.grain), std::uint32_t{0},
        [p](const tbb::blocked_range<std::size_t>& r, std::uint32_t acc) {
          return acc | or_range(p, r.begin(), r.end());
        },
        std::bit_or<std::uint32_t>{});
  }

  [[nodiscard]] std::size_t bytes_per_pass() const noexcept { return n_ * sizeof(W); }

 private:
  std::size_t n_;
  hone_bench::limit_tuning tuning_;
  hone::buffer<W> storage_;
  inline static volatile std::uint32_t sink_ = 0;
};
using read_limit = basic_read_limit<std::uint32_t>;

// ---- data -------------------------------------------------------------------------------------

// The tables of tensors bench_optim_gpu shares (bench/support/optim_data.hpp).
const std::vector<std::size_t>& mix(std::size_t total) {
  return hone_bench::optim_mix(total);
}
hone::arena_layout make_layout(const std::vector<std::size_t>& sizes) {
  return hone_bench::optim_layout(sizes);
}

/// Fills p[0, n) with base + (i % 1024) / 1024 on the oneTBB workers (hone_bench::fill_pattern).
template <class T>
void fill(T* p, std::size_t n, float base) {
  hone_bench::fill_pattern(p, n, base);
}

/// fp32 master weights and gradients in arenas laid out for one mix, and its fp32 AdamW state
/// (shared by adamw_fp32_64M and full_step_64M, which run on the same tensors).
struct model_data {
  std::vector<std::size_t> sizes;
  hone::arena_layout layout;
  std::size_t params = 0;  // elements of the tensors, padding excluded
  hone::arena<float> master;
  hone::arena<float> grad;
  hone::adamw policy{};
  hone::optimizer_state_t<hone::adamw> adamw;
  std::uint64_t adamw_steps = 0;

  explicit model_data(std::size_t total)
      : sizes(mix(total)),
        layout(make_layout(sizes)),
        master(layout),
        grad(layout),
        adamw(policy, layout) {
    for (std::size_t n : sizes) params += n;
    fill(master.all().data(), layout.total(), 0.5f);
    fill(grad.all().data(), layout.total(), 0.25f);
  }
  float* p() { return master.all().data(); }
  const float* g() const { return grad.all().data(); }
};

model_data& data(std::size_t total) {
  return hone_bench::optim_model<model_data>(total);
}

template <class Limit, std::size_t Total>
Limit& limit_of() {
  return hone_bench::optim_limit<Limit, model_data, Total>();
}

/// Runs `step` once untimed, then once per iteration; reports bytes and threads.
template <class Step>
void run_timed(benchmark::State& state, std::size_t bytes, Step&& step) {
  step();  // warm-up: caches, TLB, oneTBB workers awake
  for (auto _ : state) {
    step();
    benchmark::ClobberMemory();
  }
  hone_bench::report_bytes(state, bytes);
  hone_bench::report_threads(state);
}

constexpr float lr = 1e-3f;

// ---- adamw_fp32_{1M,16M,64M}, adamw_bf16grad_64M ----------------------------------------------

void adamw_fp32_hone(benchmark::State& state, std::size_t total) {
  auto& d = data(total);
  run_timed(state, d.params * 28,
            [&] { d.adamw.step(d.policy, {.step = ++d.adamw_steps, .lr = lr}, d.p(), d.g()); });
}

/// Registers the limit rows of `workload`: one pass of `Limit` (constructed on first use over
/// the parameters of the Total model) per iteration, one row per kernel it has.
template <class Limit, std::size_t Total>
void add_limit_rows(const std::string& workload,
                    std::vector<hone_bench::stream_kernel> kernels = {
                        hone_bench::stream_kernels.begin(), hone_bench::stream_kernels.end()}) {
  hone_bench::add_limits(
      workload,
      [](hone_bench::stream_kernel k) {
        auto& limit = limit_of<Limit, Total>();
        limit.run(k);
        return limit.bytes_per_pass();
      },
      std::move(kernels));
}

/// bf16 or fp16 gradients at the offsets of the fp32 layout (the step indexes both by the same slot
/// offsets) and an AdamW state of their own, on the 64 Mi master weights.
template <class G>
struct narrow_grads {
  hone::buffer<G> grad;
  hone::optimizer_state_t<hone::adamw> adamw;
  std::uint64_t steps = 0;
  explicit narrow_grads(model_data& d) : grad(d.layout.total()), adamw(d.policy, d.layout) {
    fill(grad.data(), grad.size(), 0.25f);
  }
};

void adamw_bf16grad_hone(benchmark::State& state) {
  auto& d = data(hone_bench::optim_64M);
  static narrow_grads<hone::bfloat16> b(d);
  run_timed(state, d.params * 26,
            [&] { b.adamw.step(d.policy, {.step = ++b.steps, .lr = lr}, d.p(), b.grad.data()); });
}

// ---- unscale_check_64M, unscale_check_fp16_64M ------------------------------------------------

/// fp32 master gradients (the unscale pass's output) and fp16 working gradients for the 64 Mi mix.
struct unscale_data {
  hone::arena<float> master_grad;
  hone::buffer<hone::half> half_grad;
  hone::tensor_lists<float, const float> from_fp32;
  hone::tensor_lists<float, const hone::half> from_fp16;
  explicit unscale_data(model_data& d) : master_grad(d.layout), half_grad(d.layout.total()) {
    fill(half_grad.data(), half_grad.size(), 0.25f);
    for (std::size_t i = 0; i < d.layout.size(); ++i) {
      const auto& s = d.layout[i];
      from_fp32.add(s.count, master_grad.all().data() + s.offset, d.g() + s.offset);
      from_fp16.add(s.count, master_grad.all().data() + s.offset, half_grad.data() + s.offset);
    }
  }
};

unscale_data& unscale_set() {
  static unscale_data u(data(hone_bench::optim_64M));
  return u;
}

/// The loss scale of iteration k: 2 and 1/2 in turn, as the torch peer's (which unscales its
/// gradients in place, so they return to their values every second iteration).
float loss_scale_of(std::uint64_t k) {
  return (k & 1) ? 0.5f : 2.0f;
}

volatile double sink_norm = 0.0;

void unscale_check_hone(benchmark::State& state) {
  auto& d = data(hone_bench::optim_64M);
  auto& u = unscale_set();
  std::uint64_t k = 0;
  run_timed(state, d.params * 8, [&] {
    const double sum_sq =
        hone::unscale_accumulate_into(u.from_fp32, 1.0f / loss_scale_of(++k), false);
    sink_norm = sum_sq;  // its finiteness is the inf check
  });
}

void unscale_check_fp16_hone(benchmark::State& state) {
  auto& d = data(hone_bench::optim_64M);
  auto& u = unscale_set();
  std::uint64_t k = 0;
  run_timed(state, d.params * 6, [&] {
    sink_norm = hone::unscale_accumulate_into(u.from_fp16, 1.0f / loss_scale_of(++k), false);
  });
}

// ---- sgd_momentum_64M -------------------------------------------------------------------------

void sgd_momentum_hone(benchmark::State& state) {
  auto& d = data(hone_bench::optim_64M);
  static const hone::sgd policy{.momentum = 0.9f};
  static hone::optimizer_state_t<hone::sgd> sgd(policy, d.layout);
  static std::uint64_t steps = 0;
  run_timed(state, d.params * 20,
            [&] { sgd.step(policy, {.step = ++steps, .lr = lr}, d.p(), d.g()); });
}

// ---- adamw8bit_64M ----------------------------------------------------------------------------

struct adamw8_data {
  hone::adamw_8bit policy{};
  hone::optimizer_state_t<hone::adamw_8bit> state;
  std::uint64_t steps = 0;
  std::size_t bytes = 0;  // per step: p (rw), g (r), codes (rw), absmax (rw), fp32 moments (rw)
  explicit adamw8_data(model_data& d) : state(policy, d.layout) {
    for (std::size_t i = 0; i < d.layout.size(); ++i) {
      const std::size_t n = d.layout[i].count;
      if (state.quantized(i)) {
        const std::size_t blocks = (n + policy.block - 1) / policy.block;
        bytes += n * (12 + 2 * 2) + blocks * 2 * 8;
      } else {
        bytes += n * 28;
      }
    }
  }
};

void adamw8bit_hone(benchmark::State& state) {
  auto& d = data(hone_bench::optim_64M);
  static adamw8_data a(d);
  run_timed(state, a.bytes,
            [&] { a.state.step(a.policy, {.step = ++a.steps, .lr = lr}, d.p(), d.g()); });
  // Optimizer state memory against fp32 AdamW's on the same layout.
  state.counters["state_bytes"] = static_cast<double>(a.state.bytes());
  state.counters["fp32_state_bytes"] = static_cast<double>(d.adamw.bytes());
  state.counters["state_ratio"] =
      static_cast<double>(a.state.bytes()) / static_cast<double>(d.adamw.bytes());
}

// ---- full_step_64M ----------------------------------------------------------------------------

// max_norm above the gradients' norm: the coefficient is 1. The torch peer's clip_grad_norm_
// multiplies its gradients by the clamped coefficient anyway (the same traffic as an active clip);
// an active clip would shrink its in-place gradients at every iteration into subnormals.
constexpr float full_step_max_norm = 1e6f;

void full_step_hone(benchmark::State& state) {
  auto& d = data(hone_bench::optim_64M);
  const hone::clip_grad_norm clip{.max_norm = full_step_max_norm};
  std::uint64_t k = 0;
  run_timed(state, d.params * 32, [&] {
    const float unscale = 1.0f / loss_scale_of(++k);
    // One read pass: total norm of grad * unscale and the inf/NaN check.
    const hone::clip_result r = clip.clip(std::as_const(d.grad), unscale);
    if (!r.nonfinite) {
      // AdamW with the unscaling and the clip coefficient folded into its gradient scale.
      d.adamw.step(d.policy,
                   {.step = ++d.adamw_steps, .lr = lr, .grad_scale = unscale * r.coefficient},
                   d.p(), d.g());
    }
  });
}

void full_step_fp16grad_hone(benchmark::State& state) {
  auto& d = data(hone_bench::optim_64M);
  static narrow_grads<hone::half> h(d);  // the full step reading 2-byte gradients twice
  const hone::clip_grad_norm clip{.max_norm = full_step_max_norm};
  std::uint64_t k = 0;
  run_timed(state, d.params * 28, [&] {
    const float unscale = 1.0f / loss_scale_of(++k);
    const hone::clip_result r = clip.clip(h.grad.data(), h.grad.size(), unscale);
    if (!r.nonfinite) {
      h.adamw.step(d.policy, {.step = ++h.steps, .lr = lr, .grad_scale = unscale * r.coefficient},
                   d.p(), h.grad.data());
    }
  });
}

/// Its limit: a read-only pass over 2-byte gradients, then the bf16-gradient AdamW limit (2 bytes
/// read, p m v read and written).
std::size_t full_step_fp16grad_limit(hone_bench::stream_kernel kernel) {
  static basic_read_limit<std::uint16_t> norm_pass(data(hone_bench::optim_64M).params);
  auto& update = limit_of<mixed_limit<std::uint16_t, 1, 0, 0, 3>, hone_bench::optim_64M>();
  norm_pass.run();
  update.run(kernel);
  return norm_pass.bytes_per_pass() + update.bytes_per_pass();
}

/// One pass of the full step's limit: a read-only pass over the gradients, then limit<4, 3>
/// with the given kernel.
std::size_t full_step_limit(hone_bench::stream_kernel kernel) {
  static read_limit norm_pass(data(hone_bench::optim_64M).params);
  auto& update = limit_of<hone_bench::limit<4, 3>, hone_bench::optim_64M>();
  norm_pass.run();
  update.run(kernel);
  return norm_pass.bytes_per_pass() + update.bytes_per_pass();
}

// ---- trainer_overhead -------------------------------------------------------------------------

constexpr std::size_t trainer_total = hone_bench::optim_16M;

using hone_bench::fixed_grad_model;
using hone_bench::no_batch;

fixed_grad_model& trainer_model() {
  static fixed_grad_model m(mix(trainer_total));
  return m;
}

constexpr float trainer_max_norm = 1.0f;

using bench_trainer = hone::trainer<fixed_grad_model, hone::fp32, hone::adamw, hone::clip_grad_norm,
                                    hone::constant_lr>;

bench_trainer& the_trainer() {
  static bench_trainer t(trainer_model(), hone::fp32{}, hone::adamw{},
                         hone::clip_grad_norm{.max_norm = trainer_max_norm},
                         hone::constant_lr{.base_lr = lr});
  return t;
}

/// The trainer's step (its direct route: one micro-batch, local gradients) written by hand with
/// the same library calls: forward_backward, the read-only norm pass over the model's gradients
/// (sum of squares of the unscaled values), the clip coefficient from that sum, the loss scaler's
/// decision, one AdamW pass over the model's gradients with unscale * coefficient as its gradient
/// scale.
struct hand_trainer {
  fixed_grad_model* model;
  hone::adamw policy{};
  hone::clip_grad_norm clip{.max_norm = trainer_max_norm};
  hone::static_loss_scaler scaler{};
  hone::arena<float> master_grad;  // column 0 of the norm pass's lists (not written)
  hone::optimizer_state_t<hone::adamw> state;
  hone::tensor_lists<float, const float> grads;
  std::uint64_t steps = 0;

  explicit hand_trainer(fixed_grad_model& m)
      : model(&m), master_grad(m.layout), state(policy, m.layout) {
    for (std::size_t i = 0; i < m.layout.size(); ++i) {
      grads.add(m.layout[i].count, master_grad.view(i).data(), m.grads.view(i).data());
    }
  }

  void step() {
    const float scale = scaler.scale();
    (void)model->forward_backward(no_batch{}, scale);
    const float unscale = 1.0f / scale;
    const double sum_sq = hone::unscaled_sum_of_squares(grads, unscale);
    const bool found_inf = !std::isfinite(sum_sq);
    if (scaler.update(found_inf)) {
      const float coef = clip.finish(static_cast<float>(std::sqrt(sum_sq))).coefficient;
      state.step(policy, {.step = ++steps, .lr = lr, .grad_scale = unscale * coef},
                 model->weights.all().data(), static_cast<const float*>(model->grads.all().data()));
    }
  }
};

hand_trainer& the_hand() {
  static hand_trainer h(trainer_model());
  return h;
}

/// The trainer's time over the hand-written step's, measured in adjacent pairs (order alternating)
/// so that both halves of a pair see the same machine: the median of `pairs` ratios. On a shared
/// machine the medians of the two separate rows move by more than the overhead asked for (3%).
double paired_overhead(int pairs) {
  auto& t = the_trainer();
  auto& h = the_hand();
  const no_batch b;
  auto seconds = [](auto&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  auto trainer_step = [&] { benchmark::DoNotOptimize(t.step(b)); };
  auto hand_step = [&] { h.step(); };
  std::vector<double> ratios;
  for (int k = 0; k < pairs; ++k) {
    double tt = 0.0, th = 0.0;
    if (k % 2 == 0) {
      tt = seconds(trainer_step);
      th = seconds(hand_step);
    } else {
      th = seconds(hand_step);
      tt = seconds(trainer_step);
    }
    ratios.push_back(tt / th);
  }
  std::sort(ratios.begin(), ratios.end());
  const std::size_t n = ratios.size();
  return n % 2 == 1 ? ratios[n / 2] : 0.5 * (ratios[n / 2 - 1] + ratios[n / 2]);
}

void trainer_overhead_hone(benchmark::State& state) {
  auto& m = trainer_model();
  auto& t = the_trainer();
  const no_batch b;
  run_timed(state, m.params * 40, [&] { benchmark::DoNotOptimize(t.step(b)); });
  state.counters["zero_copy"] = t.zero_copy() ? 1.0 : 0.0;
  state.counters["direct"] = t.backend().direct() ? 1.0 : 0.0;
  state.counters["paired_ratio"] = paired_overhead(16);
}

void trainer_overhead_hand(benchmark::State& state) {
  auto& m = trainer_model();
  auto& h = the_hand();
  run_timed(state, m.params * 40, [&] { h.step(); });
}

/// The limit of the trainer step: its three passes over shared arrays, as the step moves its data
/// (so that what one pass leaves in the cache for the next is the same): the copy F -> G (the
/// model's forward_backward), the read-only norm pass over G and the AdamW pass over W, G, m, v
/// (G read only). Five arrays of n words, staggered in one allocation as stream_limit's; each
/// pass runs limit.hpp's plain or non-temporal loop (the arena kernel: separate allocations; the
/// read pass is basic_read_limit's OR-reduction).
class trainer_limit {
  using word = std::uint32_t;
  using copy_arrays = hone_bench::detail::stream_arrays<word, 1, 0, 1>;
  using update_arrays = hone_bench::detail::stream_arrays<word, 1, 3, 0>;
  static constexpr std::size_t arrays = 5;  // F, G, W, m, v

 public:
  explicit trainer_limit(std::size_t n)
      : n_(n), storage_(hone_bench::stream_limit<word, 1, 0, 1>::pitch(n) * arrays) {
    const std::size_t pitch = hone_bench::stream_limit<word, 1, 0, 1>::pitch(n);
    hone_bench::detail::first_touch(storage_.data(), storage_.size(), grain, 0);
    for (std::size_t k = 0; k < arrays; ++k) staggered_[k] = storage_.data() + k * pitch;
    run(hone_bench::stream_kernel::plain);
  }

  /// One step's passes; returns the bytes they move.
  std::size_t run(hone_bench::stream_kernel kernel) {
    if (kernel == hone_bench::stream_kernel::arena && arena_.empty()) {
      for (std::size_t k = 0; k < arrays; ++k) {
        arena_.emplace_back(n_);
        hone_bench::detail::first_touch(arena_.back().data(), n_, grain, k * n_);
      }
    }
    std::array<word*, arrays> p = staggered_;
    if (kernel == hone_bench::stream_kernel::arena) {
      for (std::size_t k = 0; k < arrays; ++k) p[k] = arena_[k].data();
    }
    const bool nt = kernel == hone_bench::stream_kernel::nontemporal;
    const copy_arrays copy{{p[0]}, {}, {p[1]}};
    const update_arrays update{{p[1]}, {p[2], p[3], p[4]}, {}};
    pass(copy, nt);
    read_pass(p[1]);
    pass(update, nt);
    return n_ * sizeof(word) * (2 + 1 + 7);
  }

 private:
  static constexpr std::size_t grain = hone_bench::limit_tuning{}.grain;

  template <class Arrays>
  void pass(const Arrays& a, bool nt) const {
    const word mask = mask_;
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n_, grain),
                      [&a, mask, nt](const tbb::blocked_range<std::size_t>& r) {
                        if (nt) {
                          hone_bench::detail::stream_range_nt(a, mask, r.begin(), r.end());
                        } else {
                          hone_bench::detail::stream_range(a, mask, r.begin(), r.end());
                        }
                      });
  }

  void read_pass(const word* g) const {
    sink_ = tbb::parallel_reduce(
        tbb::blocked_range<std::size_t>(0, n_, grain), word{0},
        [g](const tbb::blocked_range<std::size_t>& r, word acc) {
          return acc | or_range(g, r.begin(), r.end());
        },
        std::bit_or<word>{});
  }

  std::size_t n_;
  hone::buffer<word> storage_;
  std::array<word*, arrays> staggered_{};
  std::vector<hone::buffer<word>> arena_;
  inline static volatile word mask_ = 0;
  inline static volatile word sink_ = 0;
};

// ---- trainer_fp16_64M, trainer_bf16_64M -------------------------------------------------------

/// A 64 Mi model in working type T whose gradients are fixed: they are written once, laid out in
/// T's arena, and forward_backward leaves them (the trainer only reads a model's gradients), so a
/// step moves what the trainer moves and nothing else.
template <class T>
struct working_model {
  hone::arena_layout layout;
  hone::arena<T> weights;
  hone::arena<T> grads;
  std::size_t params = 0;

  explicit working_model(std::size_t total)
      : layout(make_layout(mix(total))), weights(layout), grads(layout) {
    for (std::size_t n : mix(total)) params += n;
    fill(weights.all().data(), layout.total(), 0.5f);
    fill(grads.all().data(), layout.total(), 0.25f);
  }
  std::vector<hone::parameter<T>> parameters() {
    std::vector<hone::parameter<T>> ps;
    ps.reserve(layout.size());
    for (std::size_t i = 0; i < layout.size(); ++i) {
      ps.push_back({layout[i].name, {layout[i].count}, weights.view(i), grads.view(i)});
    }
    return ps;
  }
  float forward_backward(const no_batch& /*b*/, float /*loss_scale*/) { return 1.0f; }
};

template <class T, class Precision>
auto& working_trainer() {
  static hone::trainer t(
      hone_bench::optim_model<working_model<T>>(hone_bench::optim_64M), Precision{}, hone::adamw{},
      hone::clip_grad_norm{.max_norm = full_step_max_norm}, hone::constant_lr{.base_lr = lr});
  return t;
}

/// "hone": the trainer as users get it (the direct route); "master_route": the same trainer with
/// the direct route forbidden (the fp32 master gradients written and read again: 40 bytes per
/// parameter, reported as the row's 30 so that the GB/s compare as times).
template <class T, class Precision, bool Direct>
void trainer_working_hone(benchmark::State& state) {
  auto& m = hone_bench::optim_model<working_model<T>>(hone_bench::optim_64M);
  auto& t = working_trainer<T, Precision>();
  t.backend().set_direct_route(Direct);
  const no_batch b;
  run_timed(state, m.params * 30, [&] { benchmark::DoNotOptimize(t.step(b)); });
  state.counters["direct"] = t.backend().direct() ? 1.0 : 0.0;
  t.backend().set_direct_route(true);
}

/// Its limit: a read-only pass over 2-byte gradients, then 2 bytes read (the gradients), p m v
/// read and written, 2 bytes written (the working weights).
template <class T>
std::size_t trainer_working_limit(hone_bench::stream_kernel kernel) {
  using update_limit = mixed_limit<std::uint16_t, 1, 0, 0, 3, 0, 1>;
  auto& norm_pass = hone_bench::optim_limit<basic_read_limit<std::uint16_t>, working_model<T>,
                                            hone_bench::optim_64M>();
  auto& update = hone_bench::optim_limit<update_limit, working_model<T>, hone_bench::optim_64M>();
  norm_pass.run();
  update.run(kernel);
  return norm_pass.bytes_per_pass() + update.bytes_per_pass();
}

/// One pass of the trainer step's limit with the given kernel.
std::size_t trainer_overhead_limit(hone_bench::stream_kernel kernel) {
  return limit_of<trainer_limit, trainer_total>().run(kernel);
}

// ---- registration -----------------------------------------------------------------------------

bool register_benchmarks() {
  using hone_bench::add;
  using hone_bench::optim_16M;
  using hone_bench::optim_1M;
  using hone_bench::optim_64M;
  add("adamw_fp32_1M", "hone", [](benchmark::State& s) { adamw_fp32_hone(s, optim_1M); });
  add_limit_rows<hone_bench::limit<4, 3>, optim_1M>("adamw_fp32_1M");
  add("adamw_fp32_16M", "hone", [](benchmark::State& s) { adamw_fp32_hone(s, optim_16M); });
  add_limit_rows<hone_bench::limit<4, 3>, optim_16M>("adamw_fp32_16M");
  add("adamw_fp32_64M", "hone", [](benchmark::State& s) { adamw_fp32_hone(s, optim_64M); });
  add_limit_rows<hone_bench::limit<4, 3>, optim_64M>("adamw_fp32_64M");
  add("adamw_bf16grad_64M", "hone", adamw_bf16grad_hone);
  // p, m, v: fp32 read and written; g: 2 bytes read.
  using bf16grad_limit = mixed_limit<std::uint16_t, 1, 0, 0, 3>;
  add_limit_rows<bf16grad_limit, optim_64M>("adamw_bf16grad_64M", bf16grad_limit::kernels());
  add("unscale_check_64M", "hone", unscale_check_hone);
  // grads: read; master grads: written.
  add_limit_rows<hone_bench::stream_limit<float, 1, 0, 1>, optim_64M>("unscale_check_64M");
  add("unscale_check_fp16_64M", "hone", unscale_check_fp16_hone);
  // fp16 grads: 2 bytes read; master grads: 4 bytes written.
  using fp16_limit = mixed_limit<std::uint16_t, 1, 0, 0, 0, 1>;
  add_limit_rows<fp16_limit, optim_64M>("unscale_check_fp16_64M", fp16_limit::kernels());
  add("sgd_momentum_64M", "hone", sgd_momentum_hone);
  add_limit_rows<hone_bench::limit<3, 2>, optim_64M>("sgd_momentum_64M");
  add("adamw8bit_64M", "hone", adamw8bit_hone);
  // p: fp32 read and written; g: fp32 read; the two moment codes: 1 byte read and written: 16
  // bytes per parameter. hone's row also counts the block absmax (16 bytes per 256 elements) and
  // the fp32 moments of the small slots: 16.08 bytes per parameter on the 64 Mi mix.
  using adamw8_limit = mixed_limit<std::uint8_t, 0, 2, 1, 1>;
  add_limit_rows<adamw8_limit, optim_64M>("adamw8bit_64M", adamw8_limit::kernels());
  add("full_step_64M", "hone", full_step_hone);
  hone_bench::add_limits("full_step_64M", full_step_limit);
  add("full_step_fp16grad_64M", "hone", full_step_fp16grad_hone);
  hone_bench::add_limits("full_step_fp16grad_64M", full_step_fp16grad_limit,
                         mixed_limit<std::uint16_t, 1, 0, 0, 3>::kernels());
  add("trainer_overhead", "hone", trainer_overhead_hone);
  add("trainer_overhead", "hand", trainer_overhead_hand);
  hone_bench::add_limits("trainer_overhead", trainer_overhead_limit);
  using working_update_limit = mixed_limit<std::uint16_t, 1, 0, 0, 3, 0, 1>;
  add("trainer_fp16_64M", "hone", trainer_working_hone<hone::half, hone::fp16_mixed<>, true>);
  add("trainer_fp16_64M", "master_route",
      trainer_working_hone<hone::half, hone::fp16_mixed<>, false>);
  hone_bench::add_limits("trainer_fp16_64M", trainer_working_limit<hone::half>,
                         working_update_limit::kernels());
  add("trainer_bf16_64M", "hone", trainer_working_hone<hone::bfloat16, hone::bf16_mixed, true>);
  add("trainer_bf16_64M", "master_route",
      trainer_working_hone<hone::bfloat16, hone::bf16_mixed, false>);
  hone_bench::add_limits("trainer_bf16_64M", trainer_working_limit<hone::bfloat16>,
                         working_update_limit::kernels());
  return true;
}

std::vector<hone_bench::workload_mix> mixes() {
  std::vector<hone_bench::workload_mix> m;
  auto sizes_of = [](std::size_t total) { return [total] { return mix(total); }; };
  m.push_back({"adamw_fp32_1M", sizes_of(hone_bench::optim_1M)});
  m.push_back({"adamw_fp32_16M", sizes_of(hone_bench::optim_16M)});
  for (const char* w :
       {"adamw_fp32_64M", "adamw_bf16grad_64M", "unscale_check_64M", "unscale_check_fp16_64M",
        "sgd_momentum_64M", "adamw8bit_64M", "full_step_64M", "full_step_fp16grad_64M",
        "trainer_fp16_64M", "trainer_bf16_64M"}) {
    m.push_back({w, sizes_of(hone_bench::optim_64M)});
  }
  m.push_back({"trainer_overhead", sizes_of(trainer_total)});
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  return hone_bench::main(argc, argv, mixes(), register_benchmarks);
}
