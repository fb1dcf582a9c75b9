"""The PyTorch calls custody.torch.enable() wraps: PyTorch's pluggable allocator takes only an
allocation and a free function from Python, and its other hooks (record_stream, empty_cache, graph
capture, the memory fraction) can be set from C++ alone, so their Python entry points are wrapped to
reach the allocator library.

Each install function takes the torch module and the Library, so that the wrapping can be checked
against a stand-in for torch where PyTorch with CUDA is absent."""

import contextlib
import functools
import weakref

from ._library import CustodyError, cuda_build_location

__all__ = ["install", "install_capture", "install_memory_fraction", "pool_id", "require_cuda_device"]


def require_cuda_device(torch, what):
    """Raises CustodyError, saying so and where custody's CUDA build is, when PyTorch sees no CUDA
    device (no NVIDIA driver, or no GPU): what would follow is PyTorch's own error from deep inside
    ("Found no NVIDIA driver on your system"), which says nothing of custody. Does not initialize
    CUDA (torch.cuda.is_available() does not)."""
    if not torch.cuda.is_available():
        raise CustodyError("custody: %s needs a CUDA device, and PyTorch sees none on this machine "
                           "(torch.cuda.is_available() is False: no NVIDIA driver, or no GPU). %s. Without a GPU, "
                           "custody's package runs on its host build over virtual devices (custody.library(), "
                           "custody.sleepable, custody.owner)." % (what, cuda_build_location()))


def install(torch, lib, memory_stats, memory_summary):
    """Wraps record_stream, empty_cache, the statistics, graph capture and the memory fraction."""
    original_record = torch.Tensor.record_stream

    @functools.wraps(original_record)
    def record_stream(tensor, stream):
        original_record(tensor, stream)
        if tensor.is_cuda:
            # The library serves PyTorch's default stream (handle 0) as its device's legacy stream:
            # the tensor's device, made current for the call.
            with torch.cuda.device(tensor.device):
                lib.record_stream(tensor.untyped_storage().data_ptr(), stream.cuda_stream)

    torch.Tensor.record_stream = record_stream

    original_empty = torch.cuda.empty_cache

    @functools.wraps(original_empty)
    def empty_cache():
        original_empty()
        lib.empty_cache()  # leaves a device alone while a capture is routed into its pool

    torch.cuda.empty_cache = torch.cuda.memory.empty_cache = empty_cache
    for module in (torch.cuda, torch.cuda.memory):
        module.memory_stats = memory_stats
        module.memory_summary = memory_summary
    install_capture(torch, lib)
    install_memory_fraction(torch, lib)


def pool_id(pool):
    """The (int, int) id of a graph's memory pool as PyTorch takes it: a pool handle (a pair), another
    graph's pool(), or a torch.cuda.MemPool (its .id); None for None."""
    if pool is None:
        return None
    if not isinstance(pool, tuple) and hasattr(pool, "id"):
        pool = pool.id
    first, second = pool
    return int(first), int(second)


