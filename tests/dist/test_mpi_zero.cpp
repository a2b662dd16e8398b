// hone::zero<1> and hone::zero<2> over hone::dist::mpi_comm under mpirun with 2 and 3 ranks (an
// odd count catches off-by-one sharding): the MLP of tests/dist/dp_scenario.hpp trained with fp16
// dynamic loss scaling, AdamW with weight decay and global-norm clipping, one and two
// micro-batches per rank, its 81-float arena in 4-float windows.
//  (a) every rank holds bit-identical master weights, scaler state, counters and norm after
//      every step;
//  (b) the run matches one process accumulating every rank's micro-batches within 1e-6 (the
//      norm's sum is grouped by shard, and MPI may pair the ranks' sums in its own order), with
//      the same skipped steps and loss scales;
//  (c) two runs give the same bits;
//  (d) zero<1>, zero<2> and hone::data_parallel agree with each other within the same tolerance;
//  (e) the fp16 model's fp32 master weights are sharded (each rank holds its shard, together
//      every parameter once), with the bits of whole ones (zero_options::shard_master_weights =
//      false), both stages. Every case above runs on sharded master weights too;
//  (f) over sharded master weights, magnitude pruning and fake-quant training (its ranges agreed
//      by an all_reduce (max) over mpi_comm) give the model and master weights of whole ones.
//  (g) uneven inputs (zero_options::uneven_inputs): rank r trains 2 + 2 r steps, then joins; after
//      the join every rank holds the same bits, within 1e-6 of one process accumulating the
//      active ranks' batches (zero<2>: rank r's batches of 8 + 5 r rows, weight_by_count).
//  (h) the 16-bit wire (zero_options::wire, bf16 and fp16): zero<2>'s scatter leaves in each
//      rank's shard the bits of wire_oracle.hpp's oracle (any rotation of the rank order: MPI
//      groups the sums), and training holds the same bits on every rank, the same in two runs,
//      within 1e-2 of the fp32 wire and not equal to it.
#define BOOST_TEST_MODULE hone_dist_mpi_zero
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <cstring>
#include <hone/compress/prune.hpp>
#include <hone/compress/qat.hpp>
#include <hone/dist/mpi/mpi_comm.hpp>
#include <hone/dist/zero.hpp>
#include <span>
#include <vector>

#include "dp_scenario.hpp"
#include "mpi_scenario.hpp"
#include "wire_oracle.hpp"
#include "zero_scenario.hpp"

namespace hd = hone::dist;

namespace {
using mpi_scenario::check_identical_on_every_rank;
using mpi_scenario::make_comm;
using mpi_scenario::mpi_fixture;

template <int Stage>
void check_stage(int micro) {
  auto c = make_comm();
  const scenario sc{};
  const auto run = train_zero<Stage>(c, sc, micro);
  check_identical_on_every_rank(c, run);  // (a)
  const auto ref = train_zero_reference(c.size(), sc, micro);
  double worst = 0;
  int skipped = 0;
  for (std::size_t s = 0; s < ref.size(); ++s) {
    BOOST_TEST(run[s].skipped == ref[s].skipped, "step " << s);
    BOOST_TEST(run[s].scale == ref[s].scale, "step " << s);
    BOOST_TEST(run[s].steps_done == ref[s].steps_done, "step " << s);
    worst = std::max(worst, max_abs_diff(run[s].master, ref[s].master));
    skipped += ref[s].skipped;
  }
  BOOST_TEST_MESSAGE("zero<" << Stage << "> rank " << c.rank() << " of " << c.size() << ", "
                             << micro << " micro-batches: largest difference to one process "
                             << worst);
  BOOST_TEST(worst <= 1e-6);  // (b)
  BOOST_TEST(skipped > 0);
  BOOST_TEST(max_abs_diff(run.back().master, run.front().master) > 1e-3);
  const auto again = train_zero<Stage>(c, sc, micro);  // (c)
  for (std::size_t s = 0; s < run.size(); ++s) {
    BOOST_TEST(same_bits(run[s].master, again[s].master), "step " << s);
    BOOST_TEST(same_bits(run[s].grad_norm, again[s].grad_norm), "step " << s);
  }
}

/// zero<2> with a weight constraint: the model's weights and the gathered master weights after
/// every step.
template <class Comm, class Constraint>
std::vector<std::vector<float>> constrained_run(Comm& c, bool shard, Constraint k) {
  const scenario sc{};
  hone::zero_options o = small_windows;
  o.shard_master_weights = shard;
  mlp<hone::half> m;
  auto t = scenario_trainer(m, hone::zero<2>(c, o), std::move(k));
  BOOST_TEST(t.master_weights_sharded() == shard);
  std::vector<std::vector<float>> out;
  for (int s = 0; s < 12; ++s) {
    const auto mb = zero_batches(sc, s, c.rank(), c.size(), 1);
    (void)t.step(std::span<const mlp_batch>(mb));
    out.push_back(model_weights(m));
    out.push_back(hd::gather_master_weights(t));
  }
  return out;
}
}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(mpi_fixture);

