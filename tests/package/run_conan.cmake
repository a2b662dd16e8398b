# Package test driver: `conan create` of hone's recipe (headers and tools), offline, with the
# dependencies this machine provides declared as [platform_requires]; then `conan test` of
# test_package/ for the other option sets, which reuse the created package (the components do not
# change its package id; compiled=True does, and that set builds its package from the exported
# recipe). test_package runs the packaged hone-info and hone-ckpt too.
#   cmake -DCONAN=<conan> -DHONE_SOURCE_DIR=... -DWORK_DIR=... -DGENERATOR=... -DCXX_COMPILER=...
#         -DHONE_VERSION=x.y.z -DPLATFORM_REQUIRES=onetbb/2021.8.0|... -DOPTION_SETS=...
#         -P run_conan.cmake
# OPTION_SETS: '|'-separated option sets for hone, each ','-separated (cuda=True,mpi=True) or '-'
# for the defaults; the first one is used by `conan create`.
# Prints HONE_PACKAGE_SKIPPED (CTest's SKIP_REGULAR_EXPRESSION) when conan is not installed.
cmake_minimum_required(VERSION 3.25)
include("${CMAKE_CURRENT_LIST_DIR}/package_common.cmake")

if(NOT CONAN OR NOT EXISTS "${CONAN}")
  message("HONE_PACKAGE_SKIPPED: conan was not found on PATH when this build was configured "
          "(python3 -m pip install 'conan>=2.34,<3', then re-run cmake)")
  return()
endif()
hone_pkg_list(PLATFORM_REQUIRES)
hone_pkg_list(OPTION_SETS)
if(NOT OPTION_SETS)
  set(OPTION_SETS -)
endif()

# A private Conan home: nothing in ~/.conan2 is read or written, and no remote is consulted.
set(_home "${WORK_DIR}/conan-home")
file(REMOVE_RECURSE "${_home}" "${WORK_DIR}/test_package-build")
set(ENV{CONAN_HOME} "${_home}")
unset(ENV{CC})
set(ENV{CXX} "${CXX_COMPILER}")
hone_pkg_run(conan-version COMMAND "${CONAN}" --version)
hone_pkg_run(profile-detect COMMAND "${CONAN}" profile detect --force)
hone_pkg_run(remote-remove COMMAND "${CONAN}" remote remove "*")

# Build settings for the test_package build, in the private home's global.conf.
set(_conf "tools.cmake.cmaketoolchain:generator=${GENERATOR}\n"
          "tools.cmake.cmake_layout:test_folder=${WORK_DIR}/test_package-build\n"
          "tools.cmake.cmaketoolchain:user_presets=\n"
          "tools.build:jobs=2\n"
          "tools.build:compiler_executables={'cpp': '${CXX_COMPILER}'}\n")
if(CXX_LAUNCHER)
  list(APPEND _conf "tools.cmake.cmaketoolchain:extra_variables="
                    "{'CMAKE_CXX_COMPILER_LAUNCHER': '${CXX_LAUNCHER}'}\n")
endif()
string(JOIN "" _conf ${_conf})
file(WRITE "${_home}/global.conf" "${_conf}")

# The platform profile: the checked-in one when its [platform_requires] are exactly what this
# machine has (so that file is tested too), otherwise one written from the detected versions.
set(_checked_in "${HONE_SOURCE_DIR}/packaging/conan/profiles/debian12")
file(STRINGS "${_checked_in}" _lines)
set(_section "")
set(_declared "")
foreach(_line IN LISTS _lines)
  string(STRIP "${_line}" _line)
  if(_line MATCHES "^\\[(.*)\\]$")
    set(_section "${CMAKE_MATCH_1}")
  elseif(_section STREQUAL "platform_requires" AND _line AND NOT _line MATCHES "^#")
    list(APPEND _declared "${_line}")
  endif()
endforeach()
list(SORT _declared)
set(_detected ${PLATFORM_REQUIRES})
list(SORT _detected)
if(_declared STREQUAL _detected)
  set(_profile "${_checked_in}")
else()
  set(_profile "${WORK_DIR}/platform-profile")
  list(JOIN _detected "\n" _requires)
  file(WRITE "${_profile}"
       "[settings]\ncompiler.cppstd=20\n\n[platform_requires]\n${_requires}\n")
  message(STATUS "this machine's dependencies (${_detected}) differ from ${_checked_in} "
                 "(${_declared}): using ${_profile}")
endif()
set(_profiles -pr:h default -pr:h "${_profile}" -pr:b default)

# hone_pkg_conan_options(<set> <args var> <expected output var>)
function(hone_pkg_conan_options set args_var regex_var)
  set(_args)
  set(_enabled)
  if(NOT set STREQUAL "-")
    string(REPLACE "," ";" _options "${set}")
    foreach(_option IN LISTS _options)
      list(APPEND _args -o "hone/*:${_option}")
    endforeach()
  endif()
  foreach(_comp IN ITEMS cuda mpi nccl xtensor compiled)
    if("${_comp}=True" IN_LIST _options)
      string(APPEND _enabled " ${_comp}")
    endif()
  endforeach()
  if(NOT _enabled)
    set(_enabled " none")
  endif()
  if("compiled=True" IN_LIST _options)
    # hone::compiled is a binary of its own (compiled=True changes the package id): built here
    # from the recipe `conan create` exported.
    list(APPEND _args --build "missing:hone/*")
  endif()
  set(${args_var} ${_args} PARENT_SCOPE)
  set(${regex_var} "hone ${HONE_VERSION} .*components:${_enabled}" PARENT_SCOPE)
endfunction()

list(POP_FRONT OPTION_SETS _first)
hone_pkg_conan_options("${_first}" _args _regex)
hone_pkg_run(conan-create COMMAND "${CONAN}" create "${HONE_SOURCE_DIR}" ${_profiles} ${_args}
                                  --no-remote OUTPUT_VARIABLE _out)
if(NOT _out MATCHES "${_regex}")
  message(FATAL_ERROR "[conan-create] test_package output does not match '${_regex}'")
endif()

foreach(_set IN LISTS OPTION_SETS)
  hone_pkg_conan_options("${_set}" _args _regex)
  hone_pkg_run(conan-test-${_set}
    COMMAND "${CONAN}" test "${HONE_SOURCE_DIR}/test_package" "hone/${HONE_VERSION}" ${_profiles}
            ${_args} --no-remote OUTPUT_VARIABLE _out)
  if(NOT _out MATCHES "${_regex}")
    message(FATAL_ERROR "[conan-test-${_set}] test_package output does not match '${_regex}'")
  endif()
endforeach()
message(STATUS "package test passed")
