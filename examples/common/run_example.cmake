# examples/common/run_example.cmake: runs an example and checks how it ended, for CTest.
#
#   cmake -DEXE=<program> "-DARGS=a;b;c" [-DEXPECT_RC=0] [-DEXPECT_REGEX=<regex>]
#         [-DOUT_DIR=<dir> -DCHECK_OUTPUTS=ON] -P run_example.cmake
#
# EXPECT_RC: the exit status the program must return (default 0); unlike WILL_FAIL it is exact,
# so a crash does not pass for a rejected flag. EXPECT_REGEX: must match stdout + stderr.
# OUT_DIR is removed before the run; with CHECK_OUTPUTS the program must have written
# OUT_DIR/metrics.csv (the expected header and at least one data row) and OUT_DIR/curves.png (a
# PNG signature and an IHDR chunk).
cmake_minimum_required(VERSION 3.25)
if(NOT DEFINED EXE)
  message(FATAL_ERROR "run_example.cmake: pass -DEXE=<program>")
endif()
if(NOT DEFINED EXPECT_RC)
  set(EXPECT_RC 0)
endif()
if(DEFINED OUT_DIR)
  file(REMOVE_RECURSE "${OUT_DIR}")
endif()

execute_process(COMMAND "${EXE}" ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
message("${out}${err}")
if(NOT "${rc}" STREQUAL "${EXPECT_RC}")
  message(FATAL_ERROR "expected exit status ${EXPECT_RC}, got '${rc}'")
endif()
if(DEFINED EXPECT_REGEX AND NOT "${out}${err}" MATCHES "${EXPECT_REGEX}")
  message(FATAL_ERROR "the output does not match the expected regular expression: ${EXPECT_REGEX}")
endif()

if(CHECK_OUTPUTS)
  set(csv "${OUT_DIR}/metrics.csv")
  set(png "${OUT_DIR}/curves.png")
  foreach(f IN ITEMS "${csv}" "${png}")
    if(NOT EXISTS "${f}")
      message(FATAL_ERROR "${f} was not written")
    endif()
  endforeach()
  file(STRINGS "${csv}" lines)
  list(LENGTH lines n)
  list(GET lines 0 header)
  if(NOT header STREQUAL "step,loss,grad_norm,lr,loss_scale,skipped,val_loss,val_accuracy")
    message(FATAL_ERROR "${csv}: unexpected header '${header}'")
  endif()
  if(n LESS 2)
    message(FATAL_ERROR "${csv}: no data rows")
  endif()
  file(READ "${png}" head LIMIT 16 HEX)
  if(NOT head MATCHES "^89504e470d0a1a0a0000000d49484452")
    message(FATAL_ERROR "${png}: not a PNG file (starts with ${head})")
  endif()
  message("checked ${csv} (${n} lines) and ${png}")
endif()