BOOST_AUTO_TEST_CASE(zero_1_one_micro_batch) {
  check_stage<1>(1);
}
BOOST_AUTO_TEST_CASE(zero_1_two_micro_batches) {
  check_stage<1>(2);
}
BOOST_AUTO_TEST_CASE(zero_2_one_micro_batch) {
  check_stage<2>(1);
}
BOOST_AUTO_TEST_CASE(zero_2_two_micro_batches) {
  check_stage<2>(2);
}

BOOST_AUTO_TEST_CASE(zero_and_data_parallel_agree) {  // (d)
  auto c = make_comm();
  const scenario sc{};
  const auto z1 = train_zero<1>(c, sc);
  const auto z2 = train_zero<2>(c, sc);
  const auto ddp = train_replica(c, sc);
  double worst = 0;
  for (std::size_t s = 0; s < ddp.size(); ++s) {
    BOOST_TEST(z1[s].skipped == ddp[s].skipped);
    BOOST_TEST(z2[s].skipped == ddp[s].skipped);
    worst = std::max({worst, max_abs_diff(z1[s].master, ddp[s].master),
                      max_abs_diff(z2[s].master, ddp[s].master)});
  }
  BOOST_TEST(worst <= 1e-6);
}

BOOST_AUTO_TEST_CASE(sharded_master_weights_give_the_bits_of_whole_ones) {  // (e)
  auto c = make_comm();
  const scenario sc{};
  {
    mlp<hone::half> m;
    auto t = scenario_trainer(m, hone::zero<1>(c, small_windows));
    BOOST_TEST(t.master_weights_sharded());
    const auto sh = hone::dist::shard_of(t.layout().total(), c.rank(), c.size());
    BOOST_TEST(t.master_weights().size() <= sh.count);
    double held = static_cast<double>(t.master_weights().size());
    c.all_reduce(std::span<double>(&held, 1), hone::dist::reduce_op::sum).wait();
    BOOST_TEST(held >= 65.0);  // every parameter's master weight once over the ranks
    BOOST_TEST(held <= static_cast<double>(t.layout().total()));
  }
  hone::zero_options whole = small_windows;
  whole.shard_master_weights = false;
  for (int stage : {1, 2}) {
    const auto a = stage == 1 ? train_zero<1>(c, sc, 2) : train_zero<2>(c, sc, 2);
    const auto b = stage == 1 ? train_zero<1>(c, sc, 2, whole) : train_zero<2>(c, sc, 2, whole);
    for (std::size_t s = 0; s < a.size(); ++s) {
      BOOST_TEST(same_bits(a[s].master, b[s].master), "zero<" << stage << "> step " << s);
    }
  }
}

BOOST_AUTO_TEST_CASE(weight_constraints_over_sharded_master_weights) {  // (f)
  auto c = make_comm();
  const hone::compress::magnitude_pruning prune(
      {.schedule = {.initial = 0.2, .target = 0.6, .begin_step = 2, .every = 2, .prunings = 3}});
  const hone::compress::fake_quant_training qat{};
  const auto p1 = constrained_run(c, true, prune), p0 = constrained_run(c, false, prune);
  const auto q1 = constrained_run(c, true, qat), q0 = constrained_run(c, false, qat);
  for (std::size_t i = 0; i < p1.size(); ++i) {
    BOOST_TEST(same_bits(p1[i], p0[i]), "pruning, record " << i);
    BOOST_TEST(same_bits(q1[i], q0[i]), "fake quantization, record " << i);
  }
  // every rank's model holds the same fake-quantized weights
  std::vector<double> mine;
  for (const auto& v : q1) mine.insert(mine.end(), v.begin(), v.end());
  std::vector<double> all(mine.size() * static_cast<std::size_t>(c.size()));
  c.all_gather(std::span<const double>(mine), std::span<double>(all)).wait();
  for (int q = 1; q < c.size(); ++q) {
    BOOST_TEST(std::memcmp(all.data() + mine.size() * static_cast<std::size_t>(q), all.data(),
                           mine.size() * sizeof(double)) == 0,
               "rank " << q);
  }
}

