#!/usr/bin/env python3
"""Tests of bench/report.py (Google Benchmark JSON and peer records -> results.json records, ratios,
counters, the table) and of the peer scripts' shared package bench/peers/_common, on synthetic
inputs whose expected figures are worked out by hand here. Standard library only; registered with
CTest by bench/CMakeLists.txt (HONE_BUILD_BENCH), or run directly:

  python3 -m unittest discover -s bench/tests -v
"""
from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH / "peers"))
import report  # noqa: E402
import _common  # noqa: E402


def gb_run(name: str, ms: float, rep: int, **counters) -> dict:
    """One repetition of a Google Benchmark run as its JSON output writes it (time in ms)."""
    return {"name": name, "family_index": 0, "per_family_instance_index": 0, "run_name": name,
            "run_type": "iteration", "repetitions": 3, "repetition_index": rep,
            "threads": counters.pop("threads", 1.0), "iterations": 10, "real_time": ms,
            "cpu_time": ms / 2, "time_unit": "ms", **counters}


def gb_median(name: str, ms: float, **counters) -> dict:
    return {**gb_run(name, ms, 0, **counters), "run_type": "aggregate",
            "aggregate_name": "median", "aggregate_unit": "time"}


class ReportTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, name: str, doc) -> Path:
        path = self.dir / name
        path.write_text(json.dumps(doc))
        return path

    def gbench_file(self, name: str, benchmarks: list[dict]) -> Path:
        return self.write(name, {"context": {"hone_compiler": "gcc 12"}, "benchmarks": benchmarks})

    def run_report(self, gbench: list[Path], peers: list[Path]) -> tuple[list[dict], str]:
        out = self.dir / "results.json"
        proc = subprocess.run(
            [sys.executable, str(BENCH / "report.py"), "--gbench", *map(str, gbench), "--peer",
             *map(str, peers), "--out", str(out)], capture_output=True, text=True, check=True)
        return json.loads(out.read_text()), proc.stdout

    @staticmethod
    def find(results: list[dict], name: str, impl: str) -> dict:
        matches = [r for r in results if r["name"] == name and r["impl"] == impl]
        assert len(matches) == 1, (name, impl, results)
        return matches[0]

    def test_split_name(self):
        self.assertEqual(report.split_name("adamw_fp32_1M/hone/real_time"),
                         ("adamw_fp32_1M", "hone"))
        self.assertEqual(report.split_name("a/b/limit/manual_time"), ("a/b", "limit"))
        self.assertEqual(report.split_name("x/hone/min_time:0.050"), ("x", "hone"))
        self.assertEqual(report.split_name("lonely"), ("lonely", "hone"))

    def test_records_counters_ratios_and_table(self):
        w8, trainer, dqn = "adamw8bit_64M", "trainer_overhead", "dqn_cartpole_time_to_solve"
        gb = self.gbench_file("bench_optim.json", [
            # throughput: 1e9 bytes per iteration; 10, 20, 40 ms -> median 20 ms = 50 GB/s
            gb_run(f"{w8}/hone/real_time", 10.0, 0, bytes_per_iter=1e9, bytes_per_second=1e11,
                   threads=2.0, state_bytes=300.0, fp32_state_bytes=1000.0, state_ratio=0.3),
            gb_run(f"{w8}/hone/real_time", 40.0, 1, bytes_per_iter=1e9, bytes_per_second=2.5e10,
                   threads=2.0, state_bytes=300.0, fp32_state_bytes=1000.0, state_ratio=0.3),
            gb_run(f"{w8}/hone/real_time", 20.0, 2, bytes_per_iter=1e9, bytes_per_second=5e10,
                   threads=2.0, state_bytes=300.0, fp32_state_bytes=1000.0, state_ratio=0.3),
            gb_median(f"{w8}/hone/real_time", 20.0, bytes_per_iter=1e9, state_ratio=0.3),
            # the limit: 8, 10, 12 ms -> median 10 ms = 100 GB/s
            *(gb_run(f"{w8}/limit/real_time", ms, i, bytes_per_iter=1e9, threads=2.0)
              for i, ms in enumerate((8.0, 12.0, 10.0))),
            # a time: paired_ratio 1.02, 1.10, 1.04 -> median 1.04
            *(gb_run(f"{trainer}/hone/real_time", ms, i, paired_ratio=pr, zero_copy=1.0)
              for i, (ms, pr) in enumerate(((5.0, 1.02), (6.0, 1.10), (7.0, 1.04)))),
            {"name": "broken/hone", "run_name": "broken/hone", "error_occurred": True,
             "error_message": "no device"},
        ])
        # A second round of the trainer's benchmark: its samples and counters are pooled.
        gb2 = self.gbench_file("bench_optim.2.json", [
            gb_run(f"{trainer}/hone/real_time", 9.0, 0, paired_ratio=1.30, zero_copy=1.0),
            gb_run(f"{trainer}/hone/real_time", 8.0, 1, paired_ratio=1.20, zero_copy=1.0)])
        # The DQN workload: hone from a Google Benchmark run, one repetition per seed (100, 300,
        # 200 ms; the second seed gives up at 100000 steps), sb3 from its peer (1000, 400,
        # 600 ms): hone takes 200 / 600 of sb3's time; solved is the mean of the 0/1 outcomes.
        gb3 = self.gbench_file("bench_dqn.json", [
            gb_run(f"{dqn}/hone/manual_time", ms, i, env_steps_to_solve=steps, solved=ok,
                   seed=float(i))
            for i, (ms, steps, ok) in enumerate(((100.0, 12000.0, 1.0), (300.0, 1e5, 0.0),
                                                 (200.0, 16000.0, 1.0)))])
        peer = self.write("peer_sb3.json", [
            {"name": dqn, "impl": "sb3", "metric": "time", "value": 600.0, "unit": "ms",
             "samples_ms": [1000.0, 400.0, 600.0], "threads": 1, "env_steps_to_solve": 24000,
             "solved": 2 / 3},
            {"name": w8, "impl": "torch", "available": False, "note": "torch missing"}])
        results, printed = self.run_report([gb, gb2, gb3], [peer])

        hone = self.find(results, w8, "hone")
        self.assertEqual((hone["metric"], hone["unit"]), ("throughput", "GB/s"))
        self.assertAlmostEqual(hone["value"], 50.0)
        self.assertAlmostEqual(hone["best"], 100.0)
        self.assertEqual(hone["repetitions"], 3)  # the median aggregate is not a repetition
        self.assertEqual(hone["samples_ms"], [10.0, 40.0, 20.0])
        self.assertEqual(hone["bytes_per_iter"], 10**9)
        self.assertEqual(hone["threads"], 2)
        self.assertEqual(hone["counters"], {"bytes_per_iter": 1e9, "state_bytes": 300.0,
                                            "fp32_state_bytes": 1000.0, "state_ratio": 0.3})
        self.assertAlmostEqual(hone["fraction_of_limit"], 0.5)
        limit = self.find(results, w8, "limit")
        self.assertAlmostEqual(limit["value"], 100.0)
        self.assertAlmostEqual(limit["ratio_vs_hone"], 2.0)
        self.assertEqual(limit["counters"], {"bytes_per_iter": 1e9})

        t = self.find(results, trainer, "hone")
        self.assertEqual((t["metric"], t["unit"]), ("time", "ms"))
        self.assertEqual(t["repetitions"], 5)
        self.assertAlmostEqual(t["value"], 7.0)  # median of 5, 6, 7, 9, 8
        self.assertAlmostEqual(t["counters"]["paired_ratio"], 1.10)  # of 1.02 1.10 1.04 1.30 1.20
        self.assertEqual(t["counters"]["zero_copy"], 1.0)
        self.assertNotIn("counter_samples", t)

        h = self.find(results, dqn, "hone")
        s = self.find(results, dqn, "sb3")
        self.assertAlmostEqual(h["value"], 200.0)
        self.assertEqual(h["counters"]["env_steps_to_solve"], 16000.0)  # median
        self.assertAlmostEqual(h["counters"]["solved"], 2 / 3)  # mean
        self.assertAlmostEqual(s["value"], 600.0)
        self.assertAlmostEqual(s["best"], 400.0)
        self.assertAlmostEqual(s["ratio_vs_hone"], 200.0 / 600.0)  # times: hone / peer
        self.assertEqual(s["env_steps_to_solve"], 24000)

        torch = self.find(results, w8, "torch")
        self.assertIs(torch["available"], False)
        self.assertFalse(any(r["name"] == "broken" for r in results))

        header = printed.splitlines()[0].split()
        self.assertEqual(header[-1], "notes")
        rows = printed.split("\n\n")[0].splitlines()[2:]  # the unavailable notes follow
        line = {(x.split()[0], x.split()[1]): x for x in rows}
        self.assertIn("state_ratio=0.3", line[(w8, "hone")])
        self.assertNotIn("=", line[(w8, "limit")])
        self.assertIn("paired_ratio=1.1", line[(trainer, "hone")])
        self.assertNotIn("zero_copy", printed)  # not a goal figure
        self.assertIn("env_steps_to_solve=16000 solved=0.6667", line[(dqn, "hone")])
        self.assertIn("env_steps_to_solve=24000 solved=0.6667", line[(dqn, "sb3")])
        self.assertIn("0.33x", line[(dqn, "sb3")])
        self.assertIn("unavailable", line[(w8, "torch")])
        self.assertIn("torch (adamw8bit_64M): torch missing", printed)

        # --table on the written file prints the same table.
        again = subprocess.run([sys.executable, str(BENCH / "report.py"), "--table",
                                str(self.dir / "results.json")], capture_output=True, text=True,
                               check=True).stdout
        self.assertEqual(again, printed)

    def test_no_notes_column_without_note_figures(self):
        gb = self.gbench_file("bench_core.json", [
            gb_run("axpy/hone/real_time", 2.0, 0, bytes_per_iter=4e6),
            gb_run("axpy/limit/real_time", 1.0, 0, bytes_per_iter=4e6)])
        results, printed = self.run_report([gb], [])
        self.assertEqual(printed.splitlines()[0].split(),
                         ["workload", "impl", "median", "best", "unit", "vs", "limit", "vs",
                          "hone", "threads", "reps"])
        self.assertAlmostEqual(self.find(results, "axpy", "hone")["fraction_of_limit"], 0.5)
        markdown = report.table(results, markdown=True).splitlines()
        self.assertEqual(markdown[0].count("|"), 10)  # 9 columns
        self.assertTrue(all(row.count("|") == 10 for row in markdown))


