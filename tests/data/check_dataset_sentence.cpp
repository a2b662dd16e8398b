// Must not compile: check_dataset names the missing get() in a sentence.
#include <cstddef>

#include <hone/data/dataset.hpp>
struct samples {
  [[nodiscard]] std::size_t size() const { return 3; }
  int get(std::size_t i) { return static_cast<int>(i); }  // not const
};
static_assert(hone::data::check_dataset<samples>());
int main() {}
