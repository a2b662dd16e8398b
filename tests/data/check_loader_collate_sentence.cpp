// Must not compile: a collate function that does not take (batch, row, sample) is named in a
// sentence.
#include <cstddef>
#include <string>
#include <vector>

#include <hone/data/loader.hpp>
struct samples {
  [[nodiscard]] std::size_t size() const { return 3; }
  [[nodiscard]] int get(std::size_t i) const { return static_cast<int>(i); }
};
struct rows {
  std::vector<int> v;
};
int main() {
  const samples ds;
  const auto collate = [](rows& b, const std::string& x) { b.v.push_back(int(x.size())); };
  hone::data::loader l(ds, rows{}, collate);
  (void)l.next();
}
