# hone_peers_python(<var>): the Python interpreter of the interop tests that need packages
# scripts/deps.sh does not install (torch, peft, megatron-core): the benchmark peers' venv
# ($ENV{HONE_PEERS_VENV}, else build/bench/peers-venv) when it exists, else the python3 on PATH
# (each such test then checks what it can without those packages, or exits 77: skipped).
# Build-tree only: not installed with the package.
function(hone_peers_python out)
  if(DEFINED ENV{HONE_PEERS_VENV} AND EXISTS "$ENV{HONE_PEERS_VENV}/bin/python")
    set(_python "$ENV{HONE_PEERS_VENV}/bin/python")
  elseif(EXISTS "${PROJECT_SOURCE_DIR}/build/bench/peers-venv/bin/python")
    set(_python "${PROJECT_SOURCE_DIR}/build/bench/peers-venv/bin/python")
  else()
    find_program(HONE_PYTHON3 NAMES python3 python)
    set(_python "${HONE_PYTHON3}")
  endif()
  set(${out} "${_python}" PARENT_SCOPE)
endfunction()
