// Must not compile: check_sampler names the missing epoch_order() in a sentence.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include <hone/data/sampler.hpp>
struct every_other {
  // Not const, and named differently: not a sampler.
  void order(std::size_t n, std::vector<std::uint64_t>& out) {
    for (std::size_t i = 0; i < n; i += 2) out.push_back(i);
  }
  [[nodiscard]] std::string_view name() const { return "every-other"; }
};
static_assert(hone::data::check_sampler<every_other>());
int main() {}
