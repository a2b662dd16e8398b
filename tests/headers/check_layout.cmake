# The layout rules of docs/architecture.md, checked on the source tree:
#  - no header under include/ and no file under tests/ over 800 lines (split by component);
#  - no header under core/, optim/, precision/, schedule/ or offload/ includes anything from
#    train/ (dependencies point down);
#  - nothing outside include/hone/checkpoint/ names checkpoint::detail (the io layer and the
#    checkpoint module's public API are what other modules use).
# Run as: cmake -DSOURCE_DIR=<repository root> -P check_layout.cmake
cmake_minimum_required(VERSION 3.25)
if(NOT SOURCE_DIR)
  message(FATAL_ERROR "check_layout.cmake: pass -DSOURCE_DIR=<repository root>")
endif()
set(max_lines 800)
set(failures "")

file(GLOB_RECURSE headers RELATIVE "${SOURCE_DIR}" "${SOURCE_DIR}/include/*.hpp"
     "${SOURCE_DIR}/include/*.cuh")
file(GLOB_RECURSE test_files RELATIVE "${SOURCE_DIR}" "${SOURCE_DIR}/tests/*.cpp"
     "${SOURCE_DIR}/tests/*.cu" "${SOURCE_DIR}/tests/*.hpp" "${SOURCE_DIR}/tests/*.cuh")
foreach(f IN LISTS headers test_files)
  file(READ "${SOURCE_DIR}/${f}" text)
  string(REGEX MATCHALL "\n" newlines "${text}")
  list(LENGTH newlines n)
  if(n GREATER max_lines)
    list(APPEND failures "${f} has ${n} lines, more than ${max_lines}: split it by component")
  endif()
endforeach()

foreach(f IN LISTS headers)
  file(READ "${SOURCE_DIR}/${f}" text)
  if(f MATCHES "^include/hone/(core|optim|precision|schedule|offload)/")
    string(REGEX MATCH "#[ \t]*include[ \t]*[<\"]hone/train/[^>\"]*" up "${text}")
    if(up)
      list(APPEND failures "${f} includes a train/ header (${up}): dependencies point down")
    endif()
  endif()
  if(NOT f MATCHES "^include/hone/checkpoint/")
    string(FIND "${text}" "checkpoint::detail" at)
    if(NOT at EQUAL -1)
      list(APPEND failures "${f} names checkpoint::detail: use the checkpoint or io public API")
    endif()
  endif()
endforeach()

list(LENGTH headers nh)
list(LENGTH test_files nt)
if(failures)
  list(JOIN failures "\n  " text)
  message(FATAL_ERROR "layout rules broken:\n  ${text}")
endif()
message(STATUS "layout rules hold for ${nh} headers and ${nt} test files")
