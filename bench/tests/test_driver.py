#!/usr/bin/env python3
"""Tests of the interleaved driver (bench/driver.py), the serve mode of the peers' shared package
(bench/peers/_common) and the best-of-kernels limit of bench/report.py, on synthetic servers whose
answers are worked out by hand here. Standard library only; run by CTest with test_report.py:

  python3 -m unittest discover -s bench/tests -v
"""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH / "peers"))
import driver  # noqa: E402
import report  # noqa: E402
import _common  # noqa: E402

# A stand-in for a hone program in serve mode: answers like bench/support/harness.hpp, with a
# fixed time per benchmark (ms), and appends every request it runs to the file LOG.
FAKE_PROGRAM = textwrap.dedent('''\
    import json, sys
    TIMES = {"w/hone": 2.0, "w/limit": 1.0, "w/limit_nt": 0.8, "v/hone": 5.0}
    LOG = sys.argv[1]
    out = sys.stdout
    print(json.dumps({"hello": "fake", "protocol": 1,
                      "context": {"hone_compiler": "gcc 0"}}), file=out, flush=True)
    for line in sys.stdin:
        line = line.strip()
        if line == "quit":
            break
        if line == "list":
            print(json.dumps({"benchmarks": list(TIMES)}), file=out, flush=True)
        elif line.startswith("run "):
            name = line[4:]
            with open(LOG, "a") as f:
                f.write(name + "\\n")
            run = {"name": name + "/real_time", "run_name": name + "/real_time",
                   "run_type": "iteration", "iterations": 3, "real_time": TIMES[name],
                   "time_unit": "ms", "bytes_per_iter": 1e6, "threads": 2}
            print(json.dumps({"name": name, "runs": [run]}), file=out, flush=True)
    ''')

# A stand-in peer built on bench/peers/_common: workload "w" for impl "torch" (a sample of 4 ms,
# logged like the program's) and "v" unavailable.
FAKE_PEER = textwrap.dedent('''\
    import sys
    sys.path.insert(0, sys.argv[1])
    import _common
    LOG = sys.argv[2]
    args = _common.parser(None).parse_args(sys.argv[3:])

    def setup():
        def sample():
            with open(LOG, "a") as f:
                f.write("w/torch\\n")
            return 0.004
        return _common.Bench(sample, lambda s: _common.throughput("w", "torch", s, 10**6, 2))

    sys.exit(_common.run(args, [_common.Workload("w", "torch", setup)],
                         _common.unavailable(["v"], "torch", "no such op"), "fake_peer"))
    ''')


class DriverTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)
        self.log = self.dir / "log.txt"

    def tearDown(self):
        self.tmp.cleanup()

    def run_driver(self, *extra: str) -> list[dict]:
        prog = self.dir / "bench_fake"
        prog.write_text(f"#!{sys.executable}\n" + FAKE_PROGRAM)
        prog.chmod(0o755)
        # The driver starts a program with its own flags after the path: the fake takes the log
        # file as argv[1], so wrap it.
        wrapper = self.dir / "bench_wrapped"
        wrapper.write_text(f"#!/bin/sh\nexec {prog} {self.log} \"$@\"\n")
        wrapper.chmod(0o755)
        peer = self.dir / "fake_peer.py"
        peer.write_text(FAKE_PEER)
        peer_wrapper = self.dir / "peer.sh"
        peer_wrapper.write_text(f"#!/bin/sh\nscript=\"$1\"; shift\nexec {sys.executable} "
                                f"\"$script\" {BENCH / 'peers'} {self.log} \"$@\"\n")
        peer_wrapper.chmod(0o755)
        out = self.dir / "samples.json"
        rc = driver.main(["--programs", str(wrapper), "--peers", str(peer), "--python",
                          str(peer_wrapper), "--out", str(out), "--min-time", "0.01", *extra])
        self.assertEqual(rc, 0)
        return json.loads(out.read_text())

    def test_interleaves_repetition_by_repetition(self):
        samples = self.run_driver("--repetitions", "3", "--filter", "^w/")
        order = self.log.read_text().split()
        impls = ["w/hone", "w/limit", "w/limit_nt", "w/torch"]
        # Each repetition runs every implementation once, the order rotated by one each time.
        self.assertEqual(order, impls + impls[1:] + impls[:1] + impls[2:] + impls[:2])
        self.assertEqual(len(samples), 12)
        self.assertEqual({(s["impl"], s["repetition"]) for s in samples},
                         {(i.split("/")[1], r) for i in impls for r in range(3)})
        self.assertTrue(all(s["interleaved"].startswith("1 round(s) x 3 repetition(s)")
                            for s in samples))
        hone = [s for s in samples if s["impl"] == "hone"]
        self.assertEqual([s["samples_ms"] for s in hone], [[2.0]] * 3)
        self.assertEqual(hone[0]["compiler"], "gcc 0")  # the program's context
        # Pooled by report.py: three samples each; the limit is the best limit row (limit_nt).
        results = report.combine(samples)
        report.add_ratios(results)
        by_impl = {r["impl"]: r for r in results}
        self.assertEqual(by_impl["hone"]["repetitions"], 3)
        self.assertAlmostEqual(by_impl["hone"]["value"], 0.5)  # 1e6 bytes / 2 ms, in GB/s
        self.assertAlmostEqual(by_impl["hone"]["fraction_of_limit"], 0.4)  # 0.8 ms / 2 ms
        self.assertEqual(by_impl["hone"]["limit_impl"], "limit_nt")
        self.assertAlmostEqual(by_impl["limit"]["fraction_of_limit"], 0.8)
        self.assertAlmostEqual(by_impl["torch"]["ratio_vs_hone"], 0.5)
        table = report.table(results)
        self.assertIn("samples interleaved: 1 round(s) x 3 repetition(s)", table)
        self.assertIn("against the best limit row", table)

    def test_unavailable_peer_is_asked_once_and_rounds_repeat(self):
        samples = self.run_driver("--repetitions", "2", "--rounds", "2", "--filter", "^v/")
        self.assertEqual(self.log.read_text().split(), ["v/hone"] * 4)
        gone = [s for s in samples if s["impl"] == "torch"]
        self.assertEqual(len(gone), 1)
        self.assertIs(gone[0]["available"], False)
        self.assertEqual(sorted((s["round"], s["repetition"]) for s in samples
                                if s["impl"] == "hone"), [(1, 0), (1, 1), (2, 0), (2, 1)])


class ServeTest(unittest.TestCase):
    def test_serve_keeps_the_workload_and_answers_each_request(self):
        setups = []

        def setup(name):
            setups.append(name)
            calls = iter(range(1, 100))
            return _common.Bench(lambda: next(calls) * 1e-3,
                                 lambda s: _common.time_ms(name, "p", s, 1))

        def broken():
            raise RuntimeError("no fused kernel")

        workloads = [_common.Workload("a", "p", lambda: setup("a")),
                     _common.Workload("b", "p", lambda: setup("b")),
                     _common.Workload("c", "p", broken)]
        answers = io.StringIO()
        requests = ["list\n", "run a/p\n", "run a/p\n", "run b/p\n", "run a/p\n", "run c/p\n",
                    "run c/p\n", "run z/p\n", "what\n", "quit\n", "run a/p\n"]
        _common.serve(workloads, _common.unavailable(["d"], "p", "missing"), "peer", requests,
                      answers)
        lines = [json.loads(x) for x in answers.getvalue().splitlines()]
        self.assertEqual(lines[0], {"hello": "peer", "protocol": 1})
        self.assertEqual(lines[1], {"benchmarks": ["a/p", "b/p", "c/p", "d/p"]})
        # a is set up once for its two runs, then again after b replaced it.
        self.assertEqual([x["record"]["samples_ms"] for x in lines[2:6]],
                         [[1.0], [2.0], [1.0], [1.0]])
        self.assertEqual(setups, ["a", "b", "a"])
        self.assertEqual(lines[6]["record"]["available"], False)
        self.assertIn("no fused kernel", lines[6]["record"]["note"])
        self.assertEqual(lines[7], lines[6])  # not set up again
        self.assertIn("no benchmark named z/p", lines[8]["error"])
        self.assertIn("unknown request", lines[9]["error"])
        self.assertEqual(len(lines), 10)  # nothing after quit

    def test_peers_list_their_workloads_when_serving(self):
        """The real peers start in serve mode with the options the driver passes and list
        exactly their selected workloads (or report them unavailable where a package is missing);
        a filter that selects nothing gives an empty list."""
        peer = BENCH / "peers" / "zstd_shuffle.py"
        proc = subprocess.run(
            [sys.executable, str(peer), "--serve", "--threads", "1", "--min-time", "0.01",
             "--filter", "adam_v"], input="list\nquit\n", capture_output=True, text=True,
            check=True, timeout=120)
        hello, listing = [json.loads(x) for x in proc.stdout.splitlines()]
        self.assertEqual(hello["protocol"], 1)
        self.assertEqual(listing, {"benchmarks": ["ckpt_compress_adam_v/zstd_shuffle"]})


