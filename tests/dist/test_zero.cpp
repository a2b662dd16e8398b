// hone::zero<1> and hone::zero<2> (hone/dist/zero.hpp), ranks as threads (thread_comm.hpp: sums
// in rank order):
//  - the shards cover an arena exactly once, on 64-byte boundaries; the shard layout puts every
//    piece of a tensor at its arena offset; parameter groups follow the pieces;
//  - 2, 3 and 4 ranks, one and two micro-batches per rank, fp16 mixed precision with dynamic loss
//    scaling (the first steps overflow and are skipped), AdamW with weight decay and global-norm
//    clipping: every rank holds the same bits after every step, two runs give the same bits, the
//    steps skipped and the loss scale are those of one process accumulating every rank's
//    micro-batches, and the weights agree with it within 1e-6 (the norm's sum is grouped by shard,
//    and 1/3 rounds);
//  - without clipping, zero<1> gives the bits of hone::data_parallel (the same sums in the same
//    order, the same element-wise update);
//  - memory per rank read from the arena sizes: fp32 AdamW with the model's fp32 weights bound
//    zero-copy takes 16 bytes per parameter with data_parallel, 8 + 8/d with zero<1>, 4 + 12/d
//    with zero<2> (plus the staging bucket), for d = 1..4;
//  - SGD with momentum and parameter groups (no weight decay for biases) against one process;
//  - checkpoints: 2 ranks capture a checkpoint (collective), which resumes on 1, 2 and 3 ranks
//    and in a trainer without ZeRO; each continuation matches one process that never stopped
//    within 1e-6, every rank of a continuation holds the same bits, and the file holds whole
//    tensors (the model's shapes);
//  - clip_grad_norm of order 1, 3 and infinity (the shards' sums of |g|^p or largest |g|
//    combined over the ranks) against one process, both stages, 2 and 3 ranks;
//  - errors: a failed collective names the stage, the step, the window and the collective; a zero
//    bucket is refused with a sentence;
//  - sharded master weights (the fp16 model's fp32 master weights, zero_options::
//    shard_master_weights, which every case above runs on too): each rank holds its shard's size,
//    with the bits of whole master weights (master and model weights, both stages, 1-3 ranks);
//    broadcast_weights reaches them (the roles that read or change whole master weights over
//    sharded ones: test_zero_constraints).
#define BOOST_TEST_MODULE hone_dist_zero
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <hone/checkpoint/trainer_checkpoint.hpp>
#include <hone/dist.hpp>
#include <hone/optim/sgd.hpp>
#include <hone/train/trainer.hpp>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "dp_model.hpp"
#include "dp_scenario.hpp"
#include "flaky_comm.hpp"
#include "thread_comm.hpp"
#include "zero_resume.hpp"
#include "zero_scenario.hpp"

namespace hd = hone::dist;

