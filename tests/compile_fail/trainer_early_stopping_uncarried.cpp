// Must not compile: early stopping with a checkpoint policy that does not say its checkpoints
// carry early stopping's state (a resumed run would silently lose its counters and best weights).
#include <hone/train/early_stopping.hpp>
#include <hone/train/trainer.hpp>
#include <vector>
struct net {
  std::vector<float> w{0}, g{0};
  std::vector<hone::parameter<float>> parameters() { return {{"w", {1}, w, g}}; }
};
struct my_checkpoints {  // saves in its own way, without early stopping's state
  using role = hone::roles::checkpoint;
  struct engine {
    explicit engine(const my_checkpoints& /*policy*/) {}
    template <class Trainer>
    void before_step(Trainer& /*t*/) {}
    template <class Trainer>
    void after_step(Trainer& /*t*/, const hone::step_report& /*r*/) {}
  };
};
int main() {
  net n;
  hone::trainer t(n, my_checkpoints{}, hone::early_stopping_policy{});
}