class ProgramServeTest(unittest.TestCase):
    def test_bench_core_serves(self):
        """A real program in serve mode (bench_core of the bench preset, or HONE_BENCH_CORE): the
        hello with its context, every limit kernel listed, one sample per run request whose
        counters are the program's, errors for unknown names, and nothing else on stdout although
        the program prints elsewhere."""
        prog = Path(os.environ.get("HONE_BENCH_CORE",
                                   BENCH.parent / "build" / "bench" / "bench" / "bench_core"))
        if not prog.exists():
            self.skipTest(f"{prog} is not built (scripts/bench builds it)")
        proc = subprocess.run(
            [str(prog), "--hone_serve", "--benchmark_min_time=0.01", "--hone_threads=1"],
            input="list\nrun multi_tensor_axpy_64M/limit_nt\nrun multi_tensor_axpy_64M/nope\n",
            capture_output=True, text=True, check=True, timeout=600)
        hello, listing, run, missing = [json.loads(x) for x in proc.stdout.splitlines()]
        self.assertEqual(hello["protocol"], 1)
        self.assertEqual(hello["context"]["hone_threads"], "1")
        for impl in ("hone", "limit", "limit_nt", "limit_arena"):
            self.assertIn(f"multi_tensor_axpy_64M/{impl}", listing["benchmarks"])
        [r] = run["runs"]
        self.assertEqual(report.split_name(r["run_name"]), ("multi_tensor_axpy_64M", "limit_nt"))
        self.assertEqual(r["bytes_per_iter"], 64 * 2**20 * 12)
        self.assertGreater(r["real_time"], 0)
        self.assertIn("no benchmark named", missing["error"])


class LimitTest(unittest.TestCase):
    def test_best_limit_row_is_the_limit(self):
        rows = [{"name": "w", "impl": impl, "samples_ms": [ms], "bytes_per_iter": 10**9}
                for impl, ms in (("hone", 10.0), ("limit", 20.0), ("limit_nt", 8.0),
                                 ("limit_arena", 12.0))]
        rows.append({"name": "t", "impl": "hone", "samples_ms": [4.0]})
        rows.append({"name": "t", "impl": "limit", "samples_ms": [2.0]})
        results = report.combine(rows)
        report.add_ratios(results)
        r = {(x["name"], x["impl"]): x for x in results}
        # Above the plain limit (200%) but below the non-temporal one: the limit is limit_nt.
        self.assertAlmostEqual(r[("w", "hone")]["fraction_of_limit"], 0.8)
        self.assertEqual(r[("w", "hone")]["limit_impl"], "limit_nt")
        self.assertAlmostEqual(r[("w", "limit_arena")]["fraction_of_limit"], 8 / 12)
        self.assertAlmostEqual(r[("t", "hone")]["fraction_of_limit"], 0.5)  # times: limit / value
        lines = report.table(results).splitlines()
        self.assertTrue(lines[2].split()[1].startswith("limit"))  # limit rows first


if __name__ == "__main__":
    unittest.main()
