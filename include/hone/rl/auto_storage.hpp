// hone/rl/auto_storage.hpp: hone::auto_storage, the default storage policy of hone::replay_buffer.
// It picks, per transition type, at compile time:
//
//   hone::packed_storage  when the transition's packed record (hone::record_layout<T, true>: the
//                         fields at their natural alignment, CartPole's 42 bytes in 44) is at most
//                         auto_storage::packed_max_bytes (2048 bytes, 32 lines of 64 bytes);
//   hone::ring_storage    otherwise (one column per field).
//
// Why 2048 (docs/benchmarks.md, "Replay buffers", update "auto_storage"): sample(256) from 2^20
// items was faster on packed records at every record size measured, 44 to 2060 bytes (a sampled
// item costs its record's lines, where the columns cost at least one line per field): 1.7x for
// CartPole, 1.3-1.6x from 268 to 2060 bytes. add_batch is slower on packed records for tiny
// records (44-76 bytes: 1.5-2.8x as long, still above 25 GB/s) and at 2060 bytes (1.3-1.8x), about
// the same in between; an item is usually sampled many times for each time it is added, so the
// sample decides. 2048 is the edge of what was measured: beyond it the default keeps the columns,
// which also copy a large field in one run, give replay_buffer::for_each_column and save without
// gathering. Name hone::packed_storage or hone::ring_storage to choose yourself:
//
//   hone::replay_buffer<step, hone::prioritized<>> a(1 << 20);                       // auto
//   hone::replay_buffer<step, hone::ring_storage, hone::prioritized<>> b(1 << 20);   // columns
//
// Both storages give bit-identical batches, keys and weights, and save and load in one format.
#pragma once

#include <cstddef>
#include <type_traits>

#include "hone/core/config.hpp"
#include "hone/rl/field_layout.hpp"
#include "hone/rl/packed_storage.hpp"
#include "hone/rl/ring_storage.hpp"
#include "hone/rl/roles.hpp"
#include "hone/rl/transition.hpp"

HONE_NAMESPACE_BEGIN

/// Storage policy (the default): packed records for small transitions, columns for large ones
/// (see the top of this header).
struct auto_storage {
  using role = roles::replay_storage;
  /// The largest packed record (bytes, padding included) kept in hone::packed_storage.
  static constexpr std::size_t packed_max_bytes = 2048;
  /// The policy picked for Transition: hone::packed_storage or hone::ring_storage.
  template <class Transition>
  using policy_for =
      std::conditional_t<(record_layout<Transition, true>::bytes <= packed_max_bytes),
                         packed_storage, ring_storage>;
  template <class Transition>
  using storage_type = typename policy_for<Transition>::template storage_type<Transition>;
};

HONE_NAMESPACE_END
