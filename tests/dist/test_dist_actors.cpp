// Distributed actors (hone/rl/dist_actors.hpp) with thread ranks (thread_comm.hpp): every
// transition an actor sends arrives exactly once, in order, with the version it was tagged with;
// transitions older than the lag bound are dropped and counted exactly as a staleness_gate counts
// them; the versions actors hold never go back and equal the learner's at every round, with the
// parameters of that version; n-step windows are per actor rank; the user's own structs
// (hone::member, with padding) cross field by field, bit for bit; settings that differ between
// ranks, empty parameters, zero-size blocks and misuse give sentences. Label concurrency: CI runs
// it under ThreadSanitizer.
#define BOOST_TEST_MODULE hone_dist_actors
#include <atomic>
#include <boost/test/unit_test.hpp>
#include <cstdint>
#include <hone/core/error.hpp>
#include <hone/dist/local_comm.hpp>
#include <hone/rl/dist_actors.hpp>
#include <hone/rl/replay_buffer.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "thread_comm.hpp"

namespace {

using step = hone::transition<hone::field<"actor", std::int32_t>, hone::field<"seq", std::uint64_t>,
                              hone::field<"obs", float, 3>, hone::field<"reward", float>,
                              hone::field<"next_obs", float, 3>, hone::field<"terminated", bool>,
                              hone::field<"truncated", bool>, hone::field<"discount", float>,
                              hone::field<"policy_version", std::uint64_t>>;
using other_step =
    hone::transition<hone::field<"obs", float, 3>, hone::field<"policy_version", std::uint64_t>>;
using buffer_t = hone::replay_buffer<step>;

/// The user's own struct (hone::member fields), with padding after `done` and a double.
struct user_step {
  double value;
  std::int16_t id[3];
  bool done;
  float reward;
  std::uint32_t policy_version;
};
using user_transition =
    hone::transition<hone::member<"value", &user_step::value>, hone::member<"id", &user_step::id>,
                     hone::member<"done", &user_step::done>,
                     hone::member<"reward", &user_step::reward>,
                     hone::member<"policy_version", &user_step::policy_version>>;
using learner_t = hone::dist_learner<thread_comm, buffer_t>;
using actor_t = hone::dist_actor<thread_comm, step>;

step::record make_step(int actor, std::uint64_t seq, std::uint64_t version) {
  step::record r{};
  hone::get<"actor">(r) = actor;
  hone::get<"seq">(r) = seq;
  const float x = static_cast<float>(actor * 100000 + static_cast<int>(seq));
  hone::get<"obs">(r) = {x, -x, 0.5f};
  hone::get<"reward">(r) = 1.0f;
  hone::get<"next_obs">(r) = {x + 1.0f, -x - 1.0f, 0.25f};
  hone::get<"terminated">(r) = seq % 7 == 6;
  hone::get<"discount">(r) = 1.0f;
  hone::get<"policy_version">(r) = version;
  return r;
}

/// Parameters of version v: every element says v (so an actor can check it holds version v's).
std::vector<float> params_of(std::uint64_t v, std::size_t n = 37) {
  std::vector<float> p(n);
  for (std::size_t i = 0; i < n; ++i)
    p[i] = static_cast<float>(v) * 1000.0f + static_cast<float>(i);
  return p;
}

/// Runs body(rank) on `ranks` thread ranks; the exception of the first rank that threw (by rank)
/// is rethrown after all have joined.
template <class Body>
void run_ranks(int ranks, Body body) {
  thread_group g(ranks);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks));
  g.run([&](int r) {
    try {
      thread_comm comm(g, r);
      body(comm);
    } catch (...) {
      errors[static_cast<std::size_t>(r)] = std::current_exception();
    }
  });
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

/// The message every rank threw (they must all throw, with the same kind of error).
template <class Error, class Body>
std::vector<std::string> messages_of_all(int ranks, Body body) {
  thread_group g(ranks);
  std::vector<std::string> msgs(static_cast<std::size_t>(ranks));
  std::atomic<int> threw{0};
  g.run([&](int r) {
    thread_comm comm(g, r);
    try {
      body(comm);
    } catch (const Error& e) {
      msgs[static_cast<std::size_t>(r)] = e.what();
      threw.fetch_add(1);
    }
  });
  BOOST_TEST(threw.load() == ranks);
  return msgs;
}

