// Must not compile: two optimizers given to one trainer.
#include <hone/optim/sgd.hpp>
#include <hone/train/trainer.hpp>
#include <vector>
struct net {
  std::vector<float> w{0}, g{0};
  std::vector<hone::parameter<float>> parameters() { return {{"w", {1}, w, g}}; }
};
int main() {
  net n;
  hone::trainer<net, hone::adamw, hone::sgd> t(n, hone::adamw{}, hone::sgd{});
}
