// Must not compile: a buffer of std::string would memcpy non-trivial objects.
#include <hone/core/buffer.hpp>
#include <string>
int main() {
  hone::buffer<std::string> b(3);
}
