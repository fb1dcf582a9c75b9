"""custody's memory snapshot in PyTorch's format (custody.dump_snapshot, debug/pytorch_snapshot.hpp)
over the host build: its layout, a round trip through custody-import (the trace it imports is the
program's allocations, event for event), and PyTorch's own reader (torch.cuda._memory_viz) where
PyTorch is installed. Each case runs its program in a fresh process: tracking is chosen before a
process's first allocation."""
import csv
import importlib.util
import io
import json
import os
import pathlib
import pickle
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, run_python


MiB = 1 << 20
IMPORT = ROOT / "tools" / "custody-import"

# Allocations on two devices with owners, some freed, some live at the end; prints what it did and
# the snapshot's path. Argument: the directory to write into.
PROGRAM = """
import json, sys
import custody
lib = custody.library()
lib.configure("tracking", 1)
custody.record_history(10000)
done = []
def alloc(size, device, owner):
    with custody.owner(owner):
        address = lib.alloc(size, device)
    done.append(["allocate", device, address, size, owner])
    return address
def free(address, size, device):
    lib.free(address, size, device)
    done.append(["deallocate", device, address, size, None])
kv = alloc(1 << 20, 0, "kv_cache")
act = alloc(3000, 0, "decode/activations")
free(act, 3000, 0)
big = alloc(5 << 20, 0, "kv_cache")
other = alloc(64 << 10, 1, "weights")
path = custody.dump_snapshot(directory=sys.argv[1])
live = {str(d): custody.memory_stats(d) for d in (0, 1)}
print(json.dumps({"path": str(path), "done": done, "stats": live}))
"""


def trace_tool():
    """custody-trace: $CUSTODY_TRACE, else beside $CUSTODY_MERGE (one build's tools), else on PATH."""
    if os.environ.get("CUSTODY_TRACE"):
        return os.environ["CUSTODY_TRACE"]
    if os.environ.get("CUSTODY_MERGE"):
        beside = pathlib.Path(os.environ["CUSTODY_MERGE"]).with_name("custody-trace")
        if beside.exists():
            return str(beside)
    return shutil.which("custody-trace")


@pytest.fixture
def snapshot_run(host_lib, tmp_path):
    """Runs PROGRAM; returns (its report, the snapshot as a dict)."""
    done = run_python(PROGRAM, args=[tmp_path], env={"RANK": 3, "LOCAL_RANK": 1, "WORLD_SIZE": 4})
    report = json.loads(done.stdout.strip().splitlines()[-1])
    with open(report["path"], "rb") as f:
        return report, pickle.load(f)


