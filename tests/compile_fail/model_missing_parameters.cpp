// Must not compile: the concept check names the missing member, parameters.
#include <hone/core/model.hpp>
struct net {
  float forward_backward(int, float) { return 0; }
};
static_assert(hone::model<net>);
int main() {}
