# tools/hone-data/test_tool.cmake: runs every hone-data command on shards packed from a small
# text file, checks what they print and their exit statuses, and damages a shard (with dd and
# truncate from coreutils).
#   cmake -DTOOL=<hone-data> -DWORK=<dir> -P test_tool.cmake
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

# run(<expected rc> <regex> args...); the output is left in `out` (stdout) for the caller.
function(run rc regex)
  execute_process(COMMAND "${TOOL}" ${ARGN} RESULT_VARIABLE got OUTPUT_VARIABLE o
                  ERROR_VARIABLE err)
  message("hone-data ${ARGN} -> ${got}\n${o}${err}")
  if(NOT "${got}" STREQUAL "${rc}")
    message(FATAL_ERROR "hone-data ${ARGN}: expected exit status ${rc}, got '${got}'")
  endif()
  if(NOT "${o}${err}" MATCHES "${regex}")
    message(FATAL_ERROR "hone-data ${ARGN}: output does not match '${regex}'")
  endif()
  set(out "${o}" PARENT_SCOPE)
endfunction()

# 400 lines of 0 to 79 characters (line 7 empty), the last one without a newline.
set(text "")
foreach(i RANGE 0 399)
  math(EXPR len "(${i} * 37) % 80")
  if(i EQUAL 7)
    set(len 0)
  endif()
  string(REPEAT "x" ${len} pad)
  string(SUBSTRING "line ${i} ${pad}" 0 ${len} line)
  if(i LESS 399)
    string(APPEND text "${line}\n")
  else()
    string(APPEND text "${line}")
  endif()
endforeach()
file(WRITE "${WORK}/corpus.txt" "${text}")

run(0 "packed 400 records from .*corpus.txt' into [2-9][0-9]* shards"
    pack "${WORK}/corpus.txt" "${WORK}/out" --frame-bytes 512 --shard-bytes 4096)
if(EXISTS "${WORK}/corpus.txt.hidx")
  message(FATAL_ERROR "pack left an index file next to its input")
endif()
run(0 "corpus-00000.hshard: [0-9]+ records, [0-9]+ frames.*total: [0-9]+ shards, 400 records"
    info "${WORK}/out")
run(0 "^ok: [0-9]+ shards, 400 records, [0-9]+ frames verified" verify "${WORK}/out")
# cat: everything equals the input (plus the newline the last line lacked), and a range.
run(0 "" cat "${WORK}/out")
if(NOT out STREQUAL "${text}\n")
  message(FATAL_ERROR "hone-data cat printed other records than the input's lines")
endif()
run(0 "" cat "${WORK}/out" --records 6:9)
string(REGEX MATCHALL "[^\n]*\n" lines "${text}")
list(SUBLIST lines 6 3 want)
string(JOIN "" want ${want})
if(NOT out STREQUAL want)
  message(FATAL_ERROR "hone-data cat --records 6:9 printed '${out}', not '${want}'")
endif()
run(0 "^$" cat "${WORK}/out" --records 400:400)
run(1 "--records 399:401 is not a range within the 400 records" cat "${WORK}/out" --records 399:401)
run(1 "already holds shards named 'corpus-\\*.hshard'" pack "${WORK}/corpus.txt" "${WORK}/out")

# JSON Lines: a valid file packs; a bad line is refused naming it.
file(WRITE "${WORK}/good.jsonl" "{\"a\": 1}\n\n[2, 3]\n")
run(0 "packed 2 records" pack "${WORK}/good.jsonl" "${WORK}/j" --format jsonl)
run(0 "^\\{\"a\": 1\\}\n\\[2, 3\\]\n$" cat "${WORK}/j/good-00000.hshard")
file(WRITE "${WORK}/bad.jsonl" "{\"a\": 1}\n{\"a\": \n")
run(1 "hone-data: .*bad.jsonl.*record 1" pack "${WORK}/bad.jsonl" "${WORK}/j" --format jsonl)
# An empty input: one empty shard.
file(WRITE "${WORK}/empty.txt" "")
run(0 "packed 0 records .* into 1 shards" pack "${WORK}/empty.txt" "${WORK}/e")
run(0 "^ok: 1 shards, 0 records, 0 frames verified" verify "${WORK}/e")

# Damage: a byte of frame 0 overwritten, a truncated shard, a foreign file.
set(s0 "${WORK}/out/corpus-00000.hshard")
execute_process(COMMAND dd if=/dev/zero of=${s0} bs=1 seek=30 count=4 conv=notrunc
                RESULT_VARIABLE rc ERROR_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "dd failed (${rc})")
endif()
run(1 "^invalid: hone: shard '.*corpus-00000.hshard' frame 0 \\(records 0 to [0-9]+, file offset 16\\) does not match its checksum" verify "${WORK}/out")
run(0 "total: .* 400 records" info "${WORK}/out")  # info reads the index only
run(1 "hone-data: hone: shard .*corpus-00000.hshard' frame 0 " cat "${WORK}/out" --records 0:1)
set(s1 "${WORK}/out/corpus-00001.hshard")
execute_process(COMMAND truncate -s -3 ${s1} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "truncate failed (${rc})")
endif()
run(1 "^invalid: hone: shard '.*corpus-00001.hshard' does not end with the shard end magic: it is truncated" verify "${s1}")
run(1 "^invalid: hone: shard '.*corpus.txt' is not a hone record shard" verify "${WORK}/corpus.txt")
run(1 "^invalid: .*cannot open '.*missing.hshard'" verify "${WORK}/missing.hshard")
run(1 "holds no .hshard files" info "${WORK}")

# Usage errors: status 2.
run(2 "missing command")
run(2 "unknown command 'frobnicate'" frobnicate)
run(2 "verify takes one or more shard files" verify)
run(2 "pack takes FILE OUTDIR" pack "${WORK}/corpus.txt")
run(2 "--format must be text, jsonl or csv, got 'xml'" pack "${WORK}/corpus.txt" "${WORK}/x" --format xml)
run(2 "--frame-bytes takes a number, got 'big'" pack "${WORK}/corpus.txt" "${WORK}/x" --frame-bytes big)
run(2 "--records takes I:J" cat "${WORK}/out" --records 5)
run(0 "usage: hone-data pack FILE OUTDIR" --help)
