"""Tracking from Python over the host build: owner scopes, snapshots, diffs, the leak watch, the
per-rank reports and their merge. Each case runs in a fresh process: tracking is chosen before the
library's first allocation."""
import json
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


SEQUENCE = ROOT / "tests" / "debug" / "trend_sequence.txt"


def test_the_trend_reads_the_shared_sequence_as_the_cpp_test_does():
    # tests/debug/trend_sequence.txt: the C++ test (trend_test.cpp) feeds the same live bytes to a
    # tracker the same way and checks the same expectations, so the two read one sequence alike.
    done = run_python("""
        import json, sys, custody
        options, expect, live = {}, {}, []
        for line in open(sys.argv[1]):
            words = line.split()
            if not words or words[0].startswith("#"):
                continue
            if words[0] == "live":
                live += [int(w) for w in words[1:]]
            else:
                (options if words[0] == "options" else expect).update(w.split("=") for w in words[1:])
        custody.configure_tracking(trend={k: int(v) for k, v in options.items()})
        lib = custody.library()
        watch = custody.LeakWatch(trend=True, owners=["sequence"], callback=lambda alarm: None)
        blocks, now, alarms = [], 0, []
        with custody.owner("sequence"):
            for k, target in enumerate(live):
                while now > target:                  # whole blocks from the top, then up to it
                    address, size = blocks.pop()
                    lib.free(address, size, 0)
                    now -= size
                if target > now:
                    blocks.append((lib.alloc(target - now, 0), target - now))
                    now = target
                alarms += [(k, a) for a in watch.check()]
        trend = alarms[-1][1]["trend"] if alarms else None
        final = next(t for t in lib.rank_report()["trends"]["owners"] if t["owner"] == "sequence")
        print(json.dumps({"alarms": len(alarms), "alarm_sample": alarms[0][0] if alarms else None,
                          "final": final, "expect": expect, "reason": alarms[0][1]["reason"] if alarms else None}))
    """, args=[SEQUENCE])
    out = json.loads(done.stdout)
    expect, final = {k: float(v) for k, v in out["expect"].items()}, out["final"]
    assert out["alarms"] == expect["alarms"] and out["alarm_sample"] == expect["alarm_sample"], out
    assert final["rising"] == bool(expect["rising"])
    assert final["bytes_per_step"] == pytest.approx(expect["bytes_per_step"], rel=1e-9)
    assert final["rise_began"] == expect["rise_began"]
    assert final["leaked_bytes"] == expect["leaked_bytes"]
    assert final["confidence"] == pytest.approx(expect["confidence"], rel=1e-9)
    assert out["reason"].startswith("its floor rises: +"), out["reason"]


def test_leak_watch_trend_alarms_once_per_rise_with_the_forecast_and_reports_carry_it(tmp_path):
    run_python("""
        import json, sys, custody
        def refused(trend, word):
            try:
                custody.configure_tracking(trend=trend)
            except custody.CustodyError as e:
                assert word in str(e), e
            else:
                raise AssertionError("trend=%r was accepted" % trend)
        refused({"windowz": 4}, "unknown trend option")
        refused({"windows": 3}, "trend_windows")
        custody.configure_tracking(trend={"levels": 1, "windows": 16})
        lib = custody.library()
        alarms = []
        watch = custody.LeakWatch(trend=True, callback=alarms.append)
        kept = []
        for step in range(60):
            with custody.owner("decode/activations"):
                scratch = lib.alloc((1 << 20) + (step % 3 << 18), 0)
            with custody.owner("decode/kv_cache"):
                kept.append(lib.alloc(64 << 10, 0))   # the leak: 64 KiB a step
            lib.free(scratch, (1 << 20) + (step % 3 << 18), 0)
            watch.check()
        assert [a["owner"] for a in alarms] == ["decode/kv_cache"], alarms
        trend = alarms[0]["trend"]
        assert trend["rising"] and trend["bytes_per_step"] == 64 << 10, trend
        assert trend["steps_left"] > 0 and trend["confidence"] > 0.9999, trend
        path = custody.write_report(sys.argv[1])
        report = json.load(open(path))
        kv = next(t for t in report["trends"]["owners"] if t["owner"] == "decode/kv_cache")
        assert kv["alarms"] == 1 and kv["leaked_bytes"] == 59 * (64 << 10), kv
        assert report["trends"]["samples"] == 60 and report["trends"]["budget_bytes"] > 0, report["trends"]
    """, args=[tmp_path])


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
