"""pytest over the Python package `custody` with the allocator library named by CUSTODY_LIBRARY
(the meson test sets the host build's path; a GPU run sets the CUDA build's). Cases that need a
fresh process (options, tracking, ranks) run Python snippets in subprocesses through run_python."""
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
if "custody" not in sys.modules:
    sys.path.insert(0, str(ROOT / "python"))

import custody  # noqa: E402


def _environment(extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "python"), env.get("PYTHONPATH")]))
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "CUSTODY_MAX_BYTES", "CUSTODY_TRACKING"):
        env.pop(name, None)
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


def run_python(code, env=None, check=True, args=()):
    """Runs `code` (dedented) in a fresh interpreter; returns the CompletedProcess (text)."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], capture_output=True,
                          text=True, env=_environment(env), timeout=120)
    if check and done.returncode != 0:
        raise AssertionError("snippet failed (%d):\n%s\n%s" % (done.returncode, done.stdout, done.stderr))
    return done


def run_script(path, env=None, args=()):
    """Runs a script file in a fresh interpreter, as run_python."""
    done = subprocess.run([sys.executable, str(path), *map(str, args)], capture_output=True, text=True,
                          env=_environment(env), timeout=300)
    if done.returncode != 0:
        raise AssertionError("%s failed (%d):\n%s\n%s" % (path, done.returncode, done.stdout, done.stderr))
    return done


def cuda_torch_missing():
    """Why the cases that need PyTorch on a GPU cannot run here, or None when they can."""
    import importlib.util
    if importlib.util.find_spec("torch") is None:
        return "PyTorch is not installed"
    if custody.library().platform != "cuda":
        return "CUSTODY_LIBRARY is not the CUDA build"
    done = run_python("import torch; print(torch.cuda.is_available())", check=False)
    if done.stdout.strip() != "True":
        return "no CUDA device"
    return None


@pytest.fixture(scope="session")
def lib():
    return custody.library()


def host_library_path():
    """The host build of the allocator library: CUSTODY_LIBRARY's library when it is the host build,
    else the host build beside it (a build of the CUDA library makes both), else None."""
    if custody.library().platform == "host":
        return custody.library_path()
    beside = pathlib.Path(custody.library_path()).with_name("libcustody_torch_allocator_host.so")
    return str(beside) if beside.exists() else None


@pytest.fixture
def host_lib(monkeypatch):
    """The host build (virtual devices), made the library of this process's calls and of the
    snippets it runs: its cases run wherever the host build is, beside the CUDA build too."""
    path = host_library_path()
    if path is None:
        pytest.skip("needs the host build of the allocator library (virtual devices)")
    monkeypatch.setenv("CUSTODY_LIBRARY", path)
    return custody.library(path)
