#!/usr/bin/env python3
"""custody-import on PyTorch snapshots and RMM logs the test writes itself: what the trace holds,
blocks freed before the trace began, several devices and streams, and malformed, truncated or
hostile input (exit 2, a message naming the event or line, no output left behind).

usage: import_test.py CUSTODY_IMPORT CUSTODY_TRACE CUSTODY_REPLAY"""

import contextlib
import csv
import glob
import importlib.machinery
import importlib.util
import io
import os
import pickle
import resource
import subprocess
import sys
import tempfile
import unittest

IMPORT = TRACE_TOOL = REPLAY = None
MiB = 1 << 20


def run(*args, timeout=300, limit_memory=None):
    """Runs a command; an argument that is a list (the importer under this Python) is spliced in.
    `limit_memory`: the process's address space in bytes (RLIMIT_AS)."""
    command = []
    for a in args:
        command.extend(a if isinstance(a, list) else [str(a)])

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (limit_memory, limit_memory))

    return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=limit if limit_memory else None)


def load_importer():
    """custody-import as a module of this process (its limits can be lowered for a test)."""
    loader = importlib.machinery.SourceFileLoader("custody_import", IMPORT[1])
    spec = importlib.util.spec_from_loader("custody_import", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def event(action, addr, size, stream=0, time_us=None, **extra):
    e = {"action": action, "addr": addr, "size": size, "stream": stream, "frames": []}
    if time_us is not None:
        e["time_us"] = time_us
    e.update(extra)
    return e


def segment(address, total, blocks, device=0, stream=0):
    return {"device": device, "address": address, "total_size": total, "allocated_size": 0, "active_size": 0,
            "requested_size": 0, "stream": stream, "segment_type": "large", "segment_pool_id": (0, 0),
            "is_expandable": False, "frames": [], "blocks": blocks}


def block(address, size, state="active_allocated", requested=None):
    return {"address": address, "size": size, "requested_size": requested if requested is not None else size,
            "state": state, "frames": []}


class Case(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.out = self.path("out.ctrace")

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def write(self, name, data, mode="wb"):
        p = self.path(name)
        with open(p, mode) as f:
            f.write(data)
        return p

    def snapshot(self, data, name="snap.pickle"):
        return self.write(name, pickle.dumps(data))

    def imported(self, *args):
        p = run(IMPORT, *args, "-o", self.out)
        self.assertEqual(p.returncode, 0, p.stderr)
        return p

    def refused(self, args, *fragments, timeout=300):
        out = self.path("refused.ctrace")
        p = run(IMPORT, *args, "-o", out, timeout=timeout)
        self.assertEqual(p.returncode, 2, "expected exit 2: " + p.stderr)
        for fragment in fragments:
            self.assertIn(fragment, p.stderr)
        self.assertEqual(glob.glob(out + "*"), [], "an output file was left behind")
        return p

    def events(self):
        """The imported trace's events (through custody-trace csv), and its metadata."""
        p = run(TRACE_TOOL, "csv", self.out)
        self.assertEqual(p.returncode, 0, p.stderr)
        meta, rows = {}, []
        lines = p.stdout.splitlines()
        for line in lines:
            if line.startswith("# metadata,"):
                _, k, v = next(csv.reader([line[2:]]))
                meta[k] = v
        start = lines.index("sequence,time_ns,action,thread,stream,device,bytes,alignment,address,owner,flags")
        for r in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
            r["bytes"], r["time_ns"], r["device"] = int(r["bytes"]), int(r["time_ns"]), int(r["device"])
            r["address"], r["stream"], r["thread"] = int(r["address"], 16), int(r["stream"], 16), int(r["thread"])
            rows.append(r)
        return rows, meta

    def replay(self, *allocators):
        p = run(REPLAY, "--repetitions", "1", self.out, *allocators)
        self.assertEqual(p.returncode, 0, p.stderr)
        return p.stdout


class PyTorchSnapshots(Case):
    def basic(self):
        """Two blocks, one freed; PyTorch takes a 20 MiB segment during the trace."""
        trace = [event("segment_alloc", 0x7000000, 20 * MiB, time_us=1000),
                 event("alloc", 0x7000000, 2 * MiB, time_us=1001),
                 event("alloc", 0x7200000, 4 * MiB, time_us=1003),
                 event("free_requested", 0x7000000, 2 * MiB, time_us=1004),
                 event("free_completed", 0x7000000, 2 * MiB, time_us=1005)]
        segments = [segment(0x1000000, 8 * MiB, [block(0x1000000, 8 * MiB, "inactive")]),
                    segment(0x7000000, 20 * MiB, [block(0x7000000, 4 * MiB, "inactive"),
                                                  block(0x7200000, 4 * MiB),
                                                  block(0x7600000, 12 * MiB, "inactive")])]
        return {"device_traces": [trace], "segments": segments}

    def test_events_times_and_pytorch_reserved(self):
        p = self.imported("pytorch", self.snapshot(self.basic()))
        rows, meta = self.events()
        self.assertEqual(meta["source"], "pytorch-snapshot")
        self.assertEqual(meta["reference"], "pytorch")
        self.assertEqual(meta["started_unix_ns"], str(1000 * 1000))
        kinds = [(r["action"], r["bytes"], r["flags"]) for r in rows]
        # PyTorch held 8 MiB when the trace began (28 MiB at the end, 20 of them taken during it).
        self.assertEqual(kinds, [("reference_reserve", 8 * MiB, "pre_trace"), ("reference_reserve", 20 * MiB, ""),
                                 ("allocate", 2 * MiB, ""), ("allocate", 4 * MiB, ""), ("deallocate", 2 * MiB, "")])
        self.assertEqual([r["time_ns"] for r in rows], [0, 0, 1000, 3000, 5000])
        self.assertEqual(rows[3]["address"], 0x7200000)
        self.assertIn("5 events", p.stderr)
        out = self.replay("pool", "address_space")
        self.assertIn("pytorch (recorded)", out)
        self.assertIn("28.00 MiB", out)        # PyTorch's peak reserved
        self.assertIn("peak live 6.00 MiB", out)

    def test_blocks_freed_before_the_trace_are_allocated_at_its_start(self):
        data = self.basic()
        data["device_traces"][0].append(event("free_completed", 0x1000000, 3 * MiB, time_us=1006))
        data["segments"][0]["blocks"] = [block(0x1000000, 8 * MiB, "inactive")]
        p = self.imported("pytorch", self.snapshot(data))
        self.assertIn("1 blocks freed in the trace were allocated before it began (the first: event 6)", p.stderr)
        rows, _ = self.events()
        pre = [r for r in rows if r["flags"] == "pre_trace" and r["action"] == "allocate"]
        self.assertEqual([(r["address"], r["bytes"]) for r in pre], [(0x1000000, 3 * MiB)])
        self.assertLess(rows.index(pre[0]), 2)
        self.assertEqual(rows[-1]["action"], "deallocate")
        self.assertIn("1 of them live before the trace began", self.replay("pool"))
        self.refused(["pytorch", "--strict", self.snapshot(data, "strict.pickle")], "event 6", "--strict")

    def test_blocks_active_in_the_segments_but_never_seen_are_live_throughout(self):
        data = self.basic()
        data["segments"][0]["blocks"] = [block(0x1000000, 8 * MiB, requested=5 * MiB)]
        p = self.imported("pytorch", self.snapshot(data))
        self.assertIn("1 blocks active in the snapshot were allocated before the trace began", p.stderr)
        rows, _ = self.events()
        self.assertIn(("allocate", 5 * MiB, "pre_trace"), [(r["action"], r["bytes"], r["flags"]) for r in rows])
        self.assertIn("peak live 11.00 MiB", self.replay("pool"))

    def test_several_devices_and_streams(self):
        d0 = [event("alloc", 0x1000, MiB, stream=0, time_us=10), event("alloc", 0x2000000, MiB, stream=77, time_us=30),
              event("free_completed", 0x1000, MiB, stream=77, time_us=50)]
        d1 = [event("alloc", 0x1000, 2 * MiB, stream=5, time_us=20), event("free_completed", 0x1000, 2 * MiB,
                                                                         stream=5, time_us=40)]
        self.imported("pytorch", self.snapshot({"device_traces": [d0, d1], "segments": []}))
        rows, meta = self.events()
        body = [r for r in rows if r["action"] != "reference_reserve"]
        # Merged by time across devices; streams and devices kept.
        self.assertEqual([(r["device"], r["stream"], r["time_ns"]) for r in body],
                         [(0, 0, 0), (1, 5, 10000), (0, 77, 20000), (1, 5, 30000), (0, 77, 40000)])
        self.assertEqual(meta["devices"], "2")
        out = self.replay("pool")
        self.assertIn("device 0: 3 ops", out)
        self.assertIn("2 streams", out)
        self.assertIn("device 1: 2 ops", out)

    def test_events_without_times_keep_their_order(self):
        d0 = [event("alloc", 0x1000, MiB), event("free_completed", 0x1000, MiB)]
        d1 = [event("alloc", 0x1000, MiB)]
        self.imported("pytorch", self.snapshot({"device_traces": [d0, d1], "segments": []}))
        rows, _ = self.events()
        body = [(r["device"], r["action"]) for r in rows if r["action"] != "reference_reserve"]
        self.assertEqual(body, [(0, "allocate"), (0, "deallocate"), (1, "allocate")])
        self.assertTrue(all(r["time_ns"] == 0 for r in rows))

    def test_oom_and_expandable_segments(self):
        trace = [event("segment_map", 0x1000000, 4 * MiB), event("alloc", 0x1000000, MiB),
                 event("oom", 0, 80 << 30, device_free=0), event("segment_unmap", 0x1300000, MiB)]
        data = {"device_traces": [trace], "segments": [segment(0x1000000, 3 * MiB, [block(0x1000000, MiB)])],
                "allocator_settings": {"expandable_segments": True}}
        self.imported("pytorch", self.snapshot(data))
        rows, meta = self.events()
        self.assertEqual(meta["pytorch.expandable_segments"], "true")
        self.assertEqual([(r["action"], r["bytes"]) for r in rows],
                         [("reference_reserve", 0), ("reference_reserve", 4 * MiB), ("allocate", MiB),
                          ("allocation_failure", 80 << 30), ("reference_release", MiB)])

    def test_unknown_actions_are_skipped_with_a_note(self):
        data = self.basic()
        data["device_traces"][0].insert(1, event("workspace_snapshot", 0, 0))
        p = self.imported("pytorch", self.snapshot(data))
        self.assertIn("unknown action 'workspace_snapshot' were skipped (the first: device 0, event 2", p.stderr)
        self.refused(["pytorch", "--strict", self.snapshot(data, "s.pickle")], "workspace_snapshot")

    def test_truncated_and_not_a_pickle(self):
        whole = pickle.dumps(self.basic())
        self.refused(["pytorch", self.write("cut.pickle", whole[: len(whole) // 2])], "cut.pickle", "truncated")
        self.refused(["pytorch", self.write("text.pickle", b"not a pickle at all")], "text.pickle", "not a readable pickle")
        self.refused(["pytorch", self.path("missing.pickle")], "missing.pickle", "cannot read")

    def test_a_pickle_that_would_run_code_is_refused_before_it_runs(self):
        marker = self.path("ran")

        class Hostile:
            def __reduce__(self):
                return (os.system, ("touch " + marker,))

        data = self.basic()
        data["segments"][0]["frames"] = [Hostile()]
        self.refused(["pytorch", self.snapshot(data, "hostile.pickle")], "hostile.pickle", "posix.system",
                     "only plain dicts")
        self.assertFalse(os.path.exists(marker), "the pickle's code ran")

    def test_values_other_than_plain_ones_are_refused(self):
        data = self.basic()
        data["device_traces"][0][1]["frames"] = {1, 2}
        self.refused(["pytorch", self.snapshot(data)], "['device_traces'][0][1]['frames'] is a set")
        data["device_traces"][0][1]["frames"] = b"bytes"
        self.refused(["pytorch", self.snapshot(data, "b.pickle")], "is a bytes")

    def test_malformed_snapshots_name_the_event(self):
        def refused_with(change, *fragments):
            data = self.basic()
            change(data)
            self.refused(["pytorch", self.snapshot(data, "bad.pickle")], *fragments)

        refused_with(lambda d: d["device_traces"][0][1].pop("size"), "device 0, event 2", "has no 'size'")
        refused_with(lambda d: d["device_traces"][0][1].update(size="big"), "event 2", "'size' is a str, not a int")
        refused_with(lambda d: d["device_traces"][0][1].update(addr=-5), "event 2", "outside 0 .. 2^64-1")
        refused_with(lambda d: d["device_traces"][0].append(event("alloc", 0x7200000, MiB)),
                     "event 6", "alloc of 0x7200000, which is live since event 3")
        refused_with(lambda d: d["device_traces"][0].append(event("free_completed", 0x7000000, 2 * MiB)),
                     "event 6", "freed already")
        refused_with(lambda d: d["device_traces"][0].append(event("free_completed", 0x7200000, MiB)),
                     "event 6", "with 1048576 bytes; event 3 allocated it with 4194304 bytes")
        refused_with(lambda d: d["device_traces"][0].append(event("alloc", 0x9000000, 0)), "event 6", "0 bytes")
        refused_with(lambda d: d["segments"].pop(), "the segments hold 8388608 bytes", "do not fit together")
        refused_with(lambda d: d.pop("segments"), "has no 'segments'")
        refused_with(lambda d: d["segments"][1]["blocks"][1].pop("state"), "segments[1]['blocks'][1] has no 'state'")
        self.refused(["pytorch", self.snapshot([1, 2, 3], "list.pickle")], "a list of segments", "[0] is a int")
        self.refused(["pytorch", self.snapshot("text", "str.pickle")], "is a str, neither a dict nor a list")


def legacy_block(size, state="active_allocated", history=()):
    """A block as PyTorch wrote them before 2.1: size, state and the allocations it held (latest
    first), no address."""
    b = {"size": size, "state": state}
    if history:
        b["history"] = [{"addr": a, "real_size": n, "frames": [{"filename": "m.py", "line": 3, "name": "f"}]}
                        for a, n in history]
    return b


class OlderSnapshots(Case):
    """Snapshots of PyTorch before 2.1 (blocks without addresses, with their history; events
    without times) and lists of segments (torch.cuda.memory_snapshot())."""

    def segments_2_0(self):
        return [{"device": 0, "address": 0x1000000, "total_size": 20 * MiB, "allocated_size": 5 * MiB,
                 "active_size": 6 * MiB, "stream": 0, "segment_type": "large",
                 "blocks": [legacy_block(4 * MiB, "inactive", [(0x1000000, 3 * MiB)]),
                            legacy_block(4 * MiB, "active_allocated", [(0x1400000, 3 * MiB), (0x1400000, MiB)]),
                            legacy_block(2 * MiB, "active_pending_free", [(0x1800000, 2 * MiB)]),
                            legacy_block(10 * MiB, "inactive")]}]

    def test_blocks_without_addresses_lie_where_the_blocks_before_them_end(self):
        trace = [event("alloc", 0x1400000, 3 * MiB), event("free_requested", 0x1400000, 3 * MiB),
                 event("free_completed", 0x1400000, 3 * MiB), event("alloc", 0x1400000, 4 * MiB)]
        data = {"device_traces": [trace], "segments": self.segments_2_0()}
        p = self.imported("pytorch", self.snapshot(data))
        self.assertIn("4 entries of the blocks' history", p.stderr)
        self.assertIn("not replayed", p.stderr)
        rows, _ = self.events()
        pre = [(r["address"], r["bytes"]) for r in rows if r["flags"] == "pre_trace" and r["action"] == "allocate"]
        # The pending block, third in its segment, was live before the trace: 4 + 4 MiB into the segment,
        # with the bytes its latest history entry asked for. The block at 0x1400000 the trace allocated.
        self.assertEqual(pre, [(0x1800000, 2 * MiB)])
        body = [(r["action"], r["address"], r["bytes"]) for r in rows if r["flags"] != "pre_trace"]
        self.assertEqual(body, [("allocate", 0x1400000, 3 * MiB), ("deallocate", 0x1400000, 3 * MiB),
                                ("allocate", 0x1400000, 4 * MiB)])
        self.assertIn("peak live 6.00 MiB", self.replay("pool"))
        self.refused(["pytorch", "--strict", self.snapshot(data, "strict.pickle")], "history", "--strict")

    def test_a_list_of_segments_is_the_memory_live_when_it_was_taken(self):
        p = self.imported("pytorch", self.snapshot(self.segments_2_0()))
        self.assertIn("a list of segments", p.stderr)
        self.assertIn("no events to replay", p.stderr)
        rows, meta = self.events()
        self.assertEqual(meta["devices"], "1")
        self.assertEqual([(r["action"], r["address"], r["bytes"], r["flags"]) for r in rows],
                         [("reference_reserve", 0, 20 * MiB, "pre_trace"),
                          ("allocate", 0x1400000, 3 * MiB, "pre_trace"), ("allocate", 0x1800000, 2 * MiB, "pre_trace")])
        self.assertIn("peak live 5.00 MiB", self.replay("pool"))
        # The same segments in a dict, without device_traces: the same trace.
        self.imported("pytorch", self.snapshot({"segments": self.segments_2_0()}, "dict.pickle"))
        self.assertEqual(self.events()[0], rows)

    def test_what_cannot_be_worked_out_is_refused_by_name(self):
        segments = self.segments_2_0()
        segments[0]["total_size"] = 21 * MiB
        self.refused(["pytorch", self.snapshot(segments)], "segments[0]", "have no 'address'", "add up to 20971520",
                     "not its total_size 22020096")
        segments = self.segments_2_0()
        segments[0]["blocks"][1]["history"][0]["real_size"] = "3M"
        self.refused(["pytorch", self.snapshot(segments, "b.pickle")], "segments[0]['blocks'][1]['history'][0]",
                     "'real_size' is a str")
        segments = self.segments_2_0()
        del segments[0]["blocks"][2]["size"]
        self.refused(["pytorch", self.snapshot(segments, "c.pickle")], "segments[0]['blocks'][2] has no 'size'")


class BoundedWork(Case):
    """The work and memory of an import are bounded by its input: each object is looked at once
    however often the pickle refers to it, nesting and size have documented limits, records are
    never read twice."""

    def basic(self):
        return PyTorchSnapshots.basic(self)

    def test_an_object_referred_to_from_many_places_is_checked_once(self):
        shared = [1]
        for _ in range(30):  # 2^30 paths through 30 lists, within the depth limit
            shared = [shared, shared]
        data = self.basic()
        data["external_annotations"] = shared
        snapshot = self.snapshot(data)
        self.assertLess(os.path.getsize(snapshot), 4096)
        p = run(IMPORT, "pytorch", snapshot, "-o", self.out, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        for _ in range(34):  # 2^64 paths, 64 deep: refused for its depth, at once
            shared = [shared, shared]
        data["external_annotations"] = shared
        self.refused(["pytorch", self.snapshot(data, "s64.pickle")], "nested more than 32 deep", timeout=120)

    def test_nesting_deeper_than_the_limit_and_a_list_holding_itself_are_refused(self):
        data = self.basic()
        deep = []
        for _ in range(100):
            deep = [deep]
        data["external_annotations"] = deep
        self.refused(["pytorch", self.snapshot(data)], "nested more than 32 deep", "['external_annotations']")
        looped = []
        looped.append(looped)
        data["external_annotations"] = {"x": looped}
        self.refused(["pytorch", self.snapshot(data, "loop.pickle")], "holds itself",
                     "['external_annotations']['x']", timeout=120)

    def test_records_referred_to_twice_are_refused(self):
        data = self.basic()
        data["device_traces"] = [data["device_traces"][0], data["device_traces"][0]]
        self.refused(["pytorch", self.snapshot(data)], "device_traces[1] is device_traces[0] again")
        data = self.basic()
        events = data["device_traces"][0]
        pair = [event("alloc", 0xA000000, MiB), event("free_completed", 0xA000000, MiB)]
        events.extend(pair + pair)
        self.refused(["pytorch", self.snapshot(data, "e.pickle")], "device 0, event 8", "event 6 again")
        data = self.basic()
        data["segments"].append(data["segments"][1])
        self.refused(["pytorch", self.snapshot(data, "s.pickle")], "segments[2] is segments[1] again")

    def test_memory_is_bounded_by_the_file_whatever_its_memo_indices(self):
        # A memo index of 2^28 costs Python's C unpickler 2^29 slots (4 GiB) from a 5-byte opcode.
        data = pickle.dumps(self.basic(), protocol=2)
        self.assertEqual(data[-1:], b".")
        hostile = self.write("memo.pickle", data[:-1] + b"r" + (1 << 28).to_bytes(4, "little") + b".")
        p = run(IMPORT, "pytorch", hostile, "-o", self.out, limit_memory=1 << 30)
        self.assertEqual(p.returncode, 0, p.stderr)

    def test_a_length_field_never_allocates_more_than_the_file(self):
        # BYTEARRAY8: 9 bytes of opcode and length; Python's unpicklers make the bytearray first.
        hostile = self.write("bytearray.pickle", b"\x80\x05\x96" + (1 << 30).to_bytes(8, "little") + b"x.")
        measure = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
                   "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); print(p.stderr)")
        p = run(sys.executable, "-c", measure, IMPORT, "pytorch", hostile, "-o", self.out)
        status, peak_kib = p.stdout.split("\n")[0].split()
        self.assertEqual(status, "2", p.stdout)
        self.assertIn("bytearray", p.stdout)
        self.assertLess(int(peak_kib), 256 << 10, "a 19-byte file took %s KiB" % peak_kib)

    def test_more_values_than_the_limit_are_refused(self):
        importer = load_importer()
        importer.MAX_VALUES = 40
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            status = importer.main(["pytorch", self.snapshot(self.basic()), "-o", self.out])
        self.assertEqual(status, 2, err.getvalue())
        self.assertIn("more than 40 values", err.getvalue())
        self.assertFalse(os.path.exists(self.out))


class NumbersThatDoNotFit(Case):
    """What the trace's readers would refuse, or what cannot be a time, is refused at import."""

    def basic(self):
        return PyTorchSnapshots.basic(self)

    def test_pytorch_values_out_of_range(self):
        def refused_with(change, *fragments, name="bad.pickle"):
            data = self.basic()
            change(data)
            self.refused(["pytorch", self.snapshot(data, name)], *fragments)

        half = 1 << 63
        refused_with(lambda d: d["segments"].extend([segment(0x9000000, half, []), segment(0xA000000, half, [])]),
                     "segments[3]", "2^64-1")
        refused_with(lambda d: d["segments"].append(segment(0x9000000, MiB, [], device=1 << 40)), "segments[2]",
                     "device 1099511627776")
        refused_with(lambda d: d["segments"].append(segment(0x9000000, MiB, [], device=-7)), "segments[2]", "device -7")
        refused_with(lambda d: d["device_traces"][0][1].update(time_us=float("nan")), "event 2", "time_us")
        refused_with(lambda d: d["device_traces"][0][1].update(time_us=float("inf")), "event 2", "time_us")
        refused_with(lambda d: d["device_traces"][0][4].update(time_us=1e300), "event 5", "time_us")
        refused_with(lambda d: d["device_traces"][0][1].update(addr=10 ** 5000), "event 2", "address")
        refused_with(lambda d: d["device_traces"][0][1].update(stream=1 << 70), "event 2", "stream")
        refused_with(lambda d: d["segments"][0].update(total_size=-(10 ** 5000)), "segments[0]", "size")
        refused_with(lambda d: d["segments"][0].update(device=10 ** 5000), "segments[0]", "device")
        refused_with(lambda d: d.update(extra={10 ** 5000: {1}}), "['extra'][a 16610-bit number] is a set")
        data = self.basic()
        data["extra"] = {10 ** 5000: [1]}  # a key Python cannot print in digits: read, not printed
        self.imported("pytorch", self.snapshot(data, "bigkey.pickle"))

    def test_rmm_values_out_of_range(self):
        header = "Thread,Time,Action,Pointer,Size,Stream\n"
        for n, (line, fragment) in enumerate((("1,nan,allocate,0x1000,64,0x0", "time 'nan'"),
                                              ("1,inf,allocate,0x1000,64,0x0", "time 'inf'"),
                                              ("1,1e400,allocate,0x1000,64,0x0", "time '1e400'"),
                                              ("1,1e300,allocate,0x1000,64,0x0", "time '1e300'"),
                                              ("1,10:00:00.0,allocate,0x1000,64\r,0x0", "line 2"),
                                              ("1,10:00:00.0,allocate,0x1000,6\x004,0x0", "line 2"),
                                              ("1,10:00:00.0,allocate,0x1000,\u0666\u0664,0x0", "size"),
                                              ("1,10:00:00.0,allocate,0x1000,1_024,0x0", "size"))):
            log = self.write("r%d.csv" % n, (header + line + "\n").encode("utf-8"))
            self.refused(["rmm", log], fragment)
        good = self.write("good.csv", header + "1,10:00:00.0,allocate,0x1000,64,0x0\n", "w")
        self.refused(["rmm", good, "--device", str(1 << 40)], "--device 1099511627776")
        self.refused(["rmm", self.write("empty-first.csv", "\n" + header, "w")], "line 1")


class RmmLogs(Case):
    HEADER = "Thread,Time,Action,Pointer,Size,Stream\n"

    def log(self, body, name="rmm.csv"):
        return self.write(name, self.HEADER + body, "w")

    def test_events_threads_streams_and_times(self):
        log = self.log("140001,10:00:00.000100,allocate,0x7f0000000000,1024,0x0\n"
                       "140002,10:00:00.000350,allocate,0x7f0000100000,4096,0x55d0\n"
                       "140001,10:00:00.001100,free,0x7f0000000000,1024,0x55d0\n"
                       "140002,10:00:00.002000,allocate failure,0x0,8589934592,0x0\n")
        self.imported("rmm", log)
        rows, meta = self.events()
        self.assertEqual(meta["source"], "rmm-log")
        self.assertEqual([(r["action"], r["thread"], r["stream"], r["bytes"], r["time_ns"]) for r in rows],
                         [("allocate", 1, 0, 1024, 0), ("allocate", 2, 0x55D0, 4096, 250000),
                          ("deallocate", 1, 0x55D0, 1024, 1000000), ("allocation_failure", 2, 0, 8 << 30, 1900000)])
        info = run(TRACE_TOOL, "info", self.out).stdout
        self.assertIn("threads: 2", info)
        self.assertIn("2 streams", self.replay("pool"))

    def test_seconds_times_midnight_and_device(self):
        log = self.log("1,23:59:59.999000,allocate,0x1000,64,0x0\n1,00:00:00.001000,free,0x1000,64,0x0\n")
        self.imported("rmm", log, "--device", "3")
        rows, _ = self.events()
        self.assertEqual([(r["device"], r["time_ns"]) for r in rows], [(3, 0), (3, 2000000)])
        log = self.log("1,1634567890.5,allocate,0x1000,64,0x0\n1,1634567890.75,free,0x1000,64,0x0\n", "s.csv")
        self.imported("rmm", log)
        self.assertEqual([r["time_ns"] for r in self.events()[0]], [0, 250000000])

    def test_frees_of_blocks_from_before_the_log(self):
        log = self.log("1,10:00:00.0,allocate,0x1000,64,0x0\n1,10:00:00.1,free,0x9000,256,0x0\n"
                       "1,10:00:00.2,free,0x1000,64,0x0\n")
        p = self.imported("rmm", log)
        self.assertIn("1 blocks freed in the log were allocated before it began (the first: line 3)", p.stderr)
        rows, _ = self.events()
        self.assertEqual((rows[0]["action"], rows[0]["address"], rows[0]["bytes"], rows[0]["flags"]),
                         ("allocate", 0x9000, 256, "pre_trace"))
        self.replay("pool")
        self.refused(["rmm", "--strict", log], "line 3")

    def test_a_last_line_cut_short_is_dropped_with_a_note(self):
        log = self.write("cut.csv", self.HEADER + "1,10:00:00.0,allocate,0x1000,64,0x0\n1,10:00:00.1,free,0x10", "w")
        p = self.imported("rmm", log)
        self.assertIn("line 3 is incomplete", p.stderr)
        self.assertEqual(len(self.events()[0]), 1)
        self.refused(["rmm", "--strict", log], "line 3")

    def test_malformed_logs_name_the_line(self):
        self.refused(["rmm", self.write("h.csv", "Thread,Time,Action\n", "w")], "line 1", "expected the header")
        self.refused(["rmm", self.write("e.csv", "", "w")], "empty")
        self.refused(["rmm", self.log("1,10:00:00.0,allocate,0x1000,64\n1,10:00:00.1,free,0x1000,64,0x0\n")],
                     "line 2", "expected 6 fields")
        self.refused(["rmm", self.log("1,10:00:00.0,allocate,0x1000,sixty,0x0\n")], "line 2", "size 'sixty'")
        self.refused(["rmm", self.log("1,noon,allocate,0x1000,64,0x0\n")], "line 2", "time 'noon'")
        self.refused(["rmm", self.log("1,10:00:00.0,reserve,0x1000,64,0x0\n")], "line 2", "unknown action 'reserve'")
        self.refused(["rmm", self.log("1,10:00:00.0,allocate,0x1000,64,0x0\n1,10:00:00.1,allocate,0x1000,64,0x0\n")],
                     "line 3", "live since line 2")
        self.refused(["rmm", self.log("1,10:00:00.0,allocate,0x1000,64,0x0\n1,10:00:00.1,free,0x1000,32,0x0\n")],
                     "line 3", "line 2 allocated it with 64 bytes")
        self.refused(["rmm", self.log("1,10:00:00.0,allocate,0x1000,64,0x0\n1,10:00:00.1,free,0x1000,64,0x0\n"
                                      "1,10:00:00.2,free,0x1000,64,0x0\n")], "line 4", "line 3 freed already")
        self.refused(["rmm", self.log("1,10:00:00.0,allocate,0x1000,0,0x0\n")], "line 2", "0 bytes")
        self.refused(["rmm", self.path("missing.csv")], "missing.csv", "cannot read")


if __name__ == "__main__":
    IMPORT, TRACE_TOOL, REPLAY = [sys.executable, sys.argv[1]], sys.argv[2], sys.argv[3]
    unittest.main(argv=sys.argv[:1], verbosity=2)
