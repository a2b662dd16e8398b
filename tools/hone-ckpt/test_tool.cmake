# tools/hone-ckpt/test_tool.cmake: runs every hone-ckpt command on a small checkpoint.
#   cmake -DTOOL=<hone-ckpt> -DMAKER=<checkpoint_crash_helper> -DWORK=<dir> -P test_tool.cmake
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

# run(<expected rc> <regex> args...)
function(run rc regex)
  execute_process(COMMAND "${TOOL}" ${ARGN} RESULT_VARIABLE got OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  message("hone-ckpt ${ARGN} -> ${got}\n${out}${err}")
  if(NOT "${got}" STREQUAL "${rc}")
    message(FATAL_ERROR "hone-ckpt ${ARGN}: expected exit status ${rc}, got '${got}'")
  endif()
  if(NOT "${out}${err}" MATCHES "${regex}")
    message(FATAL_ERROR "hone-ckpt ${ARGN}: output does not match '${regex}'")
  endif()
endfunction()

foreach(i RANGE 1 2)
  execute_process(COMMAND "${MAKER}" "${WORK}/run" --once RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "making the checkpoint failed (${rc})")
  endif()
endforeach()
set(ck "${WORK}/run/step-000000002")

run(0 "model.safetensors \\(safetensors, 1 tensors.*w +F32 +\\[16384\\].*exp_avg.w.*state: step 2.*metadata writer = crash_helper"
    info "${ck}")
run(0 "checkpoint .*step-000000002" info "${WORK}/run")  # a run's root: the newest valid
run(0 "^ok: .*3 files" verify "${ck}")
run(0 "wrote .*float tensors as BF16" convert "${ck}" --to bf16 "${WORK}/bf16")
run(0 "w +BF16 +\\[16384\\]" info "${WORK}/bf16")
run(0 "^ok: " verify "${WORK}/bf16")
run(0 "model.safetensors +w +1\n.*optimizer.safetensors +exp_avg.w +1\n" diff "${ck}" "${WORK}/run/step-000000001")
run(0 "wrote .*plain safetensors" convert "${ck}" --to safetensors "${WORK}/plain")
run(0 "model.safetensors +w +0\n" diff "${ck}" "${WORK}/plain")
# The values (multiples of 0.25 up to 26) are exact in BF16.
run(0 "model.safetensors +w +0\n" diff "${ck}" "${WORK}/bf16")
run(1 "hone-ckpt: .*already exists" convert "${ck}" --to bf16 "${WORK}/bf16")

# Damage: one flipped byte, a missing MANIFEST.
file(READ "${ck}/state.json" state)
string(REPLACE "crash_helper" "crash_helpeR" state "${state}")
file(WRITE "${ck}/state.json" "${state}")
run(1 "^invalid: .*state.json" verify "${ck}")
run(0 "checkpoint .*step-000000001" info "${WORK}/run")  # falls back past the damaged one
file(REMOVE "${WORK}/plain/MANIFEST")
run(1 "^invalid: .*MANIFEST" verify "${WORK}/plain")
run(1 "^invalid: .*not a directory" verify "${WORK}/nothing")

# Usage errors: status 2.
run(2 "missing command")
run(2 "unknown command 'frobnicate'" frobnicate)
run(2 "verify takes one directory" verify)
run(2 "--to must be safetensors, bf16 or file, got 'fp8'" convert "${ck}" --to fp8 "${WORK}/x")
run(2 "diff takes two directories" diff "${ck}")
run(0 "usage: hone-ckpt info DIR" --help)
