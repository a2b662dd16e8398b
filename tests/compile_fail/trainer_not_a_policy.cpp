// Must not compile: a plain type passed where a policy is expected.
#include <hone/train/trainer.hpp>
#include <vector>
struct net {
  std::vector<float> w{0}, g{0};
  std::vector<hone::parameter<float>> parameters() { return {{"w", {1}, w, g}}; }
};
struct learning_rate {
  double value = 0.1;
};
int main() {
  net n;
  hone::trainer t(n, learning_rate{});
}
