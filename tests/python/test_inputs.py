"""Every value the package takes from the environment or from its caller is checked against the
range the library takes, and refused with a CustodyError naming the variable or option (never an
OverflowError, a UnicodeEncodeError, or a value that wraps on its way into C). Host build."""
import pytest

import custody
from custody import options

TIB = 1 << 40
U64 = (1 << 64) - 1


def test_sizes_in_the_environment_fit_the_library_or_are_refused_by_name():
    for text in ("9" * 400, "99999999 TiB", "18446744073709551616", "1e3", "-1", "12 parsecs", "\u0663\u0663",
                 "1_000", "nan", "inf GiB"):
        with pytest.raises(custody.CustodyError, match="CUSTODY_MAX_BYTES"):
            options.resolve(environ={"CUSTODY_MAX_BYTES": text})
        with pytest.raises(custody.CustodyError, match="CUSTODY_DEVICE_HEADROOM"):
            options.resolve(environ={"CUSTODY_DEVICE_HEADROOM": text})
    assert options.resolve(environ={"CUSTODY_MAX_BYTES": "16777215 TiB"})["max_bytes"] == 16777215 * TIB
    assert options.resolve(environ={"CUSTODY_MAX_BYTES": str(U64)})["max_bytes"] == U64
    assert options.resolve(environ={"CUSTODY_MAX_BYTES": "1.5 GiB"})["max_bytes"] == 3 << 29
    # Exact: no float rounding on the way.
    assert options.parse_bytes("9007199254740993") == 9007199254740993
    assert options.parse_bytes("0.1KiB") == 102


def test_options_given_in_code_are_checked_the_same_way():
    for name in ("max_bytes", "device_headroom"):
        for value in (-1, 1 << 64, 1.5, float("nan"), True, "99999999 TiB", [1]):
            with pytest.raises(custody.CustodyError, match=name):
                options.resolve(environ={}, **{name: value})
    with pytest.raises(custody.CustodyError, match="tracking"):
        options.resolve(environ={}, tracking="no thanks")
    assert options.resolve(environ={}, tracking="no")["tracking"] is False
    assert options.resolve(environ={}, claim_device=0)["claim_device"] is False
    with pytest.raises(custody.CustodyError, match="CUSTODY_CLAIM_DEVICE"):
        options.resolve(environ={"CUSTODY_CLAIM_DEVICE": "\udcff"})


def test_configure_refuses_what_would_wrap_in_the_library(host_lib):
    # Refused before the library is called: configure stays possible (no pool is made here).
    for name, value in (("max_bytes", -1), ("max_bytes", 1 << 64), ("device_headroom", U64), ("tracking", 2),
                        ("max_bytes", 1.0), ("max_bytes", True), ("max_bytes", "1GiB")):
        with pytest.raises(custody.CustodyError, match=name):
            host_lib.configure(name, value)


def test_ranks_fit_an_int_and_are_digits_only():
    for variable in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        for text in ("9" * 50, "-1", "+1", " 1", "1_0", "\u0661", "2147483648"):
            environ = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", variable: text}
            with pytest.raises(custody.CustodyError, match=variable):
                custody.rank_info(environ)
    assert custody.rank_info({"RANK": "2147483646", "LOCAL_RANK": "0", "WORLD_SIZE": "2147483647"}) == \
        (2147483646, 0, 2147483647)


def test_text_the_library_takes_is_utf8_without_nul(host_lib):
    for name in ("a\udc80b", "a\0b"):
        with pytest.raises(custody.CustodyError, match="owner"):
            host_lib.owner_push(name)
        with pytest.raises(custody.CustodyError, match="owner"):
            with custody.owner(name):
                pass
        with pytest.raises(custody.CustodyError, match="device"):
            custody.claim_device(name, 0, rank=0)
    with pytest.raises(custody.CustodyError, match="path"):
        host_lib.write_report(-1, "/tmp/a\0b")
    assert custody.current_owner() == "<untagged>"


def test_numbers_the_library_takes_are_checked_not_wrapped(host_lib):
    for call, fragment in ((lambda: host_lib.stats(1 << 40), "device"),
                           (lambda: host_lib.stats(-(1 << 40)), "device"),
                           (lambda: host_lib.alloc(1 << 70, 0), "size"),
                           (lambda: host_lib.alloc(64, 1 << 33), "device"),
                           (lambda: host_lib.alloc(64, 0, "stream"), "stream"),
                           (lambda: host_lib.claim_device("GPU-x", 1 << 40, 0), "rank"),
                           (lambda: host_lib.release_pool(0, (1 << 64, 0)), "pool"),
                           (lambda: host_lib.trim(1 << 40), "device"),
                           (lambda: host_lib.record_history(2.7), "max_entries"),
                           (lambda: custody.record_history(2.7, lib=host_lib), "max_entries"),
                           (lambda: custody.record_history("100", lib=host_lib), "max_entries"),
                           (lambda: custody.record_history(-1, lib=host_lib), "max_entries")):
        with pytest.raises(custody.CustodyError, match=fragment):
            call()


def test_the_librarys_own_variable_is_read_whole_or_refused_by_name(host_lib):
    from conftest import run_python
    for text in ("9" * 400, "-1", "12GiB", " 5", "0x10"):
        done = run_python("""
            import custody
            try:
                custody.library().alloc(64, 0)
            except custody.CustodyError as e:
                print(e)
            else:
                raise SystemExit("CUSTODY_TORCH_MAX_BYTES=%r was taken" % (__import__("os").environ["CUSTODY_TORCH_MAX_BYTES"],))
        """, env={"CUSTODY_TORCH_MAX_BYTES": text})
        assert "CUSTODY_TORCH_MAX_BYTES" in done.stdout, done.stdout
    done = run_python("""
        import custody
        lib = custody.library()
        lib.alloc(3 << 20, 0)
        try:
            lib.alloc(2 << 20, 0)
        except custody.OutOfMemoryError:
            print("capped")
    """, env={"CUSTODY_TORCH_MAX_BYTES": str(4 << 20)})
    assert "capped" in done.stdout, done.stdout


def test_sleep_functions_check_what_they_pass_to_the_library(host_lib):
    from custody import sleepable
    for call, fragment in ((lambda: sleepable.sleep(["a\udc80"], lib=host_lib), "owner"),
                           (lambda: sleepable.wake(["a\0b"], lib=host_lib), "owner"),
                           (lambda: sleepable.owner_stats("a\udc80", lib=host_lib), "owner"),
                           (lambda: sleepable.alloc(1 << 70, lib=host_lib), "size"),
                           (lambda: sleepable.alloc(64, device=1 << 40, lib=host_lib), "device"),
                           (lambda: sleepable.stats(device=1 << 40, lib=host_lib), "device"),
                           (lambda: sleepable.sleep(["x"], streams=["s"], lib=host_lib), "stream")):
        with pytest.raises(custody.CustodyError, match=fragment):
            call()
