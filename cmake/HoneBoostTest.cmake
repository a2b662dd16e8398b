# hone_link_boost_test(<target>): links Boost.Test's unit test framework into <target>, and defines
# BOOST_TEST_DYN_LINK only when that library is shared. Debian's Boost CMake package picks the shared
# library by default; Conan's and vcpkg's Boost are static by default, where BOOST_TEST_DYN_LINK
# would make the test module expect a main() that the static library already provides.
function(hone_link_boost_test target)
  target_link_libraries(${target} PRIVATE Boost::unit_test_framework)
  get_target_property(_type Boost::unit_test_framework TYPE)
  if(_type STREQUAL "UNKNOWN_LIBRARY")
    # An imported library of unknown kind: decide by its file name.
    get_target_property(_location Boost::unit_test_framework LOCATION)
    if(_location MATCHES "${CMAKE_SHARED_LIBRARY_SUFFIX}(\\.[0-9.]+)?$")
      set(_type SHARED_LIBRARY)
    endif()
  endif()
  # An INTERFACE target (Conan's CMakeDeps) carries the definitions its package sets for a shared
  # build; nothing is added to it here.
  if(_type STREQUAL "SHARED_LIBRARY")
    target_compile_definitions(${target} PRIVATE BOOST_TEST_DYN_LINK)
  endif()
endfunction()
