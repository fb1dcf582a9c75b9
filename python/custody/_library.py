"""The allocator library (plugins/torch/custody_torch_allocator.h) through ctypes.

Works without PyTorch: the package's core reads statistics, trims, claims devices and tells
errors through this module alone. The library found is, in order: $CUSTODY_LIBRARY; the CUDA build
installed in the package when a CUDA device is present; the host build installed in the package
(virtual devices: a machine with the CUDA Toolkit and no GPU, a CI runner, a login node);
the CUDA build when no host build is installed. `library().platform` says which ("cuda" or
"host"), `library_choice()` why."""

import ctypes
import json
import os
import pathlib
import threading

from . import _owners

__all__ = ["CustodyError", "OutOfMemoryError", "Library", "library", "library_path", "library_choice",
           "cuda_build_location", "check_integer", "check_text"]

_HERE = pathlib.Path(__file__).resolve().parent
_CUDA_NAME, _HOST_NAME = "libcustody_torch_allocator.so", "libcustody_torch_allocator_host.so"
_NAMES = (_CUDA_NAME, _HOST_NAME)
OUT_OF_MEMORY_MARK = "custody: out of memory"


class CustodyError(RuntimeError):
    """A call into custody's library failed; the message is the library's."""


class OutOfMemoryError(CustodyError, MemoryError):
    """An allocation found no memory; the message carries the pool's diagnostics."""


class _Stats(ctypes.Structure):
    """custody_torch_stats."""

    _fields_ = [(name, ctypes.c_uint64) for name in (
        "live_bytes", "peak_live_bytes", "reserved_bytes", "peak_reserved_bytes", "live_allocations",
        "allocations", "deallocations", "num_ooms", "held_bytes")]


# ---- what the library's C arguments take: every value is checked here, never wrapped by ctypes ----

INT_MAX = (1 << 31) - 1
U64_MAX = (1 << 64) - 1
SIZE_MAX = (1 << 63) - 1  # custody_alloc's ssize_t
# custody_configure's options and the values each takes (device_headroom's 2^64-1 means "not set").
CONFIGURE_RANGES = {"max_bytes": (0, U64_MAX), "device_headroom": (0, U64_MAX - 1), "tracking": (0, 1), "stacks": (0, 1),
                    "chunked": (0, 1), "trend_every_allocations": (0, U64_MAX), "trend_window_samples": (1, 1 << 20),
                    "trend_levels": (1, 8), "trend_windows": (4, 64)}


