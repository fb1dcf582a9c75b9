"""Sleep and wake by owner from Python: custody.sleepable over the library's sleepable memory on the
host build (real pages mapped and unmapped), custody.torch.sleep/wake over it where PyTorch is
installed, and the MemPool route on a GPU (PyTorch with CUDA and the CUDA build of the library).
Each case skips, saying why, where what it needs is missing."""
import ctypes
import importlib.util
import mmap

import pytest

from conftest import cuda_torch_missing, run_python

import custody
from custody import sleepable

PAGE = mmap.PAGESIZE


def _resident(address, size):
    """Pages of [address, address+size) in memory (mincore)."""
    libc = ctypes.CDLL(None, use_errno=True)
    pages = (size + PAGE - 1) // PAGE
    vec = (ctypes.c_ubyte * pages)()
    assert libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(size), vec) == 0, ctypes.get_errno()
    return sum(v & 1 for v in vec)


def _allocate(lib, owner, size):
    with custody.owner(owner, lib=lib):
        return sleepable.alloc(size, lib=lib)


def _pattern(seed, size):
    return bytes((seed * 131 + i * 7) & 0xFF for i in range(size))


def test_a_round_trip_keeps_offloaded_bytes_and_zeroes_discarded_ones(host_lib):
    size = 5 * PAGE + 17
    weights = _allocate(host_lib, "py-weights", size)
    cache = _allocate(host_lib, "py-cache", size)
    ctypes.memmove(weights, _pattern(1, size), size)
    ctypes.memmove(cache, _pattern(2, size), size)
    before = sleepable.stats(lib=host_lib)

    sleepable.sleep(["py-weights", "py-cache"], offload=["py-weights"], lib=host_lib)
    assert _resident(weights, size) == 0 and _resident(cache, size) == 0
    asleep = sleepable.stats(lib=host_lib)
    assert asleep["mapped_bytes"] == before["mapped_bytes"] - 2 * 6 * PAGE
    assert asleep["offloaded_bytes"] == before["offloaded_bytes"] + size
    assert sleepable.owner_stats("py-weights", lib=host_lib) == {
        "blocks": 1, "bytes": size, "mapped_bytes": 0, "offloaded_bytes": size, "asleep": True, "offload": True}
    assert sleepable.is_asleep("py-cache", lib=host_lib)

    sleepable.wake(["py-weights", "py-cache"], lib=host_lib)
    assert ctypes.string_at(weights, size) == _pattern(1, size)
    assert ctypes.string_at(cache, size) == bytes(size)
    assert sleepable.stats(lib=host_lib)["mapped_bytes"] == before["mapped_bytes"]
    assert sleepable.release_host_memory(lib=host_lib) >= size  # the offload's host memory, kept until now
    assert sleepable.release_host_memory(lib=host_lib) == 0
    sleepable.free(weights, size, lib=host_lib)
    sleepable.free(cache, size, lib=host_lib)


def test_the_rules_are_typed_errors_that_change_nothing(host_lib):
    block = _allocate(host_lib, "py-rules", PAGE)
    sleepable.sleep("py-rules", lib=host_lib)
    with pytest.raises(sleepable.OwnerAsleepError):
        sleepable.sleep("py-rules", lib=host_lib)
    with pytest.raises(sleepable.OwnerAsleepError):
        _allocate(host_lib, "py-rules", PAGE)
    with pytest.raises(sleepable.OwnerAwakeError):
        sleepable.wake(["py-rules", "py-rules-awake"], lib=host_lib)
    assert sleepable.is_asleep("py-rules", lib=host_lib)  # a refused wake woke no one
    with pytest.raises(ValueError):
        sleepable.sleep(["py-a"], offload=["py-b"], lib=host_lib)
    with pytest.raises(ValueError):
        sleepable.wake(["py-rules", "py-rules"], lib=host_lib)
    assert issubclass(sleepable.OwnerAsleepError, custody.CustodyError)
    sleepable.free(block, PAGE, lib=host_lib)  # a sleeping block may be freed
    assert sleepable.owner_stats("py-rules", lib=host_lib)["blocks"] == 0
    sleepable.wake("py-rules", lib=host_lib)
    assert not sleepable.is_asleep("py-rules", lib=host_lib)


