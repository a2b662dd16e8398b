// Tests of hone::packed_storage (the in-memory ring of packed records) and of hone::auto_storage
// (the default storage: which storage it picks on each side of its threshold, at compile time),
// and of packed_storage: the record layout against
// hand-computed offsets (aligned and unaligned, generated and user-struct records), the bytes of
// the records against the records added, and, with the column ring (hone::ring_storage) as the
// reference, bit-identical batches, keys and weights for the same adds (single adds, batches,
// batches larger than the buffer, wraps) and seeds under the uniform, the prioritized (16-ary
// and binary), the n-step and the many_writers buffers; every slot read back identical too. Bad
// capacities are config_errors; read_field/write_field copy one field of a run of slots out and
// in, the same bytes from either storage, and refuse ranges outside the buffer with a sentence.
// Saving and loading packed buffers: test_rl_extra_replay_io. That for_each_column refuses a
// packed buffer is the compile-fail test cf_packed_for_each_column (packed_for_each_column.cpp).
#define BOOST_TEST_MODULE hone_rl_extra_packed_storage
#include <boost/test/unit_test.hpp>
#include <cstdint>
#include <cstring>
#include <hone/rl/packed_storage.hpp>
#include <hone/rl/replay_buffer.hpp>
#include <limits>
#include <string>
#include <vector>

#include "replay_test_common.hpp"

using namespace replay_test;

