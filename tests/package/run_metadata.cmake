# Package test driver: the packaging files agree with the build. Versions in the vcpkg manifests
# match project(hone VERSION ...), their homepage and the Conan recipe's match its HOMEPAGE_URL;
# both say the platform (vcpkg "supports": "linux", Conan's validate()); every HONE_* option the
# vcpkg port sets exists in CMakeLists.txt; the files the recipes ship exist.
#   cmake -DHONE_SOURCE_DIR=... -DHONE_VERSION=x.y.z -P run_metadata.cmake
cmake_minimum_required(VERSION 3.25)

set(_errors "")
file(READ "${HONE_SOURCE_DIR}/CMakeLists.txt" _cmakelists)
if(NOT _cmakelists MATCHES "project\\(hone[^)]*HOMEPAGE_URL \"([^\"]+)\"")
  list(APPEND _errors "CMakeLists.txt: project(hone ...) has no HOMEPAGE_URL")
endif()
set(_homepage "${CMAKE_MATCH_1}")

foreach(_manifest IN ITEMS ports/hone/vcpkg.json vcpkg.json)
  file(READ "${HONE_SOURCE_DIR}/${_manifest}" _json)
  string(JSON _version ERROR_VARIABLE _err GET "${_json}" version-semver)
  if(_err)
    list(APPEND _errors "${_manifest}: no version-semver (${_err})")
  elseif(NOT _version STREQUAL HONE_VERSION)
    list(APPEND _errors
         "${_manifest}: version-semver ${_version}, CMakeLists.txt says ${HONE_VERSION}")
  endif()
  string(JSON _value ERROR_VARIABLE _err GET "${_json}" homepage)
  if(NOT _value STREQUAL _homepage)
    list(APPEND _errors "${_manifest}: homepage '${_value}', CMakeLists.txt says '${_homepage}'")
  endif()
  string(JSON _value ERROR_VARIABLE _err GET "${_json}" supports)
  if(NOT _value STREQUAL "linux")
    list(APPEND _errors "${_manifest}: \"supports\" is '${_value}', not 'linux' (docs/install.md)")
  endif()
endforeach()

file(READ "${HONE_SOURCE_DIR}/conanfile.py" _recipe)
if(NOT _recipe MATCHES "homepage = \"${_homepage}\"")
  list(APPEND _errors "conanfile.py: its homepage is not '${_homepage}' (CMakeLists.txt)")
endif()
foreach(_needed IN ITEMS "def layout(self)" "url = " "self.settings.os != \"Linux\""
                         "set_property(\"cmake_file_name\", \"hone\")"
                         "set_property(\"cmake_target_name\", \"hone::all\")")
  string(FIND "${_recipe}" "${_needed}" _at)
  if(_at EQUAL -1)
    list(APPEND _errors "conanfile.py lacks '${_needed}'")
  endif()
endforeach()
# The Conan package's root target must be one hone's own CMake package defines too.
file(READ "${HONE_SOURCE_DIR}/cmake/honeConfig.cmake.in" _config)
string(FIND "${_config}" "add_library(hone::all INTERFACE IMPORTED)" _at)
if(_at EQUAL -1)
  list(APPEND _errors "cmake/honeConfig.cmake.in does not define hone::all (Conan's root target)")
endif()

file(READ "${HONE_SOURCE_DIR}/ports/hone/portfile.cmake" _portfile)
string(REGEX MATCHALL "HONE_[A-Z_]+" _port_vars "${_portfile}")
list(REMOVE_DUPLICATES _port_vars)
foreach(_var IN LISTS _port_vars)
  if(NOT _cmakelists MATCHES "${_var}")
    list(APPEND _errors "ports/hone/portfile.cmake sets ${_var}, unknown to CMakeLists.txt")
  endif()
endforeach()

foreach(_file IN ITEMS LICENSE cmake/FindNCCL.cmake cmake/FindxxHash.cmake cmake/honeConfig.cmake.in
                       tools/CMakeLists.txt ports/hone/usage
                       test_package/conanfile.py
                       packaging/conan/profiles/debian12)
  if(NOT EXISTS "${HONE_SOURCE_DIR}/${_file}")
    list(APPEND _errors "${_file} is missing")
  endif()
endforeach()

if(_errors)
  list(JOIN _errors "\n  " _errors)
  message(FATAL_ERROR "packaging metadata:\n  ${_errors}")
endif()
message(STATUS "packaging metadata consistent with hone ${HONE_VERSION}")