/// Checks inside rank threads (Boost.Test's macros are not thread-safe): a failed check throws,
/// and run_ranks rethrows it after the join.
void expect(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(std::string("check failed in a rank thread: ") + what);
}
template <class Error, class F>
bool throws(F&& f) {
  try {
    f();
  } catch (const Error&) {
    return true;
  }
  return false;
}

bool contains(const std::string& s, std::string_view part) {
  return s.find(part) != std::string::npos;
}

// How many transitions actor rank q sends in round r (0 up to the whole block, varying).
std::size_t sends(int q, std::uint64_t r, std::size_t block) {
  return static_cast<std::size_t>((r * 7 + static_cast<std::uint64_t>(q) * 3) % (block + 1));
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_transition_arrives_once_in_order_with_its_version) {
  constexpr int ranks = 4;  // learner 0, actors 1..3
  constexpr std::uint64_t rounds = 40;
  const hone::dist_actor_options opt{.block = 11, .max_lag = 1000};
  std::vector<std::vector<std::pair<std::uint64_t, std::uint64_t>>> got(ranks);  // (seq, version)
  std::vector<std::vector<std::uint64_t>> tagged(ranks);  // versions the actors tagged, in order
  std::uint64_t stored = 0;
  run_ranks(ranks, [&](thread_comm& comm) {
    if (comm.rank() == 0) {
      buffer_t buffer(100000);
      learner_t learner(comm, buffer, params_of(0), opt);
      for (std::uint64_t r = 1; r <= rounds; ++r) {
        const auto st = learner.round(r == rounds, [&](int q, const step::record& rec, bool ok) {
          expect(ok, "ok");
          expect(hone::get<"actor">(rec) == q, "hone::get<'actor'>(rec) == q");
          got[static_cast<std::size_t>(q)].emplace_back(hone::get<"seq">(rec),
                                                        hone::get<"policy_version">(rec));
        });
        std::uint64_t expected = 0;
        for (int q = 1; q < ranks; ++q) expected += sends(q, r, opt.block);
        expect(st.received == expected, "st.received == expected");
        expect(st.accepted == expected, "st.accepted == expected");
        expect(st.round == r, "st.round == r");
        if (r % 3 != 0) learner.publish(params_of(learner.version() + 1));
      }
      stored = buffer.size();
      expect(learner.stats().dropped == 0u, "learner.stats().dropped == 0u");
      expect(learner.received() == stored, "learner.received() == stored");
      for (int q = 1; q < ranks; ++q) {
        expect(learner.received_from(q) == got[static_cast<std::size_t>(q)].size(),
               "learner.received_from(q) == got[static_cast<std::size_t>(q)].size()");
      }
      expect(throws<hone::config_error>([&] { learner.round(); }),
             "round() after the stop round");  // after the stop round
    } else {
      actor_t actor(comm, opt);
      const int q = comm.rank();
      std::uint64_t seq = 0;
      std::uint64_t r = 1;
      do {
        for (std::size_t i = 0; i < sends(q, r, opt.block); ++i) {
          actor.add(make_step(q, seq++, actor.version()));
          tagged[static_cast<std::size_t>(q)].push_back(actor.version());
        }
        ++r;
      } while (actor.round());
      expect(actor.sent() == seq, "actor.sent() == seq");
      expect(actor.rounds() == rounds, "actor.rounds() == rounds");
      expect(throws<hone::config_error>([&] { actor.round(); }), "round() after stop");
      expect(throws<hone::config_error>([&] { actor.add(make_step(q, seq, 0)); }),
             "add() after stop");
    }
  });
  std::uint64_t total = 0;
  for (int q = 1; q < ranks; ++q) {
    const auto& g = got[static_cast<std::size_t>(q)];
    const auto& t = tagged[static_cast<std::size_t>(q)];
    BOOST_REQUIRE(g.size() == t.size());
    for (std::size_t i = 0; i < g.size(); ++i) {
      BOOST_REQUIRE(g[i].first == i);      // in order, none lost or repeated
      BOOST_REQUIRE(g[i].second == t[i]);  // with the version it was tagged with
    }
    total += g.size();
  }
  BOOST_TEST(total == stored);
  BOOST_TEST(total > 0u);
}

