#!/usr/bin/env python3
"""custody-plot draws a replay report (PyTorch's reserved bytes included) and refuses what is not
one; it draws memory snapshots' live bytes per owner, one panel per snapshot (per rank), and prints
their figures; without matplotlib (which nothing else in custody needs) it says what to install, and
the drawing itself is skipped.

usage: plot_test.py CUSTODY_PLOT CUSTODY_REPLAY CUSTODY_TRACE"""

import importlib.machinery
import importlib.util
import json
import os
import pickle
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


def snapshot(events, blocks=()):
    """A snapshot as custody writes it: `events` are (action, address, size, owner); `blocks` the
    active blocks (address, size, owner) of one segment."""
    trace = [{"action": a, "addr": addr, "size": size, "stream": 0, "time_us": i, "frames": [],
              "user_metadata": owner} for i, (a, addr, size, owner) in enumerate(events)]
    segment_blocks = [{"address": addr, "size": size, "requested_size": size, "state": "active_allocated",
                       "frames": [{"filename": "<custody owner>", "line": 0, "name": owner}]}
                      for addr, size, owner in blocks]
    return {"segments": [{"device": 0, "address": 0x100000, "total_size": 1 << 24, "blocks": segment_blocks}],
            "device_traces": [trace], "allocator_settings": {"allocator": "custody"}}


def plot_module():
    loader = importlib.machinery.SourceFileLoader("custody_plot", PLOT)
    spec = importlib.util.spec_from_loader("custody_plot", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


class Snapshots(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def write(self, name, data):
        path = os.path.join(self.dir.name, name)
        with open(path, "wb") as f:
            pickle.dump(data, f, protocol=2)
        return path

    def ranks(self):
        """Two ranks: rank 0 with a block live before its trace began (freed in it) and one never
        freed; rank 1 a kv cache that grows."""
        rank0 = snapshot([("alloc", 0x200000, 1000, "weights"), ("free_completed", 0x300000, 500, "activations"),
                          ("alloc", 0x400000, 3000, "activations"), ("free_completed", 0x400000, 3000, "activations")],
                         blocks=[(0x200000, 1000, "weights"), (0x500000, 700, "kv_cache")])
        rank1 = snapshot([("alloc", 0x200000 + 4096 * i, 4096, "kv_cache") for i in range(3)])
        return self.write("custody-snapshot-rank0.pickle", rank0), self.write("custody-snapshot-rank1.pickle", rank1)

    def test_prints_each_owners_peak_and_end_per_rank_without_matplotlib(self):
        p = run(sys.executable, PLOT, *self.ranks(), "--summary")
        self.assertEqual(p.returncode, 0, p.stderr)
        lines = [line.split() for line in p.stdout.splitlines()]
        self.assertEqual(lines[0][:2], ["custody-snapshot-rank0.pickle,", "device"])
        rank0 = {l[0]: (int(l[2]), int(l[5])) for l in lines[1:4]}
        # activations: 500 live before the trace, freed, then 3000 for a while; kv_cache: live throughout.
        self.assertEqual(rank0, {"activations": (3000, 0), "weights": (1000, 1000), "kv_cache": (700, 700)})
        self.assertEqual(lines[5][:3], ["kv_cache", "peak", str(3 * 4096)])

    @unittest.skipUnless(HAVE_MATPLOTLIB, "matplotlib is not installed")
    def test_draws_a_png_per_rank(self):
        image = os.path.join(self.dir.name, "live.png")
        p = run(sys.executable, PLOT, *self.ranks(), "-o", image)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(image, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

    def test_refuses_what_is_not_a_plain_snapshot(self):
        class Evil:
            def __reduce__(self):
                return (os.system, ("true",))
        for data, fragment in ((Evil(), "posix.system"), ([1, 2], "not a memory snapshot"),
                               ({"segments": [], "device_traces": [[{"action": "alloc", "addr": -1, "size": 1}]]},
                                "addr")):
            p = run(sys.executable, PLOT, self.write("bad.pickle", data), "--summary")
            self.assertEqual(p.returncode, 2, p.stdout)
            self.assertNotIn("Traceback", p.stderr)
            self.assertIn(fragment, p.stderr)


class ReplayPicture(unittest.TestCase):
    def test_the_y_axis_shows_the_band_the_lines_span(self):
        band = plot_module().band
        low, high = band([[10 << 30, 10 << 30, 11 << 30], [(10 << 30) + 5]])
        self.assertGreater(low, 9 << 30)  # not from 0: the band that matters fills the picture
        self.assertLess(high, 12 << 30)
        self.assertLessEqual(low, 10 << 30)
        self.assertGreaterEqual(high, 11 << 30)
        self.assertEqual(band([]), (0, 0))

    @unittest.skipUnless(HAVE_MATPLOTLIB, "matplotlib is not installed")
    def test_the_live_line_is_on_top_and_the_legend_beside_the_plot(self):
        module = plot_module()
        saved = {}
        module.save = lambda fig, output: saved.setdefault("figure", fig)
        report = {"trace": {"file": "t"}, "devices": [{
            "device": 0, "ops": 3, "peak_live_bytes": 3 << 20,
            "allocators": [{"allocator": a, "fragmentation": 0.0, "peak_reserved_bytes": 3 << 20,
                            "timeline": {"op": [0, 1, 2], "live": [1 << 20, 3 << 20, 2 << 20],
                                         "reserved": [1 << 20, 3 << 20, 2 << 20]}} for a in ("malloc", "pool")]}]}
        module.draw(report, "x.png", None, None)
        ax = saved["figure"].axes[0]
        live = [line for line in ax.get_lines() if line.get_label() == "live (the trace)"][0]
        self.assertGreater(live.get_zorder(), max(l.get_zorder() for l in ax.get_lines() if l is not live))
        legend = ax.get_legend()
        saved["figure"].canvas.draw()
        inside = ax.get_window_extent()
        self.assertGreaterEqual(legend.get_window_extent().x0, inside.x1)  # right of the axes: covers no line


if __name__ == "__main__":
    PLOT, REPLAY, TRACE_TOOL = sys.argv[1], sys.argv[2], sys.argv[3]
    unittest.main(argv=sys.argv[:1], verbosity=2)