namespace {

template <int Stage>
std::vector<std::vector<step_record>> zero_threads(int ranks, const scenario& sc, int micro) {
  thread_group g(ranks);
  std::vector<std::vector<step_record>> out(static_cast<std::size_t>(ranks));
  g.run([&](int r) {
    thread_comm c(g, r);
    out[static_cast<std::size_t>(r)] = train_zero<Stage>(c, sc, micro);
  });
  return out;
}

void check_ranks_agree(const std::vector<std::vector<step_record>>& runs) {
  for (std::size_t r = 1; r < runs.size(); ++r) {
    for (std::size_t s = 0; s < runs[0].size(); ++s) {
      BOOST_TEST(same_bits(runs[r][s].master, runs[0][s].master), "rank " << r << " step " << s);
      BOOST_TEST(runs[r][s].scale == runs[0][s].scale);
      BOOST_TEST(runs[r][s].skipped == runs[0][s].skipped);
      BOOST_TEST(same_bits(runs[r][s].grad_norm, runs[0][s].grad_norm));
    }
  }
}

/// y = sum over tensors of w_t . x_t: fp32 tensors of the given sizes laid out in one arena as
/// the trainer lays them out, so the trainer binds them zero-copy (the master weights ARE them).
struct laid_out_linear {
  hone::arena_layout layout{sizeof(float)};
  std::vector<float> w, g;
  explicit laid_out_linear(const std::vector<std::size_t>& sizes) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      layout.add(i + 1 == sizes.size() ? "head.bias" : "t" + std::to_string(i) + ".weight",
                 sizes[i]);
    }
    w.assign(layout.total(), 0.0f);
    g.assign(layout.total(), 0.0f);
    for (std::size_t i = 0; i < w.size(); ++i)
      w[i] = 0.01f * std::sin(0.37f * static_cast<float>(i));
  }
  std::vector<hone::parameter<float>> parameters() {
    std::vector<hone::parameter<float>> out;
    for (const auto& sl : layout.slots()) {
      out.push_back({sl.name,
                     {sl.count},
                     std::span<float>(w.data() + sl.offset, sl.count),
                     std::span<float>(g.data() + sl.offset, sl.count)});
    }
    return out;
  }
  struct batch {
    std::vector<float> x;  // one row of layout.total() inputs per sample
    std::vector<float> y;
    [[nodiscard]] std::size_t count() const { return y.size(); }
  };
  batch make_batch(std::size_t rows, unsigned seed) const {
    batch b{std::vector<float>(rows * w.size()), std::vector<float>(rows)};
    for (std::size_t i = 0; i < b.x.size(); ++i)
      b.x[i] = std::cos(0.11f * static_cast<float>(i) + 0.7f * static_cast<float>(seed));
    for (std::size_t r = 0; r < rows; ++r) b.y[r] = std::sin(static_cast<float>(seed + r));
    return b;
  }
  float forward_backward(const batch& b, float scale) {
    std::fill(g.begin(), g.end(), 0.0f);
    float loss = 0;
    const std::size_t n = w.size();
    const auto rows = static_cast<float>(b.y.size());
    for (std::size_t r = 0; r < b.y.size(); ++r) {
      const float* x = &b.x[r * n];
      float pred = 0;
      for (std::size_t i = 0; i < n; ++i) pred += w[i] * x[i];
      const float e = pred - b.y[r];
      loss += e * e / rows;
      for (std::size_t i = 0; i < n; ++i) g[i] += 2 * e / rows * x[i] * scale;
    }
    return loss;
  }
};

const std::vector<std::size_t> linear_sizes{1000, 37, 501, 3};

}  // namespace

static_assert(std::is_same_v<decltype(hone::zero<2>(std::declval<hd::local_comm&>())),
                             hone::zero_redundancy<2, hd::local_comm>>);
static_assert(hone::zero_redundancy<1, hd::local_comm>::zero_stage == 1);

BOOST_AUTO_TEST_CASE(the_shards_cover_the_arena_once_on_aligned_boundaries) {
  for (std::size_t n : {1u, 15u, 16u, 17u, 81u, 1000u, 1001u, 4096u}) {
    for (int d = 1; d <= 5; ++d) {
      std::size_t next = 0;
      for (int r = 0; r < d; ++r) {
        const hd::shard_range s = hd::shard_of(n, r, d);
        BOOST_TEST(s.offset == std::min(n, next), "n " << n << " rank " << r << " of " << d);
        BOOST_TEST(s.stride % 16 == 0u);
        BOOST_TEST(s.stride * static_cast<std::size_t>(d) >= n);
        BOOST_TEST(s.stride <
                   (n + static_cast<std::size_t>(d) - 1) / static_cast<std::size_t>(d) + 16);
        next = s.offset + s.count;
        if (s.count > 0) BOOST_TEST(s.offset % 16 == 0u);
      }
      BOOST_TEST(next == n, "n " << n << " over " << d << " ranks ends at " << next);
    }
  }
  BOOST_CHECK_THROW((void)hd::shard_of(10, 2, 2), hone::config_error);
}

