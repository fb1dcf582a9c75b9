#!/usr/bin/env python3
"""custody-plot draws a replay report (PyTorch's reserved bytes included) and refuses what is not
one; without matplotlib (which nothing else in custody needs) it says what to install, and the
drawing itself is skipped.

usage: plot_test.py CUSTODY_PLOT CUSTODY_REPLAY CUSTODY_TRACE"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

PLOT = REPLAY = TRACE_TOOL = None
COLUMNS = "sequence,time_ns,action,thread,stream,device,bytes,alignment,address,owner,flags"


def run(*args):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300)


try:
    import matplotlib  # noqa: F401
    HAVE_MATPLOTLIB = True
except ImportError:
    HAVE_MATPLOTLIB = False


class Plot(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def report(self):
        """A replay report of a small trace with a reference allocator's reserved bytes."""
        rows = ["1,0,reference_reserve,0,0x0,0,8388608,256,0x0,,pre_trace",
                "2,0,allocate,0,0x0,0,1048576,256,0x1000000,,pre_trace",
                "3,10,allocate,0,0x0,0,2097152,256,0x2000000,,",
                "4,20,deallocate,0,0x0,0,2097152,256,0x2000000,,"]
        csv = self.path("t.csv")
        with open(csv, "w") as f:
            f.write("# metadata,reference,pytorch\n" + COLUMNS + "\n" + "\n".join(rows) + "\n")
        trace = self.path("t.ctrace")
        self.assertEqual(run(TRACE_TOOL, "from-csv", csv, trace).returncode, 0)
        out = self.path("report.json")
        p = run(REPLAY, "--repetitions", "1", "--json", out, trace, "pool", "malloc")
        self.assertEqual(p.returncode, 0, p.stderr)
        return out

    def test_without_matplotlib_it_says_what_to_install(self):
        hide = self.path("hide")
        os.makedirs(os.path.join(hide, "matplotlib"))
        with open(os.path.join(hide, "matplotlib", "__init__.py"), "w") as f:
            f.write("raise ImportError('hidden by the test')\n")
        env = dict(os.environ, PYTHONPATH=hide)
        p = subprocess.run([sys.executable, PLOT, self.report(), "-o", self.path("x.png")], capture_output=True,
                           text=True, env=env, timeout=300)
        self.assertEqual(p.returncode, 2)
        self.assertIn("needs matplotlib: %s -m pip install matplotlib" % sys.executable, p.stderr)
        self.assertFalse(os.path.exists(self.path("x.png")))

    @unittest.skipUnless(HAVE_MATPLOTLIB, "matplotlib is not installed")
    def test_draws_a_png(self):
        image = self.path("replay.png")
        p = run(sys.executable, PLOT, self.report(), "-o", image)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(image, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

    def test_refuses_deep_nesting_and_numbers_it_cannot_draw(self):
        deep = self.path("deep.json")
        with open(deep, "w") as f:
            f.write("[" * 100000 + "]" * 100000)
        p = run(sys.executable, PLOT, deep, "-o", self.path("x.png"))
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertNotIn("Traceback", p.stderr)
        self.assertIn("nested", p.stderr)
        with open(self.report()) as f:
            good = json.load(f)
        for change, fragment in (
                (lambda r: r["devices"][0]["allocators"][0]["timeline"]["reserved"].__setitem__(0, 10 ** 400),
                 "timeline"),
                (lambda r: r["devices"][0]["allocators"][0].__setitem__("fragmentation", float("nan")), "fragmentation"),
                (lambda r: r["devices"][0]["allocators"][0]["timeline"]["op"].append(7), "timeline"),
                (lambda r: r["devices"][0].__setitem__("allocators", {"a": 1}), "allocators"),
                (lambda r: r.__setitem__("capacity_bytes", "80GiB"), "capacity_bytes")):
            report = json.loads(json.dumps(good))
            change(report)
            bad = self.path("bad.json")
            with open(bad, "w") as f:
                json.dump(report, f)
            p = run(sys.executable, PLOT, bad, "-o", self.path("x.png"))
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertNotIn("Traceback", p.stderr)
            self.assertIn(fragment, p.stderr)

    def test_refuses_what_is_not_a_report(self):
        other = self.path("other.json")
        with open(other, "w") as f:
            json.dump({"schema": "custody.debug.rank_report", "version": 1}, f)
        p = run(sys.executable, PLOT, other, "-o", self.path("x.png"))
        self.assertEqual(p.returncode, 2)
        self.assertIn("not a custody-replay report", p.stderr)
        p = run(sys.executable, PLOT, self.path("missing.json"), "-o", self.path("x.png"))
        self.assertEqual(p.returncode, 2)
        p = run(sys.executable, PLOT, self.report(), "-o", self.path("x.png"), "--device", "4")
        self.assertEqual(p.returncode, 2)
        self.assertIn("no device 4", p.stderr)


if __name__ == "__main__":
    PLOT, REPLAY, TRACE_TOOL = sys.argv[1], sys.argv[2], sys.argv[3]
    unittest.main(argv=sys.argv[:1], verbosity=2)
