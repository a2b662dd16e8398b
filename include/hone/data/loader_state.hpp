// hone/data/loader_state.hpp: what a loader needs to resume mid-epoch exactly, and the error a
// bad sample raises.
//
// loader_state is small: the seed, the epoch, the position in the epoch's order (the number of
// entries consumed by all ranks together; sampler.hpp's header says what that means for a
// distributed run) and the count of skipped bad records, plus three checks: the dataset's size,
// the sampler's name and the generator's name. There is no hidden generator state to save: every
// random choice (the epoch's order, a batch transform's generator) is a pure function of the seed,
// the epoch and a position, so (seed, epoch, position) is the whole RNG state.
//
// In a hone checkpoint it travels in state.json's "data" object, which belongs to the data
// pipeline (checkpoint/state.hpp):
//
//   ck::training_state extra;
//   hone::data::save_loader_state(extra.data, loader.state());     // under "loader"
//   writer.save(step, [&](ck::snapshot& s) { ck::capture(trainer, s, extra); });
//   ...
//   const ck::training_state st = ck::restore(trainer, dir);
//   loader.restore(hone::data::load_loader_state(st.data));
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/data/sampler.hpp"
#include "hone/io/json.hpp"

HONE_NAMESPACE_BEGIN
namespace data {

/// A loader's resume state (header comment). A loader's state() after a batch counts that batch
/// as consumed: save it after the step that used the batch.
struct loader_state {
  std::uint64_t seed = 0;             // the seed of every random choice
  std::uint64_t epoch = 0;            // the epoch being read
  std::uint64_t position = 0;         // entries of the epoch's order consumed (all ranks together)
  std::uint64_t skipped = 0;          // bad records skipped so far (on_bad_record::skip)
  std::uint64_t dataset_size = 0;     // checked on restore: the same dataset
  std::string sampler;                // the sampler's name(): checked on restore
  std::string rng{sampler_rng_name};  // the generator: checked on restore

  friend bool operator==(const loader_state&, const loader_state&) = default;
};

/// The state as a JSON object (numbers exact: io::json keeps integers as their text).
[[nodiscard]] inline io::json::value to_json(const loader_state& s) {
  io::json::value o = io::json::value::object();
  o.set("seed", s.seed);
  o.set("epoch", s.epoch);
  o.set("position", s.position);
  o.set("skipped", s.skipped);
  o.set("dataset_size", s.dataset_size);
  o.set("sampler", s.sampler);
  o.set("rng", s.rng);
  return o;
}

/// Reads to_json()'s object; checkpoint_error naming `where` and the field when one is missing or
/// of the wrong kind.
[[nodiscard]] inline loader_state loader_state_from_json(const io::json::value& o,
                                                         std::string_view where = "loader state") {
  const std::string w(where);
  if (!o.is_object()) {
    throw checkpoint_error("hone::data: " + w + " is not a JSON object (" +
                           "write it with hone::data::to_json(loader_state))");
  }
  const auto field = [&](std::string_view name) -> const io::json::value& {
    const io::json::value* v = o.find(name);
    if (v == nullptr) {
      throw checkpoint_error("hone::data: " + w + " has no field \"" + std::string(name) +
                             "\"; it was not written by hone::data::to_json(loader_state)");
    }
    return *v;
  };
  loader_state s;
  try {
    s.seed = field("seed").as_u64();
    s.epoch = field("epoch").as_u64();
    s.position = field("position").as_u64();
    s.skipped = field("skipped").as_u64();
    s.dataset_size = field("dataset_size").as_u64();
    s.sampler = field("sampler").as_string();
    s.rng = field("rng").as_string();
  } catch (const checkpoint_error&) {
    throw;
  } catch (const error& e) {
    throw checkpoint_error("hone::data: " + w + ": " + e.what());
  }
  return s;
}

/// Puts `s` into `data` (a training_state's "data" object) under `key`.
inline void save_loader_state(io::json::value& data, const loader_state& s,
                              std::string_view key = "loader") {
  if (!data.is_object()) data = io::json::value::object();
  data.set(std::string(key), to_json(s));
}

/// Reads the state save_loader_state() put under `key` of `data`; checkpoint_error when absent.
[[nodiscard]] inline loader_state load_loader_state(const io::json::value& data,
                                                    std::string_view key = "loader") {
  const io::json::value* v = data.is_object() ? data.find(key) : nullptr;
  if (v == nullptr) {
    throw checkpoint_error("hone::data: the checkpoint's data state has no \"" + std::string(key) +
                           "\" entry; save it with hone::data::save_loader_state(extra.data, "
                           "loader.state()) before capturing the checkpoint");
  }
  return loader_state_from_json(*v, "the checkpoint's data." + std::string(key));
}

/// A sample a loader could not read or collate (or a batch whose transform failed), raised at the
/// consumer when it reaches that batch. The message names the sample index, the epoch and the
/// position, and the file and byte offset when the dataset knows them.
class sample_error : public error {
 public:
  sample_error(const std::string& what, std::uint64_t index, std::uint64_t epoch,
               std::uint64_t position, std::optional<std::uint64_t> file_offset)
      : error(what), index_(index), epoch_(epoch), position_(position), file_offset_(file_offset) {}
  /// The sample's index in the dataset.
  [[nodiscard]] std::uint64_t index() const noexcept { return index_; }
  [[nodiscard]] std::uint64_t epoch() const noexcept { return epoch_; }
  /// The sample's position in the epoch's order.
  [[nodiscard]] std::uint64_t position() const noexcept { return position_; }
  /// The record's byte offset in its file, for datasets with offset(i).
  [[nodiscard]] std::optional<std::uint64_t> file_offset() const noexcept { return file_offset_; }

 private:
  std::uint64_t index_, epoch_, position_;
  std::optional<std::uint64_t> file_offset_;
};

/// One bad record skipped under on_bad_record::skip.
struct skipped_record {
  std::uint64_t index = 0;  // the sample's index in the dataset
  std::uint64_t epoch = 0;
  std::uint64_t position = 0;  // its position in the epoch's order
  std::string message;         // what the dataset or collate function threw
};

}  // namespace data
HONE_NAMESPACE_END
