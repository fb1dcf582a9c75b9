"""The tools pip installs work from a venv that is not activated (a systemd unit, an IDE, torchrun
with an absolute interpreter): the Python scripts run with the venv's interpreter, and
custody.merge finds custody-merge beside it. Offline: the venvs are made here, and a wheel holding
the build's wheel copies of the scripts is installed with the venv's own pip, without an index.
Skips where the interpreter cannot make a venv (Debian's python3 without python3-venv)."""
import base64
import hashlib
import os
import pathlib
import shutil
import stat
import subprocess
import sys
import zipfile

import pytest

from conftest import ROOT

SCRIPTS = [pathlib.Path(p) for p in os.environ.get("CUSTODY_WHEEL_SCRIPTS", "").split(os.pathsep) if p]


def make_venv(where, with_pip):
    """A venv at `where`; skips the test when this interpreter cannot make one offline."""
    args = [sys.executable, "-m", "venv", str(where)] + ([] if with_pip else ["--without-pip"])
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        pytest.skip("this python cannot make a venv here: %s" % (done.stderr.strip().splitlines() or ["?"])[-1])
    return where / "bin" / "python"


def unactivated_env():
    """The environment of a process started by absolute path: no venv on PATH, no CUSTODY_MERGE."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CUSTODY_MERGE", "PYTHONHOME")}
    env["PATH"] = "/usr/bin:/bin"
    env["PYTHONPATH"] = str(ROOT / "python")
    return env


def test_merge_is_found_beside_the_interpreter_of_an_unactivated_venv(tmp_path):
    merge = os.environ.get("CUSTODY_MERGE")
    if not merge:
        pytest.skip("CUSTODY_MERGE names no custody-merge build (the meson test sets it)")
    python = make_venv(tmp_path / "venv", with_pip=False)
    shutil.copy(merge, python.parent / "custody-merge")  # where pip puts it
    done = subprocess.run([str(python), "-c", "import custody.merge as m; print(m.merge_program())"],
                          capture_output=True, text=True, env=unactivated_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(python.parent / "custody-merge")


def wheel_with_scripts(directory, scripts):
    """A wheel whose scripts are `scripts`, placed as meson-python places files of {bindir}."""
    name = "custody_tools_check-0.1"
    files = {"%s.data/scripts/%s" % (name, s.name): s.read_bytes() for s in scripts}
    files["%s.dist-info/METADATA" % name] = b"Metadata-Version: 2.1\nName: custody-tools-check\nVersion: 0.1\n"
    files["%s.dist-info/WHEEL" % name] = (b"Wheel-Version: 1.0\nGenerator: custody-test\nRoot-Is-Purelib: true\n"
                                          b"Tag: py3-none-any\n")
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append("%s,sha256=%s,%d" % (path, digest, len(data)))
    record.append("%s.dist-info/RECORD,," % name)
    files["%s.dist-info/RECORD" % name] = ("\n".join(record) + "\n").encode()
    wheel = directory / ("%s-py3-none-any.whl" % name)
    modes = {"%s.data/scripts/%s" % (name, s.name): os.stat(s).st_mode for s in scripts}
    with zipfile.ZipFile(wheel, "w") as z:
        for path, data in files.items():
            info = zipfile.ZipInfo(path)
            # As meson-python writes an installed file: with its mode in the build directory.
            mode = modes.get(path, stat.S_IFREG | 0o644)
            info.external_attr = (stat.S_IMODE(mode) | stat.S_IFMT(mode)) << 16
            z.writestr(info, data)
    return wheel


def test_installed_python_tools_run_with_the_venvs_interpreter(tmp_path):
    if not SCRIPTS:
        pytest.skip("CUSTODY_WHEEL_SCRIPTS names no wheel copies of the scripts (the meson test sets it)")
    python = make_venv(tmp_path / "venv", with_pip=True)
    wheel = wheel_with_scripts(tmp_path, SCRIPTS)
    done = subprocess.run([str(python), "-m", "pip", "install", "--no-index", "--no-deps", "--disable-pip-version-check",
                           "--no-cache-dir", str(wheel)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    # The programs alone: each is one file, with what it writes files with inside it; no module lands
    # in bin/, where it would be on PATH as if it were a command.
    assert sorted(p.name for p in python.parent.iterdir() if p.name.startswith("custody")) == \
        sorted(s.name for s in SCRIPTS)
    for script in SCRIPTS:
        installed = python.parent / script.name
        first = installed.read_text().split("\n", 1)[0]
        assert first == "#!" + str(python), "%s starts with %r, not the venv's interpreter" % (installed, first)
        # Started by its absolute path, with no venv on PATH, it runs (with the venv's Python).
        ran = subprocess.run([str(installed), "--help"], capture_output=True, text=True, env=unactivated_env(),
                             timeout=120)
        assert ran.returncode == 0, ran.stderr
        assert script.name in ran.stdout
    # ... and writes its file (custody_output, inlined): an RMM log imported into a trace.
    log = tmp_path / "rmm.csv"
    log.write_text("Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.000001,allocate,0x1000,256,0x0\n")
    ran = subprocess.run([str(python.parent / "custody-import"), "rmm", str(log), "-o", str(tmp_path / "t.ctrace")],
                         capture_output=True, text=True, env=unactivated_env(), timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert (tmp_path / "t.ctrace").read_bytes()[:8] == b"CUSTODYT"
