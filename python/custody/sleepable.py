"""Sleep and wake by owner, without PyTorch: memory of the allocator library's sleepable memory
(plugins/torch/custody_sleep.h, docs/sleep.md) is allocated for the calling context's owner
(custody.owner(...)); sleep() gives the device memory of named owners back, their contents dropped
or offloaded to host memory, and wake() maps it again at the same addresses, the offloaded contents
byte for byte and the others zeroed. custody.torch puts a torch.cuda.MemPool over it (sleepable()).

Every function takes the device and the library (default: custody.library()); streams are raw
handles (a cudaStream_t as an int, or None for the default stream)."""

import ctypes

from . import _owners
from ._library import _device, _stream
from ._library import SIZE_MAX, U64_MAX, CustodyError, OutOfMemoryError, check_integer, check_text, library

__all__ = ["SleepError", "OwnerAsleepError", "OwnerAwakeError", "CaptureOpenError", "alloc", "free", "sleep", "wake",
           "is_asleep", "stats", "owner_stats", "release_host_memory"]


class SleepError(CustodyError):
    """A sleep or wake that the owners' state forbids; nothing was changed."""


class OwnerAsleepError(SleepError):
    """An owner named is asleep: it cannot sleep again, nor be allocated for."""


class OwnerAwakeError(SleepError):
    """An owner named is not asleep: it cannot be woken."""


class CaptureOpenError(SleepError):
    """A stream the owners' blocks were used on is capturing a CUDA graph."""


_ERRORS = {-2: OwnerAsleepError, -3: OwnerAwakeError, -4: CaptureOpenError, -5: OutOfMemoryError}


class _Stats(ctypes.Structure):
    """custody_sleep_stats."""

    _fields_ = [(name, ctypes.c_uint64) for name in (
        "live_bytes", "live_blocks", "awake_bytes", "asleep_bytes", "mapped_bytes", "offloaded_bytes", "stuck_bytes",
        "sleeping_owners", "sleeps", "wakes", "released_bytes")]


class _OwnerStats(ctypes.Structure):
    """custody_sleep_owner_stats."""

    _fields_ = [(name, ctypes.c_uint64) for name in ("blocks", "bytes", "mapped_bytes", "offloaded_bytes")] + [
        ("asleep", ctypes.c_int), ("offload", ctypes.c_int)]


def _bound(lib):
    """The library's CDLL with the sleep functions' signatures set (once per library)."""
    cdll = lib._lib
    if not getattr(cdll, "_custody_sleep_bound", False):
        vp, c_int, ssize_t = ctypes.c_void_p, ctypes.c_int, ctypes.c_ssize_t
        names = ctypes.POINTER(ctypes.c_char_p)
        signatures = {
            "custody_sleep_alloc": (vp, [ssize_t, c_int, vp]),
            "custody_sleep_free": (None, [vp, ssize_t, c_int, vp]),
            "custody_sleep": (c_int, [c_int, names, ctypes.POINTER(c_int), c_int, ctypes.POINTER(vp), c_int]),
            "custody_wake": (c_int, [c_int, names, c_int]),
            "custody_sleep_stats_of": (c_int, [c_int, ctypes.POINTER(_Stats)]),
            "custody_sleep_owner_stats_of": (c_int, [c_int, ctypes.c_char_p, ctypes.POINTER(_OwnerStats)]),
            "custody_sleep_release_host": (ctypes.c_size_t, [c_int]),
            "custody_sleep_last_error": (ctypes.c_char_p, []),
        }
        for name, (restype, argtypes) in signatures.items():
            function = getattr(cdll, name)
            function.restype = restype
            function.argtypes = argtypes
        cdll._custody_sleep_bound = True
    return cdll


def _check(cdll, status):
    if status != 0:
        message = (cdll.custody_sleep_last_error() or b"").decode("utf-8", "replace")
        raise _ERRORS.get(status, CustodyError)(message)


def _names(owners):
    if isinstance(owners, str):
        owners = [owners]
    owners = list(owners)
    for name in owners:
        if not isinstance(name, str) or not name:
            raise ValueError("custody: an owner is a non-empty name, not %r" % (name,))
        check_text(name, "owner name")
    if len(set(owners)) != len(owners):
        raise ValueError("custody: an owner is named twice in %r" % (owners,))
    return owners


def _array(ctype, values):
    return (ctype * max(len(values), 1))(*values)


