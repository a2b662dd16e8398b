#!/usr/bin/env python3
"""Tests of bench/compile/run.py's generated translation units: --umbrellas (one TU per module
umbrella of an installation) and --floor (the headers outside hone that <hone/hone.hpp> includes,
found with the compiler's -H), on a small fake installation written here. The floor's expected
headers are the ones the fake hone headers name; the standard library's own internal headers
(bits/...) must not appear, since the headers that include them do. Needs a C++ compiler ($CXX or
g++); skipped without one.

  python3 -m unittest discover -s bench/tests -v
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compile"))
import run  # noqa: E402

CXX = os.environ.get("CXX", "g++")


@unittest.skipIf(shutil.which(CXX) is None, "no C++ compiler (%s) on PATH" % CXX)
class CompileRunTest(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="hone-compile-test-"))
        hone = self.tmp / "include" / "hone"
        (hone / "a").mkdir(parents=True)
        (hone / "hone.hpp").write_text('#include "hone/alpha.hpp"\n#include "hone/beta.hpp"\n')
        (hone / "alpha.hpp").write_text('#pragma once\n#include "hone/a/one.hpp"\n#include <vector>\n')
        (hone / "beta.hpp").write_text('#pragma once\n#include "hone/a/one.hpp"\n#include <map>\n')
        (hone / "a" / "one.hpp").write_text("#pragma once\n#include <cstdint>\n#include <vector>\n")
        (hone / "notes.txt").write_text("not a header\n")
        self.include = str(self.tmp / "include")
        self.work = self.tmp / "work"
        self.work.mkdir()

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_umbrellas_are_the_module_headers_but_hone_hpp(self):
        tus = run.umbrella_tus(self.include, str(self.work))
        self.assertEqual([Path(t).name for t in tus], ["umbrella_alpha.cpp", "umbrella_beta.cpp"])
        self.assertEqual(Path(tus[0]).read_text(), "#include <hone/alpha.hpp>\n")

    def test_floor_lists_the_outside_headers_hone_names_in_order(self):
        tu = Path(run.floor_tu(CXX, "c++20", self.include, str(self.work), []))
        names = [line.split('"')[1] for line in tu.read_text().splitlines()]
        self.assertEqual([os.path.basename(n) for n in names], ["cstdint", "vector", "map"])
        for n in names:
            self.assertNotIn(os.path.realpath(self.include), os.path.realpath(n))
        # The floor compiles on its own, without hone's include folder.
        r = subprocess.run([CXX, "-std=c++20", "-fsyntax-only", str(tu)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)


if __name__ == "__main__":
    unittest.main()