def test_more_than_the_host_has_is_out_of_memory_and_changes_nothing(host_lib):
    with open("/proc/sys/vm/overcommit_memory") as f:
        if f.read().strip() == "1":
            pytest.skip("the kernel commits whatever is asked (overcommit_memory 1)")
    before = sleepable.stats(lib=host_lib)
    with pytest.raises(custody.OutOfMemoryError):
        _allocate(host_lib, "py-huge", 1 << 44)
    assert sleepable.stats(lib=host_lib) == before


def test_an_owner_named_untagged_is_the_untagged_owner(host_lib):
    named = _allocate(host_lib, "<untagged>", PAGE)
    plain = sleepable.alloc(PAGE, lib=host_lib)
    for block in (named, plain):
        ctypes.memset(block, 7, PAGE)
    assert sleepable.owner_stats("<untagged>", lib=host_lib)["blocks"] == 2
    sleepable.sleep("<untagged>", lib=host_lib)
    assert _resident(named, PAGE) == 0 and _resident(plain, PAGE) == 0
    sleepable.wake("<untagged>", lib=host_lib)
    assert ctypes.string_at(named, PAGE) == bytes(PAGE) and ctypes.string_at(plain, PAGE) == bytes(PAGE)
    for block in (named, plain):
        sleepable.free(block, PAGE, lib=host_lib)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is not installed")
def test_custody_torch_sleep_and_wake_keep_a_tensor_over_sleepable_memory(host_lib):
    import torch

    import custody.torch

    size = 64 * PAGE
    address = _allocate(host_lib, "py-torch-weights", size)
    cache_address = _allocate(host_lib, "py-torch-cache", size)
    weights = torch.frombuffer((ctypes.c_ubyte * size).from_address(address), dtype=torch.uint8)
    cache = torch.frombuffer((ctypes.c_ubyte * size).from_address(cache_address), dtype=torch.uint8)
    weights.copy_(torch.arange(size, dtype=torch.int64).remainder(251).to(torch.uint8))
    cache.fill_(7)
    expected = weights.clone()

    custody.torch.sleep(["py-torch-weights", "py-torch-cache"], offload=["py-torch-weights"], device=0, streams=[])
    assert custody.torch.is_asleep("py-torch-weights", device=0)
    assert _resident(address, size) == 0
    with pytest.raises(custody.torch.OwnerAsleepError):
        custody.torch.sleep(["py-torch-cache"], device=0, streams=[])
    custody.torch.wake(["py-torch-weights", "py-torch-cache"], device=0)
    assert torch.equal(weights, expected)
    assert int(cache.sum()) == 0
    assert custody.torch.sleep_stats(device=0)["wakes"] >= 2
    sleepable.free(address, size, lib=host_lib)
    sleepable.free(cache_address, size, lib=host_lib)


@pytest.mark.skipif(cuda_torch_missing() is not None, reason=str(cuda_torch_missing()))
def test_on_a_gpu_tensors_in_sleepable_pools_give_their_memory_back_and_keep_their_addresses():
    run_python("""
import torch, custody.torch as ct
with ct.sleepable("weights"):
    w = torch.randn(4096, 4096, device="cuda")
with ct.sleepable("kv_cache"):
    kv = torch.ones(256 << 20, dtype=torch.uint8, device="cuda")
x = torch.randn(4096, 16, device="cuda")
y = w @ x
address = w.data_ptr()
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    out = w @ x
g.replay()
before = out.clone()
torch.cuda.synchronize()
free_awake, _ = torch.cuda.mem_get_info()

ct.sleep(["weights", "kv_cache"], offload=["weights"])
free_asleep, _ = torch.cuda.mem_get_info()
assert free_asleep - free_awake >= (256 << 20) + 4096 * 4096 * 4 - (32 << 20), (free_awake, free_asleep)
assert ct.is_asleep("weights") and ct.sleep_stats()["offloaded_bytes"] >= 4096 * 4096 * 4
try:
    with ct.sleepable("kv_cache"):
        pass
except ct.OwnerAsleepError:
    pass
else:
    raise AssertionError("allocating for a sleeping owner was allowed")

ct.wake(["weights", "kv_cache"])
assert w.data_ptr() == address
assert torch.equal(w @ x, y)
assert int(kv.sum()) == 0
g.replay()
assert torch.equal(out, before)

with torch.cuda.graph(torch.cuda.CUDAGraph()):
    try:
        ct.sleep(["weights"])
    except ct.CaptureOpenError:
        pass
    else:
        raise AssertionError("a sleep during a capture was allowed")
""")
