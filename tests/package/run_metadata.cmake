# Package test driver: the packaging files agree with the build. Versions in the vcpkg manifests
# match project(hone VERSION ...); every HONE_* option the vcpkg port sets exists in
# CMakeLists.txt; the files the recipes ship exist.
#   cmake -DHONE_SOURCE_DIR=... -DHONE_VERSION=x.y.z -P run_metadata.cmake
cmake_minimum_required(VERSION 3.25)

set(_errors "")
foreach(_manifest IN ITEMS ports/hone/vcpkg.json vcpkg.json)
  file(READ "${HONE_SOURCE_DIR}/${_manifest}" _json)
  string(JSON _version ERROR_VARIABLE _err GET "${_json}" version-semver)
  if(_err)
    list(APPEND _errors "${_manifest}: no version-semver (${_err})")
  elseif(NOT _version STREQUAL HONE_VERSION)
    list(APPEND _errors
         "${_manifest}: version-semver ${_version}, CMakeLists.txt says ${HONE_VERSION}")
  endif()
endforeach()

file(READ "${HONE_SOURCE_DIR}/CMakeLists.txt" _cmakelists)
file(READ "${HONE_SOURCE_DIR}/ports/hone/portfile.cmake" _portfile)
string(REGEX MATCHALL "HONE_[A-Z_]+" _port_vars "${_portfile}")
list(REMOVE_DUPLICATES _port_vars)
foreach(_var IN LISTS _port_vars)
  if(NOT _cmakelists MATCHES "${_var}")
    list(APPEND _errors "ports/hone/portfile.cmake sets ${_var}, unknown to CMakeLists.txt")
  endif()
endforeach()

foreach(_file IN ITEMS LICENSE cmake/FindNCCL.cmake cmake/FindxxHash.cmake ports/hone/usage
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
