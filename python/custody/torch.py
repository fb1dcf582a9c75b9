"""custody under PyTorch, two ways:

- the whole process: enable() before the first CUDA allocation makes custody PyTorch's CUDA
  allocator (every tensor: owners and stacks per tensor, snapshots, reports);
- a MemPool: mem_pool() after CUDA is initialized gives a torch.cuda.MemPool whose segments come
  from custody (used with torch.cuda.use_mem_pool): PyTorch's own allocator keeps serving tensors
  and splits custody's segments itself (what TensorRT-LLM and vLLM do for their KV caches).

What enable() installs, and how each reaches custody (PyTorch's pluggable allocator takes only an
allocation and a free function from Python; its other hooks are reachable from C++ alone; the
wrappers are custody._torch_hooks):

- allocation: custody_torch_malloc, which throws on failure. PyTorch raises it in Python as a
  RuntimeError whose message starts "custody: out of memory" and carries the pool's diagnostics;
  inside `with custody.torch.oom_as_torch_error():` it is torch.OutOfMemoryError.
- Tensor.record_stream: wrapped, so that the block is held until the recorded stream's work is
  done (custody_record_stream). Calls made from C++ do not pass through it: enable() sets
  TORCH_NCCL_AVOID_RECORD_STREAMS=1 (unless set) so that NCCL collectives keep their tensors alive
  instead of recording streams.
- torch.cuda.empty_cache: wrapped, so that custody's pools give their cached memory back.
- torch.cuda.memory_stats (and so memory_allocated, max_memory_reserved, ...) and memory_summary:
  custody's counters under PyTorch's key names.
- CUDA graph capture (torch.cuda.graph, CUDAGraph.capture_begin/capture_end/reset): wrapped, so
  that what the capture allocates comes from a private pool of custody's (the graph's pool id:
  the one given, else a graph_pool_handle() passed in), routed before the capture begins, reused
  within it and kept for the replays until the graph is reset or collected.
- torch.cuda.set_per_process_memory_fraction: caps the device's pool.
- torch.cuda.memory._record_memory_history and _dump_snapshot (which PyTorch refuses for a
  pluggable allocator): custody's history and snapshot, in PyTorch's format (tracking on).

Sleep and wake by owner (sleepable(), sleep(), wake(): custody/torch_sleep.py, docs/sleep.md) need no
enable(): each owner's tensors live in a torch.cuda.MemPool of custody's sleepable memory.
"""

import contextlib
import os

from . import _torch_hooks
from ._torch_hooks import device_index as _device_index
from . import options as _options
from . import memory_snapshot as _snapshots
from . import stats as _stats
from ._library import OUT_OF_MEMORY_MARK, CustodyError, cuda_build_location, library, library_choice, library_path
from .ranks import claim_device, rank_info
from .torch_sleep import (CaptureOpenError, OwnerAsleepError, OwnerAwakeError, SleepError, is_asleep,
                          release_host_memory, sleep, sleep_stats, sleepable, sleepable_pool, wake)
from .tracking import LeakWatch, configure_tracking, diff, owner, snapshot, write_report

__all__ = ["enable", "enabled", "memory_stats", "memory_summary", "oom_as_torch_error", "on_out_of_memory",
           "TooLateError", "owner", "snapshot", "diff", "LeakWatch", "write_report", "mem_pool", "mem_pool_stats",
           "sleepable", "sleepable_pool", "sleep", "wake", "is_asleep", "sleep_stats", "release_host_memory",
           "SleepError", "OwnerAsleepError", "OwnerAwakeError", "CaptureOpenError"]

_state = {"lib": None, "options": None}


class TooLateError(CustodyError):
    """enable() was called after PyTorch had set up its CUDA allocator."""


def enabled():
    """Whether enable() made custody PyTorch's allocator in this process."""
    return _state["lib"] is not None


