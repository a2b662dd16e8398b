// HONE_PROFILE_DISABLED (defined for this executable only): the macros leave no code. A function
// full of them is a constant expression (a zone object, with its clock reads and stores, could not
// be), their arguments are not evaluated, and nothing reaches a trace even while recording is on.
#define BOOST_TEST_MODULE hone_profile_disabled
#include <boost/test/unit_test.hpp>

#include <hone/profile.hpp>

#include "recording_sink.hpp"

#if !defined(HONE_PROFILE_DISABLED)
#error "test_disabled.cpp is built with HONE_PROFILE_DISABLED (tests/profile/CMakeLists.txt)"
#endif

namespace {
constexpr int instrumented(int x) {
  HONE_ZONE("outer");
  HONE_ZONE_NAMED(z, "named");
  HONE_COUNTER("counter", x);
  HONE_FLOW_BEGIN("flow", x);
  HONE_FLOW_END("flow", x);
  return x * 2;
}
static_assert(instrumented(21) == 42, "the profiling macros must leave no code when disabled");

int evaluated = 0;
[[maybe_unused]] int side_effect() {
  return ++evaluated;
}
}  // namespace

BOOST_AUTO_TEST_CASE(disabled_macros_record_and_evaluate_nothing) {
  hone::profile::collector c;
  c.discard();
  hone::profile::set_enabled(true);
  {
    HONE_ZONE("z");
    HONE_COUNTER("c", side_effect());
    BOOST_TEST(instrumented(1) == 2);
  }
  hone::profile::set_enabled(false);
  const auto r = drain(c);
  BOOST_TEST(r.events.empty());
  BOOST_TEST(evaluated == 0);
}
