# Runs the header-only and the separately compiled build of mode_bits.cpp and requires the same
# output, line for line (cmake -DHEADER_ONLY=<exe> -DCOMPILED=<exe> -P compare_modes.cmake).
foreach(_mode IN ITEMS HEADER_ONLY COMPILED)
  execute_process(COMMAND "${${_mode}}" OUTPUT_VARIABLE _out_${_mode} RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${${_mode}} failed (exit ${_rc}):\n${_out_${_mode}}")
  endif()
endforeach()
string(REGEX MATCHALL "\n" _lines "${_out_HEADER_ONLY}")
list(LENGTH _lines _n)
if(_n LESS 10)
  message(FATAL_ERROR "mode_bits printed ${_n} lines, expected 10:\n${_out_HEADER_ONLY}")
endif()
if(NOT _out_HEADER_ONLY STREQUAL _out_COMPILED)
  message(FATAL_ERROR "separate compilation changed results.\nheader-only:\n${_out_HEADER_ONLY}\n"
                      "hone::compiled:\n${_out_COMPILED}")
endif()
message(STATUS "both modes printed the same ${_n} lines:\n${_out_COMPILED}")
