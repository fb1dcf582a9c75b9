"""The package's core over the host build of the allocator library: no PyTorch, no GPU."""
import pathlib
import subprocess
import sys
import textwrap

import pytest

import custody
from custody import options
from conftest import _environment, run_python


def test_loads_the_host_build(host_lib):
    assert host_lib.platform == "host"
    assert host_lib.device_count == 8
    assert custody.library() is host_lib


def test_memory_stats_use_pytorchs_key_names_and_move_exactly(host_lib):
    before = custody.memory_stats(1)
    assert {"allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current",
            "reserved_bytes.all.peak", "num_ooms", "allocation.all.current"} <= set(before)
    block = host_lib.alloc(3 << 20, 1)
    during = custody.memory_stats(1)
    assert during["allocated_bytes.all.current"] == before["allocated_bytes.all.current"] + (3 << 20)
    assert during["allocation.all.current"] == before["allocation.all.current"] + 1
    assert during["reserved_bytes.all.current"] >= 3 << 20
    host_lib.free(block, 3 << 20, 1)
    after = custody.memory_stats(1)
    assert after["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]
    assert after["allocated_bytes.all.peak"] >= 3 << 20
    assert after["allocation.all.freed"] == before["allocation.all.freed"] + 1


def test_out_of_memory_raises_with_the_pools_diagnostics_and_is_counted(host_lib):
    before = custody.memory_stats(2)
    with pytest.raises(custody.OutOfMemoryError) as caught:
        host_lib.alloc(1 << 50, 2)
    message = str(caught.value)
    assert "custody: out of memory" in message and "device 2" in message and "reserved" in message
    assert isinstance(caught.value, MemoryError) and isinstance(caught.value, custody.CustodyError)
    after = custody.memory_stats(2)
    assert after["num_ooms"] == before["num_ooms"] + 1
    assert after["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]


def test_bad_requests_raise_custody_errors(host_lib):
    with pytest.raises(custody.CustodyError, match="device 42 out of range"):
        host_lib.alloc(64, 42)
    with pytest.raises(custody.CustodyError, match="no device"):
        host_lib.stats(42)
    assert host_lib.alloc(0, 1) == 0


def test_empty_cache_gives_the_reserve_back(host_lib):
    block = host_lib.alloc(4 << 20, 3)
    host_lib.free(block, 4 << 20, 3)
    assert custody.memory_stats(3)["reserved_bytes.all.current"] > 0
    assert host_lib.empty_cache() > 0
    assert custody.memory_stats(3)["reserved_bytes.all.current"] == 0


def test_memory_summary_names_the_device_and_its_counters(host_lib):
    block = host_lib.alloc(1 << 20, 4)
    text = custody.memory_summary(4)
    host_lib.free(block, 1 << 20, 4)
    assert "device 4 (host build)" in text
    assert "Allocated memory" in text and "1.0 MiB" in text
    assert "Out-of-memory errors" in text


def test_capture_hooks_reach_the_pool_and_refuse_what_it_refuses(host_lib):
    # The route opens on the stream about to be captured, never the default stream; capture itself
    # is driven from C++ (tests/interop/torch_dlopen_test.cpp) and on a GPU (test_torch.py).
    before = host_lib.stats(5)
    with pytest.raises(custody.CustodyError, match="not the default stream"):
        host_lib.begin_allocate_to_pool(5, (21, 0), None)
    host_lib.alloc(0, 5)  # makes device 5's pool, so that the refusals below come from it
    with pytest.raises(custody.CustodyError, match="custody"):
        host_lib.end_allocate_to_pool(5, (21, 0))
    with pytest.raises(custody.CustodyError, match="custody"):
        host_lib.release_pool(5, (21, 0))
    assert host_lib.stats(5)["reserved_bytes"] == before["reserved_bytes"]


def test_options_take_the_environment_over_the_code():
    chosen = options.resolve(environ={"CUSTODY_MAX_BYTES": "2GiB", "CUSTODY_TRACKING": "1"}, max_bytes=1 << 20,
                             tracking=False)
    assert chosen["max_bytes"] == 2 << 30
    assert chosen["tracking"] is True
    assert chosen["claim_device"] is True
    assert options.resolve(environ={}, max_bytes="512MiB")["max_bytes"] == 512 << 20
    assert options.resolve(environ={})["max_bytes"] is None
    with pytest.raises(custody.CustodyError, match="CUSTODY_MAX_BYTES='lots'"):
        options.resolve(environ={"CUSTODY_MAX_BYTES": "lots"})
    with pytest.raises(custody.CustodyError, match="CUSTODY_TRACKING='maybe'"):
        options.resolve(environ={"CUSTODY_TRACKING": "maybe"})
    with pytest.raises(TypeError, match="unknown option"):
        options.resolve(environ={}, max_byte=1)
    assert options.parse_bytes("2G") == 2 * 1000 ** 3
    assert options.parse_bytes("1048576") == 1 << 20


def test_rank_comes_from_torchruns_variables():
    assert custody.rank_info({}) == (0, 0, 1)
    assert custody.rank_info({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}) == (3, 1, 4)
    with pytest.raises(custody.CustodyError, match="LOCAL_RANK, WORLD_SIZE not"):
        custody.rank_info({"RANK": "3"})
    with pytest.raises(custody.CustodyError, match="do not fit"):
        custody.rank_info({"RANK": "4", "LOCAL_RANK": "0", "WORLD_SIZE": "4"})


def test_configure_caps_the_pools_before_the_first_allocation_and_is_refused_after(host_lib):
    run_python("""
        import custody
        lib = custody.library()
        lib.configure("max_bytes", 8 << 20)
        block = lib.alloc(6 << 20, 0)
        try:
            lib.alloc(4 << 20, 0)
        except custody.OutOfMemoryError as e:
            assert "out of memory" in str(e), e
        else:
            raise AssertionError("the cap was not applied")
        try:
            lib.configure("max_bytes", 1 << 30)
        except custody.CustodyError as e:
            assert "after the first allocation" in str(e), e
        else:
            raise AssertionError("configure after an allocation was accepted")
        try:
            lib.configure("bogus", 1)
        except custody.CustodyError as e:
            assert "unknown option 'bogus'" in str(e), e
        else:
            raise AssertionError("an unknown option was accepted")
    """)


def test_a_second_rank_on_the_same_gpu_fails_naming_both_ranks(host_lib, tmp_path):
    holder = """
        import sys, custody
        custody.claim_device("GPU-test-uuid", 0, rank=0)
        print("claimed", flush=True)
        sys.stdin.read()
    """
    env = _environment({"CUSTODY_RUNTIME_DIR": tmp_path})
    first = subprocess.Popen([sys.executable, "-c", textwrap.dedent(holder)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert first.stdout.readline().strip() == "claimed"
        second = run_python("""
            import custody
            try:
                custody.claim_device("GPU-test-uuid", 0, rank=1)
            except custody.CustodyError as e:
                print(e)
            else:
                raise SystemExit("the second claim succeeded")
        """, env={"CUSTODY_RUNTIME_DIR": tmp_path})
        assert "ranks 0 and 1 both chose device 0" in second.stdout, second.stdout
        assert "GPU-test-uuid" in second.stdout
    finally:
        first.communicate("")
    run_python("""
        import custody
        custody.claim_device("GPU-test-uuid", 0, rank=1)   # free again once the holder exited
    """, env={"CUSTODY_RUNTIME_DIR": tmp_path})


def test_memory_stats_count_segments_device_calls_and_active_blocks(host_lib):
    before = custody.memory_stats(6)
    assert {"segment.all.current", "num_device_alloc", "num_device_free", "active.all.current"} <= set(before)
    block = host_lib.alloc(5 << 20, 6)
    during = custody.memory_stats(6)
    assert during["segment.all.current"] >= before["segment.all.current"] + 1
    assert during["num_device_alloc"] >= before["num_device_alloc"] + 1
    assert during["active.all.current"] == before["active.all.current"] + 1
    host_lib.free(block, 5 << 20, 6)
    host_lib.trim(6)
    after = custody.memory_stats(6)
    assert after["segment.all.current"] == 0
    assert after["num_device_free"] == after["num_device_alloc"]


def test_set_max_bytes_caps_a_device_before_and_after_its_pool_exists(host_lib):
    run_python("""
        import custody
        lib = custody.library()
        lib.set_max_bytes(1, 8 << 20)             # before the pool exists: its cap
        try:
            lib.alloc(12 << 20, 1)
        except custody.OutOfMemoryError:
            pass
        else:
            raise AssertionError("the cap set before the pool was not applied")
        block = lib.alloc(4 << 20, 2)             # the pool exists, uncapped
        lib.set_max_bytes(2, 6 << 20)             # then capped: no growth beyond 6 MiB
        try:
            lib.alloc(8 << 20, 2)
        except custody.OutOfMemoryError as e:
            assert "out of memory" in str(e), e
        else:
            raise AssertionError("the cap set on a running pool was not applied")
        lib.free(block, 4 << 20, 2)
        try:
            lib.set_max_bytes(42, 1)
        except custody.CustodyError as e:
            assert "no device 42" in str(e), e
        else:
            raise AssertionError("a bad device was accepted")
    """)


def test_the_out_of_memory_callback_gets_custodys_diagnostics_before_the_error(host_lib):
    done = run_python("""
        import custody, custody.torch
        seen = []
        custody.torch.on_out_of_memory(seen.append)
        try:
            custody.library().alloc(1 << 50, 3)
        except custody.OutOfMemoryError as e:
            assert len(seen) == 1, seen            # told before the error reached the caller
            info = seen[0]
            assert info["device"] == 3 and info["requested_bytes"] == 1 << 50, info
            assert "custody: out of memory" in info["diagnostics"] and "reserved" in info["diagnostics"], info
            assert info["stats"]["num_ooms"] == 1, info["stats"]
            assert str(e).startswith(info["diagnostics"][:40]), (str(e), info)
        else:
            raise AssertionError("an impossible allocation succeeded")
        custody.torch.on_out_of_memory(None)
        try:
            custody.library().alloc(1 << 50, 3)
        except custody.OutOfMemoryError:
            pass
        assert len(seen) == 1, "a removed callback was called"
        print("ok")
    """)
    assert done.stdout.strip() == "ok"


def test_a_gpu_is_named_as_custodys_cpp_claims_name_it(host_lib):
    name = host_lib.device_name(3)
    assert name == "GPU-686f7374-0000-0000-0000-000000000003"  # interop/gpu_name.hpp's format
    with pytest.raises(custody.CustodyError, match="no device 99"):
        host_lib.device_name(99)


def test_the_package_loads_the_cuda_build_only_where_a_device_is_present(host_lib, tmp_path, monkeypatch):
    from custody import _library
    host = pathlib.Path(host_lib.path)
    cuda = host.with_name("libcustody_torch_allocator.so")
    (tmp_path / host.name).symlink_to(host)
    monkeypatch.delenv("CUSTODY_LIBRARY")
    path, why = _library.library_choice(tmp_path)
    assert path == str(tmp_path / host.name) and "host build" in why, why
    if cuda.exists():  # the CUDA build of this build tree: no device here, or one on a GPU machine
        (tmp_path / cuda.name).symlink_to(cuda)
        path, why = _library.library_choice(tmp_path)
        if _library._cuda_devices(cuda) == 0:
            assert path == str(tmp_path / host.name) and "no CUDA device" in why, why
        else:
            assert path == str(tmp_path / cuda.name) and "a CUDA device is present" in why, why
    monkeypatch.setenv("CUSTODY_LIBRARY", str(host))
    assert _library.library_choice(tmp_path) == (str(host), "CUSTODY_LIBRARY")


def test_mempool_backings_hand_out_segments_synchronously_and_count_them(host_lib):
    import ctypes
    raw = ctypes.CDLL(host_lib.path)
    assert host_lib.mempool_backings == ("pool", "vmm")
    for backing in host_lib.mempool_backings:
        alloc = getattr(raw, "custody_mempool_%s_alloc" % backing)
        free = getattr(raw, "custody_mempool_%s_free" % backing)
        alloc.restype, alloc.argtypes = ctypes.c_void_p, [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        free.restype, free.argtypes = None, [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        segment = alloc(20 << 20, 4, None)  # PyTorch's large segment
        assert segment, host_lib.last_error()
        ctypes.memset(segment, 0x5A, 20 << 20)  # usable at once, whatever stream PyTorch named
        stats = host_lib.mempool_stats(backing, 4)
        assert stats["live_bytes"] == 20 << 20 and stats["live_allocations"] == 1, (backing, stats)
        assert not alloc(1 << 50, 4, None)  # out of memory: NULL, as PyTorch's MemPool expects
        assert "out of memory" in host_lib.last_error() or "no memory" in host_lib.last_error(), host_lib.last_error()
        free(segment, 20 << 20, 4, None)
        assert host_lib.mempool_stats(backing, 4)["live_bytes"] == 0
        assert custody.memory_stats(4)["allocated_bytes.all.current"] == 0  # apart from the whole-process pools
    with pytest.raises(custody.CustodyError, match="no MemPool backing 'sleepy'"):
        host_lib.mempool_stats("sleepy", 4)