BOOST_AUTO_TEST_CASE(stale_transitions_are_dropped_and_counted_per_the_bound) {
  // Between rounds the learner publishes k(r) = 0, 1, 2, 3, 0, 1, ... versions; the transitions
  // of round r + 1 were acted with the version the actors got at round r, so they arrive with lag
  // k(r): with max_lag = 1 those of rounds after k = 2 or 3 are dropped.
  constexpr int ranks = 3;
  constexpr std::uint64_t rounds = 24;
  constexpr std::size_t per_round = 5;
  const hone::dist_actor_options opt{.block = per_round, .max_lag = 1};
  const auto publications = [](std::uint64_t r) { return r % 4; };
  std::uint64_t expect_accepted = 0, expect_dropped = 0, expect_max_seen = 0;
  for (std::uint64_t r = 2; r <= rounds; ++r) {  // round 1's transitions were acted with version 0
    const std::uint64_t lag = publications(r - 1);
    (lag > 1 ? expect_dropped : expect_accepted) += per_round * (ranks - 1);
    expect_max_seen = std::max(expect_max_seen, lag);
  }
  expect_accepted += per_round * (ranks - 1);  // round 1: lag 0
  hone::gate_stats stats{};
  std::uint64_t flagged_dropped = 0, stored = 0;
  std::vector<std::vector<std::uint64_t>> dropped_seqs(ranks);
  run_ranks(ranks, [&](thread_comm& comm) {
    if (comm.rank() == 0) {
      buffer_t buffer(100000);
      learner_t learner(comm, buffer, params_of(0), opt);
      std::uint64_t dropped_before = 0;
      for (std::uint64_t r = 1; r <= rounds; ++r) {
        const auto st = learner.round(r == rounds, [&](int q, const step::record& rec, bool ok) {
          if (!ok) {
            ++flagged_dropped;
            dropped_seqs[static_cast<std::size_t>(q)].push_back(hone::get<"seq">(rec));
          }
        });
        expect(st.dropped == learner.stats().dropped - dropped_before,
               "st.dropped == learner.stats().dropped - dropped_before");
        dropped_before = learner.stats().dropped;
        for (std::uint64_t k = 0; k < publications(r); ++k) {
          learner.publish(params_of(learner.version() + 1));
        }
      }
      stats = learner.stats();
      stored = buffer.size();
    } else {
      actor_t actor(comm, opt);
      std::uint64_t seq = 0;
      do {
        while (actor.room() > 0) actor.add(make_step(comm.rank(), seq++, actor.version()));
        expect(throws<hone::config_error>(
                   [&] { actor.add(make_step(comm.rank(), seq, actor.version())); }),
               "add() to a full block");  // the block is full
      } while (actor.round());
    }
  });
  BOOST_TEST(stats.accepted == expect_accepted);
  BOOST_TEST(stats.dropped == expect_dropped);
  BOOST_TEST(stats.max_lag_seen == expect_max_seen);
  BOOST_TEST(stats.max_lag_accepted == 1u);
  BOOST_TEST(flagged_dropped == expect_dropped);
  BOOST_TEST(stored == expect_accepted);
  // The dropped ones are whole blocks: those of the rounds after 2 or 3 publications.
  for (int q = 1; q < ranks; ++q) {
    std::vector<std::uint64_t> want;
    for (std::uint64_t r = 2; r <= rounds; ++r) {
      if (publications(r - 1) > 1) {
        for (std::size_t i = 0; i < per_round; ++i) want.push_back((r - 1) * per_round + i);
      }
    }
    BOOST_TEST(dropped_seqs[static_cast<std::size_t>(q)] == want, boost::test_tools::per_element());
  }
}

