#!/usr/bin/env python3
"""custody-replay and custody-trace driven as a user would: the report, JSON and Perfetto outputs,
the progress bar, and bad input (exit 2, a message naming the place, no output file left behind).

usage: cli_test.py CUSTODY_REPLAY CUSTODY_TRACE"""

import glob
import json
import os
import subprocess
import sys
import tempfile
import unittest

REPLAY = TRACE_TOOL = None
COLUMNS = "sequence,time_ns,action,thread,stream,device,bytes,alignment,address,owner,flags"
MiB = 1 << 20


def run(*args):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300)


def row(seq, action, size, address, stream=0, device=0, alignment=256, owner="", flags=""):
    return "%d,%d,%s,0,0x%x,%d,%d,%d,0x%x,%s,%s" % (seq, seq * 100, action, stream, device, size, alignment, address,
                                                   owner, flags)


def small_rows():
    """1 MiB and 2 MiB live (peak 3 MiB at op 1), the first freed on another stream, then the rest."""
    return [row(1, "allocate", MiB, 0x10000000), row(2, "allocate", 2 * MiB, 0x20000000, stream=0xA),
            row(3, "deallocate", MiB, 0x10000000, stream=0xB), row(4, "allocate", MiB // 2, 0x30000000, stream=0xA),
            row(5, "deallocate", 2 * MiB, 0x20000000), row(6, "deallocate", MiB // 2, 0x30000000, stream=0xA)]


class Case(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def trace(self, rows, name="t.ctrace", metadata=(("source", "test"),)):
        """A trace made from CSV rows by custody-trace from-csv."""
        csv = self.path(name + ".csv")
        with open(csv, "w") as f:
            for k, v in metadata:
                f.write("# metadata,%s,%s\n" % (k, v))
            f.write(COLUMNS + "\n")
            for r in rows:
                f.write(r + "\n")
        out = self.path(name)
        p = run(TRACE_TOOL, "from-csv", csv, out)
        self.assertEqual(p.returncode, 0, p.stderr)
        return out

    def refused(self, args, *fragments):
        p = run(REPLAY, *args)
        self.assertEqual(p.returncode, 2, "expected exit 2; stdout: %s stderr: %s" % (p.stdout, p.stderr))
        for fragment in fragments:
            self.assertIn(fragment, p.stderr)
        return p

    def no_files_like(self, prefix):
        self.assertEqual(glob.glob(prefix + "*"), [], "a file was left behind")


class ReplayOutputs(Case):
    def test_table_names_every_allocator_and_the_figures(self):
        t = self.trace(small_rows())
        p = run(REPLAY, "--repetitions", "2", "--capacity", "2.5MiB", t, "pool", "address_space", "malloc", "pmr_sync")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stderr, "")  # no progress bar when standard error is not a terminal
        for text in ("pool", "address_space", "malloc", "pmr_sync", "peak live 3.00 MiB at op 1 (event 2)",
                     "3 streams", "fragmentation", "time/op", "vs pool", "mean reserved", "mean reserved / live"):
            self.assertIn(text, p.stdout)
        leaf = [line for line in p.stdout.splitlines() if line.startswith("address_space")][0]
        self.assertIn("1.000", leaf)                # reserved == live
        self.assertIn("op 1 (event 2)", leaf)       # over 2.5 MiB from the second allocation

    def test_json_report(self):
        t = self.trace(small_rows())
        out = self.path("report.json")
        p = run(REPLAY, "--repetitions", "3", "--json", out, t, "pool", "address_space")
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(out) as f:
            report = json.load(f)
        self.assertEqual(report["schema"], "custody.replay.report")
        self.assertEqual(report["version"], 1)
        self.assertEqual(report["repetitions"], 3)
        d = report["devices"][0]
        self.assertEqual(d["peak_live_bytes"], 3 * MiB)
        self.assertEqual(d["ops"], 6)
        names = [a["allocator"] for a in d["allocators"]]
        self.assertEqual(names, ["pool", "address_space"])
        leaf = d["allocators"][1]
        self.assertEqual(leaf["peak_reserved_bytes"], 3 * MiB)
        self.assertEqual(leaf["fragmentation"], 1.0)
        # Live after each op: 1, 3, 2, 2.5, 0.5, 0 MiB; what the leaf held, averaged the same way.
        self.assertEqual(leaf["mean_live_bytes"], 1.5 * MiB)
        self.assertGreaterEqual(leaf["mean_reserved_bytes"], leaf["mean_live_bytes"])
        self.assertEqual(len(leaf["seconds"]), 3)
        self.assertEqual(len(leaf["timeline"]["op"]), 6)
        self.assertIsNone(d["reference"])
        self.no_files_like(out + ".partial")

    def test_json_to_standard_output_replaces_the_table(self):
        t = self.trace(small_rows())
        p = run(REPLAY, "--json", "-", "--repetitions", "1", t, "pool")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(json.loads(p.stdout)["schema"], "custody.replay.report")

    def test_perfetto_trace(self):
        t = self.trace(small_rows())
        out = self.path("replay.perfetto.json")
        p = run(REPLAY, "--perfetto", out, "--repetitions", "1", t, "pool", "malloc")
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(out) as f:
            events = json.load(f)["traceEvents"]
        names = [e["args"]["name"] for e in events if e["ph"] == "M"]
        self.assertEqual(names, ["device 0: pool", "device 0: malloc"])
        counters = [e for e in events if e["ph"] == "C"]
        self.assertEqual({e["name"] for e in counters}, {"live", "reserved"})
        self.assertEqual(max(e["args"]["bytes"] for e in counters if e["name"] == "live"), 3 * MiB)

    def test_progress_bar_on_request(self):
        t = self.trace(small_rows())
        p = run(REPLAY, "--progress", "--repetitions", "1", t, "pool")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("[", p.stderr)
        self.assertIn("100%", p.stderr)
        self.assertNotIn("%", run(REPLAY, "--no-progress", "--repetitions", "1", t, "pool").stderr)

    def test_devices_and_device_choice(self):
        rows = small_rows() + [row(7, "allocate", 4 * MiB, 0x10000000, device=1),
                               row(8, "deallocate", 4 * MiB, 0x10000000, device=1)]
        t = self.trace(rows)
        p = run(REPLAY, "--repetitions", "1", t, "pool")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("device 0: 6 ops", p.stdout)
        self.assertIn("device 1: 2 ops", p.stdout)
        p = run(REPLAY, "--repetitions", "1", "--device", "1", t, "pool")
        self.assertNotIn("device 0:", p.stdout)
        self.refused(["--device", "5", t, "pool"], "no allocation to replay on device 5")

    def test_list_and_help(self):
        p = run(REPLAY, "--list")
        self.assertEqual(p.returncode, 0)
        for name in ("pool", "address_space", "host_memory", "malloc", "pmr_unsync", "pmr_sync", "cuda_malloc",
                     "cuda_async", "cub"):
            self.assertIn(name, p.stdout)
        self.assertEqual(run(REPLAY, "--help").returncode, 0)


class ReplayBadInput(Case):
    def test_unknown_allocator_option_and_value(self):
        t = self.trace(small_rows())
        out = self.path("r.json")
        self.refused(["--json", out, t, "pool", "nope"], "allocator 'nope': unknown allocator")
        self.refused([t, "pool:nope=1"], "allocator 'pool:nope=1': unknown option 'nope'")
        self.refused([t, "pool:maximum_size=big"], "maximum_size='big' is not a size")
        self.refused([t, "malloc:x=1"], "takes no options")
        self.refused([t, "--repetitions", "0", "pool"], "--repetitions takes an integer of at least 1")
        self.refused([t, "--capacity", "lots", "pool"], "--capacity takes a size")
        self.refused([t, "--frobnicate", "pool"], "unknown option '--frobnicate'")
        self.refused([t], "no allocator given")
        self.refused([], "no trace given")
        self.no_files_like(out)

    def test_missing_unreadable_and_foreign_traces(self):
        self.refused([self.path("missing.ctrace"), "pool"], "missing.ctrace", "cannot open")
        self.refused([self.dir.name, "pool"], "cannot open")
        text = self.path("log.csv")
        with open(text, "w") as f:
            f.write("Thread,Time,Action,Pointer,Size,Stream\n")
        self.refused([text, "pool"], "log.csv", "not a custody trace")
        with open(self.trace(small_rows()), "rb") as f:
            data = f.read()
        cut = self.path("cut.ctrace")
        with open(cut, "wb") as f:
            f.write(data[:-3])
        self.refused([cut, "pool"], "cut.ctrace", "truncated")
        # The end record (tag and a one-byte count) replaced by an unknown record tag.
        bad = self.path("bad-tag.ctrace")
        with open(bad, "wb") as f:
            f.write(data[:-2] + b"\x00")
        self.refused([bad, "pool"], "bad-tag.ctrace", "malformed at byte %d" % (len(data) - 2),
                     "(after event %d)" % len(small_rows()), "unknown record tag 0x00")

    def test_traces_that_cannot_be_replayed(self):
        bad = self.trace([row(1, "allocate", 64, 0x1000), row(2, "deallocate", 64, 0x2000)], "bad.ctrace")
        self.refused([bad, "pool"], "event 2", "free of 0x2000", "not live")
        mismatch = self.trace([row(1, "allocate", 64, 0x1000), row(2, "deallocate", 128, 0x1000)], "m.ctrace")
        self.refused([mismatch, "pool"], "event 2", "allocated it with 64 bytes")
        zero = self.trace([row(1, "allocate", 0, 0x1000)], "zero.ctrace")
        self.refused([zero, "pool"], "event 1", "an allocation of 0 bytes")
        huge = self.trace([row(1, "allocate", 2 << 40, 0x1000)], "huge.ctrace")
        self.refused([huge, "pool"], "event 1", "larger than any device")

    def test_numbers_that_do_not_fit_are_refused(self):
        half = 1 << 63
        reserve = "%d,0,reference_reserve,0,0x0,0,%d,256,0x0,,"
        wrapped = self.trace([reserve % (1, half), reserve % (2, half), reserve % (3, half),
                              row(4, "allocate", 64, 0x1000)], "wrapped.ctrace")
        self.refused([wrapped, "malloc"], "event 2", "more than 2^64-1 bytes")
        last = self.trace([row(1, "allocate", 64, 0x1000, device=2147483647)], "device.ctrace")
        self.refused([last, "malloc"], "device 2147483647")

    def test_no_partial_output_on_failure(self):
        bad = self.trace([row(1, "allocate", 64, 0x1000), row(2, "deallocate", 64, 0x2000)], "bad.ctrace")
        out, perfetto = self.path("out.json"), self.path("out.perfetto")
        self.refused(["--json", out, "--perfetto", perfetto, bad, "pool"], "not live")
        self.no_files_like(out)
        self.no_files_like(perfetto)
        self.refused(["--json", self.path("no/such/dir/out.json"), self.trace(small_rows()), "pool"], "cannot write")

    def test_cuda_allocators_refuse_without_a_device(self):
        t = self.trace(small_rows())
        for name in ("cuda_async", "cuda_malloc", "cub", "pool:upstream=cuda_malloc"):
            p = run(REPLAY, "--repetitions", "1", t, name)
            if p.returncode == 0:
                continue  # a GPU machine: the allocator ran
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn("allocator '%s'" % name, p.stderr)
            self.assertIn("CUDA", p.stderr)


class TraceTool(Case):
    def test_csv_round_trip_is_lossless(self):
        rows = small_rows() + [row(7, "allocation_failure", 1 << 40, 0), row(8, "reference_reserve", 3 * MiB, 0,
                                                                            flags="pre_trace")]
        t = self.trace(rows, metadata=(("source", "test"), ("note", '"quoted, with a comma"')))
        first = run(TRACE_TOOL, "csv", t)
        self.assertEqual(first.returncode, 0, first.stderr)
        csv = self.path("again.csv")
        with open(csv, "w") as f:
            f.write(first.stdout)
        again = self.path("again.ctrace")
        self.assertEqual(run(TRACE_TOOL, "from-csv", csv, again).returncode, 0)
        self.assertEqual(run(TRACE_TOOL, "csv", again).stdout, first.stdout)
        with open(t, "rb") as a, open(again, "rb") as b:
            self.assertEqual(a.read(), b.read())
        info = run(TRACE_TOOL, "info", t)
        self.assertEqual(info.returncode, 0, info.stderr)
        self.assertIn("8 events", info.stdout)
        self.assertIn("allocation_failure  1", info.stdout)

    def test_csv_errors_name_the_line_and_leave_nothing(self):
        csv = self.path("bad.csv")
        with open(csv, "w") as f:
            f.write(COLUMNS + "\n" + row(1, "allocate", 64, 0x1000) + "\n" + "2,0,allocate,0,0x0,0,64\n")
        out = self.path("bad.ctrace")
        p = run(TRACE_TOOL, "from-csv", csv, out)
        self.assertEqual(p.returncode, 2)
        self.assertIn("line 3", p.stderr)
        self.assertIn("expected 11 fields", p.stderr)
        self.no_files_like(out)
        p = run(TRACE_TOOL, "csv", self.path("missing.ctrace"))
        self.assertEqual(p.returncode, 2)
        self.assertIn("missing.ctrace", p.stderr)
        self.assertEqual(run(TRACE_TOOL, "frobnicate").returncode, 2)


if __name__ == "__main__":
    REPLAY, TRACE_TOOL = sys.argv[1], sys.argv[2]
    unittest.main(argv=sys.argv[:1], verbosity=2)
