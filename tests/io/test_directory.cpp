// Tests of hone/io/directory.hpp: the temporary siblings of atomic writers (their names, the pid
// in them, whether their writer is alive), removing trees and creating directories.
#include <boost/test/unit_test.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include <hone/io/directory.hpp>
#include <hone/io/file_io.hpp>

#include "io_helpers.hpp"

namespace io = hone::io;
namespace fs = std::filesystem;
using namespace io_test;

BOOST_AUTO_TEST_CASE(temp_siblings_carry_the_writer_pid) {
  const std::string pid = std::to_string(::getpid());
  BOOST_TEST(io::temp_sibling("run/step-000000007").string() == "run/.tmp-step-000000007-" + pid);
  BOOST_TEST(io::temp_sibling("run/replay", "old-").string() == "run/.tmp-old-replay-" + pid);
  BOOST_TEST(io::temp_sibling("replay").string() == "./.tmp-replay-" + pid);
  BOOST_TEST(io::temp_owner(io::temp_sibling("run/x").filename().string()) == ::getpid());
  BOOST_TEST(io::temp_owner(".tmp-step-000000001-4242") == 4242);
  BOOST_TEST(io::temp_owner(".tmp-x") == -1);
  BOOST_TEST(io::temp_owner(".tmp-x-12a") == -1);
  BOOST_TEST(io::temp_owner(".tmp-x-") == -1);
  BOOST_TEST(io::temp_owner("4242") == -1);
  // Only names temp_sibling() makes: a step number with no pid is no temporary of process 1
  // (init always runs, so a cleaner would keep such a name forever), nor are leading zeros, a
  // missing name before the pid, or another prefix.
  BOOST_TEST(io::temp_owner(".tmp-step-000000001") == -1);
  BOOST_TEST(io::temp_owner(".tmp-x-0") == -1);
  BOOST_TEST(io::temp_owner(".tmp-x-04242") == -1);
  BOOST_TEST(io::temp_owner(".tmp--4242") == -1);
  BOOST_TEST(io::temp_owner("step-4242") == -1);
  BOOST_TEST(io::temp_owner(".tmp-x-99999999999999999999999") == -1);
  BOOST_TEST(!io::temp_owner_alive(".tmp-step-000000001"));
}

BOOST_AUTO_TEST_CASE(temp_owner_alive_tells_live_writers_from_dead_ones) {
  // This process's own temporaries are not another live writer's.
  BOOST_TEST(!io::temp_owner_alive(io::temp_sibling("run/x").filename().string()));
  BOOST_TEST(io::process_alive(::getpid()));
  // A child that has exited and been reaped: its temporaries are leftovers.
  const pid_t child = ::fork();
  BOOST_REQUIRE(child >= 0);
  if (child == 0) ::_exit(0);
  int status = 0;
  BOOST_REQUIRE(::waitpid(child, &status, 0) == child);
  BOOST_TEST(!io::process_alive(child));
  BOOST_TEST(!io::temp_owner_alive(".tmp-step-000000001-" + std::to_string(child)));
  // A live process other than this one (the parent, which outlives this test).
  const std::string parent = ".tmp-step-000000001-" + std::to_string(::getppid());
  BOOST_TEST(io::temp_owner_alive(parent));
  BOOST_TEST(!io::temp_owner_alive(".tmp-replay"));  // no pid in the name
  BOOST_TEST(!io::process_alive(0));
  BOOST_TEST(!io::process_alive(-5));
}

BOOST_AUTO_TEST_CASE(remove_tree_and_ensure_directory) {
  temp_dir dir;
  io::ensure_directory(dir / "a" / "b" / "c");
  BOOST_TEST(fs::is_directory(dir / "a" / "b" / "c"));
  io::ensure_directory(dir / "a" / "b" / "c");  // exists already: fine
  io::write_file(dir / "a" / "b" / "f", "x");
  io::remove_tree(dir / "a");
  BOOST_TEST(!fs::exists(dir / "a"));
  io::remove_tree(dir / "a");  // absent: nothing to do
  io::write_file(dir / "file", "x");
  try {
    io::ensure_directory(dir / "file");
    BOOST_ERROR("a file where a directory should be was accepted");
  } catch (const hone::io_error& e) {
    BOOST_TEST(std::string(e.what()).find("file'") != std::string::npos, e.what());
  }
  BOOST_CHECK_THROW(io::ensure_directory(dir / "file" / "sub"), hone::io_error);
}