def test_the_snapshot_is_written_rank_by_rank_in_pytorchs_layout(snapshot_run):
    report, snap = snapshot_run
    assert report["path"].endswith("custody-snapshot-rank3.pickle")
    assert set(snap) == {"segments", "device_traces", "allocator_settings"}
    assert len(snap["device_traces"]) == 2
    for seg in snap["segments"]:
        # The blocks tile the segment in address order, as PyTorch's viewer requires.
        at = seg["address"]
        for b in seg["blocks"]:
            assert b["address"] == at and b["size"] > 0
            assert b["state"] in ("active_allocated", "active_pending_free", "inactive")
            assert b["requested_size"] <= b["size"]
            at += b["size"]
        assert at == seg["address"] + seg["total_size"]
    for device in (0, 1):
        segs = [s for s in snap["segments"] if s["device"] == device]
        # The segments are what the pool holds from the device; the active blocks what is live.
        assert sum(s["total_size"] for s in segs) == report["stats"][str(device)]["reserved_bytes.all.current"]
        active = [b for s in segs for b in s["blocks"] if b["state"] == "active_allocated"]
        assert sum(b["requested_size"] for b in active) == report["stats"][str(device)]["allocated_bytes.all.current"]
    live = {b["address"]: b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"}
    kv = live[report["done"][0][2]]
    assert kv["requested_size"] == MiB
    # The owner is the outermost frame, so that the viewer's stacks and flamegraphs group by it.
    assert kv["frames"][-1] == {"filename": "<custody owner>", "line": 0, "name": "kv_cache"}
    freed = report["done"][1][2]
    assert freed not in live


def test_the_trace_holds_every_event_with_its_owner(snapshot_run):
    report, snap = snapshot_run
    trace = snap["device_traces"][0]
    actions = [e["action"] for e in trace]
    assert actions.count("alloc") == 3 and actions.count("free_requested") == 1
    # The pool grows by mapping (the default backing): its segments come as PyTorch's expandable
    # segments do, segment_map and segment_unmap.
    assert actions.count("free_completed") == 1 and actions.count("segment_map") >= 1
    alloc = next(e for e in trace if e["action"] == "alloc" and e["size"] == 3000)
    assert alloc["user_metadata"] == "decode/activations"
    assert alloc["frames"][-1]["name"] == "decode/activations"
    # A block is allocated only inside a segment the trace took before.
    taken = []
    for e in trace:
        if e["action"] == "segment_map":
            taken.append((e["addr"], e["addr"] + e["size"]))
        elif e["action"] == "alloc":
            assert any(lo <= e["addr"] < hi for lo, hi in taken), e
    times = [e["time_us"] for e in trace]
    assert times == sorted(times)


def test_custody_import_reads_the_snapshot_back_event_for_event(snapshot_run, tmp_path):
    report, _ = snapshot_run
    out = tmp_path / "round.ctrace"
    imported = subprocess.run([sys.executable, str(IMPORT), "pytorch", report["path"], "-o", str(out), "--strict"],
                              capture_output=True, text=True, timeout=120)
    assert imported.returncode == 0, imported.stderr
    tool = trace_tool()
    if tool is None:
        pytest.skip("custody-trace is not found (CUSTODY_TRACE, beside CUSTODY_MERGE, PATH)")
    listed = subprocess.run([tool, "csv", str(out)], capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("sequence,"))
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))
    blocks = [(r["action"], int(r["device"]), int(r["address"], 16), int(r["bytes"]))
              for r in rows if r["action"] in ("allocate", "deallocate")]
    expected = [(kind, device, address, size) for kind, device, address, size, _ in report["done"]]
    # Nothing was live before the trace began (no allocation flagged pre_trace), and the trace is
    # the program's own, in order per device (custody-import merges devices by time).
    assert not [r for r in rows if r["action"] == "allocate" and r["flags"]], rows
    for device in (0, 1):
        assert [b for b in blocks if b[1] == device] == [e for e in expected if e[1] == device]
    reserves = [r for r in rows if r["action"] in ("reference_reserve", "reference_release") and int(r["bytes"]) > 0]
    assert reserves, "the segments came back as the reference allocator's reserve"


needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is not installed")


@needs_torch
def test_pytorchs_memory_viz_reads_the_snapshot(snapshot_run):
    report, snap = snapshot_run
    from torch.cuda import _memory_viz

    # segsum checks its own accounting: free + allocated == reserved, segment by segment.
    summary = _memory_viz.segsum(snap)
    assert "segments: %d" % len(snap["segments"]) in summary
    trace = _memory_viz.trace(snap)
    assert "Device 0" in trace and "Device 1" in trace
    assert "del " in trace and "cudaMalloc(" in trace
    lines = _memory_viz.segments(snap, format_flamegraph=lambda text: text)
    assert "kv_cache" in lines and "active_allocated" in lines
    by_owner = _memory_viz.memory(snap, format_flamegraph=lambda text: text)
    assert any(line.split(";")[2].startswith("<custody owner>") for line in by_owner.splitlines()
               if ";active_allocated;" in line)
    html = _memory_viz.trace_plot(snap)
    assert "snapshot.pickle" in html
    assert _memory_viz.filter_alloc_free_pairs(pickle.loads(pickle.dumps(snap)))["device_traces"][0]