def check_integer(value, what, lowest, highest):
    """`value` as an int in lowest .. highest; CustodyError naming `what` otherwise (a float, a
    bool, a string, or a number out of range, which ctypes would wrap silently)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise CustodyError("custody: %s=%r is not an integer" % (what, value))
    if not lowest <= value <= highest:
        shown = str(value) if value.bit_length() <= 64 else "a %d-bit number" % value.bit_length()
        raise CustodyError("custody: %s=%s is outside %d .. %d" % (what, shown, lowest, highest))
    return value


def check_text(value, what):
    """`value` as the UTF-8 bytes of a C string; CustodyError naming `what` for what is not text,
    cannot be UTF-8 (a lone surrogate) or holds a NUL (C would cut it there)."""
    if not isinstance(value, str):
        raise CustodyError("custody: %s=%r is not text" % (what, value))
    try:
        data = value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise CustodyError("custody: %s=%r is not UTF-8 text (%s)" % (what, value, e.reason)) from None
    if b"\0" in data:
        raise CustodyError("custody: %s=%r holds a NUL character" % (what, value))
    return data


def _check_path(value, what="path"):
    """A file path as the C string the library opens (os.fsencode: any name the system can hold)."""
    try:
        data = os.fsencode(value)
    except (TypeError, UnicodeEncodeError) as e:
        raise CustodyError("custody: %s=%r is not a file path (%s)" % (what, value, e)) from None
    if b"\0" in data:
        raise CustodyError("custody: %s=%r holds a NUL character" % (what, value))
    return data


def _device(value, lowest=-1):
    return check_integer(value, "device", lowest, INT_MAX)


def _stream(value):
    return None if value is None else check_integer(value, "stream", 0, U64_MAX)


def _pool_id(value):
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise CustodyError("custody: pool id %r is not a pair of integers" % (value,))
    return tuple(check_integer(v, "pool id", 0, U64_MAX) for v in value)


class _Segments(ctypes.Structure):
    """custody_torch_segments."""

    _fields_ = [(name, ctypes.c_uint64) for name in ("held_blocks", "segments", "device_allocations", "device_frees")]


def _as_dict(*structures):
    return {name: getattr(s, name) for s in structures for name, _ in s._fields_}


# custody_out_of_memory_callback: (device, bytes, diagnostics, user)
_OOM_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p)


def _cuda_devices(path):
    """How many CUDA devices the CUDA build at `path` sees; 0 when it cannot be loaded (no CUDA
    runtime) or sees none (no driver, no GPU)."""
    try:
        lib = ctypes.CDLL(str(path))
        lib.custody_device_count.restype = ctypes.c_int
        return max(lib.custody_device_count(), 0)
    except OSError:
        return 0


def library_choice(directory=None):
    """(path, why) of the library this process uses (see the module's comment)."""
    explicit = os.environ.get("CUSTODY_LIBRARY")
    if explicit:
        return explicit, "CUSTODY_LIBRARY"
    directory = pathlib.Path(directory) if directory is not None else _HERE
    cuda, host = directory / _CUDA_NAME, directory / _HOST_NAME
    if cuda.exists() and _cuda_devices(cuda) > 0:
        return str(cuda), "the CUDA build: a CUDA device is present"
    if host.exists():
        why = "no CUDA device is present" if cuda.exists() else "no CUDA build is installed"
        return str(host), "the host build: " + why
    if cuda.exists():
        return str(cuda), "the CUDA build: no host build is installed (and no CUDA device is present)"
    raise CustodyError("custody: no allocator library in %s (looked for %s); set CUSTODY_LIBRARY to its path"
                       % (directory, ", ".join(_NAMES)))


def library_path():
    """The path of the library this process uses (see the module's comment)."""
    return library_choice()[0]


def cuda_build_location(directory=None):
    """Where the CUDA build of the library is, in words, for a message: its path when the package
    holds one, else that none was built and why one would be."""
    directory = pathlib.Path(directory) if directory is not None else _HERE
    cuda = directory / _CUDA_NAME
    if cuda.exists():
        return "the CUDA build of custody's library is installed (%s): it is what a GPU machine uses" % cuda
    return ("no CUDA build of custody's library is installed in %s (pip install builds it where the CUDA Toolkit "
            "is found)" % directory)


def _error_for(message):
    return (OutOfMemoryError if OUT_OF_MEMORY_MARK in message else CustodyError)(message)


class Library:
    """One loaded allocator library. Thread-safe, as the library is. The process keeps one library
    per path: dlopen returns the same handle, so every Library of a path shares its pools."""

    def __init__(self, path):
        self.path = str(path)
        self._lib = lib = ctypes.CDLL(self.path)
        size_t, ssize_t, u64, vp, c_int = ctypes.c_size_t, ctypes.c_ssize_t, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_int
        signatures = {
            "custody_alloc": (vp, [ssize_t, c_int, vp]),
            "custody_free": (None, [vp, ssize_t, c_int, vp]),
            "custody_stats": (c_int, [c_int, ctypes.POINTER(_Stats)]),
            "custody_segments": (c_int, [c_int, ctypes.POINTER(_Segments)]),
            "custody_trim": (size_t, [c_int]),
            "custody_report": (size_t, [ctypes.c_char_p, size_t]),
            "custody_last_error": (ctypes.c_char_p, []),
            "custody_platform": (ctypes.c_char_p, []),
            "custody_device_count": (c_int, []),
            "custody_configure": (c_int, [ctypes.c_char_p, u64]),
            "custody_claim_device": (c_int, [ctypes.c_char_p, c_int, c_int]),
            "custody_record_stream": (c_int, [vp, vp]),
            "custody_empty_cache": (size_t, []),
            "custody_begin_allocate_to_pool": (c_int, [c_int, u64, u64, vp]),
            "custody_end_allocate_to_pool": (c_int, [c_int, u64, u64]),
            "custody_release_pool": (c_int, [c_int, u64, u64]),
            "custody_owner_push": (c_int, [ctypes.c_char_p]),
            "custody_owner_pop": (c_int, []),
            "custody_owner_current": (size_t, [ctypes.c_char_p, size_t]),
            "custody_report_json": (ssize_t, [c_int, ctypes.c_char_p, size_t]),
            "custody_write_report": (c_int, [c_int, ctypes.c_char_p]),
            "custody_sample": (c_int, [c_int]),
            "custody_set_max_bytes": (c_int, [c_int, u64]),
            "custody_backing": (ssize_t, [c_int, ctypes.c_char_p, size_t]),
            "custody_set_out_of_memory_callback": (c_int, [_OOM_CALLBACK, vp]),
            "custody_device_name": (ssize_t, [c_int, ctypes.c_char_p, size_t]),
            "custody_record_history": (c_int, [u64]),
            "custody_snapshot_pickle": (ssize_t, [ctypes.c_char_p, size_t]),
            "custody_write_snapshot": (c_int, [ctypes.c_char_p]),
            "custody_mempool_backings": (ctypes.c_char_p, []),
            "custody_mempool_stats": (c_int, [ctypes.c_char_p, c_int, ctypes.POINTER(_Stats), ctypes.POINTER(_Segments)]),
        }
        for name, (restype, argtypes) in signatures.items():
            function = getattr(lib, name)
            function.restype = restype
            function.argtypes = argtypes

    _oom_callback = None  # the ctypes function the library calls: kept alive while it is installed

    def last_error(self):
        """Why this thread's last failed call failed ("" if it did not)."""
        return (self._lib.custody_last_error() or b"").decode("utf-8", "replace")

    def _check(self, status):
        if status != 0:
            raise _error_for(self.last_error())

    @property
    def platform(self):
        """"cuda", or "host" for the build over virtual devices."""
        return self._lib.custody_platform().decode()

    @property
    def device_count(self):
        return self._lib.custody_device_count()

    def alloc(self, size, device, stream=None):
        """A block of `size` bytes on `device` (an int address); raises OutOfMemoryError or
        CustodyError with the library's message. size 0 returns 0."""
        check_integer(size, "size", 0, SIZE_MAX)
        _device(device)
        _owners.sync(self)
        address = self._lib.custody_alloc(size, device, _stream(stream))
        if not address and size != 0:
            raise _error_for(self.last_error())
        return address or 0

    def free(self, address, size, device, stream=None):
        check_integer(address, "address", 0, U64_MAX)
        check_integer(size, "size", 0, SIZE_MAX)
        self._lib.custody_free(address, size, _device(device), _stream(stream))

    def stats(self, device):
        """custody_torch_stats and custody_torch_segments of `device` as one dict (zeros before its
        first allocation)."""
        out, segments = _Stats(), _Segments()
        if self._lib.custody_stats(_device(device), ctypes.byref(out)) != 0 or \
                self._lib.custody_segments(_device(device), ctypes.byref(segments)) != 0:
            raise CustodyError("custody: no device %r (%d devices)" % (device, self.device_count))
        return _as_dict(out, segments)

    def configure(self, name, value):
        """Sets an option of the pools before the first allocation: max_bytes (0 .. 2^64-1; 0: no
        cap), device_headroom (0 .. 2^64-2), tracking, stacks, chunked (0 or 1; chunked: cudaMalloc
        chunks rather than mapped granules, see backing()), and the trend's (CONFIGURE_RANGES;
        custody.configure_tracking(trend=...) sets them). Raises CustodyError naming the option for
        a value out of its range or not an integer (nothing is set then)."""
        key = check_text(name, "option name")
        lowest, highest = CONFIGURE_RANGES.get(name, (0, U64_MAX))
        if name in ("tracking", "stacks", "chunked") and isinstance(value, bool):
            value = int(value)
        check_integer(value, name, lowest, highest)
        self._check(self._lib.custody_configure(key, value))

    def claim_device(self, device_id, rank, device):
        """Claims the GPU `device_id` for `rank` until the process exits; raises CustodyError naming
        both ranks when another process holds it."""
        key = check_text(device_id, "device identity")
        self._check(self._lib.custody_claim_device(key, check_integer(rank, "rank", 0, INT_MAX), _device(device)))

    def record_stream(self, address, stream):
        """Work on `stream` uses the block at `address`: reused only after that work."""
        check_integer(address, "address", 0, U64_MAX)
        self._check(self._lib.custody_record_stream(address, _stream(stream)))

    def empty_cache(self):
        """Gives cached and held memory back to every device; returns the bytes given back."""
        return self._lib.custody_empty_cache()

    def trim(self, device=-1):
        return self._lib.custody_trim(_device(device))

    def _text(self, function, *args):
        """The whole text of a function with snprintf semantics (as custody_report). Each call
        makes the text anew (a report may grow between two calls): asks again with a larger
        buffer until the text fits. Raises CustodyError when the function returns -1."""
        capacity = 0
        while True:
            buffer = ctypes.create_string_buffer(capacity) if capacity else None
            size = function(*args, buffer, capacity)
            if size < 0:
                raise CustodyError(self.last_error())
            if size < capacity:
                return buffer.value.decode("utf-8", "replace")
            capacity = size + size // 4 + 4096

    def report(self):
        """One text line per device in use."""
        return self._text(self._lib.custody_report)

    def owner_push(self, name):
        """Opens an owner scope in this context, as entering custody.owner(name) does (nested:
        "decode" then "kv_cache" is "decode/kv_cache"), for code that cannot use a `with` block;
        owner_pop() closes it. custody.current_owner() says it, and the allocations that follow are
        charged to it: there is one current owner, the context's (custody/_owners.py)."""
        check_text(name, "owner name")
        _owners.push(name)
        _owners.sync(self)

    def owner_pop(self):
        """Closes the innermost scope owner_push opened in this context; raises CustodyError when
        there is none (a custody.owner() scope is closed by its `with` block, not here)."""
        if not _owners.pop():
            raise CustodyError("custody: owner_pop without an owner scope open on this thread (by owner_push)")
        _owners.sync(self)

    def owner_current(self):
        """The owner the library charges this thread's allocations to (PyTorch's too): the
        context's owner, which it is made to hold first."""
        _owners.sync(self)
        return self._text(self._lib.custody_owner_current)

    def _owner_push_raw(self, name):
        """The library's per-thread owner stack itself, for _owners.sync alone."""
        self._check(self._lib.custody_owner_push(name.encode("utf-8")))

    def _owner_pop_raw(self):
        self._check(self._lib.custody_owner_pop())

    def rank_report(self, device=-1):
        """This rank's tracking report on `device` (tracking on; -1: the first device in use), as
        the dict of docs/debug-report-schema.json."""
        return json.loads(self._text(self._lib.custody_report_json, _device(device)))

    def owners(self, device=-1):
        """Live memory per owner of `device` (tracking on): a list of dicts with owner,
        live_bytes, live_count and peak_bytes."""
        return self.rank_report(device)["owners"]

    def write_report(self, device, path):
        self._check(self._lib.custody_write_report(_device(device), _check_path(path)))

    def sample(self, device=-1):
        """Takes a trend sample of `device`'s tracker (tracking on; -1: the first device in use):
        each owner's floor since the previous sample is tested for a slow leak (the report's
        "trends")."""
        self._check(self._lib.custody_sample(_device(device)))

    def set_max_bytes(self, device, max_bytes):
        """Caps `device`'s pool at `max_bytes` from now on (set_per_process_memory_fraction), before
        or after its first allocation alike: 0 lets nothing more be allocated, 2^64-1 leaves no cap
        beyond the device's."""
        self._check(self._lib.custody_set_max_bytes(_device(device), check_integer(max_bytes, "max_bytes", 0, U64_MAX)))

    def backing(self, device):
        """What backs `device`'s pools, and why: ("mapped", why) (the default: 2 MiB granules mapped
        into one address range as the pool grows, given back as it trims) or ("chunked", why)
        (cudaMalloc chunks, which CUDA IPC and RDMA registration accept: asked for by CUSTODY_BACKING
        or configure("chunked", 1), or a device without virtual memory management). Decided at the
        first call that needs it and kept for the process. Raises CustodyError for a bad device or a
        CUSTODY_BACKING other than "mapped" or "chunked"."""
        name, _, why = self._text(self._lib.custody_backing, _device(device, lowest=0)).partition(" (")
        return name, why[:-1]

    def set_out_of_memory_callback(self, callback):
        """Calls callback(device, bytes, diagnostics) at every out-of-memory, before the failing
        allocation reports it; None removes it. What the callback raises is printed and dropped."""
        function = _OOM_CALLBACK() if callback is None else _OOM_CALLBACK(
            lambda device, size, text, user: callback(device, size, (text or b"").decode("utf-8", "replace")))
        self._check(self._lib.custody_set_out_of_memory_callback(function, None))
        type(self)._oom_callback = function

    def device_name(self, device):
        """The name of `device`'s GPU as custody's claims use it: "GPU-" and its UUID."""
        return self._text(self._lib.custody_device_name, _device(device, lowest=0))

    def record_history(self, max_entries):
        """Keeps each device's last `max_entries` allocation events for snapshots (0: none)."""
        self._check(self._lib.custody_record_history(check_integer(max_entries, "max_entries", 0, U64_MAX)))

    def snapshot_pickle(self):
        """The memory snapshot in PyTorch's format, as the pickle's bytes (tracking on)."""
        capacity = 0
        while True:
            buffer = ctypes.create_string_buffer(capacity) if capacity else None
            size = self._lib.custody_snapshot_pickle(buffer, capacity)
            if size < 0:
                raise CustodyError(self.last_error())
            if size <= capacity:
                return buffer.raw[:size]
            capacity = size + size // 4 + 4096

    def write_snapshot(self, path):
        self._check(self._lib.custody_write_snapshot(_check_path(path)))

    @property
    def mempool_backings(self):
        """The resources that can back a torch.cuda.MemPool ("pool", "vmm")."""
        return tuple(self._lib.custody_mempool_backings().decode().split(","))

    def mempool_stats(self, backing, device):
        """custody_torch_stats of a MemPool backing's resource on `device`, as a dict."""
        out, segments = _Stats(), _Segments()
        self._check(self._lib.custody_mempool_stats(check_text(backing, "backing"), _device(device), ctypes.byref(out), ctypes.byref(segments)))
        return _as_dict(out, segments)

    def begin_allocate_to_pool(self, device, pool_id, stream):
        """PyTorch's begin-allocate-to-pool hook, called before the capture begins: until
        end_allocate_to_pool, allocations on `device` on `stream` (the stream about to be captured,
        not the default stream) and on the streams forked into its capture come from the private pool
        `pool_id` (a pair of ints, PyTorch's MempoolId_t). Raises CustodyError."""
        first, second = _pool_id(pool_id)
        self._check(self._lib.custody_begin_allocate_to_pool(_device(device), first, second, _stream(stream)))

    def end_allocate_to_pool(self, device, pool_id):
        """Ends the routing to `pool_id` (after the capture ended); its blocks stay the graph's."""
        first, second = _pool_id(pool_id)
        self._check(self._lib.custody_end_allocate_to_pool(_device(device), first, second))

    def release_pool(self, device, pool_id):
        """Drops one hold on `pool_id` (one per begin); with none left its memory goes back."""
        first, second = _pool_id(pool_id)
        self._check(self._lib.custody_release_pool(_device(device), first, second))


_loaded = {}
_lock = threading.Lock()


def library(path=None):
    """The Library at `path` (default: library_path()), loaded once per process."""
    path = str(path or library_path())
    with _lock:
        if path not in _loaded:
            _loaded[path] = Library(path)
        return _loaded[path]
