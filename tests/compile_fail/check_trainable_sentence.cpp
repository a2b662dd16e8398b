// Must not compile: the model lists parameters but cannot compute gradients.
#include <hone/core/model.hpp>
#include <vector>
struct net {
  std::vector<hone::parameter<float>> parameters() { return {}; }
};
static_assert(hone::check_trainable<net, int>());
int main() {}
