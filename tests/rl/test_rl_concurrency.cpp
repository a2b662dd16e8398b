// hone::many_writers: writer threads add while a learner samples and updates priorities. Every
// transition is counted: none lost, none duplicated, no torn row ever sampled, stale updates
// ignored, n-step windows never mixing streams. Built and run under ThreadSanitizer too.
#define BOOST_TEST_MODULE hone_rl_concurrency
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <hone/rl/replay_buffer.hpp>
#include <random>
#include <span>
#include <thread>
#include <vector>

#include "../support/sanitizers.hpp"

namespace {

/// Field Name of every slot (capacity() * count elements), read with read_field: the same on every
/// in-memory storage (the default, auto_storage, packs these small steps into records).
template <hone::fixed_string Name, class Buffer>
auto field_values(const Buffer& b) {
  using transition = typename Buffer::transition_type;
  constexpr std::size_t i = transition::template index_of<Name>();
  using F = typename transition::template field_at<i>;
  std::vector<typename F::element_type> out(b.capacity() * F::count);
  b.read_field(i, 0, std::as_writable_bytes(std::span(out)));
  return out;
}

constexpr std::uint64_t per_writer = hone_test::under_tsan ? 3000 : 20000;
constexpr std::size_t writers = 4;

using step = hone::transition<hone::field<"id", std::uint64_t>, hone::field<"obs", float, 8>,
                              hone::field<"check", std::uint64_t>>;

step::record make(std::uint64_t id) {
  step::record r{};
  hone::get<"id">(r) = id;
  for (std::size_t k = 0; k < 8; ++k) hone::get<"obs">(r)[k] = static_cast<float>(id % 100000 + k);
  hone::get<"check">(r) = id * 0x9e3779b97f4a7c15ULL;
  return r;
}

bool whole(const hone::replay_batch<step>& b, std::size_t r) {
  const std::uint64_t id = b.get<"id">()[r];
  bool ok = b.get<"check">()[r] == id * 0x9e3779b97f4a7c15ULL;
  for (std::size_t k = 0; k < 8; ++k) {
    ok = ok && b.get<"obs">()[r * 8 + k] == static_cast<float>(id % 100000 + k);
  }
  return ok;
}

/// Runs `writers` threads adding per_writer items each (single adds or batches of 32) while the
/// learner samples (and updates priorities when the buffer is prioritized). Returns the ids
/// stored at the end, one per slot.
template <class Buffer>
std::vector<std::uint64_t> hammer(Buffer& buffer, bool batches, std::size_t& torn,
                                  std::size_t& samples) {
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  for (std::size_t w = 0; w < writers; ++w) {
    threads.emplace_back([&buffer, w, batches] {
      if (batches) {
        hone::replay_batch<step> in(32);
        for (std::uint64_t i = 0; i < per_writer; i += 32) {
          const std::size_t n =
              static_cast<std::size_t>(std::min<std::uint64_t>(32, per_writer - i));
          in.resize(n);
          for (std::size_t r = 0; r < n; ++r) in.set_row(r, make(w * per_writer + i + r));
          buffer.add_batch(in);
        }
      } else {
        for (std::uint64_t i = 0; i < per_writer; ++i) buffer.add(make(w * per_writer + i));
      }
    });
  }
  std::thread learner([&] {
    hone::replay_batch<step> b;
    std::mt19937 rng(1);
    std::vector<float> prio;
    while (!done.load()) {
      if (buffer.size() == 0) {
        std::this_thread::yield();
        continue;
      }
      try {
        buffer.sample(64, b);
      } catch (const hone::error&) {
        // Every slot is being rewritten at this instant (capacity below the writes in flight):
        // nothing can be sampled; try again.
        continue;
      }
      samples += b.size();
      for (std::size_t r = 0; r < b.size(); ++r) torn += whole(b, r) ? 0 : 1;
      if constexpr (Buffer::is_prioritized) {
        prio.resize(b.size());
        for (auto& p : prio) p = static_cast<float>(rng() % 1000) * 0.01f;
        buffer.update_priorities(b.keys(), prio);
      }
    }
  });
  for (auto& t : threads) t.join();
  done.store(true);
  learner.join();
  std::vector<std::uint64_t> stored;
  const auto ids = field_values<"id">(buffer);
  for (std::size_t s = 0; s < std::min<std::uint64_t>(buffer.total_added(), buffer.capacity());
       ++s) {
    stored.push_back(ids[s]);
  }
  return stored;
}

template <class Buffer>
void check_every_transition_exactly_once(bool batches) {
  const std::size_t total = writers * per_writer;
  Buffer buffer(total + 100);  // room for all: nothing may be missing
  std::size_t torn = 0;
  std::size_t samples = 0;
  auto stored = hammer(buffer, batches, torn, samples);
  BOOST_TEST(torn == 0u);
  BOOST_TEST(buffer.total_added() == total);
  BOOST_TEST(buffer.size() == total);
  BOOST_TEST_REQUIRE(stored.size() == total);
  std::sort(stored.begin(), stored.end());
  for (std::uint64_t i = 0; i < total; ++i) BOOST_REQUIRE(stored[i] == i);  // each exactly once
  BOOST_TEST_MESSAGE("learner sampled " << samples << " rows during the writes");
}

template <class Buffer>
void check_overwrites_keep_the_newest(bool batches) {
  constexpr std::size_t cap = 1000;
  Buffer buffer(cap);
  std::size_t torn = 0;
  std::size_t samples = 0;
  auto stored = hammer(buffer, batches, torn, samples);
  BOOST_TEST(torn == 0u);
  BOOST_TEST(buffer.total_added() == writers * per_writer);
  BOOST_TEST(buffer.size() == cap);
  std::sort(stored.begin(), stored.end());
  BOOST_TEST((std::adjacent_find(stored.begin(), stored.end()) == stored.end()));  // no duplicate
  // Keys: each slot holds the newest key of its residue, and stale keys are rejected.
  hone::replay_batch<step> b;
  buffer.sample(256, b);
  for (std::size_t r = 0; r < b.size(); ++r) {
    BOOST_TEST(b.keys()[r] >= writers * per_writer - cap);
    BOOST_TEST(b.keys()[r] % cap == b.slots()[r]);
    BOOST_TEST(buffer.contains(b.keys()[r]));
    BOOST_TEST(!buffer.contains(b.keys()[r] - cap));
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(uniform_every_transition_exactly_once) {
  check_every_transition_exactly_once<hone::replay_buffer<step, hone::many_writers>>(false);
  check_every_transition_exactly_once<hone::replay_buffer<step, hone::many_writers>>(true);
}

BOOST_AUTO_TEST_CASE(prioritized_every_transition_exactly_once) {
  using buffer_t = hone::replay_buffer<step, hone::prioritized<16>, hone::many_writers>;
  check_every_transition_exactly_once<buffer_t>(false);
  check_every_transition_exactly_once<buffer_t>(true);
}

BOOST_AUTO_TEST_CASE(overwrites_under_contention) {
  check_overwrites_keep_the_newest<hone::replay_buffer<step, hone::many_writers>>(false);
  check_overwrites_keep_the_newest<
      hone::replay_buffer<step, hone::many_writers, hone::prioritized<4>>>(true);
}

BOOST_AUTO_TEST_CASE(tiny_capacity_writers_queue_on_their_slot) {
  // Capacity below the number of writes in flight: writers a lap apart wait for each other.
  hone::replay_buffer<step, hone::many_writers, hone::prioritized<2>> buffer(3);
  std::size_t torn = 0;
  std::size_t samples = 0;
  auto stored = hammer(buffer, true, torn, samples);
  BOOST_TEST(torn == 0u);
  BOOST_TEST(buffer.total_added() == writers * per_writer);
  std::sort(stored.begin(), stored.end());
  BOOST_TEST((std::adjacent_find(stored.begin(), stored.end()) == stored.end()));
}

namespace {
using nstep =
    hone::transition<hone::field<"stream", std::uint32_t>, hone::field<"t", std::uint32_t>,
                     hone::field<"reward", float>, hone::field<"next_t", std::uint32_t>,
                     hone::field<"terminated", bool>, hone::field<"truncated", bool>,
                     hone::field<"discount", float>>;
}

BOOST_AUTO_TEST_CASE(n_step_writers_keep_their_streams_apart) {
  using buffer_t = hone::replay_buffer<nstep, hone::many_writers, hone::n_step<3>>;
  const std::size_t total = writers * per_writer;
  buffer_t buffer(total, hone::many_writers{}, hone::n_step<3>{.gamma = 0.5});
  std::vector<std::thread> threads;
  for (std::uint32_t w = 0; w < writers; ++w) {
    threads.emplace_back([&buffer, w] {
      auto writer = buffer.writer();
      for (std::uint32_t t = 0; t < per_writer; ++t) {
        nstep::record r{};
        hone::get<"stream">(r) = w;
        hone::get<"t">(r) = t;
        hone::get<"reward">(r) = 1.0f;
        hone::get<"next_t">(r) = t + 1;
        hone::get<"terminated">(r) = t % 10 == 9;
        hone::get<"truncated">(r) = t % 10 == 4 && t % 20 == 4;  // some episodes cut at 5 steps
        writer.add(r);
      }
      writer.flush();
    });
  }
  for (auto& t : threads) t.join();
  BOOST_TEST(buffer.size() == total);
  const auto stream = field_values<"stream">(buffer);
  const auto t = field_values<"t">(buffer);
  const auto next_t = field_values<"next_t">(buffer);
  const auto reward = field_values<"reward">(buffer);
  const auto discount = field_values<"discount">(buffer);
  std::vector<std::vector<int>> seen(writers, std::vector<int>(per_writer, 0));
  for (std::size_t s = 0; s < total; ++s) {
    BOOST_REQUIRE(stream[s] < writers);
    BOOST_REQUIRE(t[s] < per_writer);
    ++seen[stream[s]][t[s]];
    // The window of one stream: next_t - t steps, never crossing an episode end.
    const std::uint32_t k = next_t[s] - t[s];
    BOOST_REQUIRE((k >= 1 && k <= 3));
    const float expected_reward = k == 3 ? 1.75f : k == 2 ? 1.5f : 1.0f;
    BOOST_REQUIRE(reward[s] == expected_reward);
    BOOST_REQUIRE(discount[s] == (k == 3 ? 0.125f : k == 2 ? 0.25f : 0.5f));
  }
  for (const auto& v : seen) {
    BOOST_TEST((std::all_of(v.begin(), v.end(), [](int c) { return c == 1; })));
  }
}
