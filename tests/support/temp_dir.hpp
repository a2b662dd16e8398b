// tests/support/temp_dir.hpp: a fresh directory for one test, removed with its contents at the
// end of the scope. Named <temp>/hone-<tag>-<pid>-<n>, so parallel CTest runs and repeated uses
// in one process never collide.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

namespace hone_test {

class temp_dir {
 public:
  std::filesystem::path path;

  explicit temp_dir(std::string_view tag = "test") {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           ("hone-" + std::string(tag) + "-" + std::to_string(::getpid()) + "-" +
            std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;

  /// path / name
  std::filesystem::path operator/(const std::string& name) const { return path / name; }
};

}  // namespace hone_test
