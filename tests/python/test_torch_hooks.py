"""The PyTorch calls custody.torch wraps (custody._torch_hooks), checked against a stand-in for
torch that behaves as PyTorch's source says (aten/src/ATen/cuda/CUDAGraph.cpp: pool() is refused
until capture_end; the capture begins inside capture_begin), with no PyTorch nor GPU. The real thing
runs in test_torch.py on a GPU."""
import types

import pytest

from conftest import run_python

from custody import _torch_hooks
from custody._library import CustodyError


class FakeGraph:
    """torch.cuda.CUDAGraph as PyTorch has it: capture_begin takes a pool id (or makes one) and
    begins capturing; pool() is refused before capture_end (TORCH_CHECK(capture_ended_))."""

    def __init__(self, calls, stream):
        self.calls, self.stream = calls, stream
        self.ended = False

    def capture_begin(self, pool=None, capture_error_mode="global"):
        if self.stream.cuda_stream == 0:
            raise RuntimeError("CUDA graphs must be captured on a non-default stream.")
        if pool is not None and hasattr(pool, "id"):  # a MemPool (graphs.py's _get_pool_id)
            pool = pool.id
        self.id = tuple(pool) if pool is not None else (1, 0)
        self.stream.capturing = True
        self.calls.append(("capture_begin", self.id))

    def capture_end_pre(self):
        self.stream.capturing = False
        self.ended = True
        self.calls.append(("capture_end_pre",))

    def capture_end(self):
        self.capture_end_pre()

    def reset(self):
        self.ended = False
        self.calls.append(("reset",))

    def pool(self):
        if not self.ended:
            raise RuntimeError("Called CUDAGraph::pool() without a preceding successful capture.")
        return self.id


class RecordingLibrary:
    """The allocator library's capture hooks, recorded; begin refuses nothing but notes whether the
    stream had begun capturing already."""

    def __init__(self, calls, stream):
        self.calls, self.stream = calls, stream

    def begin_allocate_to_pool(self, device, pool_id, stream):
        self.calls.append(("route", device, tuple(pool_id), stream, "capturing" if self.stream.capturing else "idle"))

    def end_allocate_to_pool(self, device, pool_id):
        self.calls.append(("route_end", device, tuple(pool_id)))

    def release_pool(self, device, pool_id):
        self.calls.append(("release", device, tuple(pool_id)))


def fake_torch(calls, stream_handle=0x5100):
    stream = types.SimpleNamespace(cuda_stream=stream_handle, capturing=False)
    handles = iter(range(100, 200))

    class Graph(FakeGraph):
        def __init__(self):
            super().__init__(calls, stream)

    cuda = types.SimpleNamespace(CUDAGraph=Graph, current_device=lambda: 2, current_stream=lambda: stream,
                                 graph_pool_handle=lambda: (0, next(handles)))
    return types.SimpleNamespace(cuda=cuda), stream


def test_capture_takes_the_pool_id_before_and_routes_before_the_capture_begins():
    calls = []
    torch, stream = fake_torch(calls)
    lib = RecordingLibrary(calls, stream)
    _torch_hooks.install_capture(torch, lib)
    g = torch.cuda.CUDAGraph()
    g.capture_begin()  # as torch.cuda.graph(g) does without pool=
    assert calls[:2] == [("route", 2, (0, 100), 0x5100, "idle"), ("capture_begin", (0, 100))], calls
    g.capture_end()
    assert calls[2:] == [("capture_end_pre",), ("route_end", 2, (0, 100))], calls
    assert g.pool() == (0, 100)  # the id PyTorch was given is the graph's pool
    g.reset()
    assert calls[-1] == ("release", 2, (0, 100))


def test_a_shared_pool_is_routed_under_its_own_id():
    calls = []
    torch, stream = fake_torch(calls)
    _torch_hooks.install_capture(torch, RecordingLibrary(calls, stream))
    first = torch.cuda.CUDAGraph()
    first.capture_begin()
    first.capture_end()
    second = torch.cuda.CUDAGraph()
    second.capture_begin(first.pool())  # torch.cuda.graph(g2, pool=g.pool())
    assert ("route", 2, (0, 100), 0x5100, "idle") in calls and calls.count(("capture_begin", (0, 100))) == 2
    mem_pool = types.SimpleNamespace(id=(7, 0))  # a torch.cuda.MemPool as the pool
    third = torch.cuda.CUDAGraph()
    second.capture_end()
    third.capture_begin(mem_pool)
    assert calls[-2][:3] == ("route", 2, (7, 0))


