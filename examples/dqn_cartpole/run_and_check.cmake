# examples/dqn_cartpole/run_and_check.cmake: runs the example through ../common/run_example.cmake
# (exit status, output regex), then checks what it wrote into OUT_DIR with CHECK.
#   cmake -DEXE=... "-DARGS=..." -DEXPECT_RC=N -DEXPECT_REGEX=... -DOUT_DIR=... -DCHECK=...
#         -P run_and_check.cmake
cmake_minimum_required(VERSION 3.25)
include(${CMAKE_CURRENT_LIST_DIR}/../common/run_example.cmake)
include(${CHECK})
