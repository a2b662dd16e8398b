# scripts/tsan-tbb.cmake: included by the tsan preset right after project(hone)
# (CMAKE_PROJECT_hone_INCLUDE). Builds oneTBB with ThreadSanitizer through scripts/tsan-tbb (cached
# under build/tsan-tbb) with the compiler of this build, and points find_package(TBB) at it, so
# that TSan sees the happens-before edges of oneTBB's scheduler. A tsan build never falls back to
# the distribution's uninstrumented libtbb: configuring fails instead.
execute_process(
  COMMAND ${CMAKE_COMMAND} -E env "CXX=${CMAKE_CXX_COMPILER}" bash "${CMAKE_CURRENT_LIST_DIR}/tsan-tbb"
  RESULT_VARIABLE _hone_tsan_tbb_rc
  OUTPUT_VARIABLE _hone_tsan_tbb_prefix
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _hone_tsan_tbb_rc EQUAL 0 OR NOT EXISTS "${_hone_tsan_tbb_prefix}/lib/cmake/TBB/TBBConfig.cmake")
  message(FATAL_ERROR
    "The tsan preset needs oneTBB built with ThreadSanitizer and scripts/tsan-tbb could not build it "
    "(see its messages above); set HONE_TSAN_TBB_SOURCE to an unpacked oneTBB source tree of the "
    "installed version and configure again.")
endif()
set(TBB_DIR "${_hone_tsan_tbb_prefix}/lib/cmake/TBB" CACHE PATH "oneTBB built with ThreadSanitizer" FORCE)
message(STATUS "oneTBB with ThreadSanitizer: ${_hone_tsan_tbb_prefix}")