BOOST_AUTO_TEST_CASE(actor_versions_never_go_back_and_match_the_learner_at_every_round) {
  constexpr int ranks = 3;
  constexpr std::uint64_t rounds = 30;
  const hone::dist_actor_options opt{.block = 2, .max_lag = 2};
  std::vector<std::uint64_t> learner_versions(rounds + 1);
  std::vector<std::vector<std::uint64_t>> held(ranks, std::vector<std::uint64_t>(rounds + 1));
  std::vector<std::vector<std::uint64_t>> clocks(ranks, std::vector<std::uint64_t>(rounds + 1));
  std::vector<std::uint64_t> learner_clock(rounds + 1);
  std::vector<int> params_ok(ranks, 1);
  run_ranks(ranks, [&](thread_comm& comm) {
    if (comm.rank() == 0) {
      buffer_t buffer(1000);
      learner_t learner(comm, buffer, params_of(0), opt);
      learner_versions[0] = 0;
      for (std::uint64_t r = 1; r <= rounds; ++r) {
        const auto st = learner.round(r == rounds);
        learner_versions[r] = st.version;
        learner_clock[r] = learner.received();
        expect(st.params_sent == (r == 1 ? false : learner_versions[r] != learner_versions[r - 1]),
               "params sent exactly when the version changed");
        // 0, 1 or 2 publications between rounds: params are sent only when the version changed.
        for (std::uint64_t k = 0; k < r % 3; ++k) learner.publish(params_of(learner.version() + 1));
      }
    } else {
      actor_t actor(comm, opt);
      const auto q = static_cast<std::size_t>(comm.rank());
      held[q][0] = actor.version();
      if (actor.params().size() != 37 || actor.params()[5] != params_of(0)[5]) params_ok[q] = 0;
      std::uint64_t seq = 0;
      for (std::uint64_t r = 1;; ++r) {
        actor.add(make_step(comm.rank(), seq++, actor.version()));
        const bool more = actor.round();
        held[q][r] = actor.version();
        clocks[q][r] = actor.learner_received();
        const auto want = params_of(actor.version());
        for (std::size_t i = 0; i < want.size(); ++i) {
          if (actor.params()[i] != want[i]) params_ok[q] = 0;
        }
        if (!more) break;
      }
    }
  });
  for (int q = 1; q < ranks; ++q) {
    const auto& h = held[static_cast<std::size_t>(q)];
    BOOST_TEST(params_ok[static_cast<std::size_t>(q)] == 1);
    for (std::uint64_t r = 1; r <= rounds; ++r) {
      BOOST_REQUIRE(h[r] >= h[r - 1]);             // never back
      BOOST_REQUIRE(h[r] == learner_versions[r]);  // the learner's version at that round
      BOOST_REQUIRE(clocks[static_cast<std::size_t>(q)][r] == learner_clock[r]);
    }
  }
}

BOOST_AUTO_TEST_CASE(each_actor_rank_has_its_own_n_step_window) {
  // Two actors send interleaved streams through an n_step<3> buffer (gamma 0.5): every stored
  // item sums rewards of one actor only (rewards 2^seq of actor 1, 3 * 2^seq of actor 2).
  using nbuffer_t = hone::replay_buffer<step, hone::uniform, hone::n_step<3>>;
  constexpr int ranks = 3;
  const hone::dist_actor_options opt{.block = 4, .max_lag = 10};
  std::vector<std::pair<int, float>> items;
  run_ranks(ranks, [&](thread_comm& comm) {
    if (comm.rank() == 0) {
      nbuffer_t buffer(1000, hone::uniform{}, hone::n_step<3>{.gamma = 0.5});
      hone::dist_learner<thread_comm, nbuffer_t> learner(comm, buffer, params_of(0), opt);
      for (int r = 1; r <= 3; ++r) learner.round(r == 3);
      learner.flush();
      hone::replay_batch<step> batch;
      const std::size_t n = buffer.size();
      expect(n == 24u, "n == 24u");  // 12 steps per actor, flushed: one item per step
      std::vector<float> rewards(n), actors_col(n);
      for (std::size_t i = 0; i < n; ++i) {
        buffer.read_field(step::index_of<"reward">(), i,
                          std::as_writable_bytes(std::span<float>(&rewards[i], 1)));
        std::int32_t a = 0;
        buffer.read_field(step::index_of<"actor">(), i,
                          std::as_writable_bytes(std::span<std::int32_t>(&a, 1)));
        items.emplace_back(a, rewards[i]);
      }
    } else {
      hone::dist_actor<thread_comm, step> actor(comm, opt);
      const float scale = comm.rank() == 1 ? 1.0f : 3.0f;
      std::uint64_t seq = 0;
      do {
        while (actor.room() > 0) {
          auto rec = make_step(comm.rank(), seq, actor.version());
          hone::get<"terminated">(rec) = false;
          hone::get<"reward">(rec) = scale * static_cast<float>(1u << seq);
          actor.add(rec);
          ++seq;
        }
      } while (actor.round());
    }
  });
  // Item of actor a starting at step s: scale * (2^s + 0.5 * 2^(s+1) + 0.25 * 2^(s+2)) = 3 *
  // scale * 2^s for a full window; all of it divisible by the actor's scale and of the form
  // scale * k * 2^s with k in {1, 2, 3}.
  for (const auto& [a, reward] : items) {
    const float scale = a == 1 ? 1.0f : 3.0f;
    const float unit = reward / scale;
    bool ok = false;
    for (int s = 0; s < 12 && !ok; ++s) {
      for (int k = 1; k <= 3; ++k) ok = ok || unit == static_cast<float>(k * (1 << s));
    }
    BOOST_TEST(ok, "actor " << a << " item reward " << reward << " mixes streams");
  }
}

