// hone/checkpoint/policy.hpp: checkpointing as a trainer policy (role: checkpoint).
//
//   hone::trainer t(net, hone::adamw{}, hone::checkpoint::every_n_steps{
//                                          .root = "ckpt", .every = 500,
//                                          .writer = {.async = true,
//                                                     .retention = {{.keep_last = 3}}}});
//   ... t.step(batch) ...                      // saves after every 500th applied update
//   t.checkpointer().wait();                   // before exiting: the last async save's errors
//
// Saves happen after applied updates only (a skipped step never saves); the step number is the
// trainer's count of applied updates. An async writer's background error (full disk, ...) is
// rethrown by the next t.step(). What the trainer cannot know (the user's RNG states, the data
// position) comes from the optional `extra` callback, written into state.json.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "hone/checkpoint/state.hpp"
#include "hone/checkpoint/trainer_checkpoint.hpp"
#include "hone/checkpoint/writer.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/core/roles.hpp"
#include "hone/train/trainer.hpp"

HONE_NAMESPACE_BEGIN
namespace checkpoint {

class every_n_steps_engine;

/// Saves a checkpoint of the trainer after every `every` applied updates.
struct every_n_steps {
  using role = roles::checkpoint;
  using engine = every_n_steps_engine;
  /// Its checkpoints carry the early-stopping role's state (capture() saves it, restore() reads
  /// it).
  static constexpr bool carries_early_stopping = true;
  std::filesystem::path root{};
  std::uint64_t every = 1000;
  writer_options writer{};  // its root is replaced by `root`
  trainer_save_options save{};
  std::function<training_state()> extra{};  // RNG states, data position, metadata
};

/// The trainer-side object of every_n_steps: owns the checkpoint writer.
class every_n_steps_engine {
 public:
  explicit every_n_steps_engine(const every_n_steps& p) : policy_(p), writer_(options(p)) {}

  template <class Trainer>
  void before_step(Trainer& /*t*/) {
    writer_.check();
  }
  template <class Trainer>
  void after_step(Trainer& t, const step_report& r) {
    if (r.skipped || t.steps_done() % policy_.every != 0) return;
    const training_state extra = policy_.extra ? policy_.extra() : training_state{};
    writer_.save(t.steps_done(), [&](snapshot& s) { capture(t, s, extra, policy_.save); });
  }
  /// Blocks until no save is in flight; rethrows a background error.
  void wait() { writer_.wait(); }
  [[nodiscard]] checkpoint_writer& writer() noexcept { return writer_; }

 private:
  static writer_options options(const every_n_steps& p) {
    HONE_REQUIRE(!p.root.empty(),
                 "hone::checkpoint::every_n_steps: root is empty; give the run's checkpoint "
                 "directory");
    HONE_REQUIRE(p.every >= 1, "hone::checkpoint::every_n_steps: every must be at least 1");
    writer_options o = p.writer;
    o.root = p.root;
    return o;
  }
  every_n_steps policy_;
  checkpoint_writer writer_;
};

}  // namespace checkpoint
HONE_NAMESPACE_END
