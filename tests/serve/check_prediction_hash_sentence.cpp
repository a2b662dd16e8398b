// Must not compile: check_prediction_cache states what the hash policy lacks as a sentence.
#include <cstddef>
#include <hone/serve/prediction_cache.hpp>
#include <span>
struct md5_like {
  unsigned operator()(std::span<const std::byte> input) const;  // no version, 32 bits
};
static_assert(hone::serve::check_prediction_cache<int, md5_like>());
int main() {}
