// Must not compile: the offload role with 8-bit AdamW (its block-quantized state cannot be cut
// into buckets).
#include <hone/offload/optimizer_to_host.hpp>
#include <hone/optim/adamw_8bit.hpp>
#include <hone/train/trainer.hpp>
#include <vector>
struct net {
  std::vector<float> w{0}, g{0};
  std::vector<hone::parameter<float>> parameters() { return {{"w", {1}, w, g}}; }
};
int main() {
  net n;
  hone::trainer t(n, hone::adamw_8bit{}, hone::offload::optimizer_to_host{});
}
