// Shared pieces of the loader tests: small datasets in both forms of the dataset concept, a batch
// type, and a record of everything a run delivered (to compare runs bitwise, and with an oracle
// built from the sampler's epoch order by hand).
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <hone/data.hpp>

namespace loader_test {

namespace data = hone::data;

/// The view form: sample i is the value 1000 + 7 i (a throwing index throws).
struct numbers {
  std::size_t n = 0;
  std::uint64_t bad = ~std::uint64_t{0};  // this index throws
  [[nodiscard]] std::size_t size() const { return n; }
  [[nodiscard]] std::uint64_t get(std::size_t i) const {
    if (i == bad) throw std::runtime_error("record " + std::to_string(i) + " is damaged");
    return value(i);
  }
  [[nodiscard]] static std::uint64_t value(std::uint64_t i) { return 1000 + 7 * i; }
};

/// The buffer form: sample i is three values i, 2i, 3i written into the caller's vector.
struct triples {
  using buffer_type = std::vector<std::uint64_t>;
  std::size_t n = 0;
  [[nodiscard]] std::size_t size() const { return n; }
  void get(std::size_t i, buffer_type& out) const { out.assign({i, 2 * i, 3 * i}); }
};

/// A batch: one value per row (rows beyond the delivered ones keep stale values: the loader
/// reuses the storage).
struct batch {
  std::vector<std::uint64_t> v;
};

struct put {
  void operator()(batch& b, std::size_t row, std::uint64_t x) const { b.v.at(row) = x; }
};

/// What one delivered batch looked like, or an epoch's end (rows == ~0).
struct seen {
  std::uint64_t epoch = 0, index = 0, first = 0;
  std::size_t rows = 0, padded = 0;
  std::vector<std::uint64_t> indices, values;
  friend bool operator==(const seen&, const seen&) = default;
};

inline seen end_of_epoch() {
  seen s;
  s.rows = ~std::size_t{0};
  return s;
}

template <class Loader>
seen record(const data::loaded_batch<batch>* b) {
  if (b == nullptr) return end_of_epoch();
  seen s;
  s.epoch = b->info.epoch;
  s.index = b->info.index;
  s.first = b->info.first_position;
  s.rows = b->info.rows;
  s.padded = b->info.padded_rows;
  s.indices.assign(b->info.indices.begin(), b->info.indices.end());
  s.values.assign(b->data.v.begin(),
                  b->data.v.begin() + static_cast<std::ptrdiff_t>(b->info.padded_rows));
  return s;
}

/// `calls` calls of next(), recorded.
template <class Loader>
std::vector<seen> run(Loader& l, std::size_t calls) {
  std::vector<seen> out;
  for (std::size_t c = 0; c < calls; ++c) out.push_back(record<Loader>(l.next()));
  return out;
}

/// A transform that mixes the batch's generator into every row: the values then depend on
/// (seed, epoch, first position) and on nothing else.
inline void noisy(batch& b, const data::batch_info& info) {
  hone::replay_rng rng = info.rng();
  for (std::size_t r = 0; r < info.padded_rows; ++r) b.v[r] ^= rng() & 0xffff0000u;
}

/// The message of the hone::error that f throws ("" when it throws none).
template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const hone::error& e) {
    return e.what();
  }
  return "";
}

}  // namespace loader_test
