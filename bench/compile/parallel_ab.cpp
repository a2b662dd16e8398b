// Run-time check of a compile-time change (docs/benchmarks.md, "Compile time"): hone::for_each
// and transform_reduce over tensor_lists, whose oneTBB body is erased to a function pointer
// (core/parallel.hpp), against the previous form, a direct tbb::parallel_for /
// parallel_deterministic_reduce over the same chunks, in one process, alternating which goes
// first, 24 pairs; prints medians and the median of the paired ratios. 64 Mi fp32 elements in 20
// tensors: AdamW (4 arrays) and the unscale-and-square reduction (2 arrays).
//   g++ -std=c++20 -O3 -DNDEBUG -march=native -I include bench/compile/parallel_ab.cpp -ltbb
//   g++ -std=c++20 -O2 -DNDEBUG -I include bench/compile/parallel_ab.cpp -ltbb
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/parallel_reduce.h>
#include <oneapi/tbb/partitioner.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <hone/core/multi_tensor.hpp>
#include <hone/optim/adamw.hpp>
#include <hone/precision/unscale.hpp>
#include <vector>

template <class Op, class... Ts>
void old_for_each(const hone::tensor_lists<Ts...>& lists, const Op& op) {
  const auto chunks = hone::detail::make_chunks(lists, hone::host_tuning{}.grain);
  constexpr auto seq = std::index_sequence_for<Ts...>{};
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, chunks.size(), 1),
                    [&](const tbb::blocked_range<std::size_t>& r) {
                      for (std::size_t c = r.begin(); c != r.end(); ++c)
                        hone::detail::apply_chunk(op, chunks[c], lists.at(chunks[c].tensor), seq);
                    });
}
template <class R, class Op, class Reduce, class... Ts>
R old_reduce(const hone::tensor_lists<Ts...>& lists, R init, const Op& op, const Reduce& reduce) {
  const auto chunks = hone::detail::make_chunks(lists, hone::host_tuning{}.grain);
  constexpr auto seq = std::index_sequence_for<Ts...>{};
  return tbb::parallel_deterministic_reduce(
      tbb::blocked_range<std::size_t>(0, chunks.size(), 1), init,
      [&](const tbb::blocked_range<std::size_t>& r, R acc) {
        for (std::size_t c = r.begin(); c != r.end(); ++c)
          acc = reduce(acc, hone::detail::reduce_chunk(op, reduce, init, chunks[c],
                                                       lists.at(chunks[c].tensor), seq));
        return acc;
      },
      reduce, tbb::simple_partitioner{});
}

int main() {
  const std::size_t per = 64u << 20, nt = 20;
  std::vector<std::vector<float>> p(nt), g(nt), m(nt), v(nt), mg(nt);
  hone::tensor_lists<float, const float, float, float> lists;
  hone::tensor_lists<float, const float> ul;
  for (std::size_t t = 0; t < nt; ++t) {
    const std::size_t n = per / nt + (t == 0 ? per % nt : 0);
    p[t].assign(n, 0.5f);
    g[t].assign(n, 0.01f);
    m[t].assign(n, 0.f);
    v[t].assign(n, 0.f);
    mg[t].assign(n, 0.f);
    lists.add(n, p[t].data(), g[t].data(), m[t].data(), v[t].data());
    ul.add(n, mg[t].data(), g[t].data());
  }
  hone::optimizer_step_args a;
  a.step = 1;
  a.lr = 1e-3f;
  const hone::adamw_functor<float> op{
      hone::adamw_coefficients::make(0.9f, 0.999f, 1e-8f, a, 1e-3f, 0.01f)};
  const hone::unscale_accumulate<float, false> uop{0.5f};
  using clk = std::chrono::steady_clock;
  std::vector<double> ta, tb, ra, rb;
  double sink = 0;
  for (int rep = 0; rep < 24; ++rep) {
    const bool first_new = rep % 2 == 0;
    for (int k = 0; k < 2; ++k) {
      const bool use_new = (k == 0) == first_new;
      auto t0 = clk::now();
      if (use_new)
        hone::for_each(lists, op);
      else
        old_for_each(lists, op);
      auto t1 = clk::now();
      double s = use_new ? hone::transform_reduce(ul, 0.0, uop, hone::plus{})
                         : old_reduce(ul, 0.0, uop, hone::plus{});
      auto t2 = clk::now();
      sink += s;
      (use_new ? ta : tb).push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      (use_new ? ra : rb).push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    }
  }
  auto med = [](std::vector<double> x) {
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
  };
  std::printf("adamw for_each  new %.2f ms  old %.2f ms  new/old %.3f\n", med(ta), med(tb),
              med(ta) / med(tb));
  std::printf("unscale reduce  new %.2f ms  old %.2f ms  new/old %.3f\n", med(ra), med(rb),
              med(ra) / med(rb));
  // paired ratio
  std::vector<double> pr, rr;
  for (std::size_t i = 0; i < ta.size(); ++i) {
    pr.push_back(ta[i] / tb[i]);
    rr.push_back(ra[i] / rb[i]);
  }
  std::printf("paired median ratio: adamw %.3f unscale %.3f (sink %g)\n", med(pr), med(rr), sink);
}
