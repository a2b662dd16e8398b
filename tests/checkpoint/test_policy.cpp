// The checkpoint role of hone::trainer: every_n_steps saves after every N applied updates (never
// after a skipped one), applies retention, and a restore of its newest checkpoint reproduces the
// live run bit for bit.
#define BOOST_TEST_MODULE hone_checkpoint_policy
#include <boost/test/unit_test.hpp>

#include <unistd.h>
#include <cstring>
#include <filesystem>
#include <hone/checkpoint/directory.hpp>
#include <hone/checkpoint/policy.hpp>
#include <hone/train/trainer.hpp>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace fs = std::filesystem;
namespace ck = hone::checkpoint;

namespace {
struct batch {
  float x, y;
};
struct net {
  std::vector<float> w{0.5f, -0.25f}, g{0, 0};
  bool poison = false;
  std::vector<hone::parameter<float>> parameters() { return {{"w", {2}, w, g}}; }
  float forward_backward(const batch& b, float scale) {
    const float e = w[0] * b.x + w[1] - b.y;
    g[0] = 2 * e * b.x * scale;
    g[1] = poison ? std::numeric_limits<float>::quiet_NaN() : 2 * e * scale;
    return e * e;
  }
};

struct temp_root {
  fs::path path = fs::temp_directory_path() / ("hone_policy_" + std::to_string(::getpid()));
  temp_root() { fs::remove_all(path); }
  ~temp_root() { fs::remove_all(path); }
};

std::vector<std::uint64_t> steps_in(const fs::path& root) {
  std::vector<std::uint64_t> s;
  for (const auto& c : ck::list_checkpoints(root)) s.push_back(c.step);
  return s;
}
}  // namespace

static_assert(std::is_same_v<hone::trainer<net>::checkpoint_type, hone::no_checkpoint>);
static_assert(
    std::is_same_v<hone::trainer<net, ck::every_n_steps>::checkpoint_type, ck::every_n_steps>);

BOOST_AUTO_TEST_CASE(saves_every_n_applied_steps_with_retention) {
  for (bool async : {false, true}) {
    temp_root root;
    net model;
    hone::trainer t(model, hone::adamw{}, hone::constant_lr{.base_lr = 0.01},
                    ck::every_n_steps{.root = root.path,
                                      .every = 2,
                                      .writer = {.async = async, .retention = {{.keep_last = 2}}}});
    for (int i = 0; i < 5; ++i) t.step(batch{1.0f + float(i), 2.0f});
    // A skipped step (NaN gradient) does not count and does not save.
    model.poison = true;
    BOOST_TEST(t.step(batch{1, 1}).skipped);
    model.poison = false;
    t.step(batch{3, 1});  // the 6th applied update: saves step 6
    t.checkpointer().wait();
    BOOST_TEST((steps_in(root.path) == std::vector<std::uint64_t>{4, 6}), "async " << async);

    // The newest checkpoint restores a fresh trainer to exactly this state.
    net fresh;
    hone::trainer u(fresh, hone::adamw{}, hone::constant_lr{.base_lr = 0.01});
    const auto newest = ck::newest_valid(root.path, true);
    BOOST_REQUIRE(newest.has_value());
    ck::restore(u, newest->path);
    BOOST_TEST(u.steps_done() == 6u);
    BOOST_TEST(std::memcmp(u.master_weights().data(), t.master_weights().data(), 2 * 4) == 0);
    BOOST_TEST(std::memcmp(u.optimizer_state().exp_avg_sq().all().data(),
                           t.optimizer_state().exp_avg_sq().all().data(), 2 * 4) == 0);
    BOOST_TEST(u.scaler().state().skipped_steps == 1u);
  }
}

BOOST_AUTO_TEST_CASE(bad_configuration_is_a_sentence) {
  net model;
  BOOST_CHECK_THROW(hone::trainer(model, ck::every_n_steps{.every = 2}), hone::config_error);
  temp_root root;
  BOOST_CHECK_THROW(hone::trainer(model, ck::every_n_steps{.root = root.path, .every = 0}),
                    hone::config_error);
}
