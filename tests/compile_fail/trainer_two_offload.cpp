// Must not compile: two offload policies given to one trainer.
#include <hone/offload/optimizer_to_host.hpp>
#include <hone/train/trainer.hpp>
#include <vector>
struct net {
  std::vector<float> w{0}, g{0};
  std::vector<hone::parameter<float>> parameters() { return {{"w", {1}, w, g}}; }
};
int main() {
  net n;
  hone::trainer t(n, hone::offload::optimizer_to_host{},
                  hone::offload::optimizer_to_host{.delayed_update = true});
}
