"""Tracking from Python over the host build: owner scopes, snapshots, diffs, the leak watch, the
per-rank reports and their merge. Each case runs in a fresh process: tracking is chosen before the
library's first allocation."""
import pathlib

import pytest

from conftest import ROOT, run_python, run_script

EXAMPLE = ROOT / "examples" / "python" / "find_leak_by_owner.py"


@pytest.fixture(autouse=True)
def _host_only(host_lib):
    pass


def test_owner_scopes_nest_per_thread_and_snapshots_diff_by_owner():
    run_python("""
        import threading, custody
        custody.configure_tracking()
        lib = custody.library()
        keep = [lib.alloc(4096, 0)]                      # untagged
        first = custody.snapshot()
        with custody.owner("decode"):
            with custody.owner("kv_cache"):
                assert custody.current_owner() == "decode/kv_cache"
                keep.append(lib.alloc(1 << 20, 0))
                seen = []
                other = threading.Thread(target=lambda: seen.append(custody.current_owner()))
                other.start(); other.join()
                assert seen == ["<untagged>"], seen       # scopes are per thread
            assert custody.current_owner() == "decode"
            keep.append(lib.alloc(8192, 0))
        assert custody.current_owner() == "<untagged>"
        second = custody.snapshot()
        assert second.live_bytes("decode/kv_cache") == 1 << 20
        assert second.live_bytes("decode") == 8192
        assert second.live_bytes("<untagged>") == 4096
        assert custody.diff(first, second) == {"decode/kv_cache": 1 << 20, "decode": 8192}, custody.diff(first, second)
        lib.free(keep.pop(1), 1 << 20, 0)
        assert custody.diff(second, custody.snapshot()) == {"decode/kv_cache": -(1 << 20)}
        try:
            lib.owner_pop()
        except custody.CustodyError as e:
            assert "without an owner scope" in str(e)
        else:
            raise AssertionError("an unbalanced pop was accepted")
    """)


def test_leak_watch_alarms_on_threshold_and_on_steady_growth_only():
    run_python("""
        import logging, custody
        custody.configure_tracking()
        lib = custody.library()
        alarms = []
        growth = custody.LeakWatch(growth_checks=2, owners=["cache"], callback=alarms.append)
        limit = custody.LeakWatch(threshold_bytes=3 << 20, callback=alarms.append)
        with custody.owner("cache"):
            blocks = [lib.alloc(1 << 20, 0)]
        with custody.owner("steady"):
            steady = lib.alloc(1 << 20, 0)
        assert growth.check() == [] and limit.check() == []
        with custody.owner("cache"):
            blocks.append(lib.alloc(1 << 20, 0))
        assert growth.check() == []                  # grew once: not yet an alarm
        with custody.owner("cache"):
            blocks.append(lib.alloc(1 << 20, 0))
        fired = growth.check()
        assert [a["owner"] for a in fired] == ["cache"], fired
        assert fired[0]["history"] == [1 << 20, 2 << 20, 3 << 20]
        assert limit.check() == []                   # 3 MiB is not above 3 MiB
        with custody.owner("cache"):
            blocks.append(lib.alloc(1 << 20, 0))
        assert [a["owner"] for a in limit.check()] == ["cache"]
        # The meaning of a C++ watch: once per crossing, re-armed at or below the threshold; a
        # growth alarm once per run of growth.
        assert limit.check() == []                   # still above: no second alarm
        assert growth.check() == []                  # a third growth in a row: the run already raised one
        lib.free(blocks.pop(), 1 << 20, 0)           # back to 3 MiB: re-armed
        assert limit.check() == [] and growth.check() == []
        with custody.owner("cache"):
            blocks.append(lib.alloc(1 << 20, 0))
        assert [a["reason"] for a in limit.check()] == ["above %d bytes" % (3 << 20)]
        assert growth.check() == []                  # grew once since the run ended
        with custody.owner("cache"):
            blocks.append(lib.alloc(1 << 20, 0))
        assert [a["owner"] for a in growth.check()] == ["cache"]
        assert all(a["owner"] != "steady" for a in alarms)
        records = []
        handler = logging.Handler(); handler.emit = records.append
        logging.getLogger("custody").addHandler(handler)
        custody.LeakWatch(threshold_bytes=1).check()  # no callback: logged
        assert any("cache" in r.getMessage() for r in records)
    """)


def test_tracking_off_says_how_to_turn_it_on():
    done = run_python("""
        import custody
        lib = custody.library()
        lib.free(lib.alloc(64, 0), 64, 0)
        try:
            custody.snapshot()
        except custody.CustodyError as e:
            print(e)
    """)
    assert "tracking is off" in done.stdout


def test_the_worked_example_finds_the_leaking_rank_and_owner(tmp_path):
    done = run_script(EXAMPLE, args=["--ranks", "2", tmp_path])
    assert "rank 1: alarm: decode/kv_cache" in done.stdout
    assert "rank 0: alarm" not in done.stdout
    table = [line.split() for line in done.stdout.splitlines()]
    kv = next(row for row in table if row and row[0] == "decode/kv_cache")
    assert int(kv[2]) == 4 * int(kv[1]) == 8 * (256 << 10), kv   # rank 1 kept every page, rank 0 two
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank-0.json", "rank-1.json"]


def test_the_docs_show_the_example_the_tests_run():
    docs = (ROOT / "docs" / "interop-pytorch.md").read_text()
    assert EXAMPLE.read_text().strip() in docs, "docs/interop-pytorch.md must quote %s verbatim" % EXAMPLE


def test_merge_entry_point_runs_custody_merge(tmp_path):
    run_script(EXAMPLE, env={"RANK": 0, "LOCAL_RANK": 0, "WORLD_SIZE": 1}, args=[tmp_path])
    done = run_python("""
        import sys, custody.merge
        sys.exit(custody.merge.main(sys.argv[1:]))
    """, args=[tmp_path / "rank-0.json"])
    assert "decode/kv_cache" in done.stdout