def test_a_capture_pytorch_refuses_closes_its_route_again():
    calls = []
    torch, stream = fake_torch(calls, stream_handle=0)  # the default stream: PyTorch refuses
    _torch_hooks.install_capture(torch, RecordingLibrary(calls, stream))
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="non-default stream"):
        g.capture_begin()
    assert [c[0] for c in calls] == ["route", "route_end", "release"], calls


def test_set_per_process_memory_fraction_caps_the_devices_pool(host_lib):
    run_python("""
        import types, custody
        from custody import _torch_hooks
        checked = []
        def original(fraction, device=None):  # PyTorch validates, then its pluggable allocator ignores it
            if not isinstance(fraction, float) or not 0 <= fraction <= 1:
                raise ValueError("Invalid fraction value")
            checked.append(fraction)
        cuda = types.SimpleNamespace(set_per_process_memory_fraction=original, current_device=lambda: 5,
                                     _get_device_index=lambda d: d,
                                     get_device_properties=lambda d: types.SimpleNamespace(total_memory=64 << 20))
        cuda.memory = types.SimpleNamespace()
        torch = types.SimpleNamespace(cuda=cuda)
        lib = custody.library()
        _torch_hooks.install_memory_fraction(torch, lib)
        torch.cuda.set_per_process_memory_fraction(0.25)          # 16 MiB of a 64 MiB device 5
        assert checked == [0.25] and torch.cuda.get_per_process_memory_fraction() == 0.25
        assert torch.cuda.memory.get_per_process_memory_fraction(4) == 1.0
        block = lib.alloc(12 << 20, 5)
        try:
            lib.alloc(8 << 20, 5)
        except custody.OutOfMemoryError:
            pass
        else:
            raise AssertionError("the fraction did not cap the pool")
        try:
            torch.cuda.set_per_process_memory_fraction(1.5)
        except ValueError:
            pass
        else:
            raise AssertionError("PyTorch's validation was skipped")
    """)


def test_the_python_claim_of_a_gpu_locks_the_file_the_cpp_claim_locks(host_lib, tmp_path):
    done = run_python("""
        import os, sys, types, custody, custody.torch
        class Uuid:  # torch's _CUuuid: str() has no "GPU-" prefix
            bytes = b"host" + bytes(11) + b"\\x01"
            def __str__(self):
                return "686f7374-0000-0000-0000-000000000001"
        props = types.SimpleNamespace(uuid=Uuid())
        torch = types.SimpleNamespace(cuda=types.SimpleNamespace(device_count=lambda: 2,
                                                                 get_device_properties=lambda d: props))
        custody.torch._claim_gpu(torch, custody.library())
        print(sorted(os.listdir(sys.argv[1])))
    """, env={"CUSTODY_RUNTIME_DIR": tmp_path, "RANK": 1, "LOCAL_RANK": 1, "WORLD_SIZE": 2}, args=[tmp_path])
    name = host_lib.device_name(1)  # what a C++ claim of device 1 (interop/gpu_name.hpp) locks
    assert any(name in f for f in done.stdout.split("'")), (name, done.stdout)


def test_mem_pool_refuses_what_cannot_back_a_torch_mempool(host_lib):
    done = run_python("""
        import sys, types, custody, custody.torch
        sys.modules["torch"] = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: True))
        try:
            custody.torch.mem_pool()
        except custody.CustodyError as e:
            print(e)
    """)
    assert "host build" in done.stdout and "needs the CUDA build" in done.stdout, done.stdout


