// Parallel actors, versioned parameters and the policy-lag bound (hone/rl/actors.hpp): version
// monotonicity and snapshot consistency under concurrent publication, pulls at most every K steps
// (counted), the staleness bound on constructed lags (exactly the transitions older than L are
// dropped, the rest stored once each, checked by content), n-step windows that never span a
// dropped step, and actors on oneTBB writing into a many_writers buffer while the learner
// publishes, samples and updates priorities, with no transition lost or duplicated. Also run
// under ThreadSanitizer (tsan preset).
#define BOOST_TEST_MODULE hone_rl_extra_actors
#include <algorithm>
#include <atomic>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <hone/core/error.hpp>
#include <hone/rl/actors.hpp>
#include <hone/rl/replay_buffer.hpp>
#include <set>
#include <span>
#include <string_view>
#include <thread>
#include <vector>

namespace {

using step =
    hone::transition<hone::field<"id", std::uint64_t>, hone::field<"obs", float, 2>,
                     hone::field<"reward", float>, hone::field<"next_obs", float, 2>,
                     hone::field<"terminated", bool>, hone::field<"truncated", bool>,
                     hone::field<"discount", float>, hone::field<"policy_version", std::uint64_t>>;

step::record make_step(std::uint64_t id, std::uint64_t version, float reward = 1.0f) {
  step::record r{};
  hone::get<"id">(r) = id;
  hone::get<"obs">(r) = {static_cast<float>(id), 0.0f};
  hone::get<"reward">(r) = reward;
  hone::get<"next_obs">(r) = {static_cast<float>(id + 1), 0.0f};
  hone::get<"discount">(r) = 1.0f;
  hone::get<"policy_version">(r) = version;
  return r;
}

/// The values of a scalar field for the first n stored slots (no wrap in these tests), read with
/// read_field: the same on every in-memory storage (the default, auto_storage, packs these steps).
template <class T, class Buffer>
std::vector<T> column(Buffer& b, std::string_view name, std::size_t n) {
  using transition = typename Buffer::transition_type;
  std::size_t field = transition::field_count;
  transition::for_each_field([&](auto i) {
    if (transition::template field_at<i>::name.view() == name) field = i;
  });
  BOOST_REQUIRE(field < transition::field_count);
  BOOST_REQUIRE(Buffer::field_bytes(field) == sizeof(T));
  std::vector<T> out(n);
  b.read_field(field, 0, std::as_writable_bytes(std::span<T>(out)));
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(publish_returns_increasing_versions_and_pull_copies_only_newer) {
  hone::versioned_params<std::vector<int>> shared(std::vector<int>{0, 0, 0});
  BOOST_TEST(shared.version() == 0u);
  std::vector<int> local;
  std::uint64_t have = hone::versioned_params<std::vector<int>>::no_version;
  BOOST_TEST(shared.pull(local, have));
  BOOST_TEST(have == 0u);
  BOOST_TEST(local == std::vector<int>({0, 0, 0}));
  BOOST_TEST(!shared.pull(local, have));  // nothing newer
  for (int v = 1; v <= 5; ++v) {
    BOOST_TEST(shared.publish(std::vector<int>{v, v, v}) == static_cast<std::uint64_t>(v));
    BOOST_TEST(shared.version() == static_cast<std::uint64_t>(v));
  }
  BOOST_TEST(shared.pull(local, have));  // skips straight to the latest
  BOOST_TEST(have == 5u);
  BOOST_TEST(local == std::vector<int>({5, 5, 5}));
  BOOST_TEST(!shared.pull(local, have));
  // publish_with fills the spare slot, which holds the snapshot before the current one.
  const auto v6 = shared.publish_with([](std::vector<int>& p) {
    BOOST_TEST(p == std::vector<int>({4, 4, 4}));
    p = {6, 7, 8};
  });
  BOOST_TEST(v6 == 6u);
  BOOST_TEST(shared.read([](const std::vector<int>& p, std::uint64_t v) {
    return p == std::vector<int>({6, 7, 8}) && v == 6u;
  }));
  BOOST_TEST(shared.pull(local, have));
  BOOST_TEST(local == std::vector<int>({6, 7, 8}));
}

BOOST_AUTO_TEST_CASE(concurrent_readers_see_whole_snapshots_in_increasing_order) {
  constexpr std::size_t n = 4096;
  constexpr std::uint64_t publications = 3000;
  hone::versioned_params<std::vector<std::uint64_t>> shared(std::vector<std::uint64_t>(n, 0));
  std::atomic<bool> done{false};
  std::vector<std::thread> readers;
  std::vector<std::uint64_t> pulls(3, 0), torn(3, 0), backwards(3, 0);
  for (std::size_t t = 0; t < 3; ++t) {
    readers.emplace_back([&, t] {
      std::vector<std::uint64_t> local;
      std::uint64_t have = hone::versioned_params<std::vector<std::uint64_t>>::no_version;
      std::uint64_t last = 0;
      bool first = true;
      while (!done.load(std::memory_order_acquire) || have != publications) {
        if (!shared.pull(local, have)) continue;
        ++pulls[t];
        if (!first && have <= last) ++backwards[t];
        first = false;
        last = have;
        // Snapshot v holds v everywhere: any other value is a torn read.
        if (std::any_of(local.begin(), local.end(), [&](std::uint64_t x) { return x != have; })) {
          ++torn[t];
        }
      }
    });
  }
  std::vector<std::uint64_t> next(n);
  for (std::uint64_t v = 1; v <= publications; ++v) {
    std::fill(next.begin(), next.end(), v);
    BOOST_REQUIRE(shared.publish(next) == v);
  }
  done.store(true, std::memory_order_release);
  for (auto& r : readers) r.join();
  for (std::size_t t = 0; t < 3; ++t) {
    BOOST_TEST(torn[t] == 0u);
    BOOST_TEST(backwards[t] == 0u);
    BOOST_TEST(pulls[t] >= 1u);
  }
}

BOOST_AUTO_TEST_CASE(actor_params_looks_at_most_every_k_steps) {
  for (std::size_t k : {1u, 3u, 7u}) {
    hone::versioned_params<std::vector<float>> shared(std::vector<float>{0.0f});
    hone::actor_params<std::vector<float>> mine(shared, {.pull_every = k, .max_lag = 1000});
    BOOST_TEST(mine.version() == 0u);
    BOOST_TEST(mine.pulls() == 1u);  // the copy at construction
    constexpr std::size_t ticks = 50;
    std::vector<std::size_t> pulled_at;
    for (std::size_t t = 1; t <= ticks; ++t) {
      shared.publish(std::vector<float>{static_cast<float>(t)});  // always something newer
      if (mine.tick()) pulled_at.push_back(t);
      // Holds the version published at its last look (every k-th tick).
      const std::size_t last_look = t - t % k;
      BOOST_TEST(mine.version() == last_look);
      BOOST_TEST(mine.get()[0] == static_cast<float>(last_look));
    }
    BOOST_TEST(mine.steps() == ticks);
    BOOST_TEST(mine.looks() == ticks / k);
    BOOST_TEST(mine.pulls() == 1 + ticks / k);
    for (std::size_t i = 0; i < pulled_at.size(); ++i) BOOST_TEST(pulled_at[i] == (i + 1) * k);
  }
  // With nothing new published a look copies nothing.
  hone::versioned_params<std::vector<float>> still(std::vector<float>{1.0f});
  hone::actor_params<std::vector<float>> idle(still, {.pull_every = 2});
  for (int t = 0; t < 10; ++t) BOOST_TEST(!idle.tick());
  BOOST_TEST(idle.looks() == 5u);
  BOOST_TEST(idle.pulls() == 1u);
}

BOOST_AUTO_TEST_CASE(staleness_gate_drops_exactly_the_transitions_older_than_l) {
  hone::versioned_params<int> shared(0);
  for (int v = 1; v <= 10; ++v) shared.publish(v);
  hone::staleness_gate gate(shared, {.pull_every = 1, .max_lag = 3});
  std::vector<std::uint64_t> admitted;
  for (std::uint64_t v = 0; v <= 10; ++v) {
    if (gate.admit(v)) admitted.push_back(v);
  }
  BOOST_TEST(admitted == std::vector<std::uint64_t>({7, 8, 9, 10}));
  const hone::gate_stats s = gate.stats();
  BOOST_TEST(s.accepted == 4u);
  BOOST_TEST(s.dropped == 7u);
  BOOST_TEST(s.max_lag_seen == 10u);
  BOOST_TEST(s.max_lag_accepted == 3u);
  // max_lag 0: only the current version passes.
  hone::staleness_gate strict(shared, {.max_lag = 0});
  BOOST_TEST(strict.admit(10));
  BOOST_TEST(!strict.admit(9));
  // A version from the future is a tagging bug.
  BOOST_CHECK_THROW(gate.admit(11), hone::config_error);
  BOOST_CHECK_THROW(hone::staleness_gate(shared, {.pull_every = 0}), hone::config_error);
  gate.reset_stats();
  BOOST_TEST(gate.stats().accepted == 0u);
}

BOOST_AUTO_TEST_CASE(gated_writer_stores_each_admitted_step_once_by_content) {
  // Steps with known lags: versions published between steps; L = 2.
  hone::versioned_params<int> shared(0);
  hone::staleness_gate gate(shared, {.max_lag = 2});
  hone::replay_buffer<step> buffer(1024);
  hone::gated_writer<hone::replay_buffer<step>> out(buffer, gate);
  std::vector<std::uint64_t> expected;
  std::uint64_t current = 0;
  // The actor acts with a version it pulled at some point; the learner moves on meanwhile.
  const std::uint64_t acted[] = {0, 0, 0, 1, 1, 1, 1, 5, 5, 5, 2, 8, 8, 8, 8, 8, 3, 9, 10, 10};
  for (std::uint64_t id = 0; id < std::size(acted); ++id) {
    if (id % 2 == 0 && current < 10) current = shared.publish(static_cast<int>(current + 1));
    const std::uint64_t v = std::min(acted[id], current);
    const bool admitted = out.add(make_step(id, v));
    BOOST_TEST(admitted == (current - v <= 2));
    if (current - v <= 2) expected.push_back(id);
  }
  BOOST_TEST(buffer.total_added() == expected.size());
  BOOST_TEST(column<std::uint64_t>(buffer, "id", expected.size()) == expected);
  const auto s = gate.stats();
  BOOST_TEST(s.accepted == expected.size());
  BOOST_TEST(s.dropped == std::size(acted) - expected.size());
  BOOST_TEST(s.max_lag_accepted <= 2u);
  BOOST_TEST(s.max_lag_seen > 2u);
}

BOOST_AUTO_TEST_CASE(n_step_items_never_span_a_dropped_step) {
  // gamma 1 and reward 2^id: an item's reward is the sum of 2^j over the steps it covers, so it
  // names them exactly. Reference: horizon min(3, steps to the next dropped step / episode end).
  using buffer_t = hone::replay_buffer<step, hone::n_step<3>>;
  hone::versioned_params<int> shared(0);
  hone::staleness_gate gate(shared, {.max_lag = 0});
  buffer_t buffer(256, hone::n_step<3>{.gamma = 1.0});
  hone::gated_writer<buffer_t> out(buffer, gate);
  const std::vector<bool> stale = {false, false, false, false, true,  false, false,
                                   true,  false, false, false, false, false, false};
  shared.publish(1);  // current version 1: steps acted with version 0 are stale (L = 0)
  for (std::uint64_t id = 0; id < stale.size(); ++id) {
    out.add(make_step(id, stale[id] ? 0 : 1, std::ldexp(1.0f, static_cast<int>(id))));
  }
  out.flush();
  // Reference, scalar: kept steps in runs between dropped ones; each item covers the next
  // min(3, run remainder) steps of its run.
  std::vector<std::uint64_t> ref_ids;
  std::vector<float> ref_rewards;
  std::size_t begin = 0;
  while (begin < stale.size()) {
    if (stale[begin]) {
      ++begin;
      continue;
    }
    std::size_t end = begin;
    while (end < stale.size() && !stale[end]) ++end;
    for (std::size_t i = begin; i < end; ++i) {
      float sum = 0.0f;
      for (std::size_t j = i; j < std::min(i + 3, end); ++j) {
        sum += std::ldexp(1.0f, static_cast<int>(j));
      }
      ref_ids.push_back(i);
      ref_rewards.push_back(sum);
    }
    begin = end;
  }
  const std::size_t n = buffer.total_added();
  BOOST_TEST(n == ref_ids.size());
  auto ids = column<std::uint64_t>(buffer, "id", n);
  auto rewards = column<float>(buffer, "reward", n);
  // Items of one run arrive in order; runs too.
  BOOST_TEST(ids == ref_ids);
  BOOST_TEST(rewards == ref_rewards);
  BOOST_TEST(gate.stats().dropped == 2u);
}

BOOST_AUTO_TEST_CASE(actor_pool_run_calls_every_actor_exactly_steps_times) {
  hone::actor_pool pool({.actors = 5});
  BOOST_TEST(pool.actors() == 5u);
  std::vector<std::uint64_t> calls(5, 0);
  pool.run(37, [&](std::size_t a) { ++calls[a]; });
  for (auto c : calls) BOOST_TEST(c == 37u);
  // A bool step ends its actor early.
  pool.run(37, [&](std::size_t a) { return ++calls[a] < 37 + 10 + a; });
  for (std::size_t a = 0; a < 5; ++a) BOOST_TEST(calls[a] == 37 + 10 + a);
  // Exceptions reach the caller.
  BOOST_CHECK_THROW(pool.run(3,
                             [](std::size_t a) {
                               if (a == 2) throw std::runtime_error("actor 2 failed");
                             }),
                    std::runtime_error);
  BOOST_CHECK_THROW(hone::actor_pool({.actors = 0}), hone::config_error);
  BOOST_CHECK_THROW(hone::actor_pool({.actors = 2, .chunk = 0}), hone::config_error);
}

BOOST_AUTO_TEST_CASE(background_actors_stop_on_request_and_report_errors) {
  hone::actor_pool pool({.actors = 3, .chunk = 4});
  std::vector<std::atomic<std::uint64_t>> calls(3);
  pool.start([&](std::size_t a) { calls[a].fetch_add(1, std::memory_order_relaxed); });
  BOOST_TEST(pool.running());
  BOOST_CHECK_THROW(pool.start([](std::size_t) {}), hone::config_error);
  while (calls[0].load() < 100 || calls[1].load() < 100 || calls[2].load() < 100) {
    std::this_thread::yield();
  }
  pool.stop();
  BOOST_TEST(!pool.running());
  const std::uint64_t after = calls[0].load() + calls[1].load() + calls[2].load();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  BOOST_TEST(calls[0].load() + calls[1].load() + calls[2].load() == after);  // really stopped
  pool.start([](std::size_t a) {
    if (a == 1) throw std::runtime_error("actor 1 failed");
  });
  BOOST_CHECK_THROW(pool.wait(), std::runtime_error);
  BOOST_TEST(!pool.running());
}

BOOST_AUTO_TEST_CASE(actors_and_learner_lose_and_duplicate_nothing) {
  // 4 actors on oneTBB write 3000 steps each through their gated writers into a many_writers PER
  // buffer while the learner publishes versions, samples and updates priorities. Capacity holds
  // everything, so the buffer must end holding exactly the admitted steps, each once.
  using buffer_t = hone::replay_buffer<step, hone::prioritized<>, hone::many_writers>;
  constexpr std::size_t actors = 4;
  constexpr std::uint64_t per_actor = 3000;
  const hone::policy_lag lag{.pull_every = 8, .max_lag = 6};
  buffer_t buffer(actors * per_actor);
  hone::versioned_params<std::vector<float>> shared(std::vector<float>(256, 0.0f));
  hone::staleness_gate gate(shared, lag);

  struct actor_state {
    hone::actor_params<std::vector<float>> params;
    hone::gated_writer<buffer_t> out;
    std::uint64_t written = 0;
    std::vector<std::uint64_t> admitted;
    std::uint64_t last_version = 0;
    bool versions_monotone = true;
    bool snapshots_whole = true;
  };
  std::vector<std::unique_ptr<actor_state>> state;
  for (std::size_t a = 0; a < actors; ++a) {
    state.push_back(std::make_unique<actor_state>(
        actor_state{hone::actor_params<std::vector<float>>(shared, lag),
                    hone::gated_writer<buffer_t>(buffer, gate),
                    0,
                    {},
                    0,
                    true,
                    true}));
  }
  std::atomic<std::uint64_t> finished{0};
  hone::actor_pool pool({.actors = actors, .chunk = 16});
  pool.start([&](std::size_t a) {
    actor_state& s = *state[a];
    if (s.written == per_actor) return false;
    s.params.tick();
    const std::uint64_t v = s.params.version();
    if (v < s.last_version) s.versions_monotone = false;
    s.last_version = v;
    const auto& p = s.params.get();
    if (p.front() != static_cast<float>(v) || p.back() != static_cast<float>(v)) {
      s.snapshots_whole = false;
    }
    const std::uint64_t id = a * 1000000 + s.written;
    if (s.out.add(make_step(id, v))) s.admitted.push_back(id);
    if (++s.written == per_actor) finished.fetch_add(1, std::memory_order_release);
    return true;
  });

  hone::replay_batch<step> batch;
  std::vector<float> td;
  std::uint64_t version = 0;
  std::size_t samples = 0;
  while (finished.load(std::memory_order_acquire) < actors) {
    version = shared.publish(std::vector<float>(256, static_cast<float>(version + 1)));
    if (buffer.size() >= 64) {
      buffer.sample(64, batch);
      td.assign(64, 0.0f);
      for (std::size_t r = 0; r < 64; ++r) {
        td[r] = static_cast<float>(batch.get<"id">()[r] % 17) * 0.1f;
      }
      buffer.update_priorities(batch.keys(), td);
      ++samples;
    }
  }
  pool.wait();  // the loops end by returning false

  std::vector<std::uint64_t> admitted;
  for (const auto& s : state) {
    BOOST_TEST(s->versions_monotone);
    BOOST_TEST(s->snapshots_whole);
    admitted.insert(admitted.end(), s->admitted.begin(), s->admitted.end());
  }
  const hone::gate_stats st = gate.stats();
  BOOST_TEST(st.accepted + st.dropped == actors * per_actor);
  BOOST_TEST(st.accepted == admitted.size());
  BOOST_TEST(st.max_lag_accepted <= lag.max_lag);
  BOOST_TEST(buffer.total_added() == admitted.size());
  BOOST_TEST(buffer.size() == admitted.size());
  std::vector<std::uint64_t> stored = column<std::uint64_t>(buffer, "id", admitted.size());
  std::sort(stored.begin(), stored.end());
  std::sort(admitted.begin(), admitted.end());
  BOOST_TEST((std::adjacent_find(stored.begin(), stored.end()) == stored.end()));  // no duplicate
  BOOST_TEST(stored == admitted);                                                  // none lost
  BOOST_TEST_MESSAGE("versions " << version << ", samples " << samples << ", accepted "
                                 << st.accepted << ", dropped " << st.dropped << ", max lag seen "
                                 << st.max_lag_seen);
}