class PeerCommonTest(unittest.TestCase):
    def test_records(self):
        r = _common.throughput("w", "torch", [0.5, 0.25, 1.0], 10**9, 2, tensors=3)
        self.assertEqual(list(r)[:11], ["name", "impl", "metric", "value", "unit", "best",
                                        "time_ms", "repetitions", "samples_ms", "bytes_per_iter",
                                        "threads"])
        self.assertAlmostEqual(r["value"], 2.0)  # 1e9 bytes in the median 0.5 s
        self.assertAlmostEqual(r["best"], 4.0)
        self.assertAlmostEqual(r["time_ms"], 500.0)
        self.assertEqual(r["samples_ms"], [500.0, 250.0, 1000.0])
        self.assertEqual(r["tensors"], 3)
        u = _common.time_us("w", "cpprb", [3e-6, 1e-6, 2e-6], 1, peer="p")
        self.assertEqual((u["unit"], u["time_unit"]), ("us", "us"))
        self.assertAlmostEqual(u["value"], 2.0)
        self.assertAlmostEqual(u["best"], 1.0)
        m = _common.time_ms("w", "sb3", [3.0, 1.0, 2.0], 1, solved=1.0)
        self.assertEqual((m["unit"], m["repetitions"], m["solved"]), ("ms", 3, 1.0))
        self.assertAlmostEqual(m["value"], 2000.0)
        self.assertEqual(_common.unavailable(["a"], "x", "why"),
                         [{"name": "a", "impl": "x", "available": False, "note": "why"}])

    def test_select_and_sizes(self):
        self.assertEqual(_common.select(["a_1M", "a_64M", "b_1M"], "torch", "_1M/torch$"),
                         ["a_1M", "b_1M"])
        self.assertEqual(_common.select(["a_1M"], "torch", "a_1M_cuda", "_cuda"), ["a_1M"])
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "w.txt").write_text("3\n4\n")
            (Path(d) / "w_cuda.txt").write_text("5\n")
            self.assertEqual(_common.read_sizes(Path(d), "w"), [3, 4])
            self.assertEqual(_common.read_sizes(Path(d), "w", suffix="_cuda"), [5])
            self.assertEqual(_common.read_sizes(Path(d), "v"), None)

    def test_read_data(self):
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "w.bin").write_bytes(b"\x00\x01\x02")
            self.assertEqual(_common.read_data(Path(d), "w", "no_such_program"), b"\x00\x01\x02")

    def test_zstd_shuffle_peer(self):
        """The compression peer reads the workload's bytes from --sizes-dir: unavailable where
        numpy or zstandard is missing; else a ratio that reflects the data (zeros compress far,
        the shuffled constant-exponent floats less); a size that is not whole elements is an
        error naming the workload."""
        peer = BENCH / "peers" / "zstd_shuffle.py"
        with tempfile.TemporaryDirectory() as d:
            rng = random.Random(1)
            floats = b"".join((0x3f800000 + rng.getrandbits(23)).to_bytes(4, "little")
                              for _ in range(65536))
            (Path(d) / "ckpt_compress_adam_v.bin").write_bytes(floats)
            (Path(d) / "ckpt_compress_bf16_weights.bin").write_bytes(bytes(1 << 18))
            out = Path(d) / "zstd.json"
            subprocess.run([sys.executable, str(peer), "--sizes-dir", d, "--threads", "2",
                            "--repetitions", "1", "--min-time", "0.01", "--out", str(out)],
                           check=True, capture_output=True, text=True)
            records = {r["name"]: r for r in json.loads(out.read_text())}
            self.assertEqual(set(records), {"ckpt_compress_adam_v", "ckpt_compress_bf16_weights"})
            v, z = records["ckpt_compress_adam_v"], records["ckpt_compress_bf16_weights"]
            if v.get("available", True) is False:
                self.assertIn("could not be imported", v["note"])
                return
            self.assertEqual((v["impl"], v["bytes_per_iter"]), ("zstd_shuffle", 64 << 20))
            # One exponent (plane 3 constant), planes 0-2 close to uniform: about 4/3.
            self.assertGreater(v["compress_ratio"], 1.2)
            self.assertLess(v["compress_ratio"], 1.4)
            self.assertGreater(z["compress_ratio"], 100.0)
            (Path(d) / "ckpt_compress_adam_v.bin").write_bytes(bytes(6))
            bad = subprocess.run([sys.executable, str(peer), "--sizes-dir", d, "--filter", "adam_v",
                                  "--out", str(out)], capture_output=True, text=True)
            self.assertNotEqual(bad.returncode, 0)
            self.assertIn("ckpt_compress_adam_v is 6 bytes", bad.stderr)

    def test_measure(self):
        calls = []
        seconds = _common.measure(lambda: calls.append(1), 0.001, 4)
        self.assertEqual(len(seconds), 4)
        self.assertTrue(all(s >= 0 for s in seconds))
        self.assertGreater(len(calls), 4)  # warm-up, calibration and the repetitions
        before = []
        each = _common.measure_each(lambda: None, lambda: before.append(1), 0.0, 3)
        self.assertEqual(len(each), 3)
        self.assertEqual(len(before), 4)  # warm-up, then one call per repetition (min_time 0)

    def test_peers_run_from_anywhere(self):
        """Every peer runs as `python3 -P bench/peers/X.py` from another folder (its own folder
        not on sys.path but for its own insert), takes the options scripts/bench passes, and
        writes [] when --filter selects none of its workloads."""
        peers = sorted((BENCH / "peers").glob("*.py"))
        self.assertIn("sb3_dqn_cartpole.py", [p.name for p in peers])
        with tempfile.TemporaryDirectory() as d:
            for peer in peers:
                out = Path(d) / f"{peer.stem}.json"
                subprocess.run([sys.executable, "-P", str(peer), "--sizes-dir", d,
                                "--filter", "^no_such_workload$", "--threads", "1",
                                "--repetitions", "1", "--min-time", "0.01", "--out", str(out)],
                               cwd=d, check=True, capture_output=True, text=True)
                self.assertEqual(json.loads(out.read_text()), [], peer.name)

    def test_sb3_peer_reports_rather_than_fails(self):
        """The DQN peer writes one record whatever happens: unavailable where stable_baselines3
        or gymnasium is missing (the plain interpreter CTest runs), else a not-solved run after
        one evaluation at 2000 steps (a budget too small to solve CartPole)."""
        peer = BENCH / "peers" / "sb3_dqn_cartpole.py"
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "sb3.json"
            subprocess.run([sys.executable, str(peer), "--seeds", "0", "--max-steps", "2000",
                            "--out", str(out)], check=True, capture_output=True, text=True)
            [r] = json.loads(out.read_text())
            self.assertEqual((r["name"], r["impl"]), ("dqn_cartpole_time_to_solve", "sb3"))
            if r.get("available", True) is False:
                self.assertIn("could not be imported", r["note"])
            else:
                self.assertEqual(r["solved"], 0.0)
                self.assertEqual(r["env_steps_to_solve"], 2000)  # gave up at --max-steps
                self.assertEqual(r["env_steps_per_seed"], [2000])
                self.assertEqual(len(r["samples_ms"]), 1)
            bad = subprocess.run([sys.executable, str(peer), "--seeds", "0,x"],
                                 capture_output=True, text=True)
            self.assertEqual(bad.returncode, 2)
            self.assertIn("--seeds takes comma-separated integers", bad.stderr)
            bad = subprocess.run([sys.executable, str(peer), "--max-steps", "3000"],
                                 capture_output=True, text=True)
            self.assertEqual(bad.returncode, 2)
            self.assertIn("multiple of 2000", bad.stderr)


if __name__ == "__main__":
    unittest.main()