@needs_torch
def test_pytorchs_compare_finds_what_grew_between_two_snapshots(host_lib, tmp_path):
    done = run_python("""
import sys, custody
lib = custody.library()
lib.configure("tracking", 1)
custody.record_history(1000)
with custody.owner("steady"):
    lib.alloc(1 << 20, 2)
before = custody.dump_snapshot(sys.argv[1] + "/before.pickle")
with custody.owner("leak"):
    lib.alloc(24 << 20, 2)
after = custody.dump_snapshot(sys.argv[1] + "/after.pickle")
""", args=[tmp_path])
    from torch.cuda import _memory_viz

    with open(tmp_path / "before.pickle", "rb") as f:
        before = pickle.load(f)
    with open(tmp_path / "after.pickle", "rb") as f:
        after = pickle.load(f)
    grown = _memory_viz.compare(before["segments"], after["segments"], format_flamegraph=lambda text: text)
    assert "only_after" in grown and "leak" in grown and "steady" not in grown, grown


def test_snapshots_need_tracking(host_lib):
    done = run_python("""
import custody
lib = custody.library()
lib.alloc(4096, 5)
try:
    custody.memory_snapshot()
except custody.CustodyError as e:
    print(e)
else:
    raise SystemExit("a snapshot without tracking")
""")
    assert "needs tracking on" in done.stdout


def test_a_snapshot_is_never_written_through_a_link(host_lib, tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    link = tmp_path / "custody-snapshot-rank0.pickle"
    link.symlink_to(target)
    run_python("""
import sys, custody
lib = custody.library()
lib.configure("tracking", 1)
lib.alloc(4096, 6)
custody.dump_snapshot(directory=sys.argv[1])
""", args=[tmp_path])
    assert target.read_text() == "keep"
    assert not link.is_symlink()
    with open(link, "rb") as f:
        assert "segments" in pickle.load(f)


# Allocations three Python calls deep, with stacks on as the argument or the environment says;
# prints the frames of the live block's alloc event and of its leak report group.
STACKS_PROGRAM = """
import json, os, sys
import custody
custody.configure_tracking(**json.loads(sys.argv[1]))
custody.record_history(1000)
lib = custody.library()

def load_weights():
    return lib.alloc(4096, 0)

def build_model():
    return load_weights()

with custody.owner("weights"):
    address = build_model()
snapshot = custody.memory_snapshot()
alloc = [e for e in snapshot["device_traces"][0] if e["action"] == "alloc" and e["addr"] == address][0]
report = lib.rank_report(0)
groups = [g for g in report["live"]["groups"] if g["owner"] == "weights"]
print(json.dumps({"frames": alloc["frames"], "report": groups[0]["stack"] if groups else None}))
"""

PLUMBING = ("libffi", "_ctypes", "libpython", "libcustody_torch_allocator")


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_stacks_hold_the_python_frames_without_custodys_or_the_interpreters(how):
    """configure_tracking(stacks=True) and CUSTODY_STACKS=1 alike: the frames of an allocation made
    from Python are its Python calls, innermost first, then its owner: no custody frame, and none
    of the interpreter's plumbing (libffi, _ctypes, libpython) between Python and the library."""
    arguments = {"stacks": True} if how == "argument" else {}
    env = {"CUSTODY_STACKS": "1"} if how == "environment" else {}
    done = run_python(STACKS_PROGRAM, env=env, args=[json.dumps(arguments)])
    seen = json.loads(done.stdout)
    frames = seen["frames"]
    names = [f["name"] for f in frames]
    assert names[-1] == "weights" and frames[-1]["filename"] == "<custody owner>", frames
    assert names[:2] == ["load_weights", "build_model"], frames
    assert frames[0]["filename"] == "<string>" and frames[0]["line"] == 9, frames[0]
    for f in frames:
        assert not any(p in f["filename"] for p in PLUMBING), f
        assert not f["name"].startswith(("custody", "_Py", "Py", "ffi_")), f
    report = seen["report"]
    assert report and report[0] == "<string>:9 in load_weights", report
    assert not any(p in line for line in report for p in PLUMBING), report


def test_without_stacks_an_allocation_has_its_owner_alone():
    done = run_python(STACKS_PROGRAM, args=[json.dumps({})])
    frames = json.loads(done.stdout)["frames"]
    assert frames == [{"filename": "<custody owner>", "line": 0, "name": "weights"}], frames
