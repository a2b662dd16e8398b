// Must not compile: check_prediction_cache states what the output type lacks as a sentence.
#include <hone/serve/prediction_cache.hpp>
#include <memory>
struct logits {
  std::unique_ptr<float[]> values;  // not copyable, no codec
};
static_assert(hone::serve::check_prediction_cache<logits>());
int main() {}