def alloc(size, device=0, stream=None, lib=None):
    """`size` bytes of sleepable memory on `device` for the calling context's owner (an int address;
    0 for size 0). Raises OwnerAsleepError when that owner sleeps, OutOfMemoryError, CustodyError."""
    lib = lib or library()
    cdll = _bound(lib)
    check_integer(size, "size", 0, SIZE_MAX)
    _owners.sync(lib)  # the library charges the thread's owner: this context's
    address = cdll.custody_sleep_alloc(size, _device(device, 0), _stream(stream))
    if not address and size != 0:
        message = (cdll.custody_sleep_last_error() or b"").decode("utf-8", "replace")
        if "is asleep" in message:
            raise OwnerAsleepError(message)
        raise (OutOfMemoryError if "out of memory" in message else CustodyError)(message)
    return address or 0


def free(address, size, device=0, stream=None, lib=None):
    """Gives a block of alloc() back (after the work queued on `stream`); a sleeping block goes at once."""
    check_integer(address, "address", 0, U64_MAX)
    check_integer(size, "size", 0, SIZE_MAX)
    _bound(lib or library()).custody_sleep_free(address, size, _device(device, 0), _stream(stream))


def sleep(owners, offload=(), device=0, streams=(), lib=None):
    """Puts `owners` (names, or one name) of `device` to sleep: those also in `offload` have their
    contents copied to host memory first, the others' are dropped (zeros after the wake). Waits for
    the work queued so far on the streams their blocks were allocated on and on `streams`. Raises
    OwnerAsleepError, CaptureOpenError, OutOfMemoryError (no host memory for the offload),
    ValueError (offload names an owner not in owners) or CustodyError; the owners are then as they
    were."""
    owners = _names(owners)
    offload = set(_names(offload)) if offload else set()
    if not offload <= set(owners):
        raise ValueError("custody: offload names owners that are not put to sleep: %s" % sorted(offload - set(owners)))
    streams = [_stream(s) for s in streams or ()]
    cdll = _bound(lib or library())
    _check(cdll, cdll.custody_sleep(_device(device, 0), _array(ctypes.c_char_p, [o.encode() for o in owners]),
                                    _array(ctypes.c_int, [int(o in offload) for o in owners]), len(owners),
                                    _array(ctypes.c_void_p, streams), len(streams)))


def wake(owners, device=0, lib=None):
    """Wakes `owners` (names, or one name) of `device`: their memory is mapped again at the same
    addresses, offloaded contents restored and the others zeroed, before this returns. Raises
    OwnerAwakeError, OutOfMemoryError (the device has no memory for them) or CustodyError; the
    owners then still sleep."""
    owners = _names(owners)
    cdll = _bound(lib or library())
    _check(cdll, cdll.custody_wake(_device(device, 0), _array(ctypes.c_char_p, [o.encode() for o in owners]), len(owners)))


def stats(device=0, lib=None):
    """The sleepable memory of `device` as a dict (custody_sleep_stats; zeros before its first use)."""
    cdll = _bound(lib or library())
    out = _Stats()
    _check(cdll, cdll.custody_sleep_stats_of(_device(device, 0), ctypes.byref(out)))
    return {name: getattr(out, name) for name, _ in _Stats._fields_}


def owner_stats(owner, device=0, lib=None):
    """One owner's blocks on `device`: blocks, bytes, mapped_bytes, offloaded_bytes, asleep, offload."""
    cdll = _bound(lib or library())
    out = _OwnerStats()
    _check(cdll, cdll.custody_sleep_owner_stats_of(_device(device, 0), check_text(owner, "owner name"), ctypes.byref(out)))
    result = {name: getattr(out, name) for name, _ in _OwnerStats._fields_}
    result["asleep"] = bool(result["asleep"])
    result["offload"] = bool(result["offload"])
    return result


def is_asleep(owner, device=0, lib=None):
    """Whether `owner` sleeps on `device`."""
    return owner_stats(owner, device, lib)["asleep"]


def release_host_memory(device=-1, lib=None):
    """Gives back the host memory kept for offloads (pinned on a GPU) that no sleeping owner holds,
    on `device` (-1: every device); returns the bytes given back. The memory is otherwise kept from
    one sleep to the next, as PyTorch keeps its pinned memory."""
    return _bound(lib or library()).custody_sleep_release_host(_device(device))
