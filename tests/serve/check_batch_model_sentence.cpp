// Must not compile: check_batch_model states what the model lacks as a sentence.
#include <hone/serve/batcher.hpp>
#include <span>
#include <vector>
struct net {
  std::vector<float> forward(std::span<const float> batch);
};
static_assert(hone::serve::check_batch_model<net, float>());
int main() {}
