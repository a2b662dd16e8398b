// Prioritized replay under hone::many_writers with capacities that wrap every few adds: a priority
// update whose key was overwritten since it was sampled must be dropped, never land on the item
// that took the slot. The priorities make that visible: alpha = 1 and epsilon = 0 store the raw
// value itself, every key gets its own raw value (value_of, distinct over 2^22 keys, 0 for some),
// and the insertion priority (1e9) is above every update so the running maximum never moves. In
// every consistent snapshot (with_snapshot: no write in flight), each published slot then holds
// 1e9 or value_of(its own key), nothing else. Four writers (single adds and batches of 1 to
// capacity + 3 rows) race one learner that samples, checks the keys it gets, and sends its updates
// some samples late. Every tree arity (2, 4, 16) and both in-memory storages. Built and run under
// ThreadSanitizer too. It caught with_snapshot running while a reserved key still waited for its
// slot: the slot then showed the item one lap older, with that item's priority, under the
// newcomer's key (and a buffer saved there restores it so).
#define BOOST_TEST_MODULE hone_per_stress
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <hone/rl/packed_storage.hpp>
#include <hone/rl/replay_buffer.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../support/sanitizers.hpp"

namespace {

constexpr std::size_t sample_calls = hone_test::under_tsan ? 2000 : 20000;
constexpr std::size_t writers = 4;
constexpr double insertion = 1e9;        // initial_priority: above every update value
constexpr std::size_t batch_size = 16;   // rows per sample
constexpr std::size_t delay = 3;         // updates go out this many samples after their sample
constexpr std::size_t check_every = 16;  // samples between snapshot checks

using step = hone::transition<hone::field<"id", std::uint64_t>, hone::field<"obs", float, 3>>;

// The raw priority the learner sends for `key`: exact in float, distinct over 2^22 consecutive
// keys except that one key in 5 gets 0 (a zero-priority item must never be sampled).
float value_of(std::uint64_t key) {
  return key % 5 == 0 ? 0.0f : static_cast<float>(key % (std::uint64_t{1} << 22) + 1);
}

step::record make(std::uint64_t id) {
  step::record r{};
  hone::get<"id">(r) = id;
  for (std::size_t k = 0; k < 3; ++k) hone::get<"obs">(r)[k] = static_cast<float>(id % 1000 + k);
  return r;
}

struct findings {
  std::size_t snapshots = 0;
  std::size_t slots_checked = 0;
  std::size_t wrong_priority = 0;  // a slot holding neither 1e9 nor value_of(its key)
  std::size_t bad_keys = 0;        // a sampled key that names no stored item of that slot
  std::size_t updates = 0;         // update entries sent
  std::size_t applied = 0;         // ... of which the buffer applied
  std::string first;               // the first wrong slot, described
};

// Every published slot's priority against its key (call with no write in flight).
template <class Buffer>
void check_slots(Buffer& buffer, findings& f) {
  buffer.with_snapshot([&](const hone::replay_state& s) {
    const std::size_t cap = buffer.capacity();
    const std::uint64_t written = s.written;
    const auto priorities = buffer.priorities();
    const std::size_t filled = written < cap ? static_cast<std::size_t>(written) : cap;
    ++f.snapshots;
    for (std::size_t slot = 0; slot < filled; ++slot) {
      // The newest key of this slot's residue below `written`.
      const std::uint64_t back = ((written - 1) % cap + cap - slot) % cap;
      const std::uint64_t key = written - 1 - back;
      const float p = priorities[slot];
      ++f.slots_checked;
      if (p != static_cast<float>(insertion) && p != value_of(key)) {
        if (f.wrong_priority == 0) {
          std::ostringstream m;
          m << "slot " << slot << " (key " << key << ", written " << written << ") has priority "
            << p << ", not " << static_cast<float>(insertion) << " or " << value_of(key);
          for (std::uint64_t lap = 1; lap <= 8 && lap * cap <= key; ++lap) {
            if (p == value_of(key - lap * cap))
              m << " (the value of key " << key - lap * cap << ")";
          }
          f.first = m.str();
        }
        ++f.wrong_priority;
      }
    }
  });
}

template <class Buffer>
findings hammer(std::size_t capacity) {
  using sampler_cfg = typename Buffer::sampler_policy;
  Buffer buffer(capacity, sampler_cfg{.alpha = 1.0, .epsilon = 0.0, .initial_priority = insertion},
                hone::many_writers{}, typename Buffer::storage_policy{});
  findings f;
  std::atomic<bool> go{false};
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> added{0};
  std::vector<std::thread> threads;
  for (std::size_t w = 0; w < writers; ++w) {
    threads.emplace_back([&, w] {
      while (!go.load()) std::this_thread::yield();
      std::uint64_t id = w << 40;
      if (w % 2 == 0) {
        while (!stop.load()) {
          buffer.add(make(id++));
          added.fetch_add(1);
        }
      } else {
        hone::replay_batch<step> in;
        for (std::size_t k = 0; !stop.load(); ++k) {
          const std::size_t n = k % (capacity + 3) + 1;
          in.resize(n);
          for (std::size_t r = 0; r < n; ++r) in.set_row(r, make(id++));
          buffer.add_batch(in);
          added.fetch_add(n);
        }
      }
    });
  }
  std::thread learner([&] {
    hone::replay_batch<step> b;
    // Keys waiting for their late update, with total_added() when they were sampled.
    std::deque<std::pair<std::vector<std::uint64_t>, std::uint64_t>> pending;
    std::vector<float> values;
    const auto send = [&](const std::vector<std::uint64_t>& keys) {
      values.resize(keys.size());
      for (std::size_t r = 0; r < keys.size(); ++r) values[r] = value_of(keys[r]);
      f.updates += keys.size();
      f.applied += buffer.update_priorities(keys, values);
    };
    go.store(true);
    for (std::size_t samples = 0; samples < sample_calls;) {
      if (buffer.size() == 0) {
        std::this_thread::yield();
        continue;
      }
      try {
        buffer.sample(batch_size, b);
      } catch (const hone::error&) {
        continue;  // every slot is being rewritten or has priority 0 at this instant
      }
      const std::uint64_t written = buffer.total_added();
      for (std::size_t r = 0; r < b.size(); ++r) {
        const std::uint64_t key = b.keys()[r];
        // A real key (not the mark of a slot being written), of this slot, issued already.
        if (key >= written || key % capacity != b.slots()[r]) ++f.bad_keys;
      }
      pending.emplace_back(std::vector<std::uint64_t>(b.keys().begin(), b.keys().end()), written);
      if (samples % 2 == 0) {
        send(pending.back().first);  // at once, as well as late (a key updated twice)
      }
      if (pending.size() > delay) {
        // Every 64th late update waits until the writers have completed two laps of adds
        // since its sample, so its keys' slots were rewritten: stale updates are certain, also
        // when a loaded machine leaves the writers no time between a sample and its update
        // (without this wait, a run where every update happened to be applied could not show
        // that stale ones are dropped). It reads the test's own counter of completed adds, not
        // the buffer, so that the wait does not contend for the buffer's lock.
        if (samples % 64 == 0) {
          const std::uint64_t laps = pending.front().second + 2 * capacity;
          while (added.load() < laps) std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
        send(pending.front().first);
        pending.pop_front();
      }
      if (++samples % check_every == 0) check_slots(buffer, f);
    }
    stop.store(true);
    while (!pending.empty()) {
      send(pending.front().first);
      pending.pop_front();
    }
  });
  learner.join();
  for (auto& t : threads) t.join();
  BOOST_TEST(buffer.total_added() == added.load());
  check_slots(buffer, f);
  return f;
}

template <class Buffer>
void run(const char* name) {
  for (const std::size_t capacity : {std::size_t{5}, std::size_t{13}, std::size_t{64}}) {
    const findings f = hammer<Buffer>(capacity);
    BOOST_TEST_MESSAGE(name << " capacity " << capacity << ": " << f.updates << " update entries ("
                            << f.applied << " applied), " << f.snapshots << " snapshots, "
                            << f.slots_checked << " slots checked, " << f.wrong_priority
                            << " wrong priorities, " << f.bad_keys << " bad keys");
    BOOST_TEST_INFO(name << " capacity " << capacity << ": " << f.first);
    BOOST_TEST(f.wrong_priority == 0u);
    BOOST_TEST_INFO(name << " capacity " << capacity);
    BOOST_TEST(f.bad_keys == 0u);
    BOOST_TEST(f.applied > 0u);
    BOOST_TEST(f.applied < f.updates);  // some updates were stale: the race was exercised
  }
}

template <std::size_t Arity, class Storage>
using per_buffer = hone::replay_buffer<step, hone::prioritized<Arity>, hone::many_writers, Storage>;

}  // namespace

BOOST_AUTO_TEST_CASE(binary_tree_ring_storage) {
  run<per_buffer<2, hone::ring_storage>>("prioritized<2>, ring_storage");
}
BOOST_AUTO_TEST_CASE(binary_tree_packed_storage) {
  run<per_buffer<2, hone::packed_storage>>("prioritized<2>, packed_storage");
}
BOOST_AUTO_TEST_CASE(four_ary_tree_ring_storage) {
  run<per_buffer<4, hone::ring_storage>>("prioritized<4>, ring_storage");
}
BOOST_AUTO_TEST_CASE(four_ary_tree_packed_storage) {
  run<per_buffer<4, hone::packed_storage>>("prioritized<4>, packed_storage");
}
BOOST_AUTO_TEST_CASE(sixteen_ary_tree_ring_storage) {
  run<per_buffer<16, hone::ring_storage>>("prioritized<16>, ring_storage");
}
BOOST_AUTO_TEST_CASE(sixteen_ary_tree_packed_storage) {
  run<per_buffer<16, hone::packed_storage>>("prioritized<16>, packed_storage");
}
