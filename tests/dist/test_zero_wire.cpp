// hone::zero's 16-bit wire (zero_options::wire = bf16 or fp16), ranks as threads (thread_comm.hpp:
// sums in rank order, rounded back to 16 bits after each):
//  - zero<1>'s reduce and zero<2>'s scatter leave in each rank's shard the bits of the oracle of
//    wire_oracle.hpp (each rank's gradient rounded, the left fold in rank order, the average
//    rounded, widened), for 2, 3 and 4 ranks, an 81-float arena in 4-float windows and 1000
//    floats in one window, with and without `average`; zero<2>'s second scatter of a step adds in
//    fp32; at least a quarter of the elements differ from the fp32 wire;
//  - training (fp16 mixed precision, AdamW, no clipping): zero<1> and zero<2> with a 16-bit wire
//    give the bits of hone::data_parallel with that wire on every rank, and not those of the fp32
//    wire;
//  - two and three ranks holding a gradient of 40000 each overflow fp16 (the step is skipped on
//    every rank, the scale halved, the weights kept) and not bf16 or fp32;
//  - a communicator without 16-bit collectives is refused with a sentence at construction.
#define BOOST_TEST_MODULE hone_dist_zero_wire
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <hone/dist.hpp>
#include <span>
#include <string>
#include <vector>

#include "dp_model.hpp"
#include "dp_scenario.hpp"
#include "thread_comm.hpp"
#include "wire_oracle.hpp"

namespace {

/// Each rank's shard after reducing wire_gradients(elements, rank) with hone::zero<Stage> on
/// `ranks` thread ranks (zero<2>: `scatters` scatters of the same gradients, the later ones
/// accumulating).
template <int Stage>
std::vector<std::vector<float>> shards_on_threads(int ranks, std::size_t elements,
                                                  hone::zero_options o, int scatters = 1) {
  thread_group g(ranks);
  std::vector<std::vector<float>> out(static_cast<std::size_t>(ranks));
  g.run([&](int r) {
    thread_comm c(g, r);
    auto z = hone::zero<Stage>(c, o);
    std::vector<float> grads = wire_gradients(elements, r);
    const auto sh = z.shard(elements);
    if constexpr (Stage == 1) {
      z.reduce(std::span<float>(grads));
      out[static_cast<std::size_t>(r)].assign(
          grads.begin() + static_cast<std::ptrdiff_t>(sh.offset),
          grads.begin() + static_cast<std::ptrdiff_t>(sh.offset + sh.count));
    } else {
      std::vector<float> shard(sh.count, -1.0f);
      for (int k = 0; k < scatters; ++k) {
        z.scatter(
            elements, std::span<float>(shard),
            [&](std::size_t start, std::span<float> dst) {
              std::copy_n(grads.begin() + static_cast<std::ptrdiff_t>(start), dst.size(),
                          dst.begin());
            },
            /*accumulate=*/k > 0);
      }
      out[static_cast<std::size_t>(r)] = std::move(shard);
    }
  });
  return out;
}

template <class T, int Stage>
void check_shards(int ranks, std::size_t elements, hone::zero_options o, int scatters = 1) {
  std::vector<std::vector<float>> inputs;
  for (int r = 0; r < ranks; ++r) inputs.push_back(wire_gradients(elements, r));
  const auto got = shards_on_threads<Stage>(ranks, elements, o, scatters);
  hone::zero_options fp32 = o;
  fp32.wire = hone::wire_format::fp32;
  const auto plain = shards_on_threads<Stage>(ranks, elements, fp32, scatters);
  std::size_t wrong = 0, differs = 0, covered = 0;
  for (int r = 0; r < ranks; ++r) {
    const auto sh = hone::dist::shard_of(elements, r, ranks);
    const auto& have = got[static_cast<std::size_t>(r)];
    for (std::size_t j = 0; j < sh.count; ++j, ++covered) {
      float want = wire_candidates<T>(inputs, sh.offset + j, o.average)[0];
      for (int k = 1; k < scatters; ++k)
        want += wire_candidates<T>(inputs, sh.offset + j, o.average)[0];
      if (!same_float_bits(have[j], want) && wrong++ < 5) {
        BOOST_ERROR("rank " << r << " of " << ranks << ", element " << sh.offset + j << " of "
                            << elements << ": " << have[j] << ", the oracle " << want);
      }
      differs += !same_float_bits(have[j], plain[static_cast<std::size_t>(r)][j]);
    }
  }
  BOOST_TEST(covered == elements, "the shards cover " << covered << " of " << elements);
  BOOST_TEST(wrong == 0u, wrong << " elements differ from the oracle");
  BOOST_TEST(differs > elements / 4, differs << " of " << elements << " differ from the fp32 wire");
}

/// The training run of the bit-for-bit comparison: fp16 mixed precision with dynamic loss
/// scaling, AdamW with weight decay, no clipping, `reduction` as the gradient reduction role.
template <class Reduction>
std::vector<float> train_with(int rank, Reduction reduction) {
  const scenario sc{};
  mlp<hone::half> m;
  hone::trainer t(m, hone::fp16_mixed<>{.scaler = {.init_scale = 65536.0f, .growth_interval = 3}},
                  hone::adamw{.weight_decay = 0.01f}, hone::constant_lr{.base_lr = 0.01},
                  reduction);
  for (int s = 0; s < sc.steps; ++s) (void)t.step(scenario_batch(sc, s, rank));
  return hone::dist::gather_master_weights(t);
}

}  // namespace

