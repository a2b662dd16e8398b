// Must not compile: a type claiming the offload role that is not hone's offload policy.
#include <hone/train/trainer.hpp>
#include <vector>
struct net {
  std::vector<float> w{0}, g{0};
  std::vector<hone::parameter<float>> parameters() { return {{"w", {1}, w, g}}; }
};
struct my_offload {
  using role = hone::roles::offload;
};
int main() {
  net n;
  hone::trainer t(n, my_offload{});
}
