# Checks that every public host header of a module (include/hone/<module>/*.hpp, outside detail/
# and cuda/) is reached from the module's umbrella <hone/<module>.hpp>, and that <hone/hone.hpp>
# reaches every umbrella, so a header added to a module cannot be left out of the route users are
# told to include. Run as: cmake -DCXX=<compiler> -DINCLUDE_DIR=<include> -P check_umbrellas.cmake
# The dependency list comes from the compiler's preprocessor (-MM -MG: headers outside hone that
# are not installed here are listed instead of failing).
cmake_minimum_required(VERSION 3.25)
if(NOT CXX OR NOT INCLUDE_DIR)
  message(FATAL_ERROR "check_umbrellas.cmake: pass -DCXX=<compiler> -DINCLUDE_DIR=<include dir>")
endif()

function(hone_reached umbrella out)
  execute_process(
    COMMAND "${CXX}" -std=c++20 -I "${INCLUDE_DIR}" -MM -MG "${INCLUDE_DIR}/${umbrella}"
    RESULT_VARIABLE rc OUTPUT_VARIABLE deps ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "check_umbrellas.cmake: the preprocessor failed on ${umbrella}:\n${err}")
  endif()
  string(REGEX MATCHALL "hone/[A-Za-z0-9_/]+\\.hpp" reached "${deps}")
  list(REMOVE_DUPLICATES reached)
  set(${out} "${reached}" PARENT_SCOPE)
endfunction()

file(GLOB umbrellas RELATIVE "${INCLUDE_DIR}" "${INCLUDE_DIR}/hone/*.hpp")
list(REMOVE_ITEM umbrellas "hone/hone.hpp")
set(failures "")
set(modules 0)
foreach(umbrella IN LISTS umbrellas)
  string(REGEX REPLACE "^hone/(.*)\\.hpp$" "\\1" module "${umbrella}")
  file(GLOB headers RELATIVE "${INCLUDE_DIR}" "${INCLUDE_DIR}/hone/${module}/*.hpp")
  if(NOT headers)
    continue()
  endif()
  math(EXPR modules "${modules} + 1")
  hone_reached("${umbrella}" reached)
  foreach(h IN LISTS headers)
    if(NOT h IN_LIST reached)
      string(APPEND failures "  <${h}> is not reached from <${umbrella}>: include it there "
                             "(or move it to hone/${module}/detail/ if it is internal)\n")
    endif()
  endforeach()
endforeach()

hone_reached("hone/hone.hpp" reached_all)
foreach(umbrella IN LISTS umbrellas)
  if(NOT umbrella IN_LIST reached_all)
    string(APPEND failures "  <${umbrella}> is not reached from <hone/hone.hpp>: include it there\n")
  endif()
endforeach()

if(modules LESS 5)
  message(FATAL_ERROR "check_umbrellas.cmake: found only ${modules} modules under ${INCLUDE_DIR}/hone")
endif()
if(failures)
  message(FATAL_ERROR "Module umbrellas are incomplete:\n${failures}")
endif()
message(STATUS "${modules} module umbrellas reach every header of their module")
