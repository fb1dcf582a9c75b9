"""custody as PyTorch's CUDA allocator: enable() before the first CUDA allocation.

What enable() installs, and how each reaches custody (PyTorch's pluggable allocator takes only an
allocation and a free function from Python; its other hooks are reachable from C++ alone):

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
  that what the capture allocates comes from a private pool of custody's (the graph's pool id, as
  CUDAGraph.pool() names it; graphs sharing a pool share it), reused within the capture and kept
  for the replays until the graph is reset or collected (custody_begin_allocate_to_pool,
  custody_end_allocate_to_pool, custody_release_pool).
"""

import contextlib
import functools
import os
import weakref

from . import options as _options
from . import stats as _stats
from ._library import OUT_OF_MEMORY_MARK, CustodyError, library, library_path
from .ranks import claim_device, rank_info
from .tracking import LeakWatch, diff, owner, snapshot, write_report

__all__ = ["enable", "enabled", "memory_stats", "memory_summary", "oom_as_torch_error", "TooLateError", "owner",
           "snapshot", "diff", "LeakWatch", "write_report"]

_state = {"lib": None, "options": None}


class TooLateError(CustodyError):
    """enable() was called after PyTorch had set up its CUDA allocator."""


def enabled():
    """Whether enable() made custody PyTorch's allocator in this process."""
    return _state["lib"] is not None


def enable(*, max_bytes=None, device_headroom=None, tracking=None, claim_device=None, library_file=None):
    """Makes custody PyTorch's CUDA allocator. Call it before anything touches CUDA (right after
    `import torch`): PyTorch cannot change allocators once CUDA is initialized, and this raises
    TooLateError then.

    max_bytes: each device's cap (bytes, or a size like "20GiB"); device_headroom: bytes of each
    device left free for what custody does not own (NCCL, cuBLAS workspaces; default an eighth of
    the device, at most 1 GiB);
    tracking (default False): every allocation through custody's tracking resource, for
    owner(), snapshot(), LeakWatch and write_report(); claim_device (default True): claim this
    rank's GPU so that a second rank on it fails at once, naming both ranks. Each is overridden by
    its environment variable (custody.options.ENVIRONMENT: CUSTODY_MAX_BYTES,
    CUSTODY_DEVICE_HEADROOM, CUSTODY_TRACKING, CUSTODY_CLAIM_DEVICE), for jobs launched by
    torchrun. Returns the options in force."""
    import torch

    if enabled():
        return dict(_state["options"])
    chosen = _options.resolve(max_bytes=max_bytes, device_headroom=device_headroom, tracking=tracking,
                              claim_device=claim_device)
    if torch.cuda.is_initialized():
        raise TooLateError("custody: custody.torch.enable() came after CUDA was initialized (something already "
                           "allocated CUDA memory or queried a device); PyTorch cannot change its allocator then. "
                           "Call it right after `import torch`, before any .cuda(), .to('cuda') or torch.cuda call")
    path = library_file or library_path()
    lib = library(path)
    if lib.platform != "cuda":
        raise CustodyError("custody: %s is the %s build of the allocator library; PyTorch needs the CUDA build "
                           "(pip install on a machine with the CUDA Toolkit)" % (path, lib.platform))
    for name in ("max_bytes", "device_headroom"):
        if chosen[name] is not None:
            lib.configure(name, chosen[name])
    lib.configure("tracking", 1 if chosen["tracking"] else 0)
    allocator = torch.cuda.memory.CUDAPluggableAllocator(path, "custody_torch_malloc", "custody_free")
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as e:
        raise TooLateError("custody: PyTorch refused to change its allocator (%s); call custody.torch.enable() "
                           "before the first CUDA allocation" % e) from e
    os.environ.setdefault("TORCH_NCCL_AVOID_RECORD_STREAMS", "1")
    _install(torch, lib)
    _state["lib"], _state["options"] = lib, chosen
    if chosen["claim_device"]:
        rank, local_rank, world = rank_info()
        if world > 1:
            device = local_rank % max(torch.cuda.device_count(), 1)
            claim_device(torch.cuda.get_device_properties(device).uuid, device, rank, lib)
    return dict(chosen)


def _device_index(torch, device):
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    return device.index if device.index is not None else torch.cuda.current_device()


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


def _install(torch, lib):
    """Wraps the PyTorch calls that the pluggable allocator does not forward (see the module)."""
    original_record = torch.Tensor.record_stream

    @functools.wraps(original_record)
    def record_stream(tensor, stream):
        original_record(tensor, stream)
        if tensor.is_cuda:
            lib.record_stream(tensor.untyped_storage().data_ptr(), stream.cuda_stream)

    torch.Tensor.record_stream = record_stream

    original_empty = torch.cuda.empty_cache

    @functools.wraps(original_empty)
    def empty_cache():
        original_empty()
        lib.empty_cache()

    torch.cuda.empty_cache = torch.cuda.memory.empty_cache = empty_cache
    for module in (torch.cuda, torch.cuda.memory):
        module.memory_stats = memory_stats
        module.memory_summary = memory_summary

    _install_capture(torch, lib)


def _install_capture(torch, lib):
    """Wraps CUDAGraph so that custody serves each capture from the graph's private pool. PyTorch
    has begun the capture when the wrapped capture_begin returns, so the pool is routed to right
    after it, before anything of the capture is allocated; a refused routing ends the capture again
    and raises CustodyError."""
    graph = torch.cuda.CUDAGraph
    original_begin, original_end, original_reset = graph.capture_begin, graph.capture_end, graph.reset

    @functools.wraps(original_begin)
    def capture_begin(self, *args, **kwargs):
        original_begin(self, *args, **kwargs)
        device, pool_id = torch.cuda.current_device(), tuple(self.pool())
        try:
            lib.begin_allocate_to_pool(device, pool_id, torch.cuda.current_stream().cuda_stream)
        except CustodyError:
            with contextlib.suppress(Exception):
                original_end(self)
            raise
        self._custody_capture = (device, pool_id)
        # One hold per capture, dropped when the graph is reset or collected.
        self._custody_release = weakref.finalize(self, lib.release_pool, device, pool_id)

    @functools.wraps(original_end)
    def capture_end(self):
        try:
            original_end(self)
        finally:
            capture = self.__dict__.pop("_custody_capture", None)
            if capture is not None:
                lib.end_allocate_to_pool(*capture)

    @functools.wraps(original_reset)
    def reset(self):
        original_reset(self)
        release = self.__dict__.pop("_custody_release", None)
        if release is not None:
            release()

    graph.capture_begin, graph.capture_end, graph.reset = capture_begin, capture_end, reset
