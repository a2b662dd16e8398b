# examples/dqn_cartpole/blas.cmake: dqn_cartpole_use_blas(target) links target to OpenBLAS when
# find_package(BLAS) finds it (BLA_VENDOR OpenBLAS: Debian's libopenblas-dev) and defines
# DQN_CARTPOLE_BLAS and DQN_CARTPOLE_OPENBLAS, so dqn.hpp's Q-network does its matrix products
# with cblas_sgemm. Without it (or with -DDQN_CARTPOLE_BLAS=OFF) the example keeps its own loops.
# Included by this directory's CMakeLists.txt (the example) and by bench/CMakeLists.txt
# (bench_dqn); nothing else links BLAS.
include_guard(GLOBAL)
option(DQN_CARTPOLE_BLAS "examples/dqn_cartpole and bench_dqn: matrix products through OpenBLAS"
       ON)
if(DQN_CARTPOLE_BLAS)
  set(BLA_VENDOR OpenBLAS)
  find_package(BLAS QUIET)
  unset(BLA_VENDOR)
  if(BLAS_FOUND)
    message(STATUS "dqn_cartpole: Q-network matrix products through OpenBLAS (${BLAS_LIBRARIES})")
  else()
    message(STATUS "dqn_cartpole: OpenBLAS not found; the Q-network keeps its own loops")
  endif()
else()
  message(STATUS "dqn_cartpole: DQN_CARTPOLE_BLAS is OFF; the Q-network keeps its own loops")
endif()

function(dqn_cartpole_use_blas target)
  if(DQN_CARTPOLE_BLAS AND BLAS_FOUND)
    target_link_libraries(${target} PRIVATE BLAS::BLAS)
    target_compile_definitions(${target} PRIVATE DQN_CARTPOLE_BLAS DQN_CARTPOLE_OPENBLAS)
  endif()
endfunction()