BOOST_AUTO_TEST_CASE(each_shard_holds_the_oracle_s_bits) {
  for (const int n : {2, 3, 4}) {
    for (const bool average : {true, false}) {
      for (const std::size_t elements : {std::size_t{81}, std::size_t{1000}}) {
        BOOST_TEST_CONTEXT("ranks " << n << ", average " << average << ", " << elements
                                    << " floats") {
          // 81 floats: 4-float windows (several per shard); 1000: the default 25 MiB bucket.
          hone::zero_options o{
              .bucket_bytes = elements == 81 ? 16 * std::size_t(n) : std::size_t{25} << 20,
              .average = average};
          o.wire = hone::wire_format::bf16;
          check_shards<hone::bfloat16, 1>(n, elements, o);
          check_shards<hone::bfloat16, 2>(n, elements, o);
          check_shards<hone::bfloat16, 2>(n, elements, o, /*scatters=*/2);
          o.wire = hone::wire_format::fp16;
          check_shards<hone::half, 1>(n, elements, o);
          check_shards<hone::half, 2>(n, elements, o);
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(training_gives_the_bits_of_data_parallel_on_the_same_wire) {
  for (const auto wire : {hone::wire_format::bf16, hone::wire_format::fp16}) {
    for (const int n : {2, 3}) {
      BOOST_TEST_CONTEXT("wire " << hone::to_string(wire) << ", ranks " << n) {
        thread_group g(n);
        std::vector<std::vector<float>> ddp(static_cast<std::size_t>(n)), z1(ddp.size()),
            z2(ddp.size()), fp32(ddp.size());
        g.run([&](int r) {
          thread_comm c(g, r);
          hone::data_parallel_options dp = scenario_buckets;
          dp.wire = wire;
          hone::zero_options zo{.bucket_bytes = 16};
          zo.wire = wire;
          const auto u = static_cast<std::size_t>(r);
          ddp[u] = train_with(r, hone::data_parallel(c, dp));
          z1[u] = train_with(r, hone::zero<1>(c, zo));
          z2[u] = train_with(r, hone::zero<2>(c, zo));
          fp32[u] = train_with(r, hone::zero<1>(c, {.bucket_bytes = 16}));
        });
        for (std::size_t r = 0; r < ddp.size(); ++r) {
          BOOST_TEST(same_bits(z1[r], ddp[0]), "zero<1> rank " << r);
          BOOST_TEST(same_bits(z2[r], ddp[0]), "zero<2> rank " << r);
        }
        BOOST_TEST(!same_bits(z1[0], fp32[0]));  // the wire mattered
        BOOST_TEST(max_abs_diff(z1[0], fp32[0]) < 1e-2, max_abs_diff(z1[0], fp32[0]));
      }
    }
  }
}

namespace {
/// mlp<half> with fp16 loss scaling starting at 1 (a gradient of 40000 reaches the reduction as
/// 40000; min_scale below 1, so a back-off is a skipped step), AdamW, hone::zero<Stage>.
template <int Stage>
auto zero_overflow_trainer(mlp<hone::half>& m, thread_comm& c, hone::wire_format wire) {
  const hone::fp16_mixed<> fp16{
      .scaler = {.init_scale = 1.0f, .growth_interval = 1000, .min_scale = 1.0f / 64}};
  hone::zero_options o;
  o.wire = wire;
  return hone::trainer(m, fp16, hone::adamw{}, hone::accumulate::by_count{},
                       hone::zero<Stage>(c, o));
}

template <int Stage>
void check_overflow(int n, hone::wire_format wire) {
  thread_group g(n);
  std::vector<char> skipped(static_cast<std::size_t>(n)), unchanged(skipped.size());
  std::vector<float> scales(skipped.size());
  g.run([&](int r) {
    thread_comm c(g, r);
    mlp<hone::half> m;
    auto t = zero_overflow_trainer<Stage>(m, c, wire);
    (void)t.step(make_mlp_batch(4, 11u + static_cast<unsigned>(r)));
    const std::vector<float> before = hone::dist::gather_master_weights(t);
    mlp_batch b = make_mlp_batch(4, 21u + static_cast<unsigned>(r));
    b.poison = 40000.0f;  // fp16 holds it; 2 x 40000 does not
    const auto u = static_cast<std::size_t>(r);
    skipped[u] = t.step(b).skipped ? 1 : 0;
    scales[u] = t.scaler().state().scale;
    unchanged[u] = same_bits(hone::dist::gather_master_weights(t), before) ? 1 : 0;
  });
  const bool overflow = wire == hone::wire_format::fp16;
  for (std::size_t r = 0; r < skipped.size(); ++r) {
    BOOST_TEST((skipped[r] != 0) == overflow, "rank " << r);
    BOOST_TEST((unchanged[r] != 0) == overflow, "rank " << r);
    BOOST_TEST(scales[r] == (overflow ? 0.5f : 1.0f), "rank " << r);
  }
}
}  // namespace

BOOST_AUTO_TEST_CASE(an_fp16_sum_that_overflows_skips_the_step_on_every_rank) {
  for (const int n : {2, 3}) {
    for (const auto wire :
         {hone::wire_format::fp32, hone::wire_format::bf16, hone::wire_format::fp16}) {
      BOOST_TEST_CONTEXT("ranks " << n << ", wire " << hone::to_string(wire)) {
        check_overflow<1>(n, wire);
        check_overflow<2>(n, wire);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(a_communicator_without_16_bit_collectives_is_refused) {
  fp32_only_comm comm;
  (void)hone::zero<2>(comm);  // the fp32 wire needs nothing more
  for (const auto wire : {hone::wire_format::bf16, hone::wire_format::fp16}) {
    hone::zero_options o;
    o.wire = wire;
    try {
      (void)hone::zero<1>(comm, o);
      BOOST_ERROR("a " << hone::to_string(wire) << " wire over fp32_only_comm must be refused");
    } catch (const hone::config_error& e) {
      const std::string what = e.what();
      BOOST_TEST(what.find(std::string("hone::zero: options.wire is ") + hone::to_string(wire)) !=
                     std::string::npos,
                 what);
      BOOST_TEST(what.find("leave options.wire at fp32") != std::string::npos, what);
    }
  }
}
