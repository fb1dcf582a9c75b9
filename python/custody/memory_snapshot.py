"""Memory snapshots in PyTorch's format: what torch.cuda.memory._dump_snapshot() writes, which
PyTorch's viewer (pytorch.org/memory_viz, torch.cuda._memory_viz) reads, made by custody's tracker,
rank by rank. PyTorch refuses its own snapshot and history for a pluggable allocator; under
custody.torch.enable(tracking=True) torch.cuda.memory._record_memory_history and _dump_snapshot
call these. Works without PyTorch (the host build too).

    custody.record_history(100_000)           # keep each device's last 100000 events
    ...
    custody.dump_snapshot("snapshots")        # snapshots/custody-snapshot-rank<RANK>.pickle

Segments are the chunks custody's pool holds from the device; blocks its live allocations
(active_pending_free: held for another stream's work) and the gaps between them; each block's and
event's frames are its allocation's call stack (with stacks on) and, last, its owner as a frame of
its own ({"filename": "<custody owner>", "line": 0, "name": OWNER}); trace entries also carry the
owner as user_metadata. Diff two snapshots by stack and owner with torch.cuda._memory_viz.compare,
or read one back with `custody-import pytorch` (a trace for custody-replay)."""

import os
import pathlib
import pickle

from ._library import library
from .ranks import rank_info

__all__ = ["DEFAULT_HISTORY", "record_history", "memory_snapshot", "snapshot_path", "dump_snapshot"]

# Events kept per device when _record_memory_history is asked without max_entries.
DEFAULT_HISTORY = 100_000


def record_history(max_entries=DEFAULT_HISTORY, lib=None):
    """Keeps each device's last `max_entries` allocation events (allocations, frees, segments,
    out-of-memory) for the snapshots' device_traces; 0 stops and forgets. Needs tracking on. An
    integer in 0 .. 2^64-1: anything else (a float, a string) is refused with a CustodyError, as
    Library.record_history refuses it."""
    (lib or library()).record_history(max_entries)


def memory_snapshot(lib=None):
    """This rank's snapshot as the dict torch.cuda.memory._snapshot() returns (segments,
    device_traces, allocator_settings). Needs tracking on."""
    return pickle.loads((lib or library()).snapshot_pickle())


def snapshot_path(directory=None, rank=None):
    """Where this rank's snapshot goes: DIRECTORY/custody-snapshot-rank<RANK>.pickle (directory by
    default $CUSTODY_REPORT_DIR, else the working directory)."""
    directory = pathlib.Path(directory or os.environ.get("CUSTODY_REPORT_DIR") or ".")
    rank = rank_info()[0] if rank is None else rank
    return directory / ("custody-snapshot-rank%d.pickle" % rank)


def dump_snapshot(path=None, directory=None, lib=None):
    """Writes this rank's snapshot (a pickle in torch.cuda.memory._dump_snapshot()'s format) to
    `path`, or to snapshot_path(directory), and returns the path. The file is written under a
    temporary name and renamed into place, never through a link. Needs tracking on."""
    target = pathlib.Path(path) if path is not None else snapshot_path(directory)
    target.parent.mkdir(parents=True, exist_ok=True)
    (lib or library()).write_snapshot(str(target))
    return target
