# FindxxHash: locates xxHash >= 0.8 (XXH3-128), which hone's checkpoints hash with. hone uses it
# header-only (XXH_INLINE_ALL), so only the headers are required. Defines xxHash_FOUND,
# xxHash_VERSION and the imported target xxHash::xxhash.
#  - vcpkg's xxhash port and Conan's xxhash package provide a CMake package (xxHash::xxhash):
#    it is used when found;
#  - Debian's libxxhash-dev ships only headers, libraries and a pkg-config file: the headers are
#    found here and wrapped in an INTERFACE target.
if(NOT TARGET xxHash::xxhash)
  find_package(xxHash CONFIG QUIET)
endif()
if(TARGET xxHash::xxhash)
  get_target_property(_xxhash_inc xxHash::xxhash INTERFACE_INCLUDE_DIRECTORIES)
  if(_xxhash_inc AND NOT xxHash_INCLUDE_DIR)
    list(GET _xxhash_inc 0 _xxhash_first)
    set(xxHash_INCLUDE_DIR "${_xxhash_first}" CACHE PATH "Directory holding xxhash.h")
  endif()
endif()
find_path(xxHash_INCLUDE_DIR xxhash.h HINTS ${xxHash_ROOT} $ENV{xxHash_ROOT} PATH_SUFFIXES include)
if(xxHash_INCLUDE_DIR AND EXISTS "${xxHash_INCLUDE_DIR}/xxhash.h")
  file(STRINGS "${xxHash_INCLUDE_DIR}/xxhash.h" _xxhash_ver
       REGEX "^#define XXH_VERSION_(MAJOR|MINOR|RELEASE) +[0-9]+")
  string(REGEX REPLACE ".*XXH_VERSION_MAJOR +([0-9]+).*" "\\1" _xxhash_major "${_xxhash_ver}")
  string(REGEX REPLACE ".*XXH_VERSION_MINOR +([0-9]+).*" "\\1" _xxhash_minor "${_xxhash_ver}")
  string(REGEX REPLACE ".*XXH_VERSION_RELEASE +([0-9]+).*" "\\1" _xxhash_release "${_xxhash_ver}")
  set(xxHash_VERSION "${_xxhash_major}.${_xxhash_minor}.${_xxhash_release}")
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(xxHash REQUIRED_VARS xxHash_INCLUDE_DIR VERSION_VAR xxHash_VERSION)
if(xxHash_FOUND AND NOT TARGET xxHash::xxhash)
  add_library(xxHash::xxhash INTERFACE IMPORTED)
  set_target_properties(xxHash::xxhash PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${xxHash_INCLUDE_DIR}")
endif()
mark_as_advanced(xxHash_INCLUDE_DIR)
unset(_xxhash_inc)
unset(_xxhash_first)
unset(_xxhash_ver)
