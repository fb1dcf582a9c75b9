"""custody.torch on a GPU: PyTorch with CUDA and the CUDA build of the allocator library
(CUSTODY_LIBRARY). Skipped elsewhere. Each case runs in a fresh process, since PyTorch takes its
allocator once per process."""
import importlib.util

import pytest

from conftest import ROOT, cuda_torch_missing, run_python, run_script


_MISSING = cuda_torch_missing()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=str(_MISSING))

PRELUDE = """
import torch, custody, custody.torch
custody.torch.enable()
"""


def test_enable_makes_custody_the_allocator_and_stats_keep_pytorchs_names():
    done = run_python(PRELUDE + """
        x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        stats = torch.cuda.memory_stats()
        assert stats["allocated_bytes.all.current"] >= 1 << 20, stats
        assert torch.cuda.memory_allocated() == stats["allocated_bytes.all.current"]
        assert torch.cuda.max_memory_reserved() >= 1 << 20
        assert custody.library().stats(0)["live_allocations"] >= 1
        print(torch.cuda.memory_summary())
    """.replace("\n        ", "\n"))
    assert "custody memory summary" in done.stdout


def test_enable_after_cuda_is_initialized_is_a_clear_error():
    run_python("""
import torch, custody.torch
torch.zeros(1, device="cuda")
try:
    custody.torch.enable()
except custody.torch.TooLateError as e:
    assert "before the first CUDA allocation" in str(e) or "after CUDA was initialized" in str(e), e
else:
    raise AssertionError("enable() after CUDA init was accepted")
""")


def test_out_of_memory_is_a_python_error_with_custodys_diagnostics_never_a_null_tensor():
    run_python(PRELUDE + """
free, total = torch.cuda.mem_get_info()
try:
    torch.empty(total * 2, dtype=torch.uint8, device="cuda")
except RuntimeError as e:
    assert "custody: out of memory" in str(e), e
    assert not isinstance(e, torch.OutOfMemoryError)
else:
    raise AssertionError("an impossible allocation returned a tensor")
try:
    with custody.torch.oom_as_torch_error():
        torch.empty(total * 2, dtype=torch.uint8, device="cuda")
except torch.OutOfMemoryError as e:
    assert "custody: out of memory" in str(e), e
assert torch.cuda.memory_stats()["num_ooms"] == 2
y = torch.ones(1024, device="cuda")               # the device is still usable
assert float(y.sum()) == 1024.0
""")


def test_record_stream_keeps_a_block_from_reuse_until_the_side_stream_is_done():
    run_python(PRELUDE + """
side = torch.cuda.Stream()
x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
address = x.data_ptr()
with torch.cuda.stream(side):
    torch.cuda._sleep(1_000_000_000)   # keep the side stream busy (GPU cycles: about half a second)
    x.add_(1)
x.record_stream(side)
del x
assert torch.cuda.memory_stats()["active_bytes.all.current"] >= 64 << 20
y = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
assert y.data_ptr() != address, "reused while the side stream may still write it"
side.synchronize()
del y
z = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
assert custody.library().stats(0)["held_bytes"] == 0
""")


def test_empty_cache_returns_memory_to_the_device():
    # Measures what custody owns (its reserve, the bytes its pools gave back), not the device's free
    # memory, which other processes on the GPU move.
    run_python(PRELUDE + """
x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
del x
torch.cuda.synchronize()
assert torch.cuda.memory_reserved() >= 256 << 20
segments = torch.cuda.memory_stats()["segment.all.current"]
assert segments >= 1
given = custody.library().empty_cache()
torch.cuda.synchronize()
assert given >= 256 << 20, given
assert torch.cuda.memory_reserved() == 0
stats = torch.cuda.memory_stats()
assert stats["segment.all.current"] == 0 and stats["num_device_free"] >= segments, stats
""")


def test_captured_graph_replayed_from_custodys_private_pool():
    run_python(PRELUDE + """
x = torch.ones(1 << 20, device="cuda")
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):  # warm-up, as PyTorch asks before capturing
    y = x * 2 + 1
torch.cuda.current_stream().wait_stream(side)
torch.cuda.synchronize()
live_before = custody.torch.memory_stats()["allocated_bytes.all.current"]
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    t = x * 2          # freed within the capture: its block is reused by the capture
    y = t + 1
    del t
    z = y * 3
assert custody.torch.memory_stats()["allocated_bytes.all.current"] > live_before
x.fill_(2.0)
g.replay()
torch.cuda.synchronize()
assert torch.equal(y, torch.full_like(x, 5.0)), y[:4]
assert torch.equal(z, torch.full_like(x, 15.0)), z[:4]
x.fill_(3.0)
g.replay()
torch.cuda.synchronize()
assert torch.equal(z, torch.full_like(x, 21.0)), z[:4]
# A second graph sharing the pool, then both released: the private memory goes back.
g2 = torch.cuda.CUDAGraph()
with torch.cuda.graph(g2, pool=g.pool()):
    w = z - 1
g2.replay()
torch.cuda.synchronize()
assert torch.equal(w, torch.full_like(x, 20.0)), w[:4]
reserved = custody.torch.memory_stats()["reserved_bytes.all.current"]
del y, z, w
g.reset()
del g2
import gc; gc.collect()
torch.cuda.synchronize()
torch.cuda.empty_cache()
assert custody.torch.memory_stats()["reserved_bytes.all.current"] < reserved
""")


