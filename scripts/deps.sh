# scripts/deps.sh: the one list of what hone's scripts need, and the function that installs it.
# Sourced by scripts/test, scripts/demo, scripts/bench and scripts/gpu-bundle.

# Debian packages (bookworm names). libxsimd-dev is not a dependency of hone (no header uses
# it): it is here only for bench_xsimd (bench/xsimd.cpp), the measurement behind that decision
# (docs/install.md), which CMake builds only where xsimd is found.
HONE_APT_PACKAGES=(
  cmake g++ make ccache git python3 python3-pip
  clang libclang-rt-14-dev
  libtbb-dev libxtensor-dev libxsimd-dev libzstd-dev libxxhash-dev
  libboost-test-dev libbenchmark-dev libopenblas-dev
  libopenmpi-dev openmpi-bin
)
# Python packages from PyPI: Conan 2 for the package test; safetensors and numpy for the
# checkpoint interop test (tests/checkpoint/interop.py); perfetto (its trace schema,
# perfetto_trace_pb2) and protobuf for the profile interop test (tests/profile/interop.py);
# tensorboard (its event file readers) for the metrics interop test
# (tests/profile/interop_metrics.py).
HONE_PIP_PACKAGES=("conan>=2.34,<3" "safetensors>=0.4" "numpy" "perfetto" "protobuf" "tensorboard")

hone_missing_apt() {
  local p missing=()
  for p in "${HONE_APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  echo "${missing[@]}"
}

# Installs missing Debian and pip packages when root with apt; otherwise prints the exact
# commands and returns 1.
hone_install_deps() {
  local missing
  if command -v dpkg-query >/dev/null 2>&1; then
    missing=$(hone_missing_apt)
  else
    echo "scripts: this is not a Debian system; install the equivalents of: ${HONE_APT_PACKAGES[*]}" >&2
    missing=""
  fi
  if [ -n "$missing" ]; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "== installing system packages: $missing"
      apt-get update -qq
      # shellcheck disable=SC2086
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
    else
      echo "Missing system packages. Install them as root, then run this script again:" >&2
      echo "  apt-get update && apt-get install -y $missing" >&2
      return 1
    fi
  fi
  if ! command -v conan >/dev/null 2>&1 ||
     ! python3 -c "import safetensors, numpy" >/dev/null 2>&1 ||
     ! python3 -c "import perfetto.protos.perfetto.trace.perfetto_trace_pb2" >/dev/null 2>&1 ||
     ! python3 -c "import tensorboard.backend.event_processing.event_accumulator" >/dev/null 2>&1; then
    echo "== installing pip packages: ${HONE_PIP_PACKAGES[*]}"
    python3 -m pip install -q "${HONE_PIP_PACKAGES[@]}" ||
      python3 -m pip install -q --break-system-packages "${HONE_PIP_PACKAGES[@]}" ||
      echo "warning: could not pip install ${HONE_PIP_PACKAGES[*]}; the Conan package test and the checkpoint and profile interop tests will be skipped" >&2
  fi
}