BOOST_AUTO_TEST_CASE(the_shard_layout_keeps_every_piece_at_its_arena_offset) {
  mlp<hone::half> m;
  hone::arena_layout full(sizeof(float));
  for (auto& p : m.parameters()) full.add(p.name, p.value.size());
  BOOST_TEST(full.total() == 81u);
  thread_group g(3);
  std::vector<hone::arena_layout> shards(3, hone::arena_layout(sizeof(float)));
  std::vector<std::vector<hone::param_group>> groups(3);
  g.run([&](int r) {
    thread_comm c(g, r);
    const auto z = hone::zero<1>(c);
    shards[static_cast<std::size_t>(r)] = z.shard_layout(full);
    groups[static_cast<std::size_t>(r)] = z.shard_groups(full, hone::no_decay_groups(full));
  });
  // 81 floats over 3 ranks: shards of 32 (27 rounded up to 16 floats).
  BOOST_TEST(shards[0].size() == 1u);
  BOOST_TEST(shards[0][0].name == "layer1.weight");
  BOOST_TEST(shards[0][0].count == 32u);
  BOOST_TEST(shards[1].size() == 2u);
  BOOST_TEST(shards[1][0].name == "layer1.weight");
  BOOST_TEST(shards[1][0].count == 16u);
  BOOST_TEST(shards[1][1].name == "layer1.bias");
  BOOST_TEST(shards[1][1].offset == 16u);
  BOOST_TEST(shards[2].size() == 2u);
  BOOST_TEST(shards[2][0].name == "layer2.weight");
  BOOST_TEST(shards[2][1].name == "layer2.bias");
  BOOST_TEST(shards[2][1].offset == 80u - 64u);
  // no_decay_groups: the biases; rank 0's shard holds none.
  BOOST_TEST(groups[0][0].slots.empty());
  BOOST_TEST(groups[1][0].slots == std::vector<std::size_t>{1}, boost::test_tools::per_element());
  BOOST_TEST(groups[2][0].slots == std::vector<std::size_t>{1}, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(every_rank_holds_the_same_bits_and_matches_one_process) {
  const scenario sc{};
  for (int micro : {1, 2}) {
    for (int n : {2, 3, 4}) {
      BOOST_TEST_CONTEXT("ranks " << n << ", micro-batches per rank " << micro) {
        const auto ref = train_zero_reference(n, sc, micro);
        const auto z1 = zero_threads<1>(n, sc, micro);
        const auto z2 = zero_threads<2>(n, sc, micro);
        const auto z2_again = zero_threads<2>(n, sc, micro);
        check_ranks_agree(z1);
        check_ranks_agree(z2);
        double worst1 = 0, worst2 = 0;
        int skipped = 0;
        for (std::size_t s = 0; s < ref.size(); ++s) {
          BOOST_TEST(z1[0][s].skipped == ref[s].skipped, "step " << s);
          BOOST_TEST(z2[0][s].skipped == ref[s].skipped, "step " << s);
          BOOST_TEST(z1[0][s].scale == ref[s].scale, "step " << s);
          BOOST_TEST(z2[0][s].scale == ref[s].scale, "step " << s);
          BOOST_TEST(same_bits(z2[0][s].master, z2_again[0][s].master), "step " << s);
          skipped += ref[s].skipped;
          worst1 = std::max(worst1, max_abs_diff(z1[0][s].master, ref[s].master));
          worst2 = std::max(worst2, max_abs_diff(z2[0][s].master, ref[s].master));
        }
        BOOST_TEST_MESSAGE("ranks " << n << " micro " << micro << ": zero<1> " << worst1
                                    << ", zero<2> " << worst2 << " from one process");
        BOOST_TEST(worst1 <= 1e-6);
        BOOST_TEST(worst2 <= 1e-6);
        BOOST_TEST(skipped > 0);  // the first steps overflow at scale 2^16
        BOOST_TEST(ref.back().steps_done > 5u);
        // The weights moved: a run that applied nothing would also agree.
        BOOST_TEST(max_abs_diff(ref.back().master, ref.front().master) > 1e-3);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(without_clipping_zero_1_gives_the_bits_of_data_parallel) {
  const scenario sc{};
  for (int n : {2, 3}) {
    thread_group g(n);
    std::vector<std::vector<float>> ddp(static_cast<std::size_t>(n)), z(ddp.size());
    g.run([&](int r) {
      thread_comm c(g, r);
      const auto run = [&](auto reduction) {
        mlp<hone::half> m;
        hone::trainer t(
            m, hone::fp16_mixed<>{.scaler = {.init_scale = 65536.0f, .growth_interval = 3}},
            hone::adamw{.weight_decay = 0.01f}, hone::constant_lr{.base_lr = 0.01}, reduction);
        for (int s = 0; s < sc.steps; ++s) (void)t.step(scenario_batch(sc, s, r));
        return hone::dist::gather_master_weights(t);
      };
      ddp[static_cast<std::size_t>(r)] = run(hone::data_parallel(c, scenario_buckets));
      z[static_cast<std::size_t>(r)] = run(hone::zero<1>(c, small_windows));
    });
    for (int r = 0; r < n; ++r) {
      BOOST_TEST(same_bits(z[static_cast<std::size_t>(r)], ddp[0]), "ranks " << n << " rank " << r);
    }
  }
}

BOOST_AUTO_TEST_CASE(memory_per_rank_is_the_zero_formula) {
  // fp32 AdamW, the model's fp32 weights bound zero-copy: bytes per parameter held by the trainer
  // (master weights = the model's, master gradients, moments) plus the staging bucket.
  for (int d = 1; d <= 4; ++d) {
    thread_group g(d);
    std::vector<double> ddp(static_cast<std::size_t>(d)), z1(ddp.size()), z2(ddp.size());
    std::vector<double> staging1(ddp.size()), staging2(ddp.size());
    std::size_t params = 0;
    for (std::size_t s : linear_sizes) params += s;
    g.run([&](int r) {
      thread_comm c(g, r);
      const auto bytes = [&](auto& t) {
        if (!t.zero_copy())
          return -1.0;  // checked after the threads (Boost.Test is not
                        // thread-safe): the formula assumes zero-copy weights
        return static_cast<double>(t.master_weights().size() * 4 + t.master_gradients().size() * 4 +
                                   t.optimizer_state().bytes());
      };
      const auto i = static_cast<std::size_t>(r);
      laid_out_linear m(linear_sizes);
      const auto b = m.make_batch(2, 1);
      {
        hone::trainer t(m, hone::adamw{}, hone::data_parallel(c));
        (void)t.step(b);
        ddp[i] = bytes(t);
      }
      {
        hone::trainer t(m, hone::adamw{}, hone::zero<1>(c, {.bucket_bytes = 1024}));
        (void)t.step(b);
        z1[i] = bytes(t);
        staging1[i] = static_cast<double>(t.gradient_reduction().staging_bytes());
      }
      {
        hone::trainer t(m, hone::adamw{}, hone::zero<2>(c, {.bucket_bytes = 1024}));
        (void)t.step(b);
        z2[i] = bytes(t);
        staging2[i] = static_cast<double>(t.gradient_reduction().staging_bytes());
      }
    });
    laid_out_linear probe(linear_sizes);
    const auto total = static_cast<double>(probe.layout.total());  // with the 64-byte padding
    const auto p = static_cast<double>(params);
    const double shard = static_cast<double>(hd::shard_of(probe.layout.total(), 0, d).stride);
    for (std::size_t r = 0; r < ddp.size(); ++r) {
      BOOST_TEST_CONTEXT("rank " << r << " of " << d) {
        BOOST_TEST_MESSAGE("d " << d << ": DDP " << ddp[r] / p << " B/param, zero<1> " << z1[r] / p
                                << ", zero<2> " << z2[r] / p << " (+ staging " << staging2[r]
                                << " B)");
        // The arenas hold the padded layout (`total` floats): exactly 16 bytes per element.
        BOOST_TEST(ddp[r] == 16 * total);
        // zero<1>: weights 4 + gradients 4 + moments 8 / d (the shard, up to its 64-byte rounding).
        BOOST_TEST(z1[r] <= 8 * total + 8 * shard);
        BOOST_TEST(z1[r] >= 8 * total);
        // zero<2>: weights 4 + (gradients 4 + moments 8) / d.
        BOOST_TEST(z2[r] <= 4 * total + 12 * shard);
        BOOST_TEST(z2[r] >= 4 * total);
        // The staging bucket: one window per rank plus the receive window, about bucket_bytes.
        BOOST_TEST(staging2[r] <= 1024.0 + 1024.0 / d + 8);
        BOOST_TEST(staging1[r] == staging2[r]);
        if (d > 1) BOOST_TEST(z2[r] < z1[r]);
      }
    }
    // Together the ranks hold each parameter's moments once: the shards' moments add up to the
    // parameters' (a shard's layout drops the padding at its end, so not to the padded arena's).
    double moments = 0;
    for (std::size_t r = 0; r < z1.size(); ++r) moments += z1[r] - 8 * total;
    BOOST_TEST(moments >= 8 * p);
    BOOST_TEST(moments <= 8 * total);
    BOOST_TEST(moments < 8 * p + 8 * 16 * static_cast<double>(linear_sizes.size()));
  }
}

BOOST_AUTO_TEST_CASE(sgd_with_momentum_and_parameter_groups_match_one_process) {
  for (int n : {2, 3}) {
    thread_group g(n);
    std::vector<std::vector<float>> w1(static_cast<std::size_t>(n)), w2(w1.size());
    const auto policies = [] {
      return std::tuple{hone::sgd{.momentum = 0.9f, .weight_decay = 0.1f},
                        hone::constant_lr{.base_lr = 0.05},
                        hone::clip_grad_value{.clip_value = 0.05f}};
    };
    g.run([&](int r) {
      thread_comm c(g, r);
      const auto train = [&](auto reduction) {
        laid_out_linear m(linear_sizes);
        auto [opt, lr, clip] = policies();
        hone::trainer t(m, opt, lr, clip, reduction);
        t.set_param_groups(hone::no_decay_groups(t.layout()));
        for (int s = 0; s < 6; ++s) {
          (void)t.step(m.make_batch(3, static_cast<unsigned>(10 * s + r)));
        }
        return std::vector<float>(m.w.begin(), m.w.end());
      };
      w1[static_cast<std::size_t>(r)] = train(hone::zero<1>(c, {.bucket_bytes = 256}));
      w2[static_cast<std::size_t>(r)] = train(hone::zero<2>(c, {.bucket_bytes = 256}));
    });
    // One process: the ranks' batches as micro-batches, weighted 1/n each (by count, the batches
    // being equal, as the ranks' average weights them).
    laid_out_linear m(linear_sizes);
    auto [opt, lr, clip] = policies();
    hone::trainer t(m, opt, lr, clip, hone::accumulate::by_count{});
    t.set_param_groups(hone::no_decay_groups(t.layout()));
    for (int s = 0; s < 6; ++s) {
      std::vector<laid_out_linear::batch> mb;
      for (int r = 0; r < n; ++r) mb.push_back(m.make_batch(3, static_cast<unsigned>(10 * s + r)));
      (void)t.step(std::span<const laid_out_linear::batch>(mb));
    }
    const std::vector<float> ref(m.w.begin(), m.w.end());
    for (int r = 0; r < n; ++r) {
      BOOST_TEST(same_bits(w1[static_cast<std::size_t>(r)], w1[0]));
      BOOST_TEST(same_bits(w2[static_cast<std::size_t>(r)], w1[0]));
    }
    BOOST_TEST(max_abs_diff(w1[0], ref) <= 1e-6, "ranks " << n << ": " << max_abs_diff(w1[0], ref));
    BOOST_TEST(max_abs_diff(ref, laid_out_linear(linear_sizes).w) > 1e-4);  // it trained
  }
}

namespace {
namespace ck = hone::checkpoint;
namespace fs = std::filesystem;

}  // namespace

BOOST_AUTO_TEST_CASE(a_checkpoint_of_two_ranks_resumes_on_one_two_and_three) {
  const fs::path root =
      fs::temp_directory_path() / ("hone-test-zero-ckpt-" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  // 2 ranks, zero<2>: steps 0..3, then a checkpoint captured by both ranks.
  std::vector<ck::snapshot> snaps(2);
  {
    thread_group g(2);
    g.run([&](int r) {
      thread_comm c(g, r);
      (void)zero_segment<2>(c, {}, 0, 4, &snaps[static_cast<std::size_t>(r)]);
    });
  }
  const fs::path dir =
      ck::write_snapshot(root, 4, snaps[0], {.compression = std::nullopt, .sync = false});
  // One process that never stopped: the 6 micro-batches of every step, steps 0..7.
  const std::vector<float> want = six_batch_reference(8);
  // The file holds whole tensors with the model's shapes (what any hone trainer or hone-ckpt
  // reads).
  const ck::tensor_file of = ck::tensor_file::open(dir / ck::files::optimizer);
  BOOST_TEST((of.find("exp_avg.layer1.weight")->shape == ck::shape_type{8, 6}));
  BOOST_TEST((of.find("exp_avg_sq.layer2.bias")->shape == ck::shape_type{1}));
  check_resumes_on_one_two_and_three(dir, want);
  // A trainer without ZeRO restores it too.
  BOOST_TEST(max_abs_diff(plain_resume(dir), want) <= 1e-6);
  // Without the optimizer state the continuation would differ: the comparison can fail.
  const auto perturbed =
      plain_resume(dir, [](auto& t) { t.optimizer_state().exp_avg().all()[0] += 1.0f; });
  BOOST_TEST(max_abs_diff(perturbed, want) > 1e-5);
  fs::remove_all(root);
}

BOOST_AUTO_TEST_CASE(a_failed_collective_names_the_stage_the_step_and_the_window) {
  // flaky_comm fails its n-th collective. With one rank and 4-float windows, the 81-float arena
  // is one shard of 96 floats (rounded up to 16): 24 windows per pass.
  const scenario sc{};
  const auto message_of = [&](int stage, int fail_at) {
    dist_test::flaky_comm c;
    c.fail_at = fail_at;
    mlp<hone::half> m;
    try {
      if (stage == 1) {
        auto t = scenario_trainer(m, hone::zero<1>(c, small_windows));
        for (int s = 0; s < 3; ++s) (void)t.step(scenario_batch(sc, s, 0));
      } else {
        auto t = scenario_trainer(m, hone::zero<2>(c, small_windows));
        for (int s = 0; s < 3; ++s) (void)t.step(scenario_batch(sc, s, 0));
      }
    } catch (const hone::dist_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // Step 1: 24 reduce_scatters, then the all_gather of the sums of squares (#25).
  const std::string scatter = message_of(2, 3);
  BOOST_TEST(scatter.find("hone::zero<2>: step 1 on rank 0 of 1, window 3, the reduce_scatter of "
                          "a micro-batch's gradients: flaky_comm: collective #3") == 0u,
             scatter);
  const std::string sum = message_of(1, 25);
  BOOST_TEST(sum.find("hone::zero<1>: step 1 on rank 0 of 1, the all_gather of the gradients' "
                      "sums of squares: flaky_comm: collective #25") == 0u,
             sum);
  BOOST_TEST(sum.find("end the job") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(bad_options_are_refused_with_sentences) {
  hd::local_comm c;
  BOOST_CHECK_EXCEPTION((void)hone::zero<1>(c, {.bucket_bytes = 0}), hone::config_error,
                        [](const hone::config_error& e) {
                          return std::string(e.what()).find("bucket_bytes is 0") !=
                                 std::string::npos;
                        });
}

namespace {
/// dp_scenario's trainer with clip_grad_norm of order `order` and a max_norm that clips most
/// steps.
template <class... Extra>
auto clipped_trainer(mlp<hone::half>& m, float order, float max_norm, Extra... extra) {
  return hone::trainer(m,
                       hone::fp16_mixed<>{.scaler = {.init_scale = 65536.0f, .growth_interval = 3}},
                       hone::adamw{.weight_decay = 0.01f},
                       hone::clip_grad_norm{.max_norm = max_norm, .norm_type = order},
                       hone::constant_lr{.base_lr = 0.01}, hone::accumulate::by_count{}, extra...);
}

/// One process accumulating every rank's batch of each step as micro-batches.
std::vector<float> clipped_reference(int ranks, float order, float max_norm) {
  const scenario sc{};
  mlp<hone::half> m;
  auto t = clipped_trainer(m, order, max_norm);
  for (int s = 0; s < sc.steps; ++s) {
    std::vector<mlp_batch> mb;
    for (int r = 0; r < ranks; ++r) mb.push_back(scenario_batch(sc, s, r));
    (void)t.step(std::span<const mlp_batch>(mb));
  }
  const auto w = t.master_weights();
  return {w.begin(), w.end()};
}
}  // namespace

BOOST_AUTO_TEST_CASE(clipping_by_norms_of_other_orders_uses_the_global_norm) {
  const scenario sc{};
  const float infinity = std::numeric_limits<float>::infinity();
  for (const float order : {1.0f, 3.0f, infinity}) {
    for (const int n : {2, 3}) {
      BOOST_TEST_CONTEXT("order " << order << ", ranks " << n) {
        const std::vector<float> ref = clipped_reference(n, order, 0.05f);
        thread_group g(n);
        std::vector<std::vector<float>> z1(static_cast<std::size_t>(n)), z2(z1.size());
        g.run([&](int r) {
          thread_comm c(g, r);
          const auto run = [&](auto reduction) {
            mlp<hone::half> m;
            auto t = clipped_trainer(m, order, 0.05f, reduction);
            for (int s = 0; s < sc.steps; ++s) (void)t.step(scenario_batch(sc, s, r));
            return hone::dist::gather_master_weights(t);
          };
          z1[static_cast<std::size_t>(r)] = run(hone::zero<1>(c, small_windows));
          z2[static_cast<std::size_t>(r)] = run(hone::zero<2>(c, small_windows));
        });
        for (int r = 1; r < n; ++r) {
          BOOST_TEST(same_bits(z1[static_cast<std::size_t>(r)], z1[0]), "zero<1> rank " << r);
          BOOST_TEST(same_bits(z2[static_cast<std::size_t>(r)], z2[0]), "zero<2> rank " << r);
        }
        BOOST_TEST(max_abs_diff(z1[0], ref) <= 1e-6, max_abs_diff(z1[0], ref));
        BOOST_TEST(max_abs_diff(z2[0], ref) <= 1e-6, max_abs_diff(z2[0], ref));
        // The clipping acted: without it (a max_norm no step reaches) the weights differ.
        BOOST_TEST(max_abs_diff(ref, clipped_reference(n, order, 1e30f)) > 1e-4);
      }
    }
  }
}

namespace {
/// What one rank's mixed-precision ZeRO run left: its master weights' size and whether they are
/// sharded, every rank's whole master weights (gathered) and the model's weights.
struct master_run {
  std::size_t size = 0;
  bool sharded = false;
  std::vector<float> whole, model;
};

template <int Stage>
master_run run_mixed(thread_comm& c, const scenario& sc, bool shard) {
  hone::zero_options o = small_windows;
  o.shard_master_weights = shard;
  mlp<hone::half> m;
  auto t = scenario_trainer(m, hone::zero<Stage>(c, o));
  for (int s = 0; s < sc.steps; ++s) {
    const auto mb = zero_batches(sc, s, c.rank(), c.size(), 2);
    (void)t.step(std::span<const mlp_batch>(mb));
  }
  return {t.master_weights().size(), t.master_weights_sharded(),
          hone::dist::gather_master_weights(t), model_weights(m)};
}
}  // namespace

BOOST_AUTO_TEST_CASE(mixed_precision_master_weights_are_sharded_with_the_same_bits) {
  // fp16 mixed precision: the fp32 master weights are the trainer's own copy. With
  // shard_master_weights (the default) each rank keeps its shard (4/d bytes per parameter) and
  // the updated shards are gathered straight into the model's fp16 weights: the bits of the
  // whole copy (shard_master_weights = false), the master weights and the model's alike.
  const scenario sc{};
  for (int n : {1, 2, 3}) {
    thread_group g(n);
    const auto ranks = static_cast<std::size_t>(n);
    std::vector<master_run> on1(ranks), off1(ranks), on2(ranks), off2(ranks);
    g.run([&](int r) {
      thread_comm c(g, r);
      const auto i = static_cast<std::size_t>(r);
      on1[i] = run_mixed<1>(c, sc, true);
      off1[i] = run_mixed<1>(c, sc, false);
      on2[i] = run_mixed<2>(c, sc, true);
      off2[i] = run_mixed<2>(c, sc, false);
    });
    mlp<hone::half> probe;
    auto t = scenario_trainer(probe);
    const std::size_t total = t.layout().total();  // 81 floats: 65 parameters and padding
    for (std::size_t r = 0; r < ranks; ++r) {
      BOOST_TEST_CONTEXT("rank " << r << " of " << n) {
        const auto sh = hd::shard_of(total, static_cast<int>(r), n);
        for (const auto* run : {&on1[r], &on2[r]}) {
          BOOST_TEST(run->sharded);
          BOOST_TEST(run->size <= sh.count);  // the shard (its end padding dropped)
          BOOST_TEST(run->size + 16 > sh.count);
        }
        // Every rank holds the same bits.
        BOOST_TEST(same_bits(on1[r].whole, on1[0].whole));
        BOOST_TEST(same_bits(on1[r].model, on1[0].model));
        BOOST_TEST(same_bits(on2[r].whole, on2[0].whole));
        BOOST_TEST(same_bits(on2[r].model, on2[0].model));
        for (const auto* run : {&off1[r], &off2[r]}) {
          BOOST_TEST(!run->sharded);
          BOOST_TEST(run->size == total);
        }
        BOOST_TEST(same_bits(on1[r].whole, off1[r].whole));
        BOOST_TEST(same_bits(on1[r].model, off1[r].model));
        BOOST_TEST(same_bits(on2[r].whole, off2[r].whole));
        BOOST_TEST(same_bits(on2[r].model, off2[r].model));
      }
    }
    std::size_t held = 0;
    for (const auto& run : on1) held += run.size;
    BOOST_TEST(held >= 65u);  // every parameter's master weight (65) once over the ranks
    BOOST_TEST(held <= total);
    // The run trained (the model moved from its initial weights).
    BOOST_TEST(max_abs_diff(on1[0].model, model_weights(probe)) > 1e-3);
  }
}

BOOST_AUTO_TEST_CASE(broadcast_weights_reaches_sharded_master_weights) {
  // Rank 1's and 2's models start elsewhere; broadcast_weights gives every rank rank 0's model
  // weights and loads each rank's shard of the master weights from them.
  thread_group g(3);
  std::vector<master_run> runs(3);
  g.run([&](int r) {
    thread_comm c(g, r);
    mlp<hone::half> m;
    if (r != 0) {
      for (auto& v : m.w1) v = hone::half(static_cast<float>(v) + 0.25f * static_cast<float>(r));
    }
    auto t = scenario_trainer(m, hone::zero<1>(c, small_windows));
    hone::dist::broadcast_weights(t, c);
    runs[static_cast<std::size_t>(r)] = {t.master_weights().size(), t.master_weights_sharded(),
                                         hone::dist::gather_master_weights(t), model_weights(m)};
  });
  mlp<hone::half> root;
  const auto want = model_weights(root);
  for (const auto& run : runs) {
    BOOST_TEST(run.sharded);
    BOOST_TEST(same_bits(run.model, want));
    std::vector<float> master;  // the whole master weights without the padding, tensor by tensor
    mlp<hone::half> probe;
    auto t = scenario_trainer(probe);
    for (const auto& slot : t.layout().slots()) {
      master.insert(master.end(), run.whole.begin() + static_cast<std::ptrdiff_t>(slot.offset),
                    run.whole.begin() + static_cast<std::ptrdiff_t>(slot.offset + slot.count));
    }
    BOOST_TEST(same_bits(master, want));
  }
}
