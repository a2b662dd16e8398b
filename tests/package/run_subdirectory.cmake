# Package test driver: build subdirectory_consumer/, which pulls hone's source tree in with
# add_subdirectory() or FetchContent (MODE), and run it.
#   cmake -DHONE_SOURCE_DIR=... -DWORK_DIR=... -DGENERATOR=... -DCXX_COMPILER=... -DMODE=...
#         -P run_subdirectory.cmake
cmake_minimum_required(VERSION 3.25)
include("${CMAKE_CURRENT_LIST_DIR}/package_common.cmake")

if(NOT MODE)
  set(MODE add_subdirectory)
endif()
set(_build "${WORK_DIR}/consumer-build")
file(REMOVE_RECURSE "${_build}")
hone_pkg_run(configure-consumer
  COMMAND "${CMAKE_COMMAND}" -S "${CMAKE_CURRENT_LIST_DIR}/subdirectory_consumer" -B "${_build}"
          ${HONE_PKG_CONFIGURE_ARGS} "-DHONE_SOURCE_DIR=${HONE_SOURCE_DIR}"
          "-DHONE_CONSUMER_MODE=${MODE}")
hone_pkg_build_and_run("${_build}" "consumer OK")
message(STATUS "package test passed")