def enable(*, max_bytes=None, device_headroom=None, tracking=None, claim_device=None, stacks=None, backing=None,
           library_file=None, trend=None):
    """Makes custody PyTorch's CUDA allocator. Call it before anything touches CUDA (right after
    `import torch`): PyTorch cannot change allocators once CUDA is initialized, and this raises
    TooLateError then.

    max_bytes: each device's cap (bytes, or a size like "20GiB"); device_headroom: bytes of each
    device left free for what custody does not own (NCCL, cuBLAS workspaces; default an eighth of
    the device, at most 1 GiB);
    tracking (default False): every allocation through custody's tracking resource, for
    owner(), snapshot(), LeakWatch, write_report() and PyTorch-format memory snapshots;
    claim_device (default True): claim this rank's GPU so that a second rank on it fails at once,
    naming both ranks; stacks (default False): with tracking, keep each allocation's call stack
    (the application's native frames and the allocating thread's Python frames, custody's own and
    the interpreter's plumbing left out) for leak reports and snapshots; backing (default "mapped"):
    what the pools grow in, "mapped" (2 MiB granules mapped into one address range per device, given
    back as the pool trims) or "chunked" (cudaMalloc chunks: for memory that cudaIpcGetMemHandle or
    RDMA registration must accept, which refuse mapped memory; a device without virtual memory
    management gets them anyway; custody.library().backing(device) says what a device has); trend:
    with tracking, the slow-leak forecast's options (custody.configure_tracking's trend: a dict of
    every_allocations, window_samples, levels, windows; each LeakWatch(trend=True).check() is a
    sample, and the rank's reports carry every owner's trend). Each but trend is overridden by its
    environment variable (custody.options.ENVIRONMENT: CUSTODY_MAX_BYTES, CUSTODY_DEVICE_HEADROOM,
    CUSTODY_TRACKING, CUSTODY_CLAIM_DEVICE, CUSTODY_STACKS, CUSTODY_BACKING), for jobs launched by
    torchrun. Returns the options in force."""
    import torch

    if enabled():
        return dict(_state["options"])
    chosen = _options.resolve(max_bytes=max_bytes, device_headroom=device_headroom, tracking=tracking,
                              claim_device=claim_device, stacks=stacks, backing=backing)
    if torch.cuda.is_initialized():
        raise TooLateError("custody: custody.torch.enable() came after CUDA was initialized (something already "
                           "allocated CUDA memory or queried a device); PyTorch cannot change its allocator then. "
                           "Call it right after `import torch`, before any .cuda(), .to('cuda') or torch.cuda call")
    _torch_hooks.require_cuda_device(torch, "custody.torch.enable()")
    path = library_file or library_path()
    lib = library(path)
    if lib.platform != "cuda":
        raise CustodyError("custody: %s is the %s build of the allocator library (chosen: %s); PyTorch needs the "
                           "CUDA build. %s" % (path, lib.platform, library_choice()[1] if not library_file
                                               else "library_file", cuda_build_location()))
    for name in ("max_bytes", "device_headroom"):
        if chosen[name] is not None:
            lib.configure(name, chosen[name])
    configure_tracking(bool(chosen["tracking"]), stacks=bool(chosen["stacks"]), trend=trend, lib=lib)
    lib.configure("chunked", 1 if chosen["backing"] == "chunked" else 0)
    allocator = torch.cuda.memory.CUDAPluggableAllocator(path, "custody_torch_malloc", "custody_free")
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as e:
        raise TooLateError("custody: PyTorch refused to change its allocator (%s); call custody.torch.enable() "
                           "before the first CUDA allocation" % e) from e
    os.environ.setdefault("TORCH_NCCL_AVOID_RECORD_STREAMS", "1")
    _torch_hooks.install(torch, lib, memory_stats, memory_summary)
    _install_snapshots(torch, lib)
    _state["lib"], _state["options"] = lib, chosen
    if chosen["claim_device"]:
        _claim_gpu(torch, lib)
    return dict(chosen)


def _claim_gpu(torch, lib):
    """In a job of several ranks, claims this rank's GPU under the name custody's C++ claims use for
    it ("GPU-" and its UUID, interop/gpu_name.hpp, from the library), so that a C++ claim of the
    same GPU in another process (an NCCL communicator of custody's) locks the same file."""
    rank, local_rank, world = rank_info()
    if world > 1:
        device = local_rank % max(torch.cuda.device_count(), 1)
        claim_device(lib.device_name(device), device, rank, lib)


def _install_snapshots(torch, lib):
    """torch.cuda.memory._record_memory_history(enabled, ..., max_entries=N) keeps custody's history
    (N events per device; enabled=None stops it), and _dump_snapshot(filename), _snapshot() and
    memory_snapshot() write or return custody's snapshot in PyTorch's format (tracking on: PyTorch
    refuses them for a pluggable allocator)."""
    def record_memory_history(enabled="all", *args, max_entries=None, **kwargs):
        if enabled is None or enabled is False:
            lib.record_history(0)
        else:
            lib.record_history(_snapshots.DEFAULT_HISTORY if max_entries is None else max_entries)

    def dump_snapshot(filename="dump_snapshot.pickle", *args, **kwargs):
        _snapshots.dump_snapshot(filename, lib=lib)

    def snapshot_dict(*args, **kwargs):
        return _snapshots.memory_snapshot(lib=lib)

    def memory_snapshot(*args, **kwargs):
        return _snapshots.memory_snapshot(lib=lib)["segments"]

    memory = torch.cuda.memory
    memory._record_memory_history = record_memory_history
    memory._dump_snapshot = dump_snapshot
    memory._snapshot = snapshot_dict
    memory.memory_snapshot = torch.cuda.memory_snapshot = memory_snapshot


