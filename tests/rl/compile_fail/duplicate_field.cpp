// Two fields with one name are rejected with a sentence.
#include <hone/rl/transition.hpp>
using step = hone::transition<hone::field<"obs", float, 4>, hone::field<"obs", float>>;
int main() {
  return static_cast<int>(step::field_count);
}