BOOST_AUTO_TEST_CASE(user_struct_records_cross_field_by_field) {
  // hone::member records go over the wire field by field (no padding bytes): every field comes
  // back bit for bit, a 32-bit version field is read as the version.
  constexpr int ranks = 2;
  const hone::dist_actor_options opt{.block = 3, .max_lag = 5};
  using ubuffer_t = hone::replay_buffer<user_transition>;
  std::vector<user_step> got;
  const auto make = [](int i, std::uint32_t v) {
    user_step u{};
    u.value = 1.0 / (i + 3);
    u.id[0] = static_cast<std::int16_t>(-i);
    u.id[1] = static_cast<std::int16_t>(i * 7);
    u.id[2] = 32767;
    u.done = i % 2 == 1;
    u.reward = static_cast<float>(i) * 0.25f;
    u.policy_version = v;
    return u;
  };
  run_ranks(ranks, [&](thread_comm& comm) {
    if (comm.rank() == 0) {
      ubuffer_t buffer(100);
      hone::dist_learner<thread_comm, ubuffer_t> learner(comm, buffer, params_of(0), opt);
      for (int r = 1; r <= 3; ++r) {
        learner.round(r == 3, [&](int, const user_step& u, bool) { got.push_back(u); });
        learner.publish(params_of(learner.version() + 1));
      }
    } else {
      hone::dist_actor<thread_comm, user_transition> actor(comm, opt);
      int i = 0;
      do {
        while (actor.room() > 0) {
          actor.add(make(i++, static_cast<std::uint32_t>(actor.version())));
        }
      } while (actor.round());
    }
  });
  BOOST_TEST_REQUIRE(got.size() == 9u);
  for (int i = 0; i < 9; ++i) {
    // Blocks 1 and 2 were acted with version 0 (the first publish() follows round 1's
    // broadcast), block 3 with version 1.
    const user_step want = make(i, i < 6 ? 0u : 1u);
    const user_step& u = got[static_cast<std::size_t>(i)];
    BOOST_TEST(u.value == want.value);
    BOOST_TEST(u.id[0] == want.id[0]);
    BOOST_TEST(u.id[1] == want.id[1]);
    BOOST_TEST(u.id[2] == want.id[2]);
    BOOST_TEST(u.done == want.done);
    BOOST_TEST(u.reward == want.reward);
    BOOST_TEST(u.policy_version == want.policy_version);
  }
}

