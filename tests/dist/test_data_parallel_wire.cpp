// hone::data_parallel with a 16-bit wire (data_parallel_options::wire = bf16 or fp16), ranks as
// threads (thread_comm.hpp: sums in rank order, 16-bit sums in float rounded back):
//  - 2, 3 and 4 ranks, an arena of 81 floats in small buckets (a padded tail included) and one
//    of 1000 in the default buckets: every rank holds the oracle's bits (wire_oracle.hpp: each
//    rank's gradient rounded to 16 bits, the left fold in rank order rounded after each sum, the
//    fp32 average rounded, widened), so every rank holds the same bits; the fp32 wire gives other
//    bits (the rounding really happens);
//  - local_comm (one rank): the arena becomes its own 16-bit rounding;
//  - a trainer whose two ranks each hold a gradient of 40000 (finite in fp16): the fp16 wire's
//    sum overflows to inf and the step is skipped on every rank (scale backed off, weights kept);
//    bf16 and fp32 take the step;
//  - a communicator without 16-bit collectives is refused with a sentence at construction.
#define BOOST_TEST_MODULE hone_dist_data_parallel_wire
#include <boost/test/unit_test.hpp>

#include <hone/dist.hpp>
#include <span>
#include <string>
#include <vector>

#include "dp_model.hpp"
#include "thread_comm.hpp"
#include "wire_oracle.hpp"

namespace hd = hone::dist;

namespace {

/// Reduces wire_gradients(elements, r) on `ranks` thread ranks; returns every rank's arena.
std::vector<std::vector<float>> reduce_on_threads(int ranks, std::size_t elements,
                                                  hone::data_parallel_options o) {
  thread_group g(ranks);
  std::vector<std::vector<float>> out(static_cast<std::size_t>(ranks));
  g.run([&](int r) {
    thread_comm c(g, r);
    hone::data_parallel dp(c, o);
    auto grads = wire_gradients(elements, r);
    dp.reduce(std::span<float>(grads));
    out[static_cast<std::size_t>(r)] = std::move(grads);
  });
  return out;
}

template <class T>
void check_against_oracle(int ranks, std::size_t elements, hone::data_parallel_options o) {
  std::vector<std::vector<float>> inputs;
  for (int r = 0; r < ranks; ++r) inputs.push_back(wire_gradients(elements, r));
  const auto got = reduce_on_threads(ranks, elements, o);
  o.wire = hone::wire_format::fp32;
  const auto fp32 = reduce_on_threads(ranks, elements, o);
  std::size_t wrong = 0, differs_from_fp32 = 0;
  for (std::size_t i = 0; i < elements; ++i) {
    const float want = wire_candidates<T>(inputs, i)[0];  // thread_comm: the left fold
    for (int r = 0; r < ranks; ++r) {
      const float have = got[static_cast<std::size_t>(r)][i];
      if (!same_float_bits(have, want) && wrong++ < 5) {
        BOOST_ERROR("rank " << r << " of " << ranks << ", element " << i << " of " << elements
                            << ": " << have << ", the oracle " << want);
      }
    }
    differs_from_fp32 += !same_float_bits(got[0][i], fp32[0][i]);
  }
  BOOST_TEST(wrong == 0u, wrong << " elements differ from the oracle");
  BOOST_TEST(differs_from_fp32 > elements / 4,
             differs_from_fp32 << " of " << elements << " differ from the fp32 wire");
}

}  // namespace

static_assert(hd::communicator<fp32_only_comm>);
static_assert(!hd::detail::carries<fp32_only_comm, hone::bfloat16>);
static_assert(hd::detail::carries<hd::local_comm, hone::bfloat16>);
static_assert(hd::detail::carries<hd::local_comm, hone::half>);

