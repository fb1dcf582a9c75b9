"""A rank's report is written as a new file renamed into place: a symbolic link or a hard link
planted at its name in a shared report directory is replaced, never written through."""
import os

import pytest

from conftest import run_python


@pytest.fixture(autouse=True)
def _host_only(host_lib):
    pass


@pytest.mark.parametrize("link", ["symbolic", "hard"])
def test_write_report_never_writes_through_a_planted_link(tmp_path, link):
    victim = tmp_path / "victim"
    victim.write_text("someone else's file\n")
    reports = tmp_path / "reports"
    reports.mkdir()
    target = reports / "rank-0.json"
    (os.symlink if link == "symbolic" else os.link)(victim, target)
    done = run_python("""
        import sys, custody
        custody.configure_tracking()
        custody.library().alloc(4096, 0)
        print(custody.write_report(sys.argv[1]))
    """, args=[reports])
    assert victim.read_text() == "someone else's file\n"
    assert not target.is_symlink() and target.stat().st_nlink == 1
    assert '"schema":"custody.debug.rank_report"' in target.read_text().replace(" ", "")
    assert done.stdout.strip() == str(target)