namespace {

// A user struct whose fields need padding when aligned.
struct odd_step {
  bool done;
  double value;
  std::int16_t code[3];
  char tag;
  float obs[2];
};
using odd =
    hone::transition<hone::member<"done", &odd_step::done>, hone::member<"value", &odd_step::value>,
                     hone::member<"code", &odd_step::code>, hone::member<"tag", &odd_step::tag>,
                     hone::member<"obs", &odd_step::obs>>;

// Aligned: done 0, value 8, code 16..22, tag 22, obs 24..32; stride 32 (double's 8).
using odd_aligned = hone::record_layout<odd, true>;
static_assert(odd_aligned::offset<0>() == 0 && odd_aligned::offset<1>() == 8 &&
              odd_aligned::offset<2>() == 16 && odd_aligned::offset<3>() == 22 &&
              odd_aligned::offset<4>() == 24 && odd_aligned::bytes == 32 &&
              odd_aligned::alignment == 8);
// Unaligned (mmap_storage's file records): 0, 1, 9, 15, 16; 24 bytes.
using odd_packed = hone::record_layout<odd, false>;
static_assert(odd_packed::offset<0>() == 0 && odd_packed::offset<1>() == 1 &&
              odd_packed::offset<2>() == 9 && odd_packed::offset<3>() == 15 &&
              odd_packed::offset<4>() == 16 && odd_packed::bytes == 24 && odd::bytes == 24);
// The common step: obs 0, action 16, reward 20, next_obs 24, terminated 40, truncated 41,
// discount 44; 48 bytes (46 of data).
using step_storage = hone::packed_records<step>;
static_assert(step_storage::layout::offset<0>() == 0 && step_storage::layout::offset<1>() == 16 &&
              step_storage::layout::offset<2>() == 20 && step_storage::layout::offset<3>() == 24 &&
              step_storage::layout::offset<4>() == 40 && step_storage::layout::offset<5>() == 41 &&
              step_storage::layout::offset<6>() == 44 && step_storage::stride == 48 &&
              step_storage::data_bytes == 48);
static_assert(hone::packed_records<odd>::stride == 32 &&
              hone::packed_records<odd>::data_bytes == 32);
using tail_bool = hone::transition<hone::field<"x", double>, hone::field<"done", bool>>;
static_assert(hone::packed_records<tail_bool>::stride == 16 &&
              hone::packed_records<tail_bool>::data_bytes == 9);

// hone::auto_storage (the default) picks packed records up to 2048 bytes a record, columns beyond.
static_assert(std::is_same_v<hone::replay_buffer<step>::storage_type, hone::packed_records<step>>);
static_assert(std::is_same_v<hone::replay_buffer<step, hone::prioritized<>>::storage_policy,
                             hone::auto_storage>);
static_assert(std::is_same_v<hone::replay_buffer<odd>::storage_type, hone::packed_records<odd>>);
using at_threshold = hone::transition<hone::field<"obs", float, 511>, hone::field<"reward", float>>;
using past_threshold = hone::transition<hone::field<"obs", float, 512>, hone::field<"done", bool>>;
static_assert(hone::record_layout<at_threshold, true>::bytes == 2048 &&
              hone::record_layout<past_threshold, true>::bytes == 2052);
static_assert(hone::auto_storage::packed_max_bytes == 2048);
static_assert(std::is_same_v<hone::replay_buffer<at_threshold>::storage_type,
                             hone::packed_records<at_threshold>>);
static_assert(std::is_same_v<hone::replay_buffer<past_threshold>::storage_type,
                             hone::ring_columns<past_threshold>>);
// Naming a storage overrides the default.
static_assert(std::is_same_v<hone::replay_buffer<step, hone::ring_storage>::storage_type,
                             hone::ring_columns<step>>);
static_assert(
    std::is_same_v<hone::replay_buffer<past_threshold, hone::packed_storage>::storage_type,
                   hone::packed_records<past_threshold>>);

odd_step odd_for(std::uint64_t key) {
  odd_step s{};
  s.done = key % 5 == 2;
  s.value = static_cast<double>(key) * 1.5 + 0.125;
  for (int i = 0; i < 3; ++i)
    s.code[i] = static_cast<std::int16_t>(key * 3 + static_cast<std::uint64_t>(i));
  s.tag = static_cast<char>('a' + key % 26);
  s.obs[0] = static_cast<float>(key);
  s.obs[1] = -static_cast<float>(key);
  return s;
}

template <class T>
typename T::record make_record(std::uint64_t key) {
  if constexpr (std::is_same_v<T, odd>) {
    return odd_for(key);
  } else {
    return record_for(key);
  }
}

template <class T>
bool same_records(const typename T::record& a, const typename T::record& b) {
  bool same = true;
  T::for_each_field([&](auto i) {
    using F = typename T::template field_at<i>;
    same =
        same && std::memcmp(T::template elements<i>(a), T::template elements<i>(b), F::bytes) == 0;
  });
  return same;
}

// Whether row r of a batch holds the record of its key (one-step buffers).
template <class T, class Batch>
bool row_is_key(const Batch& b, std::size_t r) {
  return same_records<T>(b.row(r), make_record<T>(b.keys()[r]));
}

// The same adds, samples and priority updates on a ring_storage buffer (the reference) and a
// packed_storage buffer: identical batches, keys and weights at every step, identical slots at
// the end. `one_step`: rows are also checked against the record of their key.
template <class T, class... Policies>
void check_same_as_ring(std::size_t cap, std::uint64_t total_adds, std::uint64_t seed,
                        const Policies&... policies) {
  using ring_t = hone::replay_buffer<T, hone::ring_storage, Policies...>;
  using packed_t = hone::replay_buffer<T, hone::packed_storage, Policies...>;
  static_assert(std::is_same_v<typename ring_t::storage_type, hone::ring_columns<T>>);
  static_assert(std::is_same_v<typename packed_t::storage_type, hone::packed_records<T>>);
  ring_t ring(cap, hone::ring_storage{}, policies...);
  packed_t packed(cap, hone::packed_storage{}, policies...);
  ring.seed(seed);
  packed.seed(seed);
  typename ring_t::batch_type a;
  typename packed_t::batch_type b;
  std::uint64_t next = 0;  // the key of the next step (its record is derived from it)
  const auto add_batch = [&](std::size_t n) {
    typename ring_t::batch_type rows(n);
    for (std::size_t r = 0; r < n; ++r) rows.set_row(r, make_record<T>(next + r));
    next += n;
    ring.add_batch(rows);
    packed.add_batch(rows);
  };
  bool same = true, rows_ok = true;
  int step_no = 0;
  while (next < total_adds) {
    if (step_no % 11 == 7) {
      add_batch(2 * cap + 3);  // more rows than slots: the first ones are skipped or overwritten
    } else if (step_no % 3 == 0) {
      add_batch(5 + static_cast<std::size_t>(step_no % 4));
    } else {
      for (int k = 0; k < 3; ++k, ++next) {
        ring.add(make_record<T>(next));
        packed.add(make_record<T>(next));
      }
    }
    ring.sample(24, a);
    packed.sample(24, b);
    same = same && replay_test::same_batch<T>(a, b);
    if constexpr (!ring_t::windowed) {
      for (std::size_t r = 0; r < b.size(); ++r) rows_ok = rows_ok && row_is_key<T>(b, r);
    }
    if constexpr (ring_t::is_prioritized) {
      std::vector<float> td(a.size());
      for (std::size_t r = 0; r < td.size(); ++r) {
        td[r] = static_cast<float>((a.keys()[r] * 2654435761u) % 1000) / 250.0f;
      }
      BOOST_TEST(ring.update_priorities(a.keys(), td) == packed.update_priorities(b.keys(), td));
    }
    ++step_no;
  }
  BOOST_TEST(same, "packed_storage sampled differently from ring_storage");
  BOOST_TEST(rows_ok, "a sampled row is not the record of its key");
  BOOST_TEST(packed.size() == ring.size());
  BOOST_TEST(packed.total_added() == ring.total_added());
  BOOST_TEST(packed.total_added() > 2 * cap);  // wrapped
  bool slots_same = true;
  for (std::size_t s = 0; s < cap; ++s) {
    typename T::record x{}, y{};
    ring.storage().read(s, x);
    packed.storage().read(s, y);
    slots_same = slots_same && same_records<T>(x, y);
  }
  BOOST_TEST(slots_same, "a slot of packed_storage differs from ring_storage's");
}

}  // namespace

