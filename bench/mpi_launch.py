"""bench/mpi_launch.py: what the drivers that alternate a hone program and its torch peer under
mpirun share (scripts/bench-ddp, scripts/bench-zero): the build of the program, the mpirun
command, the peers' Python with torch and gloo, one launch, the load average. Standard library
only."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build_dir(env_var: str, target: str) -> Path:
    """The build whose bench/ folder holds `target`: $env_var when set, else the `bench` preset's
    build/bench after building `target` there."""
    given = os.environ.get(env_var)
    if given:
        return Path(given)
    subprocess.run(["cmake", "--preset", "bench"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", "--preset", "bench", "-j",
                    os.environ.get("HONE_BENCH_JOBS", "2"), "--target", target],
                   cwd=ROOT, check=True)
    return ROOT / "build" / "bench"


def mpirun_prefix(np: int, who: str) -> list[str]:
    """`mpirun -np N` (with Open MPI: --oversubscribe, and the run-as-root variables as root)."""
    if shutil.which("mpirun") is None:
        sys.exit(f"{who}: mpirun not found: install an MPI (libopenmpi-dev openmpi-bin, as "
                 "scripts/deps.sh does)")
    cmd = ["mpirun", "-np", str(np)]
    version = subprocess.run(["mpirun", "--version"], capture_output=True, text=True)
    if "Open MPI" in version.stdout + version.stderr or "OpenRTE" in version.stdout:
        cmd.append("--oversubscribe")
        if os.geteuid() == 0:
            os.environ.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return cmd


def torch_python() -> tuple[str | None, str]:
    """The peers' Python and torch's version, or (None, why not)."""
    venv = Path(os.environ.get("HONE_PEERS_VENV", ROOT / "build" / "bench" / "peers-venv"))
    if not venv.is_absolute():
        venv = ROOT / venv
    python = venv / "bin" / "python"
    if not python.exists():
        return None, f"{python} does not exist (scripts/bench --peers creates the venv)"
    probe = subprocess.run([str(python), "-c", "import torch, torch.distributed as d; "
                            "print(torch.__version__, d.is_gloo_available())"],
                           capture_output=True, text=True)
    if probe.returncode != 0 or not probe.stdout.strip().endswith("True"):
        return None, f"torch with gloo does not import there: {probe.stderr.strip()[-300:]}"
    return str(python), probe.stdout.split()[0]


def launch(cmd: list[str], label: str, who: str) -> None:
    """Runs cmd in the source tree; on failure prints its output and exits naming it."""
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        sys.exit(f"{who}: {label} failed (exit status {done.returncode}): {' '.join(cmd)}")


def load_avg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"
