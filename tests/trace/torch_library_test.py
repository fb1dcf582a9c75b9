#!/usr/bin/env python3
"""custody-replay's route through the allocator library (allocator torch_library): the calls it makes
and their order, checked against a stand-in library that writes each call down (PyTorch's
CUDAPluggableAllocator: malloc with the trace's stream, free with the allocation's size and stream,
empty_cache where the trace shows PyTorch giving segments back), then the host build of the real
library giving memory back there.

usage: torch_library_test.py CUSTODY_REPLAY CUSTODY_TRACE FAKE_LIBRARY HOST_LIBRARY"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

REPLAY = TRACE_TOOL = FAKE = HOST = None
COLUMNS = "sequence,time_ns,action,thread,stream,device,bytes,alignment,address,owner,flags"
MiB = 1 << 20


def row(seq, action, size, address=0, stream=0, flags=""):
    return "%d,%d,%s,0,0x%x,0,%d,256,0x%x,,%s" % (seq, seq * 100, action, stream, size, address, flags)


def rows():
    """A block from before the trace, freed on another stream than its own; PyTorch giving 8 MiB of
    segments back (empty_cache) before the last allocation."""
    return [row(1, "allocate", MiB, 0x10000000, flags="pre_trace"),
            row(2, "reference_reserve", 8 * MiB),
            row(3, "allocate", 2 * MiB, 0x20000000, stream=0xA),
            row(4, "deallocate", MiB, 0x10000000, stream=0xB),
            row(5, "allocate", 4 * MiB, 0x30000000, stream=0xA),
            row(6, "deallocate", 2 * MiB, 0x20000000, stream=0xA),
            row(7, "deallocate", 4 * MiB, 0x30000000, stream=0xA),
            row(8, "reference_release", 8 * MiB),
            row(9, "allocate", MiB // 2, 0x40000000, stream=0xA),
            row(10, "deallocate", MiB // 2, 0x40000000, stream=0xA)]


def run(*args, env=None):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, **(env or {})))


class Route(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def trace(self, lines):
        csv = self.path("t.csv")
        with open(csv, "w") as f:
            f.write("# metadata,source,test\n" + COLUMNS + "\n" + "\n".join(lines) + "\n")
        out = self.path("t.ctrace")
        p = run(TRACE_TOOL, "from-csv", csv, out)
        self.assertEqual(p.returncode, 0, p.stderr)
        return out

    def calls(self, *spec):
        """The calls of one measuring replay and one timed replay through the stand-in library."""
        log = self.path("calls.log")
        p = run(REPLAY, "--repetitions", "1", self.trace(rows()), *spec, env={"FAKE_TORCH_LIBRARY_LOG": log})
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(log) as f:
            return [line.split() for line in f]

    def test_the_calls_are_pytorchs_in_pytorchs_order(self):
        calls = self.calls("torch_library:path=%s" % FAKE)
        self.assertEqual(calls[:2], [["configure", "max_bytes", str(80 << 30)], ["configure", "chunked", "0"]])
        replays = calls[2:]
        self.assertEqual(len(replays) % 2, 0)
        first, second = replays[:len(replays) // 2], replays[len(replays) // 2:]
        self.assertEqual([c[0] for c in first], [c[0] for c in second])  # each replay makes the same calls
        null = "(nil)"
        block = {}
        for c in first:
            if c[0] == "malloc":
                block[c[5]] = c[1:4]  # address -> size, device, stream
        ops = [c[0] for c in first]
        # The block from before the trace first; empty_cache where PyTorch gave its segments back
        # (before the 512 KiB allocation), and once more as the replay ends (the next starts empty).
        self.assertEqual(ops, ["malloc", "malloc", "free", "malloc", "free", "free", "empty_cache", "malloc", "free",
                               "empty_cache"])
        self.assertEqual(first[0][1:4], [str(MiB), "0", null])  # PyTorch's default stream is NULL
        side = first[1][3]
        self.assertNotEqual(side, null)
        for c in first:
            if c[0] == "free":
                # The size, device and stream of the block's allocation, whatever stream the trace's
                # free names (the first block is freed on stream 0xB and was allocated on NULL).
                self.assertEqual(c[2:5], block[c[1]], c)
        self.assertEqual(first[2][1:], [first[0][5], str(MiB), "0", null])

    def test_empty_cache_never_calls_none_during_the_replay(self):
        calls = self.calls("torch_library:path=%s,empty_cache=never,max_bytes=1GiB,chunked=1" % FAKE)
        self.assertEqual(calls[:2], [["configure", "max_bytes", str(1 << 30)], ["configure", "chunked", "1"]])
        replay = calls[2:][:len(calls[2:]) // 2]
        self.assertEqual([c[0] for c in replay].count("empty_cache"), 1)  # at the end only
        self.assertEqual(replay[-1], ["empty_cache"])

    def test_the_host_library_gives_memory_back_where_pytorch_did(self):
        t = self.trace(rows())
        reserved_at_end = {}
        for mode in ("trace", "never"):  # one run each: a process configures the library once
            out = self.path("%s.json" % mode)
            p = run(REPLAY, "--repetitions", "1", "--json", out, t, "torch_library:path=%s,empty_cache=%s" % (HOST, mode))
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(out) as f:
                a = json.load(f)["devices"][0]["allocators"][0]
            self.assertEqual(a["failed_allocations"], 0)
            self.assertLessEqual(a["peak_reserved_bytes"], 8 * MiB)  # 6 MiB live at most, in 2 MiB granules
            reserved_at_end[mode] = a["timeline"]["reserved"][-1]
        self.assertEqual(reserved_at_end["trace"], 2 * MiB)   # one granule for the last block
        self.assertGreaterEqual(reserved_at_end["never"], 6 * MiB)  # free granules kept mapped

    def test_a_library_that_cannot_serve_is_refused_before_the_trace_is_read(self):
        t = self.trace(rows())
        p = run(REPLAY, t, "torch_library:path=%s" % self.path("missing.so"))
        self.assertEqual(p.returncode, 2)
        self.assertIn("cannot load", p.stderr)
        p = run(REPLAY, t, "torch_library:path=%s" % FAKE, "torch_library:path=%s,chunked=1" % FAKE)
        self.assertEqual(p.returncode, 2)
        self.assertIn("loaded already with other options", p.stderr)
        p = run(REPLAY, t, "torch_library:path=%s,chunked=2" % FAKE)
        self.assertEqual(p.returncode, 2)
        self.assertIn("chunked must be 0 or 1", p.stderr)


if __name__ == "__main__":
    REPLAY, TRACE_TOOL, FAKE, HOST = sys.argv[1:5]
    unittest.main(argv=sys.argv[:1] + sys.argv[5:])