BOOST_AUTO_TEST_CASE(records_hold_the_fields_at_their_offsets) {
  // Decoded with the hand-computed offsets above, not with the storage's layout.
  hone::replay_buffer<step, hone::packed_storage> b(8);
  for (std::uint64_t k = 0; k < 11; ++k) b.add(record_for(k));  // slot s holds key s or s + 8
  const std::span<const std::byte> bytes = b.storage().records();
  BOOST_TEST(bytes.size() == 8 * 48);
  BOOST_TEST(reinterpret_cast<std::uintptr_t>(bytes.data()) % 64 == 0);
  bool ok = true;
  for (std::size_t s = 0; s < 8; ++s) {
    const std::uint64_t key = s < 3 ? s + 8 : s;
    const record want = record_for(key);
    const std::byte* rec = bytes.data() + s * 48;
    float obs[4], next_obs[4], reward = 0, discount = 0;
    std::int32_t action = 0;
    std::memcpy(obs, rec, 16);
    std::memcpy(&action, rec + 16, 4);
    std::memcpy(&reward, rec + 20, 4);
    std::memcpy(next_obs, rec + 24, 16);
    std::memcpy(&discount, rec + 44, 4);
    ok = ok && std::memcmp(obs, hone::get<"obs">(want).data(), 16) == 0;
    ok = ok && action == hone::get<"action">(want) && reward == hone::get<"reward">(want);
    ok = ok && std::memcmp(next_obs, hone::get<"next_obs">(want).data(), 16) == 0;
    ok = ok && static_cast<bool>(rec[40]) == hone::get<"terminated">(want);
    ok = ok && static_cast<bool>(rec[41]) == hone::get<"truncated">(want);
    ok = ok && discount == hone::get<"discount">(want);
    ok = ok && rec[42] == std::byte{0} && rec[43] == std::byte{0};  // padding stays zero
  }
  BOOST_TEST(ok, "a record's bytes are not its fields at the expected offsets");
}

BOOST_AUTO_TEST_CASE(uniform_same_as_ring_storage) {
  check_same_as_ring<step>(64, 700, 3, hone::uniform{});
  check_same_as_ring<step>(1000, 2600, 4, hone::uniform{});
}

BOOST_AUTO_TEST_CASE(prioritized_same_as_ring_storage) {
  check_same_as_ring<step>(128, 900, 5,
                           hone::prioritized<>{.alpha = 0.7, .beta = 0.5, .beta_steps = 50});
  check_same_as_ring<step>(300, 1500, 6, hone::prioritized<2>{});
}

