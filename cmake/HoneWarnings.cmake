# hone_target_warnings(<target>): the warning set every hone-owned target builds with.
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
