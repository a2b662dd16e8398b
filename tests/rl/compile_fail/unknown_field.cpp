// A misspelt field name is a compile error that says so.
#include <hone/rl/batch.hpp>
using step = hone::transition<hone::field<"obs", float, 4>, hone::field<"reward", float>>;
int main() {
  hone::replay_batch<step> b(1);
  return static_cast<int>(b.get<"obz">().size());
}
