// hone::serve::dynamic_batcher with its dispatcher thread and many client threads (label
// concurrency: CI runs it under ThreadSanitizer). Every request is answered exactly once: a value
// for exactly the requests the model ran, one of the batcher's errors for the others.
#define BOOST_TEST_MODULE hone_serve_batcher_concurrency
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <future>
#include <hone/serve.hpp>
#include <mutex>
#include <span>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "../support/sanitizers.hpp"

namespace hs = hone::serve;
using namespace std::chrono_literals;

namespace {

/// Set on the client threads: the model counts the batches it ran on one (batcher_options::
/// caller_runs runs a lone request in its submit()).
thread_local bool on_client_thread = false;

/// Returns each request's id + 1 and records how often each id ran; a batch holding an id that is
/// a multiple of 97 throws. infer is only ever called by one thread at a time (checked).
struct recording_model {
  explicit recording_model(std::size_t ids) : runs(ids) {}
  std::vector<std::atomic<int>> runs;
  std::atomic<int> inside{0};
  std::atomic<int> overlapped{0};
  std::atomic<std::size_t> batches{0};
  std::atomic<std::size_t> client_batches{0};  // run on a client thread (caller_runs)
  std::chrono::nanoseconds per_request{0};     // busy time per request of a batch
  std::vector<std::uint64_t> infer(std::span<const std::uint64_t> batch) {
    if (inside.fetch_add(1) != 0) overlapped.fetch_add(1);
    batches.fetch_add(1);
    if (on_client_thread) client_batches.fetch_add(1);
    bool poison = false;
    std::vector<std::uint64_t> out;
    for (const std::uint64_t id : batch) {
      runs[id].fetch_add(1);
      poison = poison || id % 97 == 0;
      out.push_back(id + 1);
    }
    const auto until = std::chrono::steady_clock::now() + per_request * batch.size();
    while (std::chrono::steady_clock::now() < until) {
    }
    inside.fetch_sub(1);
    if (poison) throw std::runtime_error("recording_model: poisoned batch");
    return out;
  }
};

enum class outcome { value, model_error, timeout, cancelled, stopped, rejected, wrong };

outcome settle(hs::request_handle<std::uint64_t>& h, std::uint64_t id) {
  try {
    return h.get() == id + 1 ? outcome::value : outcome::wrong;
  } catch (const hs::request_timeout_error&) {
    return outcome::timeout;
  } catch (const hs::request_cancelled_error&) {
    return outcome::cancelled;
  } catch (const hs::batcher_stopped_error&) {
    return outcome::stopped;
  } catch (const std::runtime_error&) {
    return outcome::model_error;
  }
}

struct tally {
  std::mutex m;
  std::vector<outcome> of;
  std::atomic<std::size_t> values{0};
  explicit tally(std::size_t n) : of(n, outcome::wrong) {}
  void set(std::uint64_t id, outcome o) {
    std::lock_guard lock(m);
    of[id] = o;
    if (o == outcome::value) values.fetch_add(1);
  }
};

/// Runs `producers` threads submitting `per_thread` requests each (priorities, short timeouts,
/// cancellations mixed in; a rejected request is recorded as rejected), with preferred sizes or
/// the adaptive mode, then shuts down with `mode`, and checks that every request was answered
/// once, consistently with the model's runs. `caller_runs`: batcher_options::caller_runs with no
/// queue delay, so a request finding the batcher idle runs in its client's submit() while the
/// others queue for the dispatcher thread.
void run_clients(hs::shutdown_mode mode, bool shutdown_while_submitting, bool adaptive = false,
                 bool caller_runs = false) {
  constexpr int producers = 4;
  const int per_thread = hone_test::under_tsan ? 400 : 3000;
  const std::size_t n = static_cast<std::size_t>(producers * per_thread);
  recording_model model(n);
  tally t(n);
  hs::batcher_options o;
  o.max_batch_size = 16;
  if (adaptive) {  // 200 ns per request against 2 us: batches above about 10 miss the target
    model.per_request = 200ns;
    o.adaptive = {.latency_target = 2us, .additive_step = 2, .decrease_factor = 0.5};
  } else {
    o.preferred_batch_sizes = {8, 16};
  }
  o.max_queue_delay = caller_runs ? 0us : 200us;
  o.queue_capacity = 64;
  o.caller_runs = caller_runs;
  auto b = std::make_unique<hs::dynamic_batcher<recording_model, std::uint64_t>>(model, o);
  std::vector<std::thread> threads;
  for (int p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      on_client_thread = true;
      std::vector<std::pair<std::uint64_t, hs::request_handle<std::uint64_t>>> mine;
      for (int i = 0; i < per_thread; ++i) {
        const auto id = static_cast<std::uint64_t>(p * per_thread + i);
        hs::submit_options so{.priority = static_cast<int>(id % 3)};
        if (id % 11 == 0) so.timeout = 1us;  // most of these time out
        try {
          auto h = b->submit(id, so);
          if (id % 13 == 0) (void)h.cancel();
          mine.emplace_back(id, std::move(h));
        } catch (const hs::queue_full_error&) {
          t.set(id, outcome::rejected);
          std::this_thread::yield();
        } catch (const hs::batcher_stopped_error&) {
          t.set(id, outcome::rejected);
        }
        if (mine.size() >= 32) {  // a client waits for its answers now and then
          for (auto& [rid, h] : mine) t.set(rid, settle(h, rid));
          mine.clear();
        }
      }
      for (auto& [rid, h] : mine) t.set(rid, settle(h, rid));
    });
  }
  if (shutdown_while_submitting) {
    // Shut down once some requests were answered with values, while clients still submit.
    while (t.values.load() == 0) std::this_thread::yield();
    b->shutdown(mode);
  }
  for (auto& th : threads) th.join();
  b->shutdown(mode);
  const hs::batcher_stats s = b->stats();
  b.reset();

  BOOST_TEST(model.overlapped.load() == 0);
  std::size_t values = 0, model_errors = 0, timeouts = 0, cancelled = 0, stopped = 0, rejected = 0,
              ran = 0;
  for (std::size_t id = 0; id < n; ++id) {
    const int r = model.runs[id].load();
    BOOST_TEST_REQUIRE(r <= 1, "request " << id << " ran " << r << " times");
    ran += static_cast<std::size_t>(r);
    const outcome got = t.of[id];
    BOOST_TEST_REQUIRE((got != outcome::wrong), "request " << id << " got a wrong answer");
    // A request has a value or the model's error exactly when the model ran it.
    const bool by_model = got == outcome::value || got == outcome::model_error;
    BOOST_TEST_REQUIRE(by_model == (r == 1),
                       "request " << id << ": outcome " << static_cast<int>(got) << ", ran " << r);
    values += got == outcome::value;
    model_errors += got == outcome::model_error;
    timeouts += got == outcome::timeout;
    cancelled += got == outcome::cancelled;
    stopped += got == outcome::stopped;
    rejected += got == outcome::rejected;
  }
  BOOST_TEST(s.run == ran);
  BOOST_TEST(s.failed == model_errors);
  BOOST_TEST(s.timed_out == timeouts);
  BOOST_TEST(s.cancelled == cancelled + stopped);
  BOOST_TEST(s.rejected == rejected);
  BOOST_TEST(s.submitted + s.rejected == n);
  BOOST_TEST(s.batches == model.batches.load());
  BOOST_TEST(values > 0u);
  // The first submission finds the batcher idle and its queue empty.
  if (caller_runs) BOOST_TEST(model.client_batches.load() > 0u);
  if (!caller_runs) BOOST_TEST(model.client_batches.load() == 0u);
  if (adaptive && !shutdown_while_submitting) BOOST_TEST(s.batch_size_cap < o.max_batch_size);
  if (mode == hs::shutdown_mode::drain) BOOST_TEST(stopped == 0u);
  BOOST_TEST_MESSAGE("values " << values << ", model errors " << model_errors << ", timeouts "
                               << timeouts << ", cancelled " << cancelled << ", stopped " << stopped
                               << ", rejected " << rejected << ", batches " << s.batches
                               << ", mean batch " << s.mean_batch_size << ", cap "
                               << s.batch_size_cap << ", batches in submit "
                               << model.client_batches.load());
}

}  // namespace

