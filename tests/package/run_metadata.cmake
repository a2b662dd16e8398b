# Package test driver: the packaging files agree with the build. Versions in the vcpkg manifests
# match project(hone VERSION ...); the vcpkg manifests' homepage and the Conan recipe's
# homepage/url are CMakeLists.txt's HOMEPAGE_URL, or absent when project() has none (no packaging
# file may name an address of its own); both say the platform (vcpkg "supports": "linux", Conan's
# validate()); every component hone's CMake package knows is a vcpkg feature and a Conan option;
# every HONE_* option the vcpkg port sets exists in CMakeLists.txt; the files the recipes ship
# exist.
#   cmake -DHONE_SOURCE_DIR=... -DHONE_VERSION=x.y.z -P run_metadata.cmake
cmake_minimum_required(VERSION 3.25)

set(_errors "")
file(READ "${HONE_SOURCE_DIR}/CMakeLists.txt" _cmakelists)
set(_homepage "")
if(_cmakelists MATCHES "project\\(hone[^)]*HOMEPAGE_URL \"([^\"]+)\"")
  set(_homepage "${CMAKE_MATCH_1}")
endif()

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
  if(_err)
    set(_value "")
  endif()
  if(NOT _value STREQUAL _homepage)
    list(APPEND _errors "${_manifest}: homepage '${_value}', CMakeLists.txt's HOMEPAGE_URL is "
                        "'${_homepage}' (give both the same address, or neither)")
  endif()
  string(JSON _value ERROR_VARIABLE _err GET "${_json}" supports)
  if(NOT _value STREQUAL "linux")
    list(APPEND _errors "${_manifest}: \"supports\" is '${_value}', not 'linux' (docs/install.md)")
  endif()
endforeach()

file(READ "${HONE_SOURCE_DIR}/conanfile.py" _recipe)
foreach(_attribute IN ITEMS homepage url)
  if(_recipe MATCHES "\n    ${_attribute} = \"([^\"]*)\"")
    set(_value "${CMAKE_MATCH_1}")
  elseif(_recipe MATCHES "\n    ${_attribute} = homepage")
    set(_value "${_homepage}")
  elseif(_recipe MATCHES "\n    ${_attribute} = ")
    set(_value "<not a plain string>")
  else()
    set(_value "")
  endif()
  if(NOT _value STREQUAL _homepage)
    list(APPEND _errors "conanfile.py: ${_attribute} '${_value}', CMakeLists.txt's HOMEPAGE_URL "
                        "is '${_homepage}' (give both the same address, or neither)")
  endif()
endforeach()
# Every component of hone's CMake package is offered by both package managers.
file(READ "${HONE_SOURCE_DIR}/cmake/honeConfig.cmake.in" _config)
if(NOT _config MATCHES "set\\(_hone_known_components ([^)]+)\\)")
  list(APPEND _errors "cmake/honeConfig.cmake.in: no set(_hone_known_components ...)")
endif()
string(REPLACE " " ";" _components "${CMAKE_MATCH_1}")
file(READ "${HONE_SOURCE_DIR}/ports/hone/vcpkg.json" _port_json)
file(READ "${HONE_SOURCE_DIR}/ports/hone/portfile.cmake" _portfile)
foreach(_component IN LISTS _components)
  string(TOUPPER "${_component}" _upper)
  if(NOT _portfile MATCHES "\n +${_component} +HONE_ENABLE_${_upper}\n")
    list(APPEND _errors "ports/hone/portfile.cmake: vcpkg_check_features does not map the feature "
                        "'${_component}' to HONE_ENABLE_${_upper}")
  endif()
  string(JSON _value ERROR_VARIABLE _err GET "${_port_json}" features ${_component})
  if(_err)
    list(APPEND _errors "ports/hone/vcpkg.json: no feature '${_component}' (a component of hone's "
                        "CMake package)")
  endif()
  if(NOT _recipe MATCHES "\"${_component}\": \\[True, False\\]")
    list(APPEND _errors "conanfile.py: no option ${_component}=[True, False] (a component of "
                        "hone's CMake package)")
  endif()
  if(NOT _recipe MATCHES "cmake_target_name\", \"hone::${_component}\"")
    list(APPEND _errors "conanfile.py: declares no hone::${_component} target")
  endif()
endforeach()
foreach(_needed IN ITEMS "def layout(self)" "self.settings.os != \"Linux\""
                         "set_property(\"cmake_file_name\", \"hone\")"
                         "set_property(\"cmake_target_name\", \"hone::all\")")
  string(FIND "${_recipe}" "${_needed}" _at)
  if(_at EQUAL -1)
    list(APPEND _errors "conanfile.py lacks '${_needed}'")
  endif()
endforeach()
# The Conan package's root target must be one hone's own CMake package defines too.
string(FIND "${_config}" "add_library(hone::all INTERFACE IMPORTED)" _at)
if(_at EQUAL -1)
  list(APPEND _errors "cmake/honeConfig.cmake.in does not define hone::all (Conan's root target)")
endif()

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