BOOST_AUTO_TEST_CASE(n_step_same_as_ring_storage) {
  // record_for's terminated every 7 keys ends episodes inside windows.
  check_same_as_ring<step>(100, 800, 7, hone::n_step<3>{.gamma = 0.9});
  check_same_as_ring<step>(100, 800, 8, hone::n_step<3>{.gamma = 0.9}, hone::prioritized<>{});
}

BOOST_AUTO_TEST_CASE(many_writers_same_as_ring_storage) {
  check_same_as_ring<step>(96, 700, 9, hone::many_writers{}, hone::prioritized<>{});
}

BOOST_AUTO_TEST_CASE(padded_user_struct_same_as_ring_storage) {
  check_same_as_ring<odd>(50, 400, 10, hone::uniform{});
  check_same_as_ring<odd>(50, 400, 11, hone::prioritized<4>{});
}

BOOST_AUTO_TEST_CASE(bad_capacities_are_config_errors) {
  BOOST_CHECK_EXCEPTION(hone::packed_records<step>(0), hone::config_error,
                        [](const hone::config_error& e) {
                          return contains_text(e.what(), "capacity must be positive");
                        });
  BOOST_CHECK_EXCEPTION(hone::packed_records<step>(std::numeric_limits<std::size_t>::max() / 8),
                        hone::config_error, [](const hone::config_error& e) {
                          return contains_text(e.what(), "overflows the addressable size");
                        });
}

BOOST_AUTO_TEST_CASE(read_field_and_write_field_move_one_field_of_a_run_of_slots) {
  hone::replay_buffer<step, hone::ring_storage> ring(10);
  hone::replay_buffer<step, hone::packed_storage> packed(10);
  for (std::uint64_t k = 0; k < 13; ++k) {  // wrapped: slot s holds key s + 10 for s < 3
    ring.add(record_for(k));
    packed.add(record_for(k));
  }
  // Field 2 ("reward", 4 bytes) of slots 1..4 from both storages: the records' values.
  std::vector<std::byte> a(4 * 4), b(4 * 4);
  ring.read_field(2, 1, a);
  packed.read_field(2, 1, b);
  BOOST_TEST((a == b));
  float rewards[4];
  std::memcpy(rewards, b.data(), sizeof rewards);
  for (std::size_t s = 1; s < 5; ++s) {
    const std::uint64_t key = s < 3 ? s + 10 : s;
    BOOST_TEST(rewards[s - 1] == hone::get<"reward">(record_for(key)));
  }
  // Field 3 ("next_obs", 16 bytes) of slots 7..9 written into the packed records, read back, and
  // the other fields of those slots and the neighbouring slots untouched.
  std::vector<std::byte> obs(3 * 16);
  for (std::size_t i = 0; i < obs.size(); ++i) obs[i] = static_cast<std::byte>(i + 1);
  packed.write_field(3, 7, obs);
  std::vector<std::byte> back(3 * 16);
  packed.read_field(3, 7, back);
  BOOST_TEST((back == obs));
  bool others_kept = true;
  for (std::size_t s = 0; s < 10; ++s) {
    record r{}, want = record_for(s < 3 ? s + 10 : s);
    packed.storage().read(s, r);
    if (s >= 7) {
      std::memcpy(hone::get<"next_obs">(want).data(), obs.data() + (s - 7) * 16, 16);
    }
    others_kept = others_kept && same_records<step>(r, want);
  }
  BOOST_TEST(others_kept, "write_field changed bytes outside its field and slots");
  // Out of range: a sentence, nothing copied.
  std::vector<std::byte> two(2 * 4);
  const auto refused = [](auto&& f, const std::string& part) {
    try {
      f();
    } catch (const hone::config_error& e) {
      return contains_text(e.what(), part);
    }
    return false;
  };
  BOOST_TEST(refused([&] { packed.read_field(7, 0, two); }, "field 7 does not exist"));
  BOOST_TEST(refused([&] { packed.read_field(2, 9, two); }, "within the capacity 10"));
  BOOST_TEST(refused([&] { ring.write_field(2, 0, std::span<const std::byte>(two).first(6)); },
                     "whole items of 4"));
}
