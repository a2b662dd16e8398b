// hone::serve::dynamic_batcher, single-threaded and deterministic: dispatch_mode::manual with a
// test clock that moves only when a test advances it, so size caps, delays, preferred sizes,
// priorities, timeouts and cancellation are checked exactly, with no sleep.
#define BOOST_TEST_MODULE hone_serve_batcher
#include <boost/test/unit_test.hpp>

#include "test_clock.hpp"

#include <chrono>
#include <cstddef>
#include <future>
#include <hone/serve.hpp>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace hs = hone::serve;
using namespace std::chrono_literals;

namespace {

/// Doubles each request and records the batches it saw; throws on a request of -1.
struct doubler {
  std::vector<std::vector<int>> batches;
  std::vector<int> infer(std::span<const int> batch) {
    batches.emplace_back(batch.begin(), batch.end());
    std::vector<int> out;
    for (const int r : batch) {
      if (r == -1) throw std::runtime_error("doubler: request -1 is poison");
      out.push_back(2 * r);
    }
    return out;
  }
};

/// Returns one output too few.
struct short_model {
  std::vector<int> infer(std::span<const int> batch) {
    return std::vector<int>(batch.size() - 1, 0);
  }
};

struct no_infer {
  std::vector<int> run(std::span<const int>);
};
struct void_infer {
  void infer(std::span<const int>);
};
struct const_span_of_other_type {
  std::vector<int> infer(std::span<const std::string>);
};
struct unsized_output {
  int infer(std::span<const int>);
};

static_assert(hs::batch_model<doubler, int>);
static_assert(std::is_same_v<hs::response_t<doubler, int>, int>);
static_assert(hs::check_batch_model<doubler, int>());
static_assert(!hs::batch_model<no_infer, int>);
static_assert(!hs::batch_model<void_infer, int>);
static_assert(!hs::batch_model<const_span_of_other_type, int>);
static_assert(!hs::batch_model<unsized_output, int>);
static_assert(!hs::batch_model<const doubler, int>);  // infer is not const

using batcher = hs::dynamic_batcher<doubler, int, test_clock>;

hs::batcher_options manual(std::size_t cap, std::chrono::nanoseconds delay,
                           std::vector<std::size_t> preferred = {}) {
  hs::batcher_options o;
  o.max_batch_size = cap;
  o.max_queue_delay = delay;
  o.preferred_batch_sizes = std::move(preferred);
  o.mode = hs::dispatch_mode::manual;
  return o;
}

/// The request's future is ready (manual dispatch: nothing else will make it ready).
template <class H>
bool ready(H& h) {
  return h.future().wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

/// The value of a ready request (fails the test at once, instead of blocking, when not ready).
template <class H>
auto value(H& h) {
  BOOST_TEST_REQUIRE(ready(h));
  return h.get();
}

template <class E, class H>
bool fails_with(H& h) {
  if (!ready(h)) return false;
  try {
    (void)h.get();
  } catch (const E&) {
    return true;
  } catch (...) {
    return false;
  }
  return false;
}

}  // namespace

BOOST_AUTO_TEST_CASE(chosen_batch_size_follows_the_documented_rule) {
  const std::vector<std::size_t> none;
  // Without preferred sizes: the cap at once, everything after the delay, else wait.
  BOOST_TEST(hs::chosen_batch_size(0, true, 8, none) == 0u);
  BOOST_TEST(hs::chosen_batch_size(3, false, 8, none) == 0u);
  BOOST_TEST(hs::chosen_batch_size(3, true, 8, none) == 3u);
  BOOST_TEST(hs::chosen_batch_size(8, false, 8, none) == 8u);
  BOOST_TEST(hs::chosen_batch_size(20, false, 8, none) == 8u);
  const std::vector<std::size_t> pref{4, 6};
  for (std::size_t q = 0; q <= 10; ++q) {
    const std::size_t waiting = hs::chosen_batch_size(q, false, 8, pref);
    const std::size_t expired = hs::chosen_batch_size(q, true, 8, pref);
    BOOST_TEST_CONTEXT("queued " << q) {
      BOOST_TEST(waiting == (q >= 6 ? 6u : 0u));
      const std::size_t want = q == 0 ? 0 : q >= 6 ? 6 : q >= 4 ? 4 : q;
      BOOST_TEST(expired == want);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_batch_forms_at_the_size_cap_without_waiting) {
  doubler m;
  batcher b(m, manual(4, 1ms));
  std::vector<batcher::handle_type> h;
  for (int i = 0; i < 3; ++i) h.push_back(b.submit(i));
  BOOST_TEST(b.poll() == 0u);
  h.push_back(b.submit(3));
  for (int i = 4; i < 6; ++i) h.push_back(b.submit(i));
  BOOST_TEST(b.poll() == 4u);
  BOOST_TEST(b.queued() == 2u);
  for (int i = 0; i < 4; ++i) BOOST_TEST(value(h[static_cast<std::size_t>(i)]) == 2 * i);
  BOOST_TEST(m.batches.size() == 1u);
}

BOOST_AUTO_TEST_CASE(a_partial_batch_forms_exactly_when_the_oldest_has_waited_the_delay) {
  doubler m;
  batcher b(m, manual(8, 1000us));
  auto h0 = b.submit(1);
  test_clock::advance(400us);
  auto h1 = b.submit(2);
  test_clock::advance(599us);
  BOOST_TEST(b.poll() == 0u);  // the oldest waited 999 us
  test_clock::advance(1us);
  BOOST_TEST(b.poll() == 2u);  // 1000 us: the delay counts from the oldest request
  BOOST_TEST(value(h0) == 2);
  BOOST_TEST(value(h1) == 4);
}

BOOST_AUTO_TEST_CASE(preferred_sizes_are_formed_exactly_whenever_enough_requests_wait) {
  doubler m;
  batcher b(m, manual(8, 1ms, {6, 4, 4}));  // unsorted, duplicated: sorted and deduplicated
  std::vector<batcher::handle_type> h;
  for (int i = 0; i < 5; ++i) h.push_back(b.submit(i));
  BOOST_TEST(b.poll() == 0u);  // 5 < 6: wait for a larger preferred size until the delay
  test_clock::advance(1ms);
  BOOST_TEST(b.poll() == 4u);  // the largest preferred size that 5 can meet
  BOOST_TEST(b.poll() == 1u);  // 1 left, older than the delay, fewer than the smallest preferred
  for (int i = 0; i < 7; ++i) h.push_back(b.submit(10 + i));
  BOOST_TEST(b.poll() == 6u);  // 7 >= 6 = the largest preferred size: at once, not the cap 8
  BOOST_TEST(b.poll() == 0u);
  test_clock::advance(1ms);
  BOOST_TEST(b.poll() == 1u);
  BOOST_TEST(m.batches.size() == 4u);
  BOOST_TEST(m.batches[0] == (std::vector<int>{0, 1, 2, 3}));
  BOOST_TEST(m.batches[2] == (std::vector<int>{10, 11, 12, 13, 14, 15}));
}

BOOST_AUTO_TEST_CASE(higher_priorities_run_first_and_equal_ones_in_submission_order) {
  doubler m;
  batcher b(m, manual(2, 1ms));
  auto a = b.submit(1, {.priority = 0});
  auto c = b.submit(2, {.priority = 1});
  auto d = b.submit(3, {.priority = 0});
  auto e = b.submit(4, {.priority = 2});
  auto f = b.submit(5, {.priority = -1});
  BOOST_TEST(b.poll() == 2u);
  BOOST_TEST(b.poll() == 2u);
  test_clock::advance(1ms);
  BOOST_TEST(b.poll() == 1u);
  BOOST_TEST(m.batches.size() == 3u);
  BOOST_TEST(m.batches[0] == (std::vector<int>{4, 2}));
  BOOST_TEST(m.batches[1] == (std::vector<int>{1, 3}));
  BOOST_TEST(m.batches[2] == (std::vector<int>{5}));
  BOOST_TEST(value(a) + value(c) + value(d) + value(e) + value(f) == 30);
}

BOOST_AUTO_TEST_CASE(a_request_past_its_timeout_fails_and_is_not_run) {
  doubler m;
  auto o = manual(8, 1ms);
  o.default_timeout = 300us;
  batcher b(m, o);
  auto t = b.submit(7, {.timeout = 100us});
  auto d = b.submit(8);  // the default 300 us
  auto n = b.submit(9, {.timeout = 5ms});
  test_clock::advance(99us);
  BOOST_TEST(b.poll() == 0u);
  BOOST_TEST(b.queued() == 3u);
  test_clock::advance(1us);
  BOOST_TEST(b.poll() == 0u);
  BOOST_TEST(b.queued() == 2u);
  BOOST_TEST(fails_with<hs::request_timeout_error>(t));
  test_clock::advance(200us);
  BOOST_TEST(b.poll() == 0u);
  BOOST_TEST(fails_with<hs::request_timeout_error>(d));
  test_clock::advance(700us);
  BOOST_TEST(b.poll() == 1u);
  BOOST_TEST(value(n) == 18);
  BOOST_TEST(m.batches.size() == 1u);
  BOOST_TEST(m.batches[0] == (std::vector<int>{9}));
  BOOST_TEST(b.stats().timed_out == 2u);
}

BOOST_AUTO_TEST_CASE(a_cancelled_request_is_not_run_and_its_future_says_so) {
  doubler m;
  batcher b(m, manual(8, 1ms));
  auto a = b.submit(1);
  auto c = b.submit(2);
  auto d = b.submit(3);
  BOOST_TEST(c.cancel());
  BOOST_TEST(!c.cancel());  // once
  BOOST_TEST(b.queued() == 2u);
  test_clock::advance(1ms);
  BOOST_TEST(b.poll() == 2u);
  BOOST_TEST(fails_with<hs::request_cancelled_error>(c));
  BOOST_TEST(!a.cancel());  // already run
  BOOST_TEST(value(a) == 2);
  BOOST_TEST(value(d) == 6);
  BOOST_TEST(m.batches.size() == 1u);
  BOOST_TEST(m.batches[0] == (std::vector<int>{1, 3}));
  BOOST_TEST(b.stats().cancelled == 1u);
}

BOOST_AUTO_TEST_CASE(a_full_queue_rejects_at_once_and_accepts_again_when_room_is_made) {
  doubler m;
  auto o = manual(8, 1ms);
  o.queue_capacity = 3;
  batcher b(m, o);
  auto h0 = b.submit(0);
  auto h1 = b.submit(1);
  auto h2 = b.submit(2);
  BOOST_CHECK_THROW((void)b.submit(3), hs::queue_full_error);
  try {
    (void)b.submit(3);
  } catch (const hs::queue_full_error& e) {
    BOOST_TEST(std::string(e.what()).find("queue_capacity") != std::string::npos);
  }
  BOOST_TEST(b.queued() == 3u);
  BOOST_TEST(h1.cancel());  // a cancelled request frees its place
  auto h3 = b.submit(3);
  test_clock::advance(1ms);
  BOOST_TEST(b.poll() == 3u);
  auto h4 = b.submit(4);
  BOOST_TEST(b.stats().rejected == 2u);
  BOOST_TEST(b.stats().submitted == 5u);
  BOOST_TEST(value(h3) == 6);
  test_clock::advance(1ms);
  BOOST_TEST(b.poll() == 1u);
  BOOST_TEST(value(h4) == 8);
}

BOOST_AUTO_TEST_CASE(a_model_exception_fails_exactly_its_batch_and_serving_goes_on) {
  doubler m;
  batcher b(m, manual(2, 1ms));
  auto a = b.submit(1);
  auto p = b.submit(-1);
  auto c = b.submit(3);
  auto d = b.submit(4);
  BOOST_TEST(b.poll() == 2u);
  BOOST_TEST(b.poll() == 2u);
  for (auto* h : {&a, &p}) {
    try {
      (void)value(*h);
      BOOST_FAIL("a request of the failing batch got a value");
    } catch (const std::runtime_error& e) {
      BOOST_TEST(std::string(e.what()) == "doubler: request -1 is poison");
    }
  }
  BOOST_TEST(value(c) == 6);
  BOOST_TEST(value(d) == 8);
  BOOST_TEST(b.stats().failed == 2u);
  BOOST_TEST(b.stats().run == 4u);
}

BOOST_AUTO_TEST_CASE(a_model_returning_the_wrong_number_of_outputs_fails_its_batch) {
  short_model m;
  hs::dynamic_batcher<short_model, int, test_clock> b(m, manual(2, 1ms));
  auto a = b.submit(1);
  auto c = b.submit(2);
  BOOST_TEST(b.poll() == 2u);
  try {
    (void)value(a);
    BOOST_FAIL("no error");
  } catch (const hone::error& e) {
    BOOST_TEST(std::string(e.what()).find("returned 1 outputs for a batch of 2") !=
               std::string::npos);
  }
  BOOST_TEST(fails_with<hone::error>(c));
}

BOOST_AUTO_TEST_CASE(shutdown_drain_runs_every_queued_request_without_waiting) {
  doubler m;
  batcher b(m, manual(2, 1h));
  std::vector<batcher::handle_type> h;
  for (int i = 0; i < 5; ++i) h.push_back(b.submit(i));
  b.shutdown(hs::shutdown_mode::drain);
  BOOST_TEST(m.batches.size() == 3u);
  for (int i = 0; i < 5; ++i) BOOST_TEST(value(h[static_cast<std::size_t>(i)]) == 2 * i);
  BOOST_CHECK_THROW((void)b.submit(9), hs::batcher_stopped_error);
  BOOST_TEST(b.stats().rejected == 1u);
}

BOOST_AUTO_TEST_CASE(shutdown_cancel_fails_every_queued_request_without_running_it) {
  doubler m;
  batcher b(m, manual(2, 1h));
  std::vector<batcher::handle_type> h;
  for (int i = 0; i < 5; ++i) h.push_back(b.submit(i));
  BOOST_TEST(b.poll() == 2u);
  b.shutdown(hs::shutdown_mode::cancel);
  BOOST_TEST(m.batches.size() == 1u);
  BOOST_TEST(value(h[0]) == 0);
  BOOST_TEST(value(h[1]) == 2);
  for (std::size_t i = 2; i < 5; ++i) BOOST_TEST(fails_with<hs::batcher_stopped_error>(h[i]));
  BOOST_TEST(!h[3].cancel());
  BOOST_TEST(b.stats().cancelled == 3u);
  b.shutdown();  // idempotent
}

BOOST_AUTO_TEST_CASE(statistics_count_batches_fill_and_queue_delay) {
  doubler m;
  batcher b(m, manual(4, 1ms));
  std::vector<batcher::handle_type> h;
  for (int i = 0; i < 4; ++i) h.push_back(b.submit(i));
  test_clock::advance(200us);
  BOOST_TEST(b.poll() == 4u);  // full: waited 200 us each
  h.push_back(b.submit(9));
  test_clock::advance(1ms);
  BOOST_TEST(b.poll() == 1u);  // waited 1 ms
  const hs::batcher_stats s = b.stats();
  BOOST_TEST(s.batches == 2u);
  BOOST_TEST(s.run == 5u);
  BOOST_TEST(s.mean_batch_size == 2.5);
  BOOST_TEST(s.mean_fill == 2.5 / 4);
  BOOST_TEST(s.queue_delay_p50_ns >= 200e3 * (1 - 1.0 / 32));
  BOOST_TEST(s.queue_delay_p50_ns <= 200e3 * (1 + 1.0 / 32));
  BOOST_TEST(s.queue_delay_max_ns == 1e6);
}

BOOST_AUTO_TEST_CASE(bad_options_are_refused_with_a_sentence) {
  doubler m;
  BOOST_CHECK_THROW(batcher(m, manual(0, 1ms)), hone::config_error);
  BOOST_CHECK_THROW(batcher(m, manual(4, 1ms, {8})), hone::config_error);
  BOOST_CHECK_THROW(batcher(m, manual(4, 1ms, {0})), hone::config_error);
  auto o = manual(4, 1ms);
  o.queue_capacity = 0;
  BOOST_CHECK_THROW(batcher(m, o), hone::config_error);
  try {
    batcher b(m, manual(4, 1ms, {5}));
    BOOST_FAIL("no error");
  } catch (const hone::config_error& e) {
    BOOST_TEST(std::string(e.what()).find("preferred batch size 5 is outside") !=
               std::string::npos);
  }
  hs::dynamic_batcher<doubler, int> threaded(m, {.max_batch_size = 4});
  BOOST_CHECK_THROW((void)threaded.poll(), hone::config_error);
}

namespace {
/// Takes 10 us of the test clock per request of a batch.
struct timed_model {
  std::vector<std::size_t> sizes;
  std::vector<int> infer(std::span<const int> batch) {
    sizes.push_back(batch.size());
    test_clock::advance(std::chrono::microseconds(10) * static_cast<int>(batch.size()));
    return {batch.begin(), batch.end()};
  }
};
}  // namespace

BOOST_AUTO_TEST_CASE(the_adaptive_mode_grows_the_cap_additively_and_cuts_it_multiplicatively) {
  timed_model m;
  auto o = manual(16, 1ms);
  o.queue_capacity = 1000;
  o.adaptive = {.latency_target = 45us, .additive_step = 1, .decrease_factor = 0.5};
  hs::dynamic_batcher<timed_model, int, test_clock> b(m, o);
  BOOST_TEST(b.stats().batch_size_cap == 1u);  // starts at min_batch_size
  std::vector<hs::request_handle<int>> h;
  for (int i = 0; i < 200; ++i) h.push_back(b.submit(i));
  for (int i = 0; i < 9; ++i) BOOST_TEST(b.poll() > 0u);
  // 1..4 take <= 40 us (grow), 5 takes 50 us > 45 us (cut to floor(5 * 0.5) = 2), then 2..4, 5.
  BOOST_TEST(m.sizes == (std::vector<std::size_t>{1, 2, 3, 4, 5, 2, 3, 4, 5}));
  BOOST_TEST(b.stats().batch_size_cap == 2u);
  b.shutdown(hs::shutdown_mode::cancel);
}

BOOST_AUTO_TEST_CASE(the_adaptive_mode_grows_only_after_full_batches_and_stays_in_bounds) {
  timed_model m;
  auto o = manual(3, 1ms);
  o.adaptive = {.latency_target = 1h, .additive_step = 2, .min_batch_size = 2};
  hs::dynamic_batcher<timed_model, int, test_clock> b(m, o);
  BOOST_TEST(b.stats().batch_size_cap == 2u);
  auto h0 = b.submit(0);
  test_clock::advance(1ms);
  BOOST_TEST(b.poll() == 1u);  // a partial batch (the delay): no evidence for a larger cap
  BOOST_TEST(b.stats().batch_size_cap == 2u);
  auto h1 = b.submit(1);
  auto h2 = b.submit(2);
  BOOST_TEST(b.poll() == 2u);  // full: 2 + 2 capped at max_batch_size 3
  BOOST_TEST(b.stats().batch_size_cap == 3u);
  BOOST_TEST(value(h2) == 2);
  (void)value(h0);
  (void)value(h1);
  // Cuts never go below min_batch_size.
  timed_model m2;
  auto o2 = manual(8, 1ms);
  o2.adaptive = {.latency_target = 1us, .decrease_factor = 0.1, .min_batch_size = 2};
  hs::dynamic_batcher<timed_model, int, test_clock> b2(m2, o2);
  std::vector<hs::request_handle<int>> h;
  for (int i = 0; i < 6; ++i) h.push_back(b2.submit(i));
  BOOST_TEST(b2.poll() == 2u);
  BOOST_TEST(b2.stats().batch_size_cap == 2u);
  BOOST_TEST(b2.poll() == 2u);
}

BOOST_AUTO_TEST_CASE(bad_adaptive_options_are_refused_with_a_sentence) {
  timed_model m;
  auto o = manual(8, 1ms, {4});
  o.adaptive.latency_target = 1ms;
  try {
    hs::dynamic_batcher<timed_model, int, test_clock> b(m, o);
    BOOST_FAIL("no error");
  } catch (const hone::config_error& e) {
    BOOST_TEST(std::string(e.what()).find("cannot be combined") != std::string::npos);
  }
  o.preferred_batch_sizes.clear();
  o.adaptive.decrease_factor = 1.0;
  using tb = hs::dynamic_batcher<timed_model, int, test_clock>;
  BOOST_CHECK_THROW(tb(m, o), hone::config_error);
  o.adaptive.decrease_factor = 0.5;
  o.adaptive.min_batch_size = 9;
  BOOST_CHECK_THROW(tb(m, o), hone::config_error);
  o.adaptive.min_batch_size = 1;
  o.adaptive.additive_step = 0;
  BOOST_CHECK_THROW(tb(m, o), hone::config_error);
}

// ---------------------------------------------------------------------------------------------
// The caller-runs fast path (batcher_options::caller_runs)

namespace {
hs::batcher_options caller_runs(std::size_t cap, std::chrono::nanoseconds delay,
                                std::vector<std::size_t> preferred = {}) {
  hs::batcher_options o = manual(cap, delay, std::move(preferred));
  o.caller_runs = true;
  return o;
}

/// Doubles each request; its first batch submits two more requests to the batcher (which must
/// queue them: a batch is running).
struct resubmitting_model {
  hs::dynamic_batcher<resubmitting_model, int, test_clock>* batcher = nullptr;
  std::vector<hs::request_handle<int>> inner;
  std::vector<std::vector<int>> batches;
  std::vector<int> infer(std::span<const int> batch) {
    batches.emplace_back(batch.begin(), batch.end());
    if (batches.size() == 1) {
      inner.push_back(batcher->submit(100));
      inner.push_back(batcher->submit(200, {.priority = 1}));
    }
    std::vector<int> out;
    for (const int r : batch) out.push_back(2 * r);
    return out;
  }
};
}  // namespace

BOOST_AUTO_TEST_CASE(caller_runs_runs_a_lone_request_in_submit_when_the_rule_forms_it_at_once) {
  doubler m;
  batcher b(m, caller_runs(1, 1ms));  // a cap of 1: a lone request's batch forms at once
  auto h = b.submit(3, {.timeout = 1us});
  BOOST_TEST(ready(h));  // no poll(): submit ran it
  BOOST_TEST(value(h) == 6);
  BOOST_TEST(m.batches.size() == 1u);
  BOOST_TEST(b.queued() == 0u);
  BOOST_TEST(b.poll() == 0u);
  BOOST_TEST(!h.cancel());  // already run
  auto h2 = b.submit(4);
  BOOST_TEST(value(h2) == 8);
  const hs::batcher_stats s = b.stats();
  BOOST_TEST(s.submitted == 2u);
  BOOST_TEST(s.batches == 2u);
  BOOST_TEST(s.run == 2u);
  BOOST_TEST(s.timed_out == 0u);
  BOOST_TEST(s.queue_delay_max_ns == 0);  // formed as it was submitted
}

BOOST_AUTO_TEST_CASE(caller_runs_applies_exactly_when_chosen_batch_size_takes_one_request_now) {
  struct want {
    std::size_t cap;
    std::chrono::nanoseconds delay;
    std::vector<std::size_t> preferred;
    bool in_submit;
  };
  const std::vector<want> cases{
      {1, 1ms, {}, true},       // the cap is 1
      {4, 0ns, {}, true},       // no delay: a partial batch forms at once
      {4, 1ms, {1}, true},      // the largest preferred size is 1
      {4, 0ns, {2, 4}, true},   // no delay: fewer than the smallest preferred size, all of them
      {4, 1ms, {}, false},      // waits up to 1 ms for a fuller batch
      {4, 1ms, {1, 2}, false},  // waits for 2, the largest preferred size
  };
  for (const want& w : cases) {
    BOOST_TEST_CONTEXT("cap " << w.cap << ", delay " << w.delay.count() << " ns, "
                              << w.preferred.size() << " preferred sizes") {
      doubler m;
      batcher b(m, caller_runs(w.cap, w.delay, w.preferred));
      auto h = b.submit(5);
      BOOST_TEST(ready(h) == w.in_submit);
      BOOST_TEST(b.queued() == (w.in_submit ? 0u : 1u));
      BOOST_TEST(
          hs::chosen_batch_size(1, w.delay == 0ns, w.cap, b.options().preferred_batch_sizes) ==
          (w.in_submit ? 1u : 0u));
      if (!w.in_submit) {
        test_clock::advance(1ms);
        BOOST_TEST(b.poll() == 1u);  // the dispatching side forms it after the delay, as before
      }
      BOOST_TEST(value(h) == 10);
    }
  }
  // Without the option nothing changes: the request waits for poll().
  doubler m;
  batcher b(m, manual(1, 1ms));
  auto h = b.submit(5);
  BOOST_TEST(!ready(h));
  BOOST_TEST(b.poll() == 1u);
  BOOST_TEST(value(h) == 10);
}

BOOST_AUTO_TEST_CASE(caller_runs_queues_behind_a_running_batch_and_behind_queued_requests) {
  resubmitting_model m;
  hs::dynamic_batcher<resubmitting_model, int, test_clock> b(m, caller_runs(4, 0ns));
  m.batcher = &b;
  auto a = b.submit(1);  // runs in submit; the model submits 100 and 200 meanwhile
  BOOST_TEST(ready(a));
  BOOST_TEST(value(a) == 2);
  BOOST_TEST(m.inner.size() == 2u);
  BOOST_TEST(!ready(m.inner[0]));  // a batch was running: queued, not run inside the model
  BOOST_TEST(b.queued() == 2u);
  auto c = b.submit(3);  // the queue is not empty: queued behind them, in the usual order
  BOOST_TEST(!ready(c));
  BOOST_TEST(b.queued() == 3u);
  BOOST_TEST(b.poll() == 3u);
  BOOST_TEST(m.batches.size() == 2u);
  BOOST_TEST(m.batches[1] == (std::vector<int>{200, 100, 3}));  // priority, then submission order
  BOOST_TEST(value(c) == 6);
  BOOST_TEST(value(m.inner[0]) == 200);
  BOOST_TEST(value(m.inner[1]) == 400);
  auto d = b.submit(4);  // idle and empty again: in submit
  BOOST_TEST(value(d) == 8);
  BOOST_TEST(b.stats().batches == 3u);
  BOOST_TEST(b.stats().submitted == 5u);
}

BOOST_AUTO_TEST_CASE(caller_runs_puts_the_model_error_in_the_future_and_serving_goes_on) {
  doubler m;
  batcher b(m, caller_runs(1, 1ms));
  auto p = b.submit(-1);  // submit itself does not throw the model's error
  BOOST_TEST(fails_with<std::runtime_error>(p));
  auto h = b.submit(2);
  BOOST_TEST(value(h) == 4);
  BOOST_TEST(b.stats().failed == 1u);
  BOOST_TEST(b.stats().run == 2u);
}

BOOST_AUTO_TEST_CASE(caller_runs_keeps_backpressure_shutdown_and_the_adaptive_cap) {
  {  // a full queue is not bypassed: requests queued behind a batch stay bounded
    doubler m;
    auto o = caller_runs(4, 1ms);
    o.queue_capacity = 1;
    batcher b(m, o);
    auto h = b.submit(1);  // 1 of a cap of 4 with a delay: queued
    BOOST_CHECK_THROW((void)b.submit(2), hs::queue_full_error);
    b.shutdown(hs::shutdown_mode::drain);
    BOOST_TEST(value(h) == 2);
    BOOST_CHECK_THROW((void)b.submit(3), hs::batcher_stopped_error);
    BOOST_TEST(b.stats().rejected == 2u);
  }
  {  // the adaptive cap: a lone request runs in submit while the cap is 1; the full batch of 1
     // (10 us <= 15 us) grows the cap to 2, so the next lone request waits for the delay
    timed_model m;
    auto o = caller_runs(4, 1ms);
    o.adaptive = {.latency_target = 15us};
    hs::dynamic_batcher<timed_model, int, test_clock> b(m, o);
    BOOST_TEST(b.stats().batch_size_cap == 1u);
    auto h0 = b.submit(0);
    BOOST_TEST(ready(h0));
    BOOST_TEST(b.stats().batch_size_cap == 2u);
    auto h1 = b.submit(1);
    BOOST_TEST(!ready(h1));
    test_clock::advance(1ms);
    BOOST_TEST(b.poll() == 1u);
    BOOST_TEST(value(h1) == 1);
    BOOST_TEST(m.sizes == (std::vector<std::size_t>{1, 1}));
  }
}