BOOST_AUTO_TEST_CASE(thread_ranks_hold_the_oracle_s_bits_on_both_16_bit_wires) {
  constexpr hone::data_parallel_options small{.bucket_bytes = 64, .first_bucket_bytes = 32};
  for (int n : {2, 3, 4}) {
    for (std::size_t elements : {std::size_t{81}, std::size_t{1000}}) {
      hone::data_parallel_options o = elements == 81 ? small : hone::data_parallel_options{};
      BOOST_TEST_CONTEXT("ranks " << n << ", " << elements << " elements") {
        o.wire = hone::wire_format::bf16;
        BOOST_TEST_CONTEXT("bf16") {
          check_against_oracle<hone::bfloat16>(n, elements, o);
        }
        o.wire = hone::wire_format::fp16;
        BOOST_TEST_CONTEXT("fp16") {
          check_against_oracle<hone::half>(n, elements, o);
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(without_average_the_owner_sends_the_rounded_sum) {
  const std::size_t elements = 81;
  hone::data_parallel_options o{.bucket_bytes = 64, .first_bucket_bytes = 32, .average = false};
  o.wire = hone::wire_format::bf16;
  std::vector<std::vector<float>> inputs;
  for (int r = 0; r < 3; ++r) inputs.push_back(wire_gradients(elements, r));
  const auto got = reduce_on_threads(3, elements, o);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < elements; ++i)
    for (const auto& rank : got)
      wrong += !same_float_bits(rank[i], wire_candidates<hone::bfloat16>(inputs, i, false)[0]);
  BOOST_TEST(wrong == 0u);
}

BOOST_AUTO_TEST_CASE(one_rank_rounds_its_arena_to_the_wire_type) {
  hd::local_comm comm;
  for (auto wire : {hone::wire_format::bf16, hone::wire_format::fp16}) {
    BOOST_TEST_CONTEXT(hone::to_string(wire)) {
      hone::data_parallel dp(comm, {.bucket_bytes = 64, .first_bucket_bytes = 32, .wire = wire});
      auto grads = wire_gradients(81, 0);
      const auto before = grads;
      dp.reduce(std::span<float>(grads));
      dp.reduce(std::span<float>(grads));  // a second step: the lane is reused
      for (std::size_t i = 0; i < grads.size(); ++i) {
        const float want = wire == hone::wire_format::bf16
                               ? static_cast<float>(hone::bfloat16(before[i]))
                               : static_cast<float>(hone::half(before[i]));
        BOOST_TEST(same_float_bits(grads[i], want), "element " << i);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(an_fp16_sum_that_overflows_skips_the_step_on_every_rank) {
  for (int n : {2, 3}) {
    for (auto wire : {hone::wire_format::fp32, hone::wire_format::bf16, hone::wire_format::fp16}) {
      BOOST_TEST_CONTEXT("ranks " << n << ", wire " << hone::to_string(wire)) {
        thread_group g(n);
        std::vector<hone::step_report> reports(static_cast<std::size_t>(n));
        std::vector<float> scales(static_cast<std::size_t>(n));
        std::vector<char> unchanged(
            static_cast<std::size_t>(n));  // not vector<bool>: one byte per rank
        g.run([&](int r) {
          thread_comm c(g, r);
          mlp<hone::half> m;
          auto t = overflow_trainer(m, c, wire);
          (void)t.step(make_mlp_batch(4, 11u + static_cast<unsigned>(r)));
          const auto w = t.master_weights();
          const std::vector<float> before(w.begin(), w.end());
          mlp_batch b = make_mlp_batch(4, 21u + static_cast<unsigned>(r));
          b.poison = 40000.0f;  // fp16 holds it; 2 x 40000 does not
          const auto u = static_cast<std::size_t>(r);
          reports[u] = t.step(b);
          scales[u] = t.scaler().state().scale;
          const auto after = t.master_weights();
          unchanged[u] = std::equal(after.begin(), after.end(), before.begin()) ? 1 : 0;
        });
        const bool overflow = wire == hone::wire_format::fp16;
        for (std::size_t r = 0; r < reports.size(); ++r) {
          BOOST_TEST(reports[r].skipped == overflow, "rank " << r);
          BOOST_TEST((unchanged[r] != 0) == overflow, "rank " << r);
          BOOST_TEST(scales[r] == (overflow ? 0.5f : 1.0f), "rank " << r);
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(a_communicator_without_16_bit_collectives_is_refused) {
  fp32_only_comm comm;
  hone::data_parallel ok(comm);  // the fp32 wire needs nothing more
  (void)ok;
  for (auto wire : {hone::wire_format::bf16, hone::wire_format::fp16}) {
    try {
      hone::data_parallel dp(comm, {.wire = wire});
      BOOST_ERROR("a " << hone::to_string(wire) << " wire over fp32_only_comm must be refused");
    } catch (const hone::config_error& e) {
      const std::string what = e.what();
      BOOST_TEST(
          what.find(std::string("options.wire is ") + hone::to_string(wire)) != std::string::npos,
          what);
      BOOST_TEST(what.find("leave options.wire at fp32") != std::string::npos, what);
    }
  }
}