BOOST_AUTO_TEST_CASE(uneven_inputs_join) {  // (g)
  auto c = make_comm();
  std::vector<std::vector<int>> steps(1);
  for (int r = 0; r < c.size(); ++r) steps[0].push_back(2 + 2 * r);
  for (int stage : {1, 2}) {
    scenario sc{};
    hone::zero_options o = small_windows;
    o.uneven_inputs = true;
    if (stage == 2) {
      sc.extra_rows_per_rank = 5;
      sc.weight_by_count = o.weight_by_count = true;
    }
    mlp<hone::half> m;
    std::vector<float> master;
    hone::dist::join_report rep;
    const auto train = [&](auto zero) {
      auto t = scenario_trainer(m, zero);
      for (int s = 0; s < steps[0][static_cast<std::size_t>(c.rank())]; ++s) {
        (void)t.step(scenario_batch(sc, s, c.rank()));
      }
      rep = hone::dist::join(t);
      master = hd::gather_master_weights(t);
    };
    if (stage == 1) {
      train(hone::zero<1>(c, o));
    } else {
      train(hone::zero<2>(c, o));
    }
    const auto ref = train_reference_uneven(sc, steps);
    BOOST_TEST(max_abs_diff(master, ref.steps.back().master) <= 1e-6, "zero<" << stage << ">");
    BOOST_TEST(rep.shadowed_steps == static_cast<std::uint64_t>(2 * (c.size() - 1 - c.rank())));
    std::vector<double> mine(master.begin(), master.end());
    std::vector<double> all(mine.size() * static_cast<std::size_t>(c.size()));
    c.all_gather(std::span<const double>(mine), std::span<double>(all)).wait();
    for (int q = 1; q < c.size(); ++q) {
      BOOST_TEST(std::memcmp(all.data() + mine.size() * static_cast<std::size_t>(q), all.data(),
                             mine.size() * sizeof(double)) == 0,
                 "zero<" << stage << "> rank " << q);
    }
  }
}

namespace {
template <class T>
void check_wire_shard(hd::mpi_comm& c, hone::wire_format wire, std::size_t elements) {
  hone::zero_options o{.bucket_bytes = 16 * static_cast<std::size_t>(c.size())};
  o.wire = wire;
  auto z = hone::zero<2>(c, o);
  std::vector<std::vector<float>> inputs;
  for (int r = 0; r < c.size(); ++r) inputs.push_back(wire_gradients(elements, r));
  const std::vector<float>& mine = inputs[static_cast<std::size_t>(c.rank())];
  const auto sh = z.shard(elements);
  std::vector<float> shard(sh.count);
  z.scatter(
      elements, std::span<float>(shard),
      [&](std::size_t start, std::span<float> dst) {
        std::copy_n(mine.begin() + static_cast<std::ptrdiff_t>(start), dst.size(), dst.begin());
      },
      /*accumulate=*/false);
  std::size_t wrong = 0;
  for (std::size_t j = 0; j < sh.count; ++j) {
    const auto want = wire_candidates<T>(inputs, sh.offset + j);
    bool ok = false;
    for (const float w : want) ok = ok || same_float_bits(shard[j], w);
    if (!ok && wrong++ < 5) {
      BOOST_ERROR("rank " << c.rank() << " of " << c.size() << ", element " << sh.offset + j
                          << " of " << elements << ": " << shard[j] << ", the oracle (left fold) "
                          << want[0]);
    }
  }
  BOOST_TEST(wrong == 0u, wrong << " elements differ from the oracle");
}
}  // namespace

BOOST_AUTO_TEST_CASE(sixteen_bit_wire) {  // (h)
  auto c = make_comm();
  const scenario sc{};
  for (const auto wire : {hone::wire_format::bf16, hone::wire_format::fp16}) {
    BOOST_TEST_CONTEXT("wire " << hone::to_string(wire)) {
      for (const std::size_t elements : {std::size_t{81}, std::size_t{1000}}) {
        if (wire == hone::wire_format::bf16) {
          check_wire_shard<hone::bfloat16>(c, wire, elements);
        } else {
          check_wire_shard<hone::half>(c, wire, elements);
        }
      }
      hone::zero_options o = small_windows;
      o.wire = wire;
      const auto run = train_zero<2>(c, sc, 1, o);
      check_identical_on_every_rank(c, run);
      const auto again = train_zero<2>(c, sc, 1, o);
      const auto fp32 = train_zero<2>(c, sc, 1);
      for (std::size_t s = 0; s < run.size(); ++s) {
        BOOST_TEST(same_bits(run[s].master, again[s].master), "step " << s);
      }
      const double d = max_abs_diff(run.back().master, fp32.back().master);
      BOOST_TEST(d > 0.0);
      BOOST_TEST(d < 1e-2, d);
    }
  }
}
