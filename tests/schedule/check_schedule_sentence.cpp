// Must not compile: check_schedule states what to add as a sentence.
#include <hone/schedule/schedule.hpp>
struct my_schedule {
  using role = hone::roles::schedule;
  void validate() const {}
};
static_assert(hone::check_schedule<my_schedule>());
int main() {}
