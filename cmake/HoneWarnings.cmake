# hone_target_warnings(<target>): the warning set every hone-owned target builds with; and
# hone_run_heavy(<target>), below: the optimization a sanitizer build gives its slowest programs.
# Host code: -Wall -Wextra -Wpedantic -Werror (g++ and clang). CUDA code: the same flags passed to
# the host compiler, and nvcc's own warnings as errors.
option(HONE_WERROR "Treat warnings as errors in hone's own targets" ON)
function(hone_target_warnings target)
  set(_flags -Wall -Wextra -Wpedantic -Wshadow -Wconversion-null)
  if(HONE_WERROR)
    list(APPEND _flags -Werror)
  endif()
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${_flags}>)
  set(_cuda_host -Wall,-Wextra)
  if(HONE_WERROR)
    string(APPEND _cuda_host ",-Werror")
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--Werror=all-warnings>)
  endif()
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${_cuda_host}>)
endfunction()

# hone_run_heavy(<target>): marks a test or example program whose run time dominates a test run.
# It gets HONE_RUN_HEAVY_FLAGS appended to its compile options (after CMAKE_CXX_FLAGS, so an -O
# there wins). Empty by default; the sanitizer presets compile everything at -Og (under ASan +
# UBSan about two thirds of the -O1 compile time) and these programs at -O1 (test_numeric runs
# 82 s at -Og against 37 s at -O1). docs/testing.md has the figures.
set(HONE_RUN_HEAVY_FLAGS "" CACHE STRING
    "Extra compile options for the programs marked by hone_run_heavy() (the asan preset: -O1)")
function(hone_run_heavy target)
  if(HONE_RUN_HEAVY_FLAGS)
    separate_arguments(_flags NATIVE_COMMAND "${HONE_RUN_HEAVY_FLAGS}")
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${_flags}>)
  endif()
endfunction()
