// tests/support/error_text.hpp: the message of the exception a call throws, for tests that check
// hone's error sentences.
#pragma once

#include <exception>
#include <string>
#include <utility>

namespace hone_test {

/// The what() of the exception of type E that f() throws, or "(no error)" when it throws none.
/// Exceptions of other types propagate (the test case then fails naming them), so a check of the
/// sentence also checks the type.
template <class E = std::exception, class F>
std::string error_of(F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const E& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace hone_test