def on_out_of_memory(callback):
    """Calls callback(info) at every out-of-memory of custody's allocator, before the error reaches
    PyTorch (PyTorch refuses its own out-of-memory observers for a pluggable allocator). info is a
    dict: device, requested_bytes, diagnostics (custody's message: live, reserved, largest free
    block, fragmentation) and stats (custody.memory_stats of the device). Called on the allocating
    thread, with the GIL taken for it; it must not allocate CUDA memory. None removes it. Works
    without PyTorch too (custody.library())."""
    lib = _state["lib"] or library()
    if callback is None:
        lib.set_out_of_memory_callback(None)
        return

    def tell(device, requested, diagnostics):
        callback({"device": device, "requested_bytes": requested, "diagnostics": diagnostics,
                  "stats": _stats.memory_stats(device, lib)})

    lib.set_out_of_memory_callback(tell)


def mem_pool(backing="pool", *, use_on_oom=False, library_file=None):
    """A torch.cuda.MemPool whose memory comes from custody: PyTorch's caching allocator keeps
    serving tensors and takes whole segments (2 MiB, 20 MiB, or a large request rounded up) from
    custody's `backing`, which it splits into blocks itself. Use it in a scope, after CUDA is
    initialized and without changing the process's allocator:

        pool = custody.torch.mem_pool()          # or mem_pool("vmm")
        with torch.cuda.use_mem_pool(pool):
            kv_cache = torch.empty(...)

    Backings (custody.library().mempool_backings): "pool", custody's pool (its limits, device
    headroom and statistics, shared by every MemPool over it), growing by mapping granules or in
    cudaMalloc chunks as custody.library().backing(device) says (CUSTODY_BACKING=chunked for memory
    CUDA IPC or RDMA registration must accept); "vmm", the virtual-memory resource (each segment
    mapped on demand and unmapped, once the work queued on its stream has run, when PyTorch gives it
    back).

    The trade-off against enable(): behind a MemPool PyTorch splits blocks and custody sees
    segments, so owners, stacks and snapshots are per segment; use enable(tracking=True) for them
    per tensor. A MemPool needs PyTorch's own caching allocator: after enable() it is refused.
    Segments come back to custody when PyTorch frees them (torch.cuda.empty_cache(), the pool's
    release). use_on_oom: PyTorch may serve other allocations from this pool when it runs out."""
    import torch

    if enabled():
        raise CustodyError("custody: mem_pool() needs PyTorch's own caching allocator, and custody.torch.enable() "
                           "made custody the whole process's allocator (every tensor already comes from custody)")
    _torch_hooks.require_cuda_device(torch, "custody.torch.mem_pool()")
    path = library_file or library_path()
    known = library(path).mempool_backings
    if backing not in known:
        raise CustodyError("custody: no MemPool backing %r (known: %s)" % (backing, ", ".join(known)))
    allocator = _torch_hooks.pluggable_allocator(torch, path, "custody_mempool_%s_alloc" % backing,
                                                 "custody_mempool_%s_free" % backing)
    return torch.cuda.MemPool(allocator.allocator(), use_on_oom=use_on_oom) if use_on_oom \
        else torch.cuda.MemPool(allocator.allocator())


def mem_pool_stats(backing="pool", device=None):
    """The counters of a MemPool backing's resource on `device` (custody.memory_stats' keys): the
    segments PyTorch took from it, not its tensors."""
    import torch

    lib = library()
    index = _device_index(torch, device)
    raw = lib.mempool_stats(backing, index)
    return {key: _stats.PYTORCH_KEYS[key](raw) for key in sorted(_stats.PYTORCH_KEYS)}


def memory_stats(device=None):
    """custody's counters of `device` under PyTorch's key names (see custody.stats)."""
    import torch

    return _stats.memory_stats(_device_index(torch, device), _state["lib"] or library())


def memory_summary(device=None, abbreviated=False):
    """custody's summary table of `device` (abbreviated is accepted for PyTorch's signature)."""
    import torch

    return _stats.memory_summary(_device_index(torch, device), _state["lib"] or library())


def is_custody_oom(error):
    """Whether `error` (raised by a PyTorch call) is custody's out-of-memory."""
    return isinstance(error, (RuntimeError, MemoryError)) and OUT_OF_MEMORY_MARK in str(error)


@contextlib.contextmanager
def oom_as_torch_error():
    """Inside it, custody's out-of-memory raised by PyTorch calls is torch.OutOfMemoryError (with
    the same message, chained to the original). Usable as a decorator too."""
    import torch

    try:
        yield
    except (RuntimeError, MemoryError) as e:
        if is_custody_oom(e) and not isinstance(e, torch.OutOfMemoryError):
            raise torch.OutOfMemoryError(str(e)) from e
        raise

