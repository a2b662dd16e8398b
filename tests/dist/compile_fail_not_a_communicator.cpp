// Must not compile: a communicator without barrier(). The error must be check_communicator's
// sentence naming the missing member function.
#include <hone/dist/local_comm.hpp>

struct no_barrier : hone::dist::local_comm {
  void barrier() = delete;
};

static_assert(hone::dist::check_communicator<no_barrier>());

int main() {
  return 0;
}