def test_without_a_gpu_the_torch_entry_points_say_so_and_where_the_cuda_build_is():
    """PyTorch installed, no NVIDIA driver (a login node, a CI runner with the toolkit): custody's
    error, naming the missing device and where custody's CUDA build is, instead of the host build's
    name or PyTorch's "Found no NVIDIA driver" from deep inside."""
    done = run_python("""
        import sys, types

        def no_driver():
            raise RuntimeError("Found no NVIDIA driver on your system.")

        torch = types.ModuleType("torch")
        torch.cuda = types.SimpleNamespace(is_available=lambda: False, is_initialized=lambda: False,
                                           current_device=no_driver)
        sys.modules["torch"] = torch
        import custody, custody.torch as ct

        calls = {"enable": ct.enable, "sleepable": lambda: ct.sleepable("kv_cache").__enter__(),
                 "sleep": lambda: ct.sleep(["kv_cache"]), "wake": lambda: ct.wake(["kv_cache"]),
                 "mem_pool": ct.mem_pool}
        for name, call in calls.items():
            try:
                call()
                print(name, "| no error")
            except custody.CustodyError as e:
                print(name, "| custody |", e)
            except Exception as e:
                print(name, "| other |", type(e).__name__, e)
        """)
    lines = done.stdout.splitlines()
    assert len(lines) == 5, done.stdout + done.stderr
    for line in lines:
        name, kind, message = line.split(" | ", 2)
        assert kind == "custody", line
        assert "needs a CUDA device, and PyTorch sees none" in message, line
        assert "CUDA build of custody's library" in message, line


def test_a_capture_that_fails_at_its_end_raises_its_own_error_not_the_routes():
    calls = []
    torch, stream = fake_torch(calls)

    class FailingEnd(torch.cuda.CUDAGraph):
        fail = True

        def capture_end_pre(self):
            super().capture_end_pre()
            if self.fail:
                raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    class RefusingLibrary(RecordingLibrary):
        def end_allocate_to_pool(self, device, pool_id):
            super().end_allocate_to_pool(device, pool_id)
            raise CustodyError("custody: the route could not be closed")

    torch.cuda.CUDAGraph = FailingEnd
    _torch_hooks.install_capture(torch, RefusingLibrary(calls, stream))
    g = torch.cuda.CUDAGraph()
    g.capture_begin()
    with pytest.raises(RuntimeError, match="operation not permitted when stream is capturing") as caught:
        g.capture_end()
    assert not isinstance(caught.value, CustodyError)
    assert ("route_end", 2, (0, 100)) in calls  # the route is closed all the same
    # A capture that ends well still reports a refusal to close its route.
    FailingEnd.fail = False
    ok = torch.cuda.CUDAGraph()
    ok.capture_begin()
    with pytest.raises(CustodyError, match="could not be closed"):
        ok.capture_end()


def test_a_sleepable_pool_allocates_through_the_function_that_answers_null_when_memory_runs_out(host_lib,
                                                                                                 monkeypatch):
    import sys

    from custody import torch_sleep

    names = []

    def recording_allocator(torch, path, alloc_name, free_name):
        names.append((alloc_name, free_name))
        return types.SimpleNamespace(allocator=lambda: "raw allocator")

    monkeypatch.setattr(torch_sleep, "_pluggable_allocator", recording_allocator)
    monkeypatch.setattr(torch_sleep, "_pools", {})
    cuda = types.SimpleNamespace(MemPool=lambda raw: ("MemPool", raw), current_device=lambda: 0, is_available=lambda: True)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    assert torch_sleep.sleepable_pool("null-when-full", 0) == ("MemPool", "raw allocator")
    (alloc_name, free_name), = names
    assert free_name == "custody_sleep_free"
    # PyTorch's caching allocator calls a MemPool's allocation function and takes NULL for out of
    # memory (then frees its cache, retries and raises torch.OutOfMemoryError); an exception thrown
    # through it would end the process here (ctypes) and skip the retry there.
    done = run_python("""
        import ctypes, sys, custody
        lib = ctypes.CDLL(custody.library_path())
        alloc = getattr(lib, sys.argv[1])
        alloc.restype, alloc.argtypes = ctypes.c_void_p, [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        print(alloc(1 << 60, 0, None))
    """, args=[alloc_name], check=False)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.splitlines()[0] == "None", done.stdout
