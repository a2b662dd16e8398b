#!/usr/bin/env python3
"""Compile-time benchmark: how long a user's translation unit takes to compile against hone.

Installs hone from one or more source trees into temporary prefixes, exactly as a user would
(cmake -S <src> -B <build> -DHONE_BUILD_TESTS=OFF -DHONE_BUILD_EXAMPLES=OFF, cmake --install),
then times `<cxx> -std=c++20 <opt> -c <tu>` of each translation unit against each installed
copy. Repetitions are interleaved (rep 1: every tree, every TU, every flag; rep 2: ...; the
order of the trees alternates between repetitions) so that load from other processes falls on
all of them alike. Reports the median and minimum wall time and the median CPU time (user + sys
of the compiler and its children) per tree, TU and flag, and the ratios of each tree's medians to
the first tree's. On a machine shared with other work, the CPU time is the steadier figure (wall
time includes waiting for a core).

  bench/compile/run.py                                   # this tree, 3 TUs, -O3 and -O2, 5 reps
  bench/compile/run.py --tree before=../hone-old --tree after=. --reps 7
  bench/compile/run.py --tu bench/compile/include_only.cpp --opt=-O3 --json out.json
  bench/compile/run.py --tree before=../hone-old --tree after=. --compiled-tree compiled=.

--compiled-tree measures a tree in hone's separate-compilation mode (the hone::compiled
component, docs/install.md): it is installed with HONE_ENABLE_COMPILED=ON, its static library is
built (Release, one job; timed --reps times from clean and reported on its own line, since a user
pays it once per build of the library, not once per file), and the translation units are compiled
with -DHONE_SEPARATE_COMPILATION, the definition hone::compiled gives its users.

The translation units default to the ones next to this script, whatever tree is measured, so an
older release can be measured with today's TUs.

--umbrellas adds one generated translation unit per module umbrella (`#include <hone/<m>.hpp>`
for every hone/<m>.hpp of the first tree's installation but hone.hpp): what each module costs a
file that names it. --floor adds `floor.cpp`: every header outside hone that <hone/hone.hpp> of
the first tree includes (the standard library, oneTBB, zstd, xxHash, <immintrin.h>; found with
`-H`), and no hone code: what a file that includes the whole umbrella pays before hone's own
code, the part no change to hone's headers short of including less can take away.

  bench/compile/run.py --tree after=. --tu bench/compile/include_only.cpp --umbrellas --floor
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DEFAULT_TUS = [os.path.join(HERE, t) for t in ("include_only.cpp", "include_core.cpp",
                                               "trainer_three_precisions.cpp")]


def run_or_exit(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit("run.py: '%s' failed:\n%s" % (" ".join(cmd), r.stdout))


def timed(cmd):
    """Returns (wall seconds, cpu seconds of the command and the children it waited for)."""
    with tempfile.TemporaryFile() as log:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            log.seek(0)
            sys.exit("run.py: '%s' failed:\n%s" % (" ".join(cmd),
                                                    log.read().decode(errors="replace")))
    return wall, usage.ru_utime + usage.ru_stime


def install(name, src, work, cmake_args, compiled=False, reps=1):
    """Installs a tree; returns (include dir, library build samples [(wall, cpu)] or [])."""
    build = os.path.join(work, "build-" + name)
    prefix = os.path.join(work, "prefix-" + name)
    # The tools are not built (only headers are measured); trees without that option ignore it.
    configure = ["cmake", "--no-warn-unused-cli", "-S", src, "-B", build,
                 "-DHONE_BUILD_TESTS=OFF", "-DHONE_BUILD_EXAMPLES=OFF", "-DHONE_BUILD_TOOLS=OFF",
                 "-DCMAKE_INSTALL_PREFIX=" + prefix] + cmake_args
    library = []
    if compiled:
        if not os.path.isdir(os.path.join(src, "src")):
            sys.exit("run.py: %s has no separate-compilation mode (no src/)" % src)
        configure += ["-DHONE_ENABLE_COMPILED=ON", "-DCMAKE_BUILD_TYPE=Release",
                      "-DCMAKE_CXX_COMPILER_LAUNCHER="]  # no ccache: the build is timed
    run_or_exit(configure)
    if compiled:
        for _ in range(reps):
            run_or_exit(["cmake", "--build", build, "--target", "clean"])
            library.append(timed(["cmake", "--build", build, "--target", "hone_compiled",
                                  "-j", "1"]))
    run_or_exit(["cmake", "--install", build])
    include = os.path.join(prefix, "include")
    if not os.path.isfile(os.path.join(include, "hone", "hone.hpp")):
        sys.exit("run.py: %s has no hone/hone.hpp after the install" % include)
    return include, library


def compile_once(cxx, std, opt, include, tu, out, extra):
    """Returns (wall seconds, cpu seconds) of one compilation; exits on a compile error."""
    cmd = [cxx, "-std=" + std, opt, "-I", include, "-c", tu, "-o", out] + extra
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace")
    proc.stdout.close()
    proc.stderr.close()
    if proc.returncode != 0:
        sys.exit("run.py: '%s' failed:\n%s" % (" ".join(cmd), err))
    return wall, usage.ru_utime + usage.ru_stime


def umbrella_tus(include, work):
    """One TU per module umbrella hone/<m>.hpp of an installation (hone.hpp excepted)."""
    tus = []
    for header in sorted(os.listdir(os.path.join(include, "hone"))):
        if not header.endswith(".hpp") or header == "hone.hpp":
            continue
        tu = os.path.join(work, "umbrella_" + header[:-len(".hpp")] + ".cpp")
        with open(tu, "w") as f:
            f.write("#include <hone/%s>\n" % header)
        tus.append(tu)
    return tus


def floor_tu(cxx, std, include, work, extra):
    """floor.cpp: the headers outside `include` that <hone/hone.hpp> includes, in their order."""
    probe = os.path.join(work, "floor_probe.cpp")
    with open(probe, "w") as f:
        f.write("#include <hone/hone.hpp>\n")
    r = subprocess.run([cxx, "-std=" + std, "-H", "-fsyntax-only", "-I", include, probe] + extra,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit("run.py: -H of <hone/hone.hpp> failed:\n" + r.stderr)
    root = os.path.realpath(include)
    headers = []
    is_hone = [True]  # per include depth: is that header hone's (depth 0: the probe itself)
    for line in r.stderr.splitlines():
        dots, _, path = line.partition(" ")
        if not dots or set(dots) != {"."} or not path:
            continue
        depth = len(dots)
        inside = os.path.realpath(path).startswith(root + os.sep)
        # The headers outside hone that a hone header includes; what they include follows.
        if not inside and is_hone[depth - 1] and path not in headers:
            headers.append(path)
        del is_hone[depth:]
        is_hone.append(inside)
    tu = os.path.join(work, "floor.cpp")
    with open(tu, "w") as f:
        f.write("".join('#include "%s"\n' % h for h in headers))
    return tu


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tree", action="append", metavar="NAME=SRC",
                    help="a hone source tree to install and measure (repeatable; the first is the "
                         "reference of the ratios); default: current=<this repository>")
    ap.add_argument("--compiled-tree", action="append", default=[], metavar="NAME=SRC",
                    help="a hone source tree measured in its separate-compilation mode "
                         "(hone::compiled; repeatable, measured after the --tree ones)")
    ap.add_argument("--tu", action="append", metavar="FILE",
                    help="translation unit to compile (repeatable); default: include_only.cpp, "
                         "include_core.cpp and trainer_three_precisions.cpp next to this script")
    ap.add_argument("--opt", action="append", metavar="FLAG",
                    help="optimization flag, written --opt=-O1 (repeatable); default: -O3 and -O2")
    ap.add_argument("--umbrellas", action="store_true",
                    help="also compile one generated TU per module umbrella <hone/<m>.hpp>")
    ap.add_argument("--floor", action="store_true",
                    help="also compile floor.cpp: the headers outside hone that <hone/hone.hpp> "
                         "includes, without hone")
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions (default 5)")
    ap.add_argument("--cxx", default=os.environ.get("CXX", "g++"), help="compiler (default $CXX or g++)")
    ap.add_argument("--std", default="c++20")
    ap.add_argument("--cxxflag", action="append", default=[], metavar="FLAG",
                    help="extra compiler flag (repeatable)")
    ap.add_argument("--cmake-arg", action="append", default=[], metavar="ARG",
                    help="extra argument to the install's cmake configure (repeatable)")
    ap.add_argument("--work", help="work folder (kept); default: a temporary folder, removed")
    ap.add_argument("--json", help="also write every sample and summary to this file")
    a = ap.parse_args()

    trees = []
    compiled = set()  # names of the trees measured in the separate-compilation mode
    specs = [(s, False) for s in (a.tree or ["current=" + REPO])]
    specs += [(s, True) for s in a.compiled_tree]
    for spec, is_compiled in specs:
        name, sep, src = spec.partition("=")
        if not sep or not name or not os.path.isfile(os.path.join(src, "CMakeLists.txt")):
            sys.exit("run.py: --tree wants NAME=SRC with a hone source tree at SRC, got '%s'" % spec)
        if name in dict(trees):
            sys.exit("run.py: two trees are named '%s'" % name)
        trees.append((name, os.path.abspath(src)))
        if is_compiled:
            compiled.add(name)
    tus = [os.path.abspath(t) for t in (a.tu or DEFAULT_TUS)]
    opts = a.opt or ["-O3", "-O2"]
    if a.reps < 1:
        sys.exit("run.py: --reps must be at least 1")

    work = a.work or tempfile.mkdtemp(prefix="hone-compile-")
    os.makedirs(work, exist_ok=True)
    try:
        includes, libraries = {}, {}
        for name, src in trees:
            includes[name], libraries[name] = install(name, src, work, a.cmake_arg,
                                                      name in compiled, a.reps)
        flags = {name: a.cxxflag + (["-DHONE_SEPARATE_COMPILATION"] if name in compiled else [])
                 for name, _ in trees}
        first = includes[trees[0][0]]
        if a.umbrellas:
            tus += umbrella_tus(first, work)
        if a.floor:
            tus.append(floor_tu(a.cxx, a.std, first, work, flags[trees[0][0]]))
        out = os.path.join(work, "tu.o")
        version = subprocess.run([a.cxx, "--version"], stdout=subprocess.PIPE,
                                 text=True).stdout.splitlines()[0]
        print("# %s  %s  %s, %d CPUs, load %s" % (
            datetime.datetime.now().isoformat(timespec="seconds"), version, platform.machine(),
            os.cpu_count(), " ".join("%.2f" % x for x in os.getloadavg())))
        for name, src in trees:
            print("# %s: %s%s" % (name, src, " (separate compilation: hone::compiled)"
                                   if name in compiled else ""))
        for name, _ in trees:
            if libraries[name]:
                walls = [w for w, _ in libraries[name]]
                cpus = [c for _, c in libraries[name]]
                print("# %s: hone::compiled library build (Release, -j 1, from clean, %d reps): "
                      "cpu median %.2f s, wall median %.2f s, min %.2f s; paid once per build of "
                      "the library, not per file" % (name, len(cpus), statistics.median(cpus),
                                                     statistics.median(walls), min(walls)))
        # One untimed compilation each, to warm the file cache.
        for name, _ in trees:
            for tu in tus:
                compile_once(a.cxx, a.std, opts[0], includes[name], tu, out, flags[name])
        samples = {}  # (tu, opt, tree) -> [(wall, cpu)]
        for rep in range(a.reps):
            order = trees if rep % 2 == 0 else list(reversed(trees))
            for tu in tus:
                for opt in opts:
                    for name, _ in order:
                        s = compile_once(a.cxx, a.std, opt, includes[name], tu, out, flags[name])
                        samples.setdefault((tu, opt, name), []).append(s)
            print("# rep %d/%d done, load %s" % (rep + 1, a.reps,
                  " ".join("%.2f" % x for x in os.getloadavg())), file=sys.stderr)
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)

    print("%-32s %-4s %-10s %9s %9s %9s %7s %7s" % ("tu", "opt", "tree", "median_s", "min_s",
                                                       "cpu_med_s", "ratio", "cpu_rat"))
    summary = []
    for tu in tus:
        for opt in opts:
            ref = ref_cpu = None
            for name, _ in trees:
                walls = [w for w, _ in samples[(tu, opt, name)]]
                cpus = [c for _, c in samples[(tu, opt, name)]]
                med, cpu = statistics.median(walls), statistics.median(cpus)
                ref, ref_cpu = ref or med, ref_cpu or cpu
                row = {"tu": os.path.basename(tu), "opt": opt, "tree": name, "median_s": med,
                       "min_s": min(walls), "cpu_median_s": cpu, "ratio_to_first": med / ref,
                       "cpu_ratio_to_first": cpu / ref_cpu, "wall_s": walls, "cpu_s": cpus}
                summary.append(row)
                print("%-32s %-4s %-10s %9.2f %9.2f %9.2f %7.2f %7.2f" % (
                    row["tu"], opt, name, med, row["min_s"], cpu, med / ref, cpu / ref_cpu))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"compiler": version, "reps": a.reps, "trees": dict(trees),
                       "compiled_trees": sorted(compiled), "rows": summary,
                       "library_builds": {n: libraries[n] for n in libraries if libraries[n]}},
                      f, indent=1)


if __name__ == "__main__":
    main()
