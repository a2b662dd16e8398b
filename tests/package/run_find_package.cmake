# Package test driver: install hone, then use it from find_package_consumer/.
#   cmake -DHONE_SOURCE_DIR=... -DWORK_DIR=... -DGENERATOR=... -DCXX_COMPILER=... [options]
#         -P run_find_package.cmake
# Options (besides those of package_common.cmake):
#   INSTALL=ON             configure hone's source with HONE_BUILD_TESTS=OFF (+ HONE_OPTIONS) in
#                          WORK_DIR/hone-build and install it into PREFIX (else PREFIX must exist)
#   PREFIX                 install prefix (default WORK_DIR/prefix)
#   HONE_OPTIONS           '|'-separated -D settings for hone's configure (HONE_ENABLE_MPI=ON|...)
#   VERSION                version the consumer asks for (default 0.1)
#   COMPONENTS             '|'-separated required components
#   OPTIONAL_COMPONENTS    '|'-separated optional components
#   CONSUMER_OPTIONS       '|'-separated -D settings for the consumer's configure
#                          (CMAKE_DISABLE_FIND_PACKAGE_xtensor=ON: a machine without xtensor)
#   INSTALLED_FILES        '|'-separated files (relative to PREFIX) the installation must hold
#   RUN_TOOLS=ON           the installed bin/hone-info, bin/hone-ckpt and bin/hone-data must run
#   EXPECT_CONFIGURE_ERROR the consumer's configure must fail with output matching this regex
#   EXPECT_OUTPUT          regex the consumer's output must match (default: "consumer OK")
cmake_minimum_required(VERSION 3.25)
include("${CMAKE_CURRENT_LIST_DIR}/package_common.cmake")

if(NOT PREFIX)
  set(PREFIX "${WORK_DIR}/prefix")
endif()
if(NOT VERSION)
  set(VERSION 0.1)
endif()
if(NOT EXPECT_OUTPUT)
  set(EXPECT_OUTPUT "consumer OK")
endif()
hone_pkg_list(HONE_OPTIONS)
hone_pkg_list(COMPONENTS)
hone_pkg_list(OPTIONAL_COMPONENTS)
hone_pkg_list(CONSUMER_OPTIONS)
hone_pkg_list(INSTALLED_FILES)

if(INSTALL)
  # A fresh, separate build of the source: the test does not depend on the state of the build
  # tree that runs it.
  file(REMOVE_RECURSE "${WORK_DIR}/hone-build" "${PREFIX}")
  set(_hone_args)
  foreach(_setting IN LISTS HONE_OPTIONS)
    list(APPEND _hone_args "-D${_setting}")
  endforeach()
  hone_pkg_run(configure-hone
    COMMAND "${CMAKE_COMMAND}" -S "${HONE_SOURCE_DIR}" -B "${WORK_DIR}/hone-build"
            ${HONE_PKG_CONFIGURE_ARGS} -DHONE_BUILD_TESTS=OFF -DHONE_BUILD_EXAMPLES=OFF
            -DHONE_BUILD_TOOLS=OFF -DHONE_BUILD_BENCH=OFF -DHONE_INSTALL=ON
            "-DCMAKE_INSTALL_PREFIX=${PREFIX}"
            ${_hone_args})
  hone_pkg_run(build-hone COMMAND "${CMAKE_COMMAND}" --build "${WORK_DIR}/hone-build"
                                  --config Release)
  hone_pkg_run(install-hone COMMAND "${CMAKE_COMMAND}" --install "${WORK_DIR}/hone-build"
                                    --config Release)
  # Every public header is installed, and nothing else lands under include/.
  file(GLOB_RECURSE _source_headers RELATIVE "${HONE_SOURCE_DIR}/include"
       "${HONE_SOURCE_DIR}/include/*.hpp" "${HONE_SOURCE_DIR}/include/*.cuh"
       "${HONE_SOURCE_DIR}/include/*.h")
  file(GLOB_RECURSE _installed RELATIVE "${PREFIX}/include" "${PREFIX}/include/*")
  list(SORT _source_headers)
  list(SORT _installed)
  if(NOT _installed STREQUAL _source_headers)
    message(FATAL_ERROR "installed include/ differs from the source headers:\n"
                        "  installed: ${_installed}\n  source: ${_source_headers}")
  endif()
  foreach(_file IN ITEMS honeConfig.cmake honeConfigVersion.cmake honeTargets.cmake FindNCCL.cmake)
    if(NOT EXISTS "${PREFIX}/share/cmake/hone/${_file}")
      message(FATAL_ERROR "the installation lacks share/cmake/hone/${_file}")
    endif()
  endforeach()
endif()
if(NOT EXISTS "${PREFIX}/share/cmake/hone/honeConfig.cmake")
  message(FATAL_ERROR "no hone installation in ${PREFIX}")
endif()
foreach(_file IN LISTS INSTALLED_FILES)
  if(NOT EXISTS "${PREFIX}/${_file}")
    message(FATAL_ERROR "the installation lacks ${_file}")
  endif()
endforeach()
if(RUN_TOOLS)
  hone_pkg_run(hone-info COMMAND "${PREFIX}/bin/hone-info" OUTPUT_VARIABLE _out)
  if(NOT _out MATCHES "^hone [0-9]+\\.[0-9]+\\.[0-9]+ ")
    message(FATAL_ERROR "[hone-info] the installed tool printed no version")
  endif()
  hone_pkg_run(hone-ckpt-usage COMMAND "${PREFIX}/bin/hone-ckpt"
               EXPECT_FAILURE "usage: hone-ckpt info DIR")
  hone_pkg_run(hone-data-usage COMMAND "${PREFIX}/bin/hone-data"
               EXPECT_FAILURE "usage: hone-data pack FILE OUTDIR")
endif()

set(_consumer_build "${WORK_DIR}/consumer-build")
file(REMOVE_RECURSE "${_consumer_build}")
# Component lists go to the consumer comma-separated: a ';' would split the argument list here.
list(JOIN COMPONENTS "," _components)
list(JOIN OPTIONAL_COMPONENTS "," _optional)
set(_configure_consumer
    "${CMAKE_COMMAND}" -S "${CMAKE_CURRENT_LIST_DIR}/find_package_consumer" -B "${_consumer_build}"
    ${HONE_PKG_CONFIGURE_ARGS} "-DCMAKE_PREFIX_PATH=${PREFIX}" "-DHONE_EXPECTED_PREFIX=${PREFIX}"
    "-DHONE_CONSUMER_VERSION=${VERSION}" "-DHONE_CONSUMER_COMPONENTS=${_components}"
    "-DHONE_CONSUMER_OPTIONAL_COMPONENTS=${_optional}")
foreach(_setting IN LISTS CONSUMER_OPTIONS)
  list(APPEND _configure_consumer "-D${_setting}")
endforeach()

if(EXPECT_CONFIGURE_ERROR)
  hone_pkg_run(configure-consumer COMMAND ${_configure_consumer}
               EXPECT_FAILURE "${EXPECT_CONFIGURE_ERROR}")
else()
  hone_pkg_run(configure-consumer COMMAND ${_configure_consumer})
  hone_pkg_build_and_run("${_consumer_build}" "${EXPECT_OUTPUT}")
endif()
message(STATUS "package test passed")
