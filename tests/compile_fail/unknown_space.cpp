// Must not compile: a space without space_traits.
#include <hone/core/buffer.hpp>
struct my_space {};
int main() {
  hone::buffer<float, my_space> b(3);
}
