"""Sleep and wake by owner from PyTorch (custody.torch re-exports these): what vLLM's sleep mode
does, on custody's sleepable memory.

    with custody.torch.sleepable("weights"):
        model = build_model().cuda()
    with custody.torch.sleepable("kv_cache"):
        cache = torch.empty(..., device="cuda")
    custody.torch.sleep(["weights", "kv_cache"], offload=["weights"])   # the GPU memory goes back
    ...                                                                 # train, or another model
    custody.torch.wake(["weights", "kv_cache"])                         # same addresses: tensors and
                                                                        # captured graphs keep working

Each owner has a torch.cuda.MemPool of its own per device, backed by a CUDAPluggableAllocator over
the library's custody_sleep_alloc and custody_sleep_free: PyTorch's caching allocator splits and
caches segments inside the pool, so a segment never serves two owners. This needs no
custody.torch.enable(): the process keeps PyTorch's allocator for everything else.

Host memory: the pinned memory offloaded contents are copied into is kept from one sleep to the
next (pinning fresh memory at every sleep costs more than the copy); release_host_memory() gives
back what no sleeping owner holds.

Streams: PyTorch does not tell its allocator which streams a tensor is used on, so sleep() waits
for the work queued on the stream each segment was allocated on and on the current stream (or the
streams given). Segments PyTorch caches in a pool (freed tensors) sleep too: call
torch.cuda.empty_cache() first to give them back instead."""

import contextlib

from . import sleepable as _sleepable
from ._torch_hooks import device_index as _device_index
from ._torch_hooks import pluggable_allocator as _pluggable_allocator
from ._torch_hooks import require_cuda_device as _require_cuda_device
from ._library import library_path
from .tracking import owner as _owner_scope

__all__ = ["sleepable", "sleepable_pool", "sleep", "wake", "is_asleep", "sleep_stats", "release_host_memory",
           "SleepError", "OwnerAsleepError", "OwnerAwakeError", "CaptureOpenError"]

release_host_memory = _sleepable.release_host_memory

SleepError = _sleepable.SleepError
OwnerAsleepError = _sleepable.OwnerAsleepError
OwnerAwakeError = _sleepable.OwnerAwakeError
CaptureOpenError = _sleepable.CaptureOpenError

_pools = {}

# The allocation function of the owners' MemPools. PyTorch's caching allocator takes a NULL from a
# MemPool's allocator as out of memory: it frees its cached blocks, retries, and raises
# torch.OutOfMemoryError (CUDACachingAllocator.cpp's allocPrimitive). custody_sleep_alloc returns
# NULL; custody_sleep_malloc would throw through PyTorch instead, skipping that retry.
SLEEPABLE_ALLOC = "custody_sleep_alloc"


def _device(torch, device, what):
    """The index of `device`; the current CUDA device for None, which needs one: custody's error then
    where PyTorch would raise "Found no NVIDIA driver". A number names a device of custody's library
    (the host build's virtual devices too)."""
    if device is None:
        _require_cuda_device(torch, what)
    return _device_index(torch, device)


def sleepable_pool(owner, device=None):
    """The torch.cuda.MemPool of `owner` on `device` (default: the current one), made on first use
    and kept for the process: what a tensor allocated in it holds sleeps and wakes with `owner`."""
    import torch

    _require_cuda_device(torch, "custody.torch.sleepable_pool()")
    key = (owner, _device_index(torch, device))
    if key not in _pools:
        _pools[key] = torch.cuda.MemPool(
            _pluggable_allocator(torch, library_path(), SLEEPABLE_ALLOC, "custody_sleep_free").allocator())
    return _pools[key]


@contextlib.contextmanager
def sleepable(owner, device=None):
    """Inside, what this thread allocates on `device` (default: the current one) through PyTorch is
    `owner`'s sleepable memory (its MemPool, under its owner scope). Yields the pool. Raises
    OwnerAsleepError while `owner` sleeps: PyTorch could otherwise hand out a segment it cached in
    the pool, which is not mapped while its owner sleeps."""
    import torch

    _require_cuda_device(torch, "custody.torch.sleepable()")
    index = _device_index(torch, device)
    if _sleepable.is_asleep(owner, device=index):
        raise OwnerAsleepError("custody: owner '%s' is asleep on device %d: wake it before allocating for it"
                               % (owner, index))
    pool = sleepable_pool(owner, index)
    with _owner_scope(owner), torch.cuda.use_mem_pool(pool, index):
        yield pool


def _streams(torch, device, streams):
    if streams is not None:
        return [s.cuda_stream if hasattr(s, "cuda_stream") else s for s in streams]
    if not torch.cuda.is_initialized():
        return []
    return [torch.cuda.current_stream(device).cuda_stream]


def sleep(owners, offload=(), device=None, streams=None):
    """Gives back the GPU memory of `owners` on `device` (default: the current one), the contents of
    those in `offload` copied to pinned host memory first, the others' dropped. Waits for the work
    queued so far on the streams their segments were allocated on and on `streams` (default: the
    current stream); no device-wide synchronization. Raises OwnerAsleepError, CaptureOpenError,
    OutOfMemoryError, ValueError, CustodyError, each with the owners as they were."""
    import torch

    index = _device(torch, device, "custody.torch.sleep()")
    _sleepable.sleep(owners, offload, device=index, streams=_streams(torch, index, streams))


def wake(owners, device=None):
    """Maps the memory of `owners` on `device` again at the same addresses, restores the offloaded
    contents and zeroes the others; returns when they are in place. Raises OwnerAwakeError,
    OutOfMemoryError, CustodyError, with the owners still asleep."""
    import torch

    _sleepable.wake(owners, device=_device(torch, device, "custody.torch.wake()"))


def is_asleep(owner, device=None):
    import torch

    return _sleepable.is_asleep(owner, device=_device(torch, device, "custody.torch.is_asleep()"))


def sleep_stats(device=None):
    """The sleepable memory of `device` (see custody.sleepable.stats)."""
    import torch

    return _sleepable.stats(device=_device(torch, device, "custody.torch.sleep_stats()"))