BOOST_AUTO_TEST_CASE(settings_that_differ_between_ranks_are_refused_on_every_rank) {
  using namespace std::string_view_literals;
  {  // block sizes differ
    const auto msgs = messages_of_all<hone::config_error>(3, [](thread_comm& comm) {
      const hone::dist_actor_options opt{.block = comm.rank() == 2 ? 8u : 16u};
      if (comm.rank() == 0) {
        buffer_t buffer(100);
        learner_t learner(comm, buffer, params_of(0), opt);
      } else {
        actor_t actor(comm, opt);
      }
    });
    for (const auto& m : msgs) {
      BOOST_TEST(
          contains(m, "rank 2 sends blocks of 8 transitions but the learner (rank 0) expects 16"),
          m);
      BOOST_TEST(contains(m, "same dist_actor_options::block"), m);
    }
  }
  {  // transition types differ
    const auto msgs = messages_of_all<hone::config_error>(3, [](thread_comm& comm) {
      const hone::dist_actor_options opt{.block = 4};
      if (comm.rank() == 0) {
        buffer_t buffer(100);
        learner_t learner(comm, buffer, params_of(0), opt);
      } else if (comm.rank() == 1) {
        actor_t actor(comm, opt);
      } else {
        hone::dist_actor<thread_comm, other_step> actor(comm, opt);
      }
    });
    for (const auto& m : msgs) BOOST_TEST(contains(m, "same hone::transition"), m);
  }
  {  // two learners
    const auto msgs = messages_of_all<hone::config_error>(3, [](thread_comm& comm) {
      const hone::dist_actor_options opt{.block = 4};
      buffer_t buffer(100);
      if (comm.rank() != 2) {
        learner_t learner(comm, buffer, params_of(0), opt);
      } else {
        actor_t actor(comm, opt);
      }
    });
    for (const auto& m : msgs) {
      BOOST_TEST(contains(m, "rank 1 constructed a hone::dist_learner but rank 0 is the learner"),
                 m);
    }
  }
  {  // the learner ranks differ
    const auto msgs = messages_of_all<hone::config_error>(2, [](thread_comm& comm) {
      buffer_t buffer(100);
      if (comm.rank() == 0) {
        learner_t learner(comm, buffer, params_of(0), {.block = 4, .learner = 0});
      } else {
        actor_t actor(comm, {.block = 4, .learner = 1});
      }
    });
    for (const auto& m : msgs) {
      BOOST_TEST(contains(m, "rank 1 names rank 1 as the learner but rank 0 names rank 0"), m);
    }
  }
  {  // parameter element types differ
    const auto msgs = messages_of_all<hone::config_error>(2, [](thread_comm& comm) {
      buffer_t buffer(100);
      if (comm.rank() == 0) {
        learner_t learner(comm, buffer, params_of(0), {.block = 4});
      } else {
        hone::dist_actor<thread_comm, step, double> actor(comm, {.block = 4});
      }
    });
    for (const auto& m : msgs) BOOST_TEST(contains(m, "same element type T"), m);
  }
  {  // empty initial parameters
    const auto msgs = messages_of_all<hone::config_error>(2, [](thread_comm& comm) {
      buffer_t buffer(100);
      if (comm.rank() == 0) {
        learner_t learner(comm, buffer, std::span<const float>(), {.block = 4});
      } else {
        actor_t actor(comm, {.block = 4});
      }
    });
    for (const auto& m : msgs) BOOST_TEST(contains(m, "initial parameters are empty"), m);
  }
}

BOOST_AUTO_TEST_CASE(bad_inputs_give_sentences) {
  const auto message = [](auto&& f) {
    try {
      f();
    } catch (const hone::config_error& e) {
      return std::string(e.what());
    }
    return std::string("(nothing thrown)");
  };
  // Zero-size blocks, on every rank (checked before any collective).
  const auto zero = messages_of_all<hone::config_error>(2, [](thread_comm& comm) {
    buffer_t buffer(100);
    if (comm.rank() == 0) {
      learner_t learner(comm, buffer, params_of(0), {.block = 0});
    } else {
      actor_t actor(comm, {.block = 0});
    }
  });
  for (const auto& m : zero) BOOST_TEST(contains(m, "dist_actor_options::block is 0"), m);
  // One rank: no actor can exist.
  {
    hone::dist::local_comm one;
    buffer_t buffer(100);
    const auto m = message(
        [&] { hone::dist_learner<hone::dist::local_comm, buffer_t> l(one, buffer, params_of(0)); });
    BOOST_TEST(contains(m, "has 1 rank; distributed actors need at least 2"), m);
  }
  // A learner rank out of range.
  const auto range = messages_of_all<hone::config_error>(
      2, [](thread_comm& comm) { actor_t actor(comm, {.block = 4, .learner = 5}); });
  for (const auto& m : range) BOOST_TEST(contains(m, "dist_actor_options::learner is 5"), m);
  // publish() of another size, add() of a version from the future.
  std::string publish_msg, future_msg;
  run_ranks(2, [&](thread_comm& comm) {
    if (comm.rank() == 0) {
      buffer_t buffer(100);
      learner_t learner(comm, buffer, params_of(0), {.block = 4});
      publish_msg = message([&] { learner.publish(params_of(1, 36)); });
      learner.round(true);
    } else {
      actor_t actor(comm, {.block = 4});
      future_msg = message([&] { actor.add(make_step(1, 0, 1)); });
      actor.round();
    }
  });
  BOOST_TEST(contains(publish_msg, "the parameters hold 36 elements but the initial ones held 37"),
             publish_msg);
  BOOST_TEST(contains(future_msg, "tagged with policy version 1 but this actor holds version 0"),
             future_msg);
}
