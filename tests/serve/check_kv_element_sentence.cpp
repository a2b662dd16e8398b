// Must not compile: a KV cache of doubles is refused with a sentence naming the element types.
#include <hone/serve/kv_cache.hpp>
int main() {
  hone::serve::kv_cache<double> cache({16, 1, 8}, 4);
  return static_cast<int>(cache.free_blocks());
}
