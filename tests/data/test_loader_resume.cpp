// Tests of exact mid-epoch resume (hone/data/loader.hpp, loader_state.hpp): a run stopped after
// any number of next() calls, its state written as JSON and read back into a fresh loader with
// another thread count, continues with bitwise the batches of the uninterrupted run; the same
// through a real hone checkpoint (state.json's "data" object, written by checkpoint_writer and
// found by newest_valid); distributed runs resumed on the same world size (bitwise) and on
// another one (every entry of the epoch read exactly once, checked position by position against
// the sampler's order); states of another dataset, sampler or generator refused. Label
// concurrency: CI runs it under ThreadSanitizer.
#define BOOST_TEST_MODULE hone_data_loader_resume
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <hone/checkpoint.hpp>

#include "loader_common.hpp"

using namespace loader_test;
namespace fs = std::filesystem;
namespace ck = hone::checkpoint;

namespace {

using shuffled_loader = data::loader<numbers, batch, put, data::shuffled_sampler>;
using dist_sampler = data::distributed_sampler<data::shuffled_sampler>;
using dist_loader = data::loader<numbers, batch, put, dist_sampler>;

std::unique_ptr<shuffled_loader> make(const numbers& ds, std::size_t threads, std::size_t prefetch,
                                      data::last_batch last = data::last_batch::pad) {
  auto l = std::make_unique<shuffled_loader>(
      ds, batch{std::vector<std::uint64_t>(6)}, put{},
      data::loader_options{
          .batch_size = 6, .threads = threads, .prefetch = prefetch, .seed = 99, .last = last});
  l->set_transform(noisy);
  return l;
}

std::unique_ptr<dist_loader> make_rank(const numbers& ds, std::size_t rank, std::size_t world,
                                       std::size_t threads, data::tail t = data::tail::pad) {
  auto l = std::make_unique<dist_loader>(
      ds, batch{std::vector<std::uint64_t>(4)}, put{},
      data::loader_options{.batch_size = 4, .threads = threads, .prefetch = 2, .seed = 5},
      dist_sampler(data::shuffled_sampler{}, rank, world, t));
  l->set_transform(noisy);
  return l;
}

// A state through its JSON text and back, as it travels in a checkpoint.
data::loader_state through_json(const data::loader_state& s) {
  const std::string text = data::to_json(s).dump();
  return data::loader_state_from_json(hone::io::json::parse(text, "test"));
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_resumed_run_sees_the_same_batches_whatever_the_thread_count) {
  const numbers ds{47};  // 8 batches of 6 per epoch, the last one padded
  constexpr std::size_t calls = 3 * 9;
  auto straight = make(ds, 2, 3);
  const std::vector<seen> want = run(*straight, calls);
  const std::vector<std::pair<std::size_t, std::size_t>> threads{{0, 2}, {2, 0}, {1, 4}, {4, 1}};
  for (std::size_t stop = 0; stop <= calls; ++stop) {
    const auto [before, after] = threads[stop % threads.size()];
    std::vector<seen> got;
    data::loader_state saved;
    {
      auto first = make(ds, before, 1 + stop % 3);
      got = run(*first, stop);
      saved = through_json(first->state());
    }  // destroyed with batches prefetched
    auto second = make(ds, after, 2);
    second->restore(saved);
    const std::vector<seen> rest = run(*second, calls - stop);
    got.insert(got.end(), rest.begin(), rest.end());
    BOOST_TEST((got == want), "stopped after " << stop << " calls");
  }
}

BOOST_AUTO_TEST_CASE(the_state_travels_through_a_real_checkpoint) {
  const numbers ds{31};
  constexpr std::size_t calls = 20;
  auto straight = make(ds, 1, 2, data::last_batch::keep);
  const std::vector<seen> want = run(*straight, calls);
  const fs::path root =
      fs::temp_directory_path() / ("hone-loader-ckpt-" + std::to_string(::getpid()));
  fs::remove_all(root);
  std::vector<seen> got;
  {
    auto first = make(ds, 2, 2, data::last_batch::keep);
    got = run(*first, 7);
    ck::training_state extra;
    extra.data.set("other", "kept beside the loader");
    data::save_loader_state(extra.data, first->state());
    ck::checkpoint_writer w({.root = root});
    const std::vector<float> weights{1.0f, 2.0f, 3.0f};
    BOOST_TEST(w.save(7, [&](ck::snapshot& s) {
      s.add(ck::files::weights, "w", {3}, weights);
      s.state.step = 7;
      s.state.data = extra.data;
    }));
    w.wait();
  }
  const auto c = ck::newest_valid(root);
  BOOST_REQUIRE(c.has_value());
  const ck::training_state st = ck::read_state(c->path / ck::files::state);
  BOOST_TEST(st.data.at("other").as_string() == "kept beside the loader");
  auto second = make(ds, 0, 3, data::last_batch::keep);
  second->restore(data::load_loader_state(st.data));
  const std::vector<seen> rest = run(*second, calls - 7);
  got.insert(got.end(), rest.begin(), rest.end());
  BOOST_TEST((got == want));
  fs::remove_all(root);
}

BOOST_AUTO_TEST_CASE(the_state_json_is_exact_and_checked) {
  data::loader_state s;
  s.seed = std::numeric_limits<std::uint64_t>::max();
  s.epoch = 123456789012345ULL;
  s.position = 77;
  s.skipped = 3;
  s.dataset_size = 1ULL << 40;
  s.sampler = "shuffled";
  BOOST_TEST((through_json(s) == s));
  hone::io::json::value o = data::to_json(s);
  o.as_object().erase(o.as_object().begin() + 2);  // "position"
  BOOST_TEST(message_of([&] {
               (void)data::loader_state_from_json(o, "data.loader");
             }).find("data.loader has no field \"position\"") != std::string::npos);
  BOOST_TEST(message_of([&] {
               (void)data::load_loader_state(hone::io::json::value::object());
             }).find("save_loader_state") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_state_of_another_dataset_sampler_or_generator_is_refused) {
  const numbers ds{31};
  auto l = make(ds, 1, 1);
  data::loader_state s = l->state();
  s.dataset_size = 30;
  BOOST_TEST(message_of([&] { l->restore(s); }).find("a dataset of 30 samples, this one has 31") !=
             std::string::npos);
  s = l->state();
  s.sampler = "sequential";
  BOOST_TEST(message_of([&] {
               l->restore(s);
             }).find("'sequential' sampler, this loader has a 'shuffled' one") !=
             std::string::npos);
  s = l->state();
  s.rng = "mt19937";
  BOOST_TEST(message_of([&] { l->restore(s); }).find("generator 'mt19937'") != std::string::npos);
}

namespace {

// World-size runs: `steps` lockstep steps on `world` ranks from `from` (nullopt: a fresh start);
// records every rank's batches. Returns the ranks' common state after the last step.
data::loader_state lockstep(const numbers& ds, std::size_t world, std::size_t steps,
                            const data::loader_state* from, std::vector<std::vector<seen>>& out,
                            std::size_t threads) {
  std::vector<std::unique_ptr<dist_loader>> ranks;
  for (std::size_t r = 0; r < world; ++r) {
    ranks.push_back(make_rank(ds, r, world, threads + r % 2));
    if (from != nullptr) ranks.back()->restore(*from);
  }
  out.assign(world, {});
  for (std::size_t k = 0; k < steps; ++k) {
    for (std::size_t r = 0; r < world; ++r) out[r].push_back(record<dist_loader>(ranks[r]->next()));
  }
  for (std::size_t r = 1; r < world; ++r) {
    BOOST_TEST((ranks[r]->state() == ranks[0]->state()), "rank " << r << " after " << steps);
  }
  return ranks[0]->state();
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_distributed_run_resumes_bitwise_on_the_same_world_size) {
  const numbers ds{50};  // 3 ranks, batches of 4: 17 entries each (pad), 5 batches per epoch
  std::vector<std::vector<seen>> want, got, rest;
  (void)lockstep(ds, 3, 13, nullptr, want, 1);
  for (const std::size_t stop : {1u, 4u, 5u, 6u, 9u}) {
    const data::loader_state s = through_json(lockstep(ds, 3, stop, nullptr, got, 0));
    (void)lockstep(ds, 3, 13 - stop, &s, rest, 2);
    for (std::size_t r = 0; r < 3; ++r) {
      got[r].insert(got[r].end(), rest[r].begin(), rest[r].end());
      BOOST_TEST((got[r] == want[r]), "rank " << r << " stopped after " << stop);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_world_size_change_reads_every_entry_of_the_epoch_once) {
  const numbers ds{50};
  std::vector<std::uint64_t> order;
  data::shuffled_sampler{}.epoch_order(50, 5, 0, order);
  for (const std::size_t before : {3u, 2u, 1u}) {
    for (const std::size_t after : {2u, 4u, 1u, 3u}) {
      for (const std::size_t stop : {1u, 2u, 3u}) {
        std::vector<int> reads(50, 0);
        // Each delivered row's epoch position is first + row * world: rows past 50 are padding.
        const auto tally = [&](const std::vector<std::vector<seen>>& batches, std::size_t world) {
          for (const auto& rank : batches) {
            for (const seen& s : rank) {
              if (s.rows == end_of_epoch().rows) continue;
              BOOST_TEST(s.epoch == 0u);
              for (std::size_t row = 0; row < s.rows; ++row) {
                const std::uint64_t p = s.first + row * world;
                if (p >= 50) continue;
                ++reads[p];
                BOOST_TEST(s.indices[row] == order[p], "position " << p);
                BOOST_TEST((s.values[row] & 0xffffu) == (numbers::value(order[p]) & 0xffffu));
              }
            }
          }
        };
        std::vector<std::vector<seen>> first, second;
        const data::loader_state s = lockstep(ds, before, stop, nullptr, first, 1);
        BOOST_TEST(s.position == std::min<std::uint64_t>(50, stop * 4 * before));
        tally(first, before);
        // The rest of the epoch on the new world size: at most ceil(rest / 4 / after) batches and
        // the epoch's end.
        const std::uint64_t rest = 50 - s.position;
        const std::size_t steps = static_cast<std::size_t>((rest + 4 * after - 1) / (4 * after));
        const data::loader_state e = lockstep(ds, after, steps + 1, &s, second, 0);
        tally(second, after);
        BOOST_TEST(e.epoch == 1u);
        for (std::size_t r = 0; r < after; ++r) {
          BOOST_TEST(second[r].back().rows == end_of_epoch().rows);
        }
        for (std::size_t p = 0; p < 50; ++p) {
          BOOST_TEST(reads[p] == 1, before << " -> " << after << " ranks after " << stop
                                           << " steps: position " << p);
        }
      }
    }
  }
}
