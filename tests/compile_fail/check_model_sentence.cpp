// Must not compile: check_model states what to add as a sentence.
#include <hone/core/model.hpp>
struct net {
  float forward_backward(int, float) { return 0; }
};
static_assert(hone::check_model<net>());
int main() {}