BOOST_AUTO_TEST_CASE(many_clients_every_request_answered_once_then_drain) {
  run_clients(hs::shutdown_mode::drain, false);
}

BOOST_AUTO_TEST_CASE(many_clients_with_the_adaptive_mode_every_request_answered_once) {
  run_clients(hs::shutdown_mode::drain, false, true);
}

BOOST_AUTO_TEST_CASE(shutdown_cancel_while_clients_submit_answers_every_request) {
  run_clients(hs::shutdown_mode::cancel, true);
}

BOOST_AUTO_TEST_CASE(shutdown_drain_while_clients_submit_answers_every_request) {
  run_clients(hs::shutdown_mode::drain, true);
}

BOOST_AUTO_TEST_CASE(the_dispatcher_forms_a_partial_batch_after_the_delay_by_itself) {
  struct echo {
    std::vector<int> infer(std::span<const int> b) { return {b.begin(), b.end()}; }
  } m;
  hs::dynamic_batcher<echo, int> b(m, {.max_batch_size = 64, .max_queue_delay = 1ms});
  auto h = b.submit(5);
  BOOST_TEST(h.get() == 5);  // one request, far below the cap: the delay forms its batch
  auto w = b.submit(6);      // the destructor drains what is queued
  BOOST_TEST(b.stats().submitted == 2u);
  (void)w;
}