def test_llama_prefill_and_decode_under_custody_with_tracking_by_owner():
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed")
    run_python("""
import torch, custody, custody.torch
custody.torch.enable(tracking=True)
from transformers import LlamaConfig, LlamaForCausalLM
config = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8,
                     num_key_value_heads=4, vocab_size=1024, max_position_embeddings=512)
with custody.torch.owner("weights"):
    model = LlamaForCausalLM(config).to("cuda", torch.float16).eval()
ids = torch.randint(0, 1024, (2, 64), device="cuda")
with torch.no_grad():
    with custody.torch.owner("prefill"):
        out = model(ids, use_cache=True)
    past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
    for _ in range(16):
        with custody.torch.owner("decode"):
            out = model(token, past_key_values=past, use_cache=True)
        past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
snap = custody.torch.snapshot()
assert snap.live_bytes("weights") > 0, snap.owners
assert snap.live_bytes() > snap.live_bytes("weights"), snap.owners
print(snap.owners)
""")


def test_the_worked_example_under_torchrun(tmp_path):
    import shutil
    import torch  # noqa: F401  (present: the module is not skipped)
    if torch_device_count() < 2 or shutil.which("torchrun") is None:
        pytest.skip("needs torchrun and two GPUs")
    import subprocess
    done = subprocess.run(["torchrun", "--nproc-per-node", "2", str(ROOT / "examples/python/find_leak_by_owner.py"),
                           str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "rank 1: alarm: decode/kv_cache" in done.stdout


def torch_device_count():
    import torch
    return torch.cuda.device_count()


def test_memory_stats_keys_are_pytorchs_own():
    native = run_python("""
import json, torch
x = torch.empty(1 << 20, device="cuda")
print(json.dumps(sorted(torch.cuda.memory_stats())))
""")
    import json
    from custody import stats
    keys = set(json.loads(native.stdout.strip().splitlines()[-1]))
    assert set(stats.PYTORCH_KEYS) <= keys, set(stats.PYTORCH_KEYS) - keys


def test_a_graph_captured_with_torch_cuda_graph_and_an_empty_cache_inside_replays():
    run_python(PRELUDE + """
x = torch.ones(1 << 20, device="cuda")
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g, pool=torch.cuda.graph_pool_handle()):
    y = x * 2
    torch.cuda.empty_cache()   # what libraries do defensively: must not break the capture
    z = y + 1
x.fill_(3.0)
g.replay()
torch.cuda.synchronize()
assert torch.equal(z, torch.full_like(x, 7.0)), z[:4]
""")


def test_record_stream_of_a_tensor_on_the_default_stream():
    run_python(PRELUDE + """
side = torch.cuda.Stream()
x = torch.ones(16 << 20, dtype=torch.uint8, device="cuda")   # PyTorch's default stream (handle 0)
with torch.cuda.stream(side):
    torch.cuda._sleep(100_000_000)
    x.add_(1)
x.record_stream(side)
del x
assert custody.library().stats(0)["held_bytes"] >= 16 << 20
side.synchronize()
y = torch.empty(16 << 20, dtype=torch.uint8, device="cuda")
assert custody.library().stats(0)["held_bytes"] == 0
""")


def test_set_per_process_memory_fraction_caps_custodys_pool():
    run_python(PRELUDE + """
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction(0.05)
assert torch.cuda.get_per_process_memory_fraction() == 0.05
try:
    torch.empty(int(total * 0.06), dtype=torch.uint8, device="cuda")
except RuntimeError as e:
    assert "custody: out of memory" in str(e), e
else:
    raise AssertionError("the fraction did not cap the pool")
ok = torch.empty(int(total * 0.02), dtype=torch.uint8, device="cuda")
""")


def test_the_out_of_memory_callback_runs_before_pytorch_raises():
    run_python(PRELUDE + """
seen = []
custody.torch.on_out_of_memory(seen.append)
free, total = torch.cuda.mem_get_info()
try:
    torch.empty(total * 2, dtype=torch.uint8, device="cuda")
except RuntimeError as e:
    assert len(seen) == 1 and seen[0]["requested_bytes"] >= total * 2, seen
    assert seen[0]["diagnostics"] in str(e) or "custody: out of memory" in seen[0]["diagnostics"], seen
else:
    raise AssertionError("an impossible allocation returned a tensor")
""")


def test_pytorchs_snapshot_calls_write_custodys_snapshot_which_its_viewer_reads(tmp_path):
    run_python("""
import pickle, sys, torch, custody, custody.torch
custody.torch.enable(tracking=True)
torch.cuda.memory._record_memory_history(max_entries=10000)
with custody.torch.owner("weights"):
    w = torch.randn(1024, 1024, device="cuda")
with custody.torch.owner("activations"):
    a = w @ w
    del a
torch.cuda.memory._dump_snapshot(sys.argv[1])
snap = pickle.load(open(sys.argv[1], "rb"))
from torch.cuda import _memory_viz
print(_memory_viz.segsum(snap))
assert "weights" in _memory_viz.memory(snap, format_flamegraph=lambda t: t)
assert any(e["action"] == "alloc" and e["user_metadata"] == "activations" for e in snap["device_traces"][0])
assert torch.cuda.memory._snapshot()["segments"]
""", args=[tmp_path / "snap.pickle"])


MEMPOOL = """
import sys, torch, custody, custody.torch
backing = sys.argv[1]
torch.zeros(1, device="cuda")                    # CUDA is initialized: PyTorch's allocator serves
pool = custody.torch.mem_pool(backing)
with torch.cuda.use_mem_pool(pool):
    kv = torch.full((64 << 20,), 2.0, device="cuda")
    small = torch.ones(1000, device="cuda")
outside = torch.ones(1 << 20, device="cuda")    # PyTorch's own pool again
stats = custody.torch.mem_pool_stats(backing)
assert stats["allocated_bytes.all.current"] >= (64 << 20) * 4, stats   # custody holds PyTorch's segments
assert float(kv.sum()) == 2.0 * (64 << 20) and float(small.sum()) == 1000.0
assert outside.data_ptr() != kv.data_ptr()
del kv, small
torch.cuda.synchronize()
del pool
import gc; gc.collect()
torch.cuda.empty_cache()
assert custody.torch.mem_pool_stats(backing)["allocated_bytes.all.current"] == 0, custody.torch.mem_pool_stats(backing)
"""


@pytest.mark.parametrize("backing", ["pool", "vmm"])
def test_a_torch_mempool_over_custody_serves_its_scope(backing):
    run_python(MEMPOOL, args=[backing])


@pytest.mark.parametrize("backing", ["mapped", "chunked"])
def test_the_backing_decides_whether_cuda_ipc_takes_custodys_memory(backing):
    # What the chunked backing is for: cudaIpcGetMemHandle (through the driver, as vLLM's custom
    # all-reduce asks it: the allocation's base from cuPointerGetAttribute) takes memory of a
    # cudaMalloc chunk and refuses memory mapped with cuMemMap.
    done = run_python("""
import ctypes, sys, torch, custody, custody.torch
custody.torch.enable(backing=sys.argv[1])
x = torch.ones(3 << 20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
assert torch.cuda.memory_stats()["custody.backing"] == sys.argv[1], torch.cuda.memory_stats()
assert custody.library().backing(0)[0] == sys.argv[1]
print(custody.library().report())
driver = ctypes.CDLL("libcuda.so.1")
base = ctypes.c_uint64()
CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11
assert driver.cuPointerGetAttribute(ctypes.byref(base), CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                    ctypes.c_uint64(x.data_ptr())) == 0
handle = (ctypes.c_char * 64)()
print("ipc", driver.cuIpcGetMemHandle(handle, base))
""", args=[backing])
    status = int(done.stdout.split("ipc")[-1])
    assert "custody device 0 (%s: " % backing in done.stdout, done.stdout
    if backing == "chunked":
        assert status == 0, done.stdout
        assert " chunks, " in done.stdout
    else:
        assert status != 0, done.stdout
        assert "granules of" in done.stdout


def test_tensors_copy_between_gpus_that_are_peers_over_mapped_memory():
    # PyTorch copies between peers directly once it has enabled peer access, which does not reach
    # mapped memory: the library grants each peer access to what it maps.
    if torch_device_count() < 2:
        pytest.skip("needs two GPUs")
    run_python(PRELUDE + """
if not torch.cuda.can_device_access_peer(1, 0):
    raise SystemExit(0)
a = torch.arange(1 << 22, dtype=torch.float32, device="cuda:0")
b = a.to("cuda:1")
c = torch.empty_like(b, device="cuda:0")
c.copy_(b)
torch.cuda.synchronize(0)
torch.cuda.synchronize(1)
assert torch.equal(a, c) and custody.library().backing(1)[0] == "mapped"
""")


def test_mem_pool_is_refused_under_the_whole_process_switch():
    done = run_python(PRELUDE + """
try:
    custody.torch.mem_pool()
except custody.CustodyError as e:
    print(e)
""")
    assert "whole process" in done.stdout