def install_capture(torch, lib):
    """Wraps CUDAGraph so that custody serves each capture from the graph's private pool, as PyTorch's
    CUDAGraph::capture_begin does for its own allocator:

    - the pool id is taken before the capture begins: the one given (pool=, a graph's pool() or a
      MemPool), else a new torch.cuda.graph_pool_handle() passed in to PyTorch; CUDAGraph.pool() is
      refused until capture_end, so it cannot be asked after the capture began;
    - the route opens before cudaStreamBeginCapture, on the stream about to be captured: a free on it
      in between (an autograd thread's) is then already the capture's, and no event is recorded that
      the capture would refuse (CUDAGraph.cpp's "Addendum");
    - it ends right after PyTorch ends the capture (capture_end_pre where PyTorch has it, which the
      context manager also calls when a capture fails at entry; else capture_end), and the graph
      holds the pool until it is reset or collected.

    A refused routing raises CustodyError before anything is captured; a capture_begin that PyTorch
    refuses closes the route again."""
    graph = torch.cuda.CUDAGraph
    original_begin, original_reset = graph.capture_begin, graph.reset
    end_name = "capture_end_pre" if hasattr(graph, "capture_end_pre") else "capture_end"
    original_end = getattr(graph, end_name)

    @functools.wraps(original_begin)
    def capture_begin(self, pool=None, *args, **kwargs):
        route = pool_id(pool)
        if route is None:
            pool = route = pool_id(torch.cuda.graph_pool_handle())
        device = torch.cuda.current_device()
        lib.begin_allocate_to_pool(device, route, torch.cuda.current_stream().cuda_stream)
        try:
            original_begin(self, pool, *args, **kwargs)
        except BaseException:
            with contextlib.suppress(CustodyError):
                lib.end_allocate_to_pool(device, route)
                lib.release_pool(device, route)
            raise
        self._custody_capture = (device, route)
        # One hold per capture, dropped when the graph is reset or collected.
        self._custody_release = weakref.finalize(self, lib.release_pool, device, route)

    @functools.wraps(original_end)
    def capture_end(self, *args, **kwargs):
        try:
            result = original_end(self, *args, **kwargs)
        except BaseException:
            # The capture's own error is the one to see: the route is closed, and a refusal to
            # close it is dropped rather than raised in its place.
            capture = self.__dict__.pop("_custody_capture", None)
            if capture is not None:
                with contextlib.suppress(CustodyError):
                    lib.end_allocate_to_pool(*capture)
            raise
        capture = self.__dict__.pop("_custody_capture", None)
        if capture is not None:
            lib.end_allocate_to_pool(*capture)
        return result

    @functools.wraps(original_reset)
    def reset(self):
        original_reset(self)
        release = self.__dict__.pop("_custody_release", None)
        if release is not None:
            release()

    graph.capture_begin, graph.reset = capture_begin, reset
    setattr(graph, end_name, capture_end)


_allocators = {}


def pluggable_allocator(torch, path, alloc_name, free_name):
    """The CUDAPluggableAllocator over `alloc_name` and `free_name` of the library at `path`, made once
    and kept for the process (PyTorch calls its functions for as long as a MemPool over it lives).
    Raises CustodyError unless `path` is the CUDA build: a MemPool hands its memory to CUDA kernels."""
    from ._library import library

    key = (str(path), alloc_name, free_name)
    if key not in _allocators:
        lib = library(path)
        if lib.platform != "cuda":
            raise CustodyError("custody: %s is the %s build of the allocator library; a MemPool needs the CUDA build"
                               % (path, lib.platform))
        _allocators[key] = torch.cuda.memory.CUDAPluggableAllocator(str(path), alloc_name, free_name)
    return _allocators[key]


def device_index(torch, device):
    """The index of `device` (None: the current device; an int, a torch.device or a text such as
    "cuda:1"; "cuda" alone: the current device)."""
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    return device.index if device.index is not None else torch.cuda.current_device()


def install_memory_fraction(torch, lib):
    """torch.cuda.set_per_process_memory_fraction(f, device) caps the device's pool at f times the
    device's memory (PyTorch validates the fraction first; its pluggable allocator would ignore it),
    and get_per_process_memory_fraction answers what was set (1.0 before)."""
    original_set = torch.cuda.set_per_process_memory_fraction
    fractions = {}

    @functools.wraps(original_set)
    def set_per_process_memory_fraction(fraction, device=None):
        original_set(fraction, device)
        index = device_index(torch, device)
        total = torch.cuda.get_device_properties(index).total_memory
        lib.set_max_bytes(index, int(fraction * total))
        fractions[index] = fraction

    def get_per_process_memory_fraction(device=None):
        return fractions.get(device_index(torch, device), 1.0)

    for module in (torch.cuda, torch.cuda.memory):
        module.set_per_process_memory_fraction = set_per_process_memory_fraction
        module.get_per_process_memory_fraction = get_per_process_memory_fraction