BOOST_AUTO_TEST_CASE(destruction_drains_the_queue) {
  struct echo {
    std::vector<int> infer(std::span<const int> b) { return {b.begin(), b.end()}; }
  } m;
  std::vector<hs::request_handle<int>> hs_;
  {
    hs::dynamic_batcher<echo, int> b(m, {.max_batch_size = 64, .max_queue_delay = 1h});
    for (int i = 0; i < 10; ++i) hs_.push_back(b.submit(i));
  }
  for (int i = 0; i < 10; ++i) BOOST_TEST(hs_[static_cast<std::size_t>(i)].get() == i);
  BOOST_TEST(!hs_[0].cancel());  // the handle outlives the batcher
}

BOOST_AUTO_TEST_CASE(caller_runs_many_clients_every_request_answered_once_then_drain) {
  run_clients(hs::shutdown_mode::drain, false, false, true);
}

BOOST_AUTO_TEST_CASE(caller_runs_with_the_adaptive_mode_every_request_answered_once) {
  run_clients(hs::shutdown_mode::drain, false, true, true);
}

BOOST_AUTO_TEST_CASE(caller_runs_shutdown_cancel_while_clients_submit_answers_every_request) {
  run_clients(hs::shutdown_mode::cancel, true, false, true);
}

BOOST_AUTO_TEST_CASE(caller_runs_a_lone_client_runs_every_batch_itself_and_the_dispatcher_none) {
  struct where {
    std::thread::id client = std::this_thread::get_id();
    std::size_t elsewhere = 0;  // written by whichever thread runs a batch, read after shutdown
    std::vector<int> infer(std::span<const int> b) {
      if (std::this_thread::get_id() != client) ++elsewhere;
      return {b.begin(), b.end()};
    }
  } m;
  hs::dynamic_batcher<where, int> b(m, {.max_batch_size = 1, .caller_runs = true});
  for (int i = 0; i < 200; ++i) {
    auto h = b.submit(i);
    BOOST_TEST_REQUIRE((h.future().wait_for(0s) == std::future_status::ready));
    BOOST_TEST_REQUIRE(h.get() == i);
  }
  b.shutdown();
  BOOST_TEST(m.elsewhere == 0u);
  BOOST_TEST(b.stats().batches == 200u);
}

BOOST_AUTO_TEST_CASE(shutdown_waits_for_a_batch_running_in_a_clients_submit) {
  // The client's batch blocks in the model until released; meanwhile a second request queues
  // (a batch is running) and shutdown(drain) begins. shutdown() must return only after the
  // client's batch ended, with the queued request run by the dispatcher.
  struct gate {
    std::atomic<bool> entered{false}, release{false}, left{false};
    std::vector<std::pair<int, std::thread::id>> ran;  // one batch at a time writes it
    std::vector<int> infer(std::span<const int> b) {
      for (const int r : b) ran.emplace_back(r, std::this_thread::get_id());
      if (b.front() == 1) {
        entered = true;
        while (!release) std::this_thread::yield();
        left = true;
      }
      return {b.begin(), b.end()};
    }
  } m;
  hs::dynamic_batcher<gate, int> b(m, {.max_batch_size = 1, .caller_runs = true});
  std::atomic<int> got1{-1};
  std::thread::id client_id;
  std::thread client([&] { got1 = b.submit(1).get(); });
  client_id = client.get_id();
  while (!m.entered) std::this_thread::yield();
  auto h2 = b.submit(2);  // a batch runs: queued for the dispatcher
  BOOST_TEST(b.queued() == 1u);
  std::atomic<bool> returned{false}, left_before_return{false};
  std::thread stopper([&] {
    b.shutdown(hs::shutdown_mode::drain);
    left_before_return = m.left.load();
    returned = true;
  });
  std::this_thread::sleep_for(20ms);
  BOOST_TEST(!returned.load());  // the client's batch still runs
  m.release = true;
  client.join();
  stopper.join();
  BOOST_TEST(left_before_return.load());
  BOOST_TEST(got1.load() == 1);
  BOOST_TEST(h2.get() == 2);
  BOOST_TEST_REQUIRE(m.ran.size() == 2u);
  BOOST_TEST((m.ran[0].first == 1 && m.ran[0].second == client_id));
  BOOST_TEST((m.ran[1].first == 2 && m.ran[1].second != client_id &&
              m.ran[1].second != std::this_thread::get_id()));  // the dispatcher's
}
