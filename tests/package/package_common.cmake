# Helpers shared by the package test drivers (run with cmake -P). Every driver receives:
#   HONE_SOURCE_DIR  hone's source tree           WORK_DIR       a scratch folder it owns
#   GENERATOR        CMake generator to use       MAKE_PROGRAM   its build tool (may be empty)
#   CXX_COMPILER     C++ compiler                 CXX_LAUNCHER   e.g. ccache (may be empty)
#   FORWARD          '|'-separated -D settings forwarded to every configure (dependency *_DIR, ...)
# Lists are passed '|'-separated because ';' would split CTest's command line.

foreach(_var IN ITEMS HONE_SOURCE_DIR WORK_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${_var} OR "${${_var}}" STREQUAL "")
    message(FATAL_ERROR "package test driver: -D${_var}=... is required")
  endif()
endforeach()

# hone_pkg_list(<var>): turns a '|'-separated argument into a CMake list.
macro(hone_pkg_list var)
  string(REPLACE "|" ";" ${var} "${${var}}")
endmacro()

# The -D arguments every configure gets: generator, compiler, launcher, forwarded settings.
set(HONE_PKG_CONFIGURE_ARGS -G "${GENERATOR}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
                            -DCMAKE_BUILD_TYPE=Release -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
if(MAKE_PROGRAM)
  list(APPEND HONE_PKG_CONFIGURE_ARGS "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(CXX_LAUNCHER)
  list(APPEND HONE_PKG_CONFIGURE_ARGS "-DCMAKE_CXX_COMPILER_LAUNCHER=${CXX_LAUNCHER}")
endif()
set(_forward "${FORWARD}")
hone_pkg_list(_forward)
foreach(_setting IN LISTS _forward)
  list(APPEND HONE_PKG_CONFIGURE_ARGS "-D${_setting}")
endforeach()

# hone_pkg_run(<step> COMMAND <cmd>... [EXPECT_FAILURE <regex>] [OUTPUT_VARIABLE <var>])
# Runs one step, echoing its command line and output. Without EXPECT_FAILURE the step must
# succeed; with it, the step must fail and its output (whitespace runs read as one space) must
# match <regex>.
function(hone_pkg_run step)
  cmake_parse_arguments(PARSE_ARGV 1 R "" "EXPECT_FAILURE;OUTPUT_VARIABLE" "COMMAND")
  list(JOIN R_COMMAND "' '" _shown)
  message(STATUS "[${step}] '${_shown}'")
  execute_process(COMMAND ${R_COMMAND} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out
                  ERROR_VARIABLE _out)
  message("${_out}")
  if(DEFINED R_EXPECT_FAILURE)
    if(_rc EQUAL 0)
      message(FATAL_ERROR "[${step}] succeeded but was expected to fail")
    endif()
    # CMake wraps long messages: match against the output with all whitespace runs as one space.
    string(REGEX REPLACE "[ \t\r\n]+" " " _flat "${_out}")
    if(NOT _flat MATCHES "${R_EXPECT_FAILURE}")
      message(FATAL_ERROR "[${step}] failed as expected, but its output does not match "
                          "'${R_EXPECT_FAILURE}'")
    endif()
    message(STATUS "[${step}] failed as expected")
  elseif(NOT _rc EQUAL 0)
    message(FATAL_ERROR "[${step}] failed (${_rc})")
  endif()
  if(R_OUTPUT_VARIABLE)
    set(${R_OUTPUT_VARIABLE} "${_out}" PARENT_SCOPE)
  endif()
endfunction()

# hone_pkg_build_and_run(<build dir> <expected output regex>): builds a configured consumer and
# runs its `consumer` program, whose output must match the regex.
function(hone_pkg_build_and_run build_dir regex)
  hone_pkg_run(build COMMAND "${CMAKE_COMMAND}" --build "${build_dir}" --config Release
                             --parallel 2)
  hone_pkg_run(run COMMAND "${build_dir}/bin/consumer" OUTPUT_VARIABLE _out)
  if(NOT _out MATCHES "${regex}")
    message(FATAL_ERROR "[run] output does not match '${regex}'")
  endif()
endfunction()
