"""What backs the allocator library's pools (mapped granules by default, cudaMalloc chunks when asked
for), what the report and the statistics say of it, and set_max_bytes' one meaning: over the host
build, each case in a fresh process (the backing and the options are the process's)."""
import pytest

from conftest import run_python


def test_the_pools_grow_by_mapping_granules_by_default_and_say_so(host_lib):
    done = run_python("""
        import custody
        lib = custody.library()
        assert lib.backing(3) == ("mapped", "the default"), lib.backing(3)
        block = lib.alloc(3 << 20, 3)
        stats = custody.memory_stats(3)
        assert stats["custody.backing"] == "mapped", stats
        assert stats["reserved_bytes.all.current"] % (2 << 20) == 0          # whole 2 MiB granules
        assert stats["segment.all.current"] == stats["reserved_bytes.all.current"] // (2 << 20)
        print(lib.report())
        print(custody.memory_summary(3))
        lib.free(block, 3 << 20, 3)
        lib.trim(3)
        assert custody.memory_stats(3)["reserved_bytes.all.current"] == 0     # unmapped again
    """)
    assert "custody device 3 (mapped: the default)" in done.stdout, done.stdout
    assert "granules of 2097152 B mapped" in done.stdout
    assert "device 3 (host build)\nbacking: mapped (the default)" in done.stdout


@pytest.mark.parametrize("how", ["environment", "option"])
def test_the_chunked_fallback_serves_when_asked_for(host_lib, how):
    env = {"CUSTODY_BACKING": "chunked"} if how == "environment" else {}
    done = run_python("""
        import sys, custody
        lib = custody.library()
        if sys.argv[1] == "option":
            lib.configure("chunked", 1)
        name, why = lib.backing(4)
        assert name == "chunked", (name, why)
        blocks = [lib.alloc(3 << 20, 4), lib.alloc(1000, 4)]
        stats = custody.memory_stats(4)
        assert stats["custody.backing"] == "chunked"
        assert stats["segment.all.current"] >= 2                              # a chunk of each kind
        assert stats["num_device_alloc"] == stats["segment.all.current"]
        print(lib.report())
        lib.free(blocks[0], 3 << 20, 4)
        lib.free(blocks[1], 1000, 4)
        assert lib.empty_cache() > 0
        assert custody.memory_stats(4)["reserved_bytes.all.current"] == 0
        print(why)
    """, env=env, args=[how])
    assert "custody device 4 (chunked: " in done.stdout and " chunks, " in done.stdout, done.stdout
    expected = "CUSTODY_BACKING=chunked" if how == "environment" else "the option chunked"
    assert done.stdout.strip().splitlines()[-1] == expected


def test_the_environment_wins_over_the_option_and_a_bad_value_is_refused_by_name(host_lib):
    done = run_python("""
        import custody
        lib = custody.library()
        lib.configure("chunked", 1)
        print(lib.backing(0))
    """, env={"CUSTODY_BACKING": "mapped"})
    assert "('mapped', 'CUSTODY_BACKING=mapped')" in done.stdout, done.stdout
    done = run_python("""
        import custody
        lib = custody.library()
        for call in (lambda: lib.backing(0), lambda: lib.alloc(4096, 0)):
            try:
                call()
            except custody.CustodyError as e:
                print(e)
            else:
                raise AssertionError("CUSTODY_BACKING=vmm was accepted")
        assert lib.stats(0)["allocations"] == 0
    """, env={"CUSTODY_BACKING": "vmm"})
    assert done.stdout.count("CUSTODY_BACKING='vmm' is neither 'mapped' nor 'chunked'") == 2, done.stdout


def test_the_option_is_refused_once_a_devices_backing_is_decided(host_lib):
    done = run_python("""
        import custody
        lib = custody.library()
        assert lib.backing(5)[0] == "mapped"     # decided, and kept for the process
        try:
            lib.configure("chunked", 1)
        except custody.CustodyError as e:
            print(e)
        else:
            raise AssertionError("chunked was accepted after device 5's backing was decided")
        assert lib.backing(5)[0] == "mapped"
    """)
    assert "after device 5's backing was decided" in done.stdout, done.stdout


def test_enable_takes_the_backing_option_and_its_environment_variable():
    from custody import options

    assert options.resolve()["backing"] == "mapped"
    assert options.resolve(backing="chunked")["backing"] == "chunked"
    assert options.resolve(environ={"CUSTODY_BACKING": "chunked"}, backing="mapped")["backing"] == "chunked"
    with pytest.raises(options.CustodyError, match="CUSTODY_BACKING='cudamalloc' is not one of mapped, chunked"):
        options.resolve(environ={"CUSTODY_BACKING": "cudamalloc"})
    with pytest.raises(options.CustodyError, match="backing=3 is not one of"):
        options.resolve(backing=3)


@pytest.mark.parametrize("tracking", [0, 1])
def test_the_reports_reserved_bytes_are_memory_stats_own(host_lib, tracking):
    done = run_python("""
        import re, sys, custody
        lib = custody.library()
        lib.configure("tracking", int(sys.argv[1]))
        blocks = [(lib.alloc(n, 2), n) for n in (1000, 300 << 10, 5 << 20, 7 << 20)]
        lib.free(*blocks.pop(1), 2)                   # cached on its stream
        report = lib.report()
        stats = custody.memory_stats(2)
        line = next(l for l in report.splitlines() if l.startswith("custody device 2 "))
        reserved = int(re.search(r"reserved (\\d+) B \\(peak (\\d+) B\\)", line).group(1))
        assert reserved == stats["reserved_bytes.all.current"], (line, stats)
        live = int(re.search(r"live (\\d+) B in", line).group(1))
        assert live == stats["allocated_bytes.all.current"], (line, stats)
        for what in ("granules of", "B cached on streams", "B free to all", "largest free block"):
            assert what in line, (what, line)
        print(line)
    """, args=[tracking])
    assert "custody device 2 (mapped" in done.stdout


def test_set_max_bytes_of_0_caps_at_0_before_and_after_the_first_allocation(host_lib):
    run_python("""
        import ctypes, custody
        lib = custody.library()
        # Python's API, before device 1 has a pool, and after device 2 has one.
        lib.set_max_bytes(1, 0)
        for device in (1, 2):
            if device == 2:
                lib.free(lib.alloc(4096, 2), 4096, 2)
                lib.set_max_bytes(2, 0)
            try:
                lib.alloc(4 << 20, device)
            except custody.OutOfMemoryError:
                pass
            else:
                raise AssertionError("set_max_bytes(%d, 0) did not cap device %d at 0" % (device, device))
        # The C function itself, before device 3 has a pool: the same meaning.
        c = ctypes.CDLL(custody.library_path())
        c.custody_set_max_bytes.argtypes, c.custody_set_max_bytes.restype = [ctypes.c_int, ctypes.c_uint64], ctypes.c_int
        c.custody_alloc.argtypes, c.custody_alloc.restype = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p], ctypes.c_void_p
        assert c.custody_set_max_bytes(3, 0) == 0
        assert c.custody_alloc(4 << 20, 3, None) is None
        # A cap raised again serves again.
        lib.set_max_bytes(1, 64 << 20)
        lib.free(lib.alloc(4 << 20, 1), 4 << 20, 1)
    """)
