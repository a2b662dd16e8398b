// Must not compile: a loader over a type that is not a dataset says which member is missing.
#include <cstddef>
#include <vector>

#include <hone/data/loader.hpp>
struct samples {  // get(i) but no size()
  [[nodiscard]] int get(std::size_t i) const { return static_cast<int>(i); }
};
struct rows {
  std::vector<int> v;
};
int main() {
  const samples ds;
  const auto collate = [](rows& b, std::size_t row, int x) { b.v.at(row) = x; };
  hone::data::loader l(ds, rows{}, collate);
  (void)l.next();
}
