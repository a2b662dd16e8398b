// Tests of hone/offload on the CPU: the offload engine with the host transport against the plain
// host optimizer (fp32 / bf16 / fp16 working parameters, immediate and delayed update, buckets of
// several sizes, boundaries inside tensors): master weights, optimizer state and the parameters
// every forward/backward sees are bit-identical to the reference sequence. Also the order of the
// transfers, argument errors, the memory monitor (real RSS of a large mapping) and the batch-size
// finder on a fake memory limit.
#define BOOST_TEST_MODULE hone_offload
#include <boost/test/unit_test.hpp>

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <hone/core/error.hpp>
#include <hone/offload/batch_size_finder.hpp>
#include <hone/offload/memory_monitor.hpp>
#include <hone/offload/optimizer_to_host.hpp>
#include <hone/optim/param_group.hpp>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "problem.hpp"

namespace {

namespace ot = offload_test;
namespace off = hone::offload;

template <class Opt>
std::vector<std::vector<float>> state_tensors(const hone::optimizer_state_t<Opt>& s) {
  std::vector<std::vector<float>> out;
  s.for_each_tensor(
      [&](std::string_view, const auto& a) { out.emplace_back(a.all().begin(), a.all().end()); });
  return out;
}

/// Runs n steps through the engine and checks everything against the reference.
template <class Opt, class G, class W>
void check_engine(const Opt& opt, std::size_t bucket_bytes, bool delayed,
                  const std::vector<hone::param_group>& groups = {}, std::uint64_t n = 5) {
  BOOST_TEST_CONTEXT("bucket_bytes " << bucket_bytes << ", delayed " << delayed << ", G size "
                                     << sizeof(G) << ", W size " << sizeof(W)) {
    const auto l = ot::layout();
    hone::optimizer_state_t<Opt> ref_state(opt, l);
    std::vector<std::vector<W>> ref_seen;
    const auto ref_master =
        ot::reference<Opt, G, W>(opt, ref_state, l, n, delayed, groups, &ref_seen);

    off::engine<Opt, G, W> eng({.bucket_bytes = bucket_bytes, .delayed_update = delayed}, opt, l);
    const auto init = ot::initial(l);
    std::copy(init.begin(), init.end(), eng.master().all().begin());
    std::vector<W> dev_params(l.total());
    std::vector<G> dev_grads(l.total());
    eng.push_params(dev_params.data());
    for (std::uint64_t k = 1; k <= n; ++k) {
      BOOST_TEST(ot::same_bits(dev_params.data(), ref_seen[k - 1].data(), l.total()),
                 "parameters seen by forward/backward " << k);
      ot::backward(l, dev_params.data(), dev_grads.data(), k);
      eng.step(ot::args(k), dev_grads.data(), dev_params.data(), groups);
      BOOST_TEST(eng.pending() == delayed);
    }
    eng.flush(dev_params.data());
    BOOST_TEST(!eng.pending());
    BOOST_TEST(ot::same_bits(eng.master().all().data(), ref_master.data(), l.total()));
    const auto final_params = ot::cast<W>(ref_master);
    BOOST_TEST(ot::same_bits(dev_params.data(), final_params.data(), l.total()));
    const auto a = state_tensors<Opt>(eng.state());
    const auto b = state_tensors<Opt>(ref_state);
    BOOST_TEST_REQUIRE(a.size() == b.size());
    for (std::size_t t = 0; t < a.size(); ++t) {
      BOOST_TEST(ot::same_bits(a[t].data(), b[t].data(), a[t].size()), "state tensor " << t);
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(engine)

BOOST_AUTO_TEST_CASE(buckets_cut_the_arena) {
  const auto b = off::make_buckets(10, 8, 2);
  BOOST_TEST(b.size() == 3u);
  BOOST_TEST((b[0] == off::bucket_range{0, 4}));
  BOOST_TEST((b[2] == off::bucket_range{8, 10}));
  BOOST_TEST(off::make_buckets(0, 8, 4).empty());
  BOOST_TEST(off::make_buckets(10, 7, 4).size() == 10u);  // 1 element per bucket
  BOOST_CHECK_THROW(off::make_buckets(10, 0, 4), hone::config_error);
  BOOST_CHECK_THROW(off::make_buckets(10, 3, 4), hone::config_error);
}

BOOST_AUTO_TEST_CASE(fp32_matches_reference) {
  // 4 bytes: one element per bucket; 100 and 4096 bytes: boundaries inside tensors; 1 MiB: one.
  for (std::size_t bytes :
       {std::size_t{4}, std::size_t{100}, std::size_t{4096}, std::size_t{1} << 20}) {
    for (bool delayed : {false, true}) {
      check_engine<hone::adamw, float, float>(hone::adamw{}, bytes, delayed, {},
                                              bytes == 4 ? 3 : 5);
    }
  }
}

BOOST_AUTO_TEST_CASE(bf16_matches_reference) {
  for (std::size_t bytes :
       {std::size_t{2}, std::size_t{62}, std::size_t{3000}, std::size_t{1} << 20}) {
    for (bool delayed : {false, true}) {
      check_engine<hone::adamw, hone::bfloat16, hone::bfloat16>(
          hone::adamw{.weight_decay = 0.1f}, bytes, delayed, {}, bytes == 2 ? 3 : 5);
    }
  }
}

BOOST_AUTO_TEST_CASE(groups_amsgrad_half_and_sgd) {
  const auto l = ot::layout();
  const auto groups = hone::make_param_groups(
      l, {{hone::is_no_decay_name, 0.5f, 0.0f},
          {[](std::string_view n) { return n.starts_with("head."); }, 2.0f, 0.05f}});
  for (bool delayed : {false, true}) {
    check_engine<hone::adamw, hone::bfloat16, hone::bfloat16>(hone::adamw{.amsgrad = true}, 1000,
                                                              delayed, groups);
    check_engine<hone::adamw, hone::half, hone::half>(hone::adamw{}, 1000, delayed, groups);
    check_engine<hone::adamw, hone::bfloat16, float>(hone::adamw{}, 1000, delayed);
    check_engine<hone::sgd, float, hone::bfloat16>(hone::sgd{.momentum = 0.9f, .nesterov = true},
                                                   1000, delayed, groups);
  }
}

BOOST_AUTO_TEST_CASE(immediate_pipeline_order) {
  using rec = off::transfer_record;
  using k = rec::kind;
  hone::arena_layout l(sizeof(float));
  l.add("w", 10);  // 10 floats, buckets of 4: [0,4) [4,8) [8,10)
  off::engine<hone::adamw, float, float> eng({.bucket_bytes = 16}, hone::adamw{}, l);
  BOOST_TEST(eng.buckets().size() == 3u);
  std::vector<float> p(l.total()), g(l.total(), 0.25f);
  eng.push_params(p.data());
  eng.transport().clear_log();
  eng.step({.step = 1, .lr = 0.1f}, g.data(), p.data());
  const std::vector<rec> expected = {
      {k::to_host, 0, 16},     {k::to_host, 1, 16},       {k::to_host, 2, 8},
      {k::wait_to_host, 0, 0}, {k::wait_to_device, 0, 0}, {k::to_device, 0, 16},
      {k::wait_to_host, 1, 0}, {k::wait_to_device, 1, 0}, {k::to_device, 1, 16},
      {k::wait_to_host, 2, 0}, {k::wait_to_device, 2, 0}, {k::to_device, 2, 8}};
  BOOST_TEST((eng.transport().log() == expected));
  for (std::size_t i = 0; i < 10; ++i) BOOST_TEST(p[i] < 0.0f);  // moved against the gradient
}

BOOST_AUTO_TEST_CASE(delayed_update_order) {
  using k = off::transfer_record::kind;
  hone::arena_layout l(sizeof(float));
  l.add("w", 8);
  off::engine<hone::adamw, float, float> eng({.bucket_bytes = 16, .delayed_update = true},
                                             hone::adamw{}, l);
  std::vector<float> p(l.total(), 0.0f), g(l.total(), 1.0f);
  eng.push_params(p.data());
  eng.transport().clear_log();
  eng.step({.step = 1, .lr = 0.1f}, g.data(), p.data());
  // Update 1 is not on the device yet: the next forward/backward sees the old parameters.
  BOOST_TEST(p[0] == 0.0f);
  BOOST_TEST(eng.pending());
  eng.step({.step = 2, .lr = 0.1f}, g.data(), p.data());
  // Step 2's call first published update 1, then took step 2's gradients.
  BOOST_TEST(p[0] < 0.0f);
  const float after_one = p[0];
  eng.flush(p.data());
  BOOST_TEST(p[0] < after_one);
  const auto& log = eng.transport().log();
  // Step 1: to_host 0,1; job 1: (wait_to_host, wait_to_device) x 2; step 2: to_device 0,1 (update
  // 1) then to_host 0,1; job 2; flush: to_device 0,1.
  std::vector<k> kinds;
  for (const auto& r : log) kinds.push_back(r.what);
  const std::vector<k> expected = {
      k::to_host,      k::to_host,        k::wait_to_host, k::wait_to_device,
      k::wait_to_host, k::wait_to_device, k::to_device,    k::to_device,
      k::to_host,      k::to_host,        k::wait_to_host, k::wait_to_device,
      k::wait_to_host, k::wait_to_device, k::to_device,    k::to_device};
  BOOST_TEST((kinds == expected));
}

BOOST_AUTO_TEST_CASE(argument_errors) {
  const auto l = ot::layout();
  using eng_t = off::engine<hone::adamw, hone::bfloat16, hone::bfloat16>;
  BOOST_CHECK_THROW(eng_t({.bucket_bytes = 0}, hone::adamw{}, l), hone::config_error);
  BOOST_CHECK_THROW(eng_t({.bucket_bytes = 1}, hone::adamw{}, l), hone::config_error);
  BOOST_CHECK_THROW(eng_t({}, hone::adamw{.beta1 = 1.5f}, l), hone::config_error);
  for (bool delayed : {false, true}) {
    eng_t eng({.bucket_bytes = 64, .delayed_update = delayed}, hone::adamw{}, l);
    std::vector<hone::bfloat16> p(l.total()), g(l.total());
    BOOST_CHECK_THROW(eng.step({.step = 1, .lr = 0.1f}, nullptr, p.data()), hone::config_error);
    BOOST_CHECK_THROW(eng.step({.step = 1, .lr = 0.1f}, g.data(), nullptr), hone::config_error);
    // Bad arguments are reported by the call itself, in delayed mode too, and change nothing.
    BOOST_CHECK_THROW(eng.step({.step = 1, .lr = -1.0f}, g.data(), p.data()), hone::config_error);
    BOOST_CHECK_THROW(eng.step({.step = 0, .lr = 0.1f}, g.data(), p.data()), hone::config_error);
    BOOST_CHECK_THROW(eng.step({.step = 1, .lr = 0.1f}, g.data(), p.data(), {{.slots = {99}}}),
                      hone::config_error);
    BOOST_TEST(!eng.pending());
    BOOST_CHECK_THROW(eng.push_params(nullptr), hone::config_error);
    BOOST_CHECK_THROW(eng.flush(nullptr), hone::config_error);
  }
}

BOOST_AUTO_TEST_CASE(policy_plays_offload_role) {
  static_assert(hone::plays_role_v<off::optimizer_to_host, hone::roles::offload>);
  const off::optimizer_to_host p{};
  BOOST_TEST(p.bucket_bytes == (std::size_t{25} << 20));
  BOOST_TEST(!p.delayed_update);
}

BOOST_AUTO_TEST_SUITE_END()

// ---- memory monitor -----------------------------------------------------------------------------

namespace {
constexpr std::size_t mib = std::size_t{1} << 20;

/// An anonymous mapping of `bytes`, touched so it is resident, unmapped (RSS drops) on reset.
struct resident_block {
  void* p = nullptr;
  std::size_t bytes = 0;
  explicit resident_block(std::size_t n) : bytes(n) {
    p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    BOOST_TEST_REQUIRE(p != MAP_FAILED);
    std::memset(p, 1, n);
  }
  void reset() {
    if (p != nullptr) ::munmap(p, bytes);
    p = nullptr;
  }
  ~resident_block() { reset(); }
};

bool wait_until(const auto& cond) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}
}  // namespace

BOOST_AUTO_TEST_SUITE(monitor)

BOOST_AUTO_TEST_CASE(rss_is_read) {
  const std::size_t before = off::host_rss_bytes();
  BOOST_TEST(before > 0u);
  resident_block block(64 * mib);
  BOOST_TEST(off::host_rss_bytes() >= before + 48 * mib);
  const auto s = off::sample_memory();
  BOOST_TEST(s.host_rss > 0u);
  BOOST_TEST(s.device_used == 0u);  // host-only build
}

BOOST_AUTO_TEST_CASE(callbacks_fire_once_per_crossing) {
  off::memory_monitor mon({.interval = std::chrono::milliseconds(1)});
  // Boost.Test is not thread-safe: the callbacks (monitor thread) only record, checks run here.
  std::atomic<int> above{0}, below{0};
  std::atomic<std::size_t> rss_at_above{0};
  const std::size_t base = off::host_rss_bytes();
  const std::size_t level = base + 96 * mib;
  const std::size_t idx =
      mon.add_threshold({.what = off::memory_source::host_rss,
                         .bytes = level,
                         .on_above =
                             [&](const off::memory_sample& s) {
                               rss_at_above = s.host_rss;
                               ++above;
                             },
                         .on_below = [&](const off::memory_sample&) { ++below; },
                         .hysteresis_bytes = 48 * mib});
  resident_block block(256 * mib);
  BOOST_TEST(wait_until([&] { return above.load() == 1; }), "on_above fired by the thread");
  BOOST_TEST(rss_at_above.load() >= level);
  mon.sample_now();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // many samples above the level
  BOOST_TEST(above.load() == 1);
  BOOST_TEST(below.load() == 0);
  BOOST_TEST(mon.peak().host_rss >= base + 240 * mib);
  block.reset();
  BOOST_TEST(wait_until([&] { return below.load() == 1; }), "on_below fired after the free");
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  BOOST_TEST(below.load() == 1);
  BOOST_TEST(mon.times_above(idx) == 1u);
  BOOST_TEST(mon.times_below(idx) == 1u);
  BOOST_TEST(mon.latest().host_rss < level);
  // A second crossing fires again.
  resident_block again(256 * mib);
  mon.sample_now();
  BOOST_TEST(wait_until([&] { return above.load() == 2; }));
  mon.stop();
  mon.stop();  // idempotent
  BOOST_TEST(mon.samples() > 2u);
}

BOOST_AUTO_TEST_CASE(sample_now_is_synchronous) {
  // A long interval: only sample_now evaluates the threshold during the test.
  off::memory_monitor mon({.interval = std::chrono::hours(1)});
  int above = 0, below = 0;  // callbacks of sample_now run on this thread
  const std::size_t base = off::host_rss_bytes();
  mon.add_threshold({.bytes = base + 64 * mib,
                     .on_above = [&](const off::memory_sample&) { ++above; },
                     .on_below = [&](const off::memory_sample&) { ++below; }});
  mon.sample_now();
  BOOST_TEST(above == 0);
  {
    resident_block block(160 * mib);
    mon.sample_now();
    mon.sample_now();
    BOOST_TEST(above == 1);
  }
  mon.sample_now();
  BOOST_TEST(below == 1);
  BOOST_TEST(above == 1);
}

BOOST_AUTO_TEST_CASE(monitor_errors) {
  BOOST_CHECK_THROW(off::memory_monitor({.interval = std::chrono::microseconds(0)}),
                    hone::config_error);
  off::memory_monitor mon({.interval = std::chrono::milliseconds(5)});
  BOOST_CHECK_THROW(mon.add_threshold({.bytes = 0}), hone::config_error);
  BOOST_CHECK_THROW(mon.add_threshold({.bytes = 10, .hysteresis_bytes = 11}), hone::config_error);
}

BOOST_AUTO_TEST_SUITE_END()

// ---- batch-size finder --------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(batch_size)

BOOST_AUTO_TEST_CASE(finds_exact_limit) {
  for (std::size_t limit : {1u, 2u, 3u, 7u, 8u, 100u, 1000u, 1023u, 1024u, 1025u, 77777u}) {
    std::size_t calls = 0;
    const auto r = off::find_batch_size([&](std::size_t b) {
      ++calls;
      if (b > limit) throw hone::allocation_error("fake OOM", b * 1000);
    });
    BOOST_TEST_CONTEXT("limit " << limit) {
      BOOST_TEST(r.batch_size == limit);
      BOOST_TEST(r.trials.size() == calls);
      BOOST_TEST(static_cast<double>(r.trials.size()) <=
                 2.0 * std::log2(static_cast<double>(limit)) + 2.0);
      for (const auto& t : r.trials) {
        BOOST_TEST(t.fits == (t.batch_size <= limit));
        BOOST_TEST(t.error.empty() == t.fits);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(start_max_and_other_oom_kinds) {
  auto limit_at = [](std::size_t limit, int kind) {
    return [=](std::size_t b) {
      if (b <= limit) return;
      if (kind == 0) throw std::bad_alloc();
      throw hone::cuda_error("cudaMalloc failed: out of memory", off::cuda_out_of_memory_code);
    };
  };
  // Start above the limit: search below it.
  BOOST_TEST(off::find_batch_size(limit_at(10, 0), {.start = 64, .max = 1000}).batch_size == 10u);
  // The bound: everything fits up to max.
  auto r = off::find_batch_size(limit_at(5000, 1), {.start = 3, .max = 1000});
  BOOST_TEST(r.batch_size == 1000u);
  BOOST_TEST(r.trials.back().batch_size == 1000u);
  BOOST_TEST(off::find_batch_size(limit_at(700, 1), {.start = 3, .max = 1000}).batch_size == 700u);
  // Nothing fits.
  r = off::find_batch_size(limit_at(0, 0), {.start = 4, .max = 100});
  BOOST_TEST(r.batch_size == 0u);
  BOOST_TEST(r.trials.size() == 3u);  // 4, 2, 1
  BOOST_TEST(off::find_batch_size(limit_at(9, 0), {.start = 9, .max = 9}).batch_size == 9u);
}

BOOST_AUTO_TEST_CASE(other_exceptions_propagate) {
  BOOST_CHECK_THROW(off::find_batch_size([](std::size_t b) {
                      if (b > 4) throw std::runtime_error("not memory");
                    }),
                    std::runtime_error);
  BOOST_CHECK_THROW(off::find_batch_size([](std::size_t b) {
                      if (b > 4) throw hone::cuda_error("illegal address", 700);
                    }),
                    hone::cuda_error);
  BOOST_CHECK_THROW(off::find_batch_size([](std::size_t) {}, {.start = 0}), hone::config_error);
  BOOST_CHECK_THROW(off::find_batch_size([](std::size_t) {}, {.start = 8, .max = 4}),
                    hone::config_error);
}

BOOST_AUTO_TEST_SUITE_END()
