"""Tracking from Python: owner scopes, snapshots and their diffs by owner, a leak watch (threshold,
growth, and the slow-leak forecast of the floor's trend), and one JSON report per rank for
custody-merge. Needs tracking on (configure_tracking() before the first
allocation, or custody.torch.enable(tracking=True)); works without PyTorch."""

import contextlib
import logging
import os
import pathlib
import time

from . import _owners
from . import options as _options
from ._library import CustodyError, check_text, library
from .ranks import rank_info

__all__ = ["configure_tracking", "owner", "current_owner", "Snapshot", "snapshot", "diff", "LeakWatch",
           "describe_trend", "report_path", "write_report"]

_log = logging.getLogger("custody")


TREND_OPTIONS = ("every_allocations", "window_samples", "levels", "windows")


def configure_tracking(on=True, stacks=None, trend=None, lib=None):
    """Turns tracking on (or off) for the allocations to come; before the first allocation.

    stacks (default False): keep each allocation's call stack for leak reports and snapshots: the
    application's native frames and, in Python, the allocating thread's Python frames in place of
    the interpreter's (custody's own frames and the interpreter's plumbing, libffi, _ctypes and
    libpython, left out), as PyTorch's _record_memory_history(stacks="all") keeps them. The
    environment overrides the code, as for custody.torch.enable(): CUSTODY_TRACKING and
    CUSTODY_STACKS (1/0, true/false, yes/no, on/off).
    trend, a dict of custody/debug/trend.hpp's trend_options: every_allocations (the trackers also
    take a trend sample every N allocations; by default only LeakWatch(trend=True).check()
    samples), window_samples, levels, windows (the time scales the floor is tested at). Raises
    CustodyError for an unknown key or a value out of range. Returns {"tracking": ..., "stacks": ...}."""
    chosen = _options.resolve(tracking=on, stacks=stacks)
    lib = lib or library()
    for key, value in (trend or {}).items():
        if key not in TREND_OPTIONS:
            raise CustodyError("custody: unknown trend option %r (known: %s)" % (key, ", ".join(TREND_OPTIONS)))
        lib.configure("trend_" + key, value)
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
    """Alarms when an owner's live bytes pass a threshold, keep growing, or when their floor rises,
    with the meaning a C++ watch (custody::debug::watch) has. check() takes a snapshot; an owner
    raises an alarm when its live bytes rise above `threshold_bytes` (once per crossing: the alarm
    re-arms at a check that finds the owner back at or below it), when they grew at each of the
    last `growth_checks` checks (once per run of growth: it re-arms after a check without growth),
    or with `trend`, when the floor of its live bytes rises significantly: each check is then a
    trend sample of the tracker (custody/debug/trend.hpp, the same code a C++ tracker runs; a step
    is a check), and the alarm comes once per rise with the forecast: the rate per step and per
    second, its confidence, the bytes leaked since the rise began and the time left before the
    device's budget. An alarm is a dict (owner, live_bytes, history, reason, and for a trend
    alarm, trend: the trend's dict as the report holds it), passed to `callback` when given, else
    logged as a warning on the "custody" logger. Only the names in `owners` are watched when given.
    Not thread-safe: check from one thread; with `trend`, keep one such watch per device (each
    check is a sample of the device's tracker)."""

    def __init__(self, threshold_bytes=None, growth_checks=None, owners=None, callback=None, device=-1, lib=None,
                 trend=False):
        if threshold_bytes is None and growth_checks is None and not trend:
            raise ValueError("custody: a LeakWatch needs threshold_bytes, growth_checks, trend or several")
        if growth_checks is not None and growth_checks < 1:
            raise ValueError("custody: growth_checks must be at least 1")
        self.threshold_bytes = threshold_bytes
        self.growth_checks = growth_checks
        self.trend = bool(trend)
        self.owners = set(owners) if owners is not None else None
        self.callback = callback
        self.device = device
        self._lib = lib
        self._history = {}
        self._above = set()   # owners above the threshold at the last check (disarmed)
        self._growths = {}    # owner -> consecutive checks with growth
        self._trend_alarms = {}  # owner -> the trend's alarms at the last check

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

    def _trend_raised(self, name, trend):
        """The trend alarm `trend` (a report's trend dict, or None) raises for `name` now, if any."""
        if not self.trend or trend is None:
            return None
        before = self._trend_alarms.get(name, 0)
        self._trend_alarms[name] = trend["alarms"]
        if trend["alarms"] <= before or not trend["rising"]:
            return None
        return "its floor rises: " + describe_trend(trend)

    def check(self):
        """Takes a snapshot (with `trend`, a trend sample first); returns the alarms it raised (each
        also called back or logged)."""
        lib = self._lib or library()
        if self.trend:
            lib.sample(self.device)
        report = lib.rank_report(self.device)
        now = Snapshot({o["owner"]: o for o in report["owners"]}, self.device, time.time())
        trends = {t["owner"]: t for t in report.get("trends", {}).get("owners", [])}
        alarms = []
        for name in sorted(set(now.owners) | set(self._history)):
            if self.owners is not None and name not in self.owners:
                continue
            history = self._history.setdefault(name, [])
            history.append(now.live_bytes(name))
            del history[:-((self.growth_checks or 0) + 1)]
            reasons = [r for r in (self._reason(name, history), self._trend_raised(name, trends.get(name))) if r]
            for reason in reasons:
                alarm = {"owner": name, "live_bytes": history[-1], "history": list(history), "reason": reason}
                if reason.startswith("its floor rises"):
                    alarm["trend"] = trends[name]
                alarms.append(alarm)
                if self.callback is not None:
                    self.callback(alarm)
                else:
                    _log.warning("custody: owner %s holds %d bytes: %s (history %s)", name, history[-1], reason, history)
        return alarms


def describe_trend(trend):
    """A trend (a report's trend dict) in one line: its rate, confidence, what leaked and the time
    left ("+700 B a step (28000 B/s, confidence 0.99999996), 159093 B since sample 171, 1.2 h left")."""
    text = "+%.0f B a step" % trend["bytes_per_step"]
    if trend["bytes_per_second"] is not None:
        text += " (%.0f B/s, confidence %.8f)" % (trend["bytes_per_second"], trend["confidence"])
    else:
        text += " (confidence %.8f)" % trend["confidence"]
    text += ", %d B since sample %d" % (trend["leaked_bytes"], trend["rise_began"])
    if trend["seconds_left"] is not None:
        text += ", %s left" % _duration(trend["seconds_left"])
    elif trend["steps_left"] is not None:
        text += ", %.0f steps left" % trend["steps_left"]
    return text


def _duration(seconds):
    """As the C++ forecast writes it: "12 s", "41 min", "2.3 h", "3.5 days"."""
    if seconds < 120:
        return "%.0f s" % seconds
    if seconds < 7200:
        return "%.0f min" % (seconds / 60)
    if seconds < 172800:
        return "%.1f h" % (seconds / 3600)
    return "%.1f days" % (seconds / 86400)


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
