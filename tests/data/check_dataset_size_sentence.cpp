// Must not compile: check_dataset names the missing size() in a sentence.
#include <cstddef>

#include <hone/data/dataset.hpp>
struct samples {
  [[nodiscard]] int get(std::size_t i) const { return static_cast<int>(i); }
};
static_assert(hone::data::check_dataset<samples>());
int main() {}
