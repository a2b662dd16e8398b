# Fuzz test driver (CTest label fuzz): builds the libFuzzer target over the checkpoint readers with
# clang++ (unless FUZZER names one already built) and runs it for a bounded time, starting from the
# regression corpus of malformed files and the valid seeds. New inputs go to WORK_DIR/new, never
# into the committed corpus. A crash leaves its input in WORK_DIR (crash-*): add it to
# tests/checkpoint/corpus (make_corpus.cpp) once fixed.
#   cmake [-DFUZZER=<fuzzer> | -DCLANGXX=<clang++> -DSOURCE=<fuzz_readers.cpp> -DINCLUDES=<a|b>
#         -DLIBS=<a|b> [-DLAUNCHER=<ccache>]] -DWORK_DIR=<dir> -DCORPUS=<dir> -DSEEDS=<dir>
#         -DSECONDS=<n> [-DNAME=<target name> -DWHAT=<what it fuzzes>] -P run_fuzz.cmake
# (tests/data reuses it for the shard reader with its own NAME, WHAT and directories.)
# Prints HONE_FUZZ_SKIPPED (CTest's SKIP_REGULAR_EXPRESSION) when no clang++ was found.
cmake_minimum_required(VERSION 3.25)
if(NOT NAME)
  set(NAME fuzz_readers)
endif()
if(NOT WHAT)
  set(WHAT "the checkpoint readers")
endif()

file(MAKE_DIRECTORY "${WORK_DIR}")
if(NOT FUZZER)
  if(NOT CLANGXX)
    message("HONE_FUZZ_SKIPPED: no clang++ was found when this build was configured (libFuzzer "
            "needs clang; on Debian: apt-get install clang libclang-rt-14-dev)")
    return()
  endif()
  set(FUZZER "${WORK_DIR}/${NAME}")
  string(REPLACE "|" ";" INCLUDES "${INCLUDES}")
  string(REPLACE "|" ";" LIBS "${LIBS}")
  set(_includes "")
  foreach(_dir IN LISTS INCLUDES)
    list(APPEND _includes "-isystem" "${_dir}")
  endforeach()
  message(STATUS "building ${FUZZER} with ${CLANGXX}")
  execute_process(
    COMMAND ${LAUNCHER} "${CLANGXX}" -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined
            -fno-sanitize-recover=undefined ${_includes} "${SOURCE}" ${LIBS} -o "${FUZZER}"
    RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "building the fuzz target with ${CLANGXX} failed (${_rc})")
  endif()
endif()

file(REMOVE_RECURSE "${WORK_DIR}/new")
file(MAKE_DIRECTORY "${WORK_DIR}/new")
execute_process(
  COMMAND "${FUZZER}" -max_total_time=${SECONDS} -timeout=10 -rss_limit_mb=2048
          -print_final_stats=1 -artifact_prefix=${WORK_DIR}/ "${WORK_DIR}/new" "${CORPUS}"
          "${SEEDS}"
  WORKING_DIRECTORY "${WORK_DIR}"
  RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "the fuzz target failed (${_rc}): the input that broke a reader is in "
                      "${WORK_DIR} (crash-*, timeout-*, oom-*, leak-*); reproduce with "
                      "${FUZZER} <that file>")
endif()
message(STATUS "fuzzing ${WHAT} for ${SECONDS} s found nothing")
