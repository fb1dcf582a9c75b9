"""Tracking from Python: owner scopes, snapshots and their diffs by owner, a leak watch, and one
JSON report per rank for custody-merge. Needs tracking on (configure_tracking() before the first
allocation, or custody.torch.enable(tracking=True)); works without PyTorch."""

import contextlib
import logging
import os
import pathlib
import time

from . import _owners
from . import options as _options
from ._library import check_text, library
from .ranks import rank_info

__all__ = ["configure_tracking", "owner", "current_owner", "Snapshot", "snapshot", "diff", "LeakWatch",
           "report_path", "write_report"]

_log = logging.getLogger("custody")


def configure_tracking(on=True, stacks=None, lib=None):
    """Turns tracking on (or off) for the allocations to come; before the first allocation.

    stacks (default False): keep each allocation's call stack for leak reports and snapshots: the
    application's native frames and, in Python, the allocating thread's Python frames in place of
    the interpreter's (custody's own frames and the interpreter's plumbing, libffi, _ctypes and
    libpython, left out), as PyTorch's _record_memory_history(stacks="all") keeps them. The
    environment overrides the code, as for custody.torch.enable(): CUSTODY_TRACKING and
    CUSTODY_STACKS (1/0, true/false, yes/no, on/off). Returns {"tracking": ..., "stacks": ...}."""
    chosen = _options.resolve(tracking=on, stacks=stacks)
    lib = lib or library()
    lib.configure("tracking", 1 if chosen["tracking"] else 0)
    lib.configure("stacks", 1 if chosen["stacks"] else 0)
    return {"tracking": chosen["tracking"], "stacks": chosen["stacks"]}


@contextlib.contextmanager
def owner(name, lib=None):
    """Memory allocated inside is `name`'s; nested scopes join with '/' ("decode" then "kv_cache"
    is "decode/kv_cache"). The scope follows Python's context (contextvars): each thread, each
    asyncio task and each generator's caller sees its own owner (custody/_owners.py says how
    PyTorch's allocations follow it). Raises CustodyError for a name that is not text the library
    takes (UTF-8, no NUL)."""
    lib = lib or library()
    check_text(name, "owner name")
    scope = _owners.enter(name)
    try:
        _owners.sync(lib)
        yield
    finally:
        _owners.leave(scope)
        _owners.sync(lib)


def current_owner(lib=None):
    """The owner of what is allocated here now: this context's innermost open scope
    ("<untagged>" outside every scope)."""
    return _owners.current() or _owners.UNTAGGED


class Snapshot:
    """Live memory per owner on one device at one time: `owners` maps a name to a dict of
    live_bytes, live_count and peak_bytes."""

    def __init__(self, owners, device, taken_at):
        self.owners = owners
        self.device = device
        self.taken_at = taken_at

    def live_bytes(self, name=None):
        """One owner's live bytes (0 when it has none), or every owner's together."""
        if name is not None:
            return self.owners.get(name, {}).get("live_bytes", 0)
        return sum(o["live_bytes"] for o in self.owners.values())

    def __repr__(self):
        return "Snapshot(device=%d, %d owners, %d live bytes)" % (self.device, len(self.owners), self.live_bytes())


def snapshot(device=-1, lib=None):
    """Live memory per owner now (device -1: the first device in use)."""
    return Snapshot({o["owner"]: o for o in (lib or library()).owners(device)}, device, time.time())


def diff(before, after):
    """Owner -> change of live bytes from `before` to `after`, for the owners whose bytes changed,
    largest growth first."""
    names = set(before.owners) | set(after.owners)
    changes = {n: after.live_bytes(n) - before.live_bytes(n) for n in names}
    return dict(sorted(((n, d) for n, d in changes.items() if d != 0), key=lambda item: (-item[1], item[0])))


class LeakWatch:
    """Alarms when an owner's live bytes pass a threshold or keep growing, with the meaning a C++
    watch (custody::debug::watch) has. check() takes a snapshot; an owner raises an alarm when its
    live bytes rise above `threshold_bytes` (once per crossing: the alarm re-arms when the owner is
    back at or below it), or when they grew at each of the last `growth_checks` checks (once per
    run of growth: it re-arms after a check without growth). An alarm is a dict (owner,
    live_bytes, history, reason), passed to `callback` when given, else logged as a warning on the
    "custody" logger. Only the names in `owners` are watched when given. Not thread-safe: check
    from one thread."""

    def __init__(self, threshold_bytes=None, growth_checks=None, owners=None, callback=None, device=-1, lib=None):
        if threshold_bytes is None and growth_checks is None:
            raise ValueError("custody: a LeakWatch needs threshold_bytes, growth_checks or both")
        if growth_checks is not None and growth_checks < 1:
            raise ValueError("custody: growth_checks must be at least 1")
        self.threshold_bytes = threshold_bytes
        self.growth_checks = growth_checks
        self.owners = set(owners) if owners is not None else None
        self.callback = callback
        self.device = device
        self._lib = lib
        self._history = {}
        self._above = set()   # owners above the threshold at the last check (disarmed)
        self._growths = {}    # owner -> consecutive checks with growth

    def _reason(self, name, history):
        """Why `name` raises an alarm now (None: it does not), and the state for the next check."""
        above = self.threshold_bytes is not None and history[-1] > self.threshold_bytes
        crossed = above and name not in self._above
        (self._above.add if above else self._above.discard)(name)
        grew = len(history) > 1 and history[-1] > history[-2]
        self._growths[name] = self._growths.get(name, 0) + 1 if grew else 0
        if crossed:
            return "above %d bytes" % self.threshold_bytes
        if self.growth_checks is not None and self._growths[name] == self.growth_checks:
            return "grew at each of the last %d checks" % self.growth_checks
        return None

    def check(self):
        """Takes a snapshot; returns the alarms it raised (each also called back or logged)."""
        now = snapshot(self.device, self._lib)
        alarms = []
        for name in sorted(set(now.owners) | set(self._history)):
            if self.owners is not None and name not in self.owners:
                continue
            history = self._history.setdefault(name, [])
            history.append(now.live_bytes(name))
            del history[:-((self.growth_checks or 0) + 1)]
            reason = self._reason(name, history)
            if reason:
                alarm = {"owner": name, "live_bytes": history[-1], "history": list(history), "reason": reason}
                alarms.append(alarm)
                if self.callback is not None:
                    self.callback(alarm)
                else:
                    _log.warning("custody: owner %s holds %d bytes: %s (history %s)", name, history[-1], reason, history)
        return alarms


def report_path(directory=None, rank=None):
    """Where this rank's report goes: DIRECTORY/rank-<RANK>.json, the name C++ reports have
    (custody::debug::report_file_name), so one glob finds both (directory by default
    $CUSTODY_REPORT_DIR, else the working directory)."""
    directory = pathlib.Path(directory or os.environ.get("CUSTODY_REPORT_DIR") or ".")
    rank = rank_info()[0] if rank is None else rank
    return directory / ("rank-%d.json" % rank)


def write_report(directory=None, device=-1, lib=None):
    """Writes this rank's JSON report (its rank from the launcher's environment) and returns its
    path; custody-merge (custody.merge) merges the reports of every rank."""
    path = report_path(directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    (lib or library()).write_report(device, str(path))
    return path
