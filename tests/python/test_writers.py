"""Every file custody writes goes through its one output-file writer (include/custody/core/detail/
output_file.hpp in C++, tools/custody_output.py in Python): a scan of the sources finds no other way
of writing a file, and the library's writers (a rank's report, a snapshot) write a named pipe in
place and let threads write one path at once, as that writer does. The tools' outputs with links
planted where they write: tests/trace/output_links_test.py."""
import os
import pathlib
import re
import select
import stat
import threading

import pytest

from conftest import ROOT, run_python

# The two writers, and what else may create a file: the device lock's lock file (opened and held,
# never written: interop/device_lock.hpp).
WRITERS = {"include/custody/core/detail/output_file.hpp", "tools/custody_output.py"}
NOT_OUTPUTS = {("include/custody/interop/device_lock.hpp", "::openat(dir, name.c_str(), O_RDWR | O_CREAT")}

# Each way of writing a file in either language, as it is spelled in a statement.
CPP_WRITES = [r"\bstd::(?:o?fstream|filebuf)\b", r"\b(?:f|fd)?open\s*\([^;]*\"[^\"]*[wa+][^\"]*\"\s*\)",
              r"\b(?:open|openat|creat)\s*\([^;]*\bO_(?:CREAT|WRONLY|RDWR|TRUNC|APPEND)\b",
              r"(?<![\w.])(?:std::|::)?rename(?:at)?\s*\(", r"\bmkstemps?\s*\(", r"\btmpfile\s*\(",
              r"\bstd::filesystem::(?:copy|copy_file|rename|create_symlink)\b"]
PY_WRITES = [r"\bopen\s*\([^)]*,\s*(?:mode\s*=\s*)?[rb]*[\"'][^\"']*[wax+]", r"\bos\.open\s*\([^)]*O_(?:CREAT|WRONLY|RDWR)",
             r"\.write_(?:text|bytes)\s*\(", r"\bos\.(?:replace|rename|link|symlink)\s*\(",
             r"\bshutil\.(?:copy\w*|move)\s*\(", r"\bmkstemp\s*\(", r"\bNamedTemporaryFile\b", r"\bos\.fdopen\s*\(",
             r"\bsavefig\s*\(\s*[\"'\w.]+\.(?:png|pdf|svg)"]


def sources():
    """(relative path, language) of every source that ships or runs as a tool: the headers, the
    plugins, the tools, the package, the benchmarks, the examples, the scripts and the fuzz harness
    (the tests' own fixtures are left out)."""
    found = []
    for top in ("include", "plugins", "tools", "python", "bench", "examples", "scripts", "tests/fuzz"):
        for path in sorted((ROOT / top).rglob("*")):
            if not path.is_file():
                continue
            rel = path.relative_to(ROOT).as_posix()
            if path.suffix in (".hpp", ".cpp", ".h", ".cu", ".cuh"):
                found.append((rel, "c++"))
            elif path.suffix == ".py" or (path.suffix == "" and path.read_bytes()[:40].startswith(b"#!") and
                                          b"python" in path.read_bytes()[:40]):
                found.append((rel, "python"))
    return found


def statements(text, language):
    """The text cut into statements (C++: at ';' and braces; Python: logical lines), comments out."""
    if language == "c++":
        text = re.sub(r"//[^\n]*", "", text)
        return [s.strip() for s in re.split(r"[;{}]", text)]
    text = re.sub(r'"""(?:.|\n)*?"""', '""', text)
    text = re.sub(r"#[^\n]*", "", text)
    return [s.strip() for s in text.split("\n")]


def test_every_file_writer_goes_through_the_one_output_file_writer():
    files = sources()
    assert len(files) > 100 and any(rel == "tools/custody-import" for rel, _ in files)  # the scan sees the tree
    found = []
    for rel, language in files:
        if rel in WRITERS:
            continue
        text = (ROOT / rel).read_text(encoding="utf-8", errors="replace")
        for statement in statements(text, language):
            for pattern in CPP_WRITES if language == "c++" else PY_WRITES:
                if re.search(pattern, statement) and not any(rel == f and s in statement for f, s in NOT_OUTPUTS):
                    found.append("%s: %s" % (rel, " ".join(statement.split())[:160]))
    assert found == [], "files written around the output-file writer:\n" + "\n".join(found)


def test_the_scan_finds_each_way_of_writing_a_file():
    cpp = ['std::ofstream out(path)', 'FILE* f = std::fopen(path.c_str(), "wb")', 'int fd = ::open(p, O_WRONLY | O_CREAT, 0644)',
           'std::rename(a.c_str(), b.c_str())', 'std::filesystem::copy_file(a, b)']
    python = ['with open(path, "w") as f:', "open(p, 'ab')", 'open(p, mode="x")', "target.write_text(data)",
              "os.replace(tmp, path)", "shutil.copy(a, b)", "fig.savefig('plot.png')"]
    for language, lines, patterns in (("c++", cpp, CPP_WRITES), ("python", python, PY_WRITES)):
        for line in lines:
            assert any(re.search(p, s) for s in statements(line, language) for p in patterns), line
    for line in ('std::ifstream in(path)', 'std::fopen(path.c_str(), "rb")', "open(path)", "open(p, 'rb')"):
        language = "c++" if "std::" in line else "python"
        patterns = CPP_WRITES if language == "c++" else PY_WRITES
        assert not any(re.search(p, s) for s in statements(line, language) for p in patterns), line


# One rank's report or snapshot written to argv[2] (argv[1]: report or snapshot), once or by eight
# threads ten times each (argv[3]: threads); prints the failures.
WRITE = """
import sys, threading, custody
lib = custody.library()
lib.configure("tracking", 1)
lib.alloc(4096, 0)
kind, path, how = sys.argv[1:4]
write = (lambda: custody.dump_snapshot(path)) if kind == "snapshot" else (lambda: lib.write_report(-1, path))
failures = []
def loop(times):
    for _ in range(times):
        try:
            write()
        except Exception as e:
            failures.append(repr(e))
if how == "threads":
    threads = [threading.Thread(target=loop, args=(10,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
else:
    loop(1)
print(len(failures), failures[:3])
"""


@pytest.mark.parametrize("kind", ["report", "snapshot"])
def test_a_named_pipe_is_written_in_place(host_lib, tmp_path, kind):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # there before the writer opens it
    received, finished = [], threading.Event()

    def drain():
        while True:
            ready, _, _ = select.select([reader], [], [], 0.05)
            chunk = os.read(reader, 1 << 16) if ready else b""
            if chunk:
                received.append(chunk)
            elif finished.is_set():
                return

    thread = threading.Thread(target=drain)
    thread.start()
    try:
        done = run_python(WRITE, args=[kind, fifo, "once"])
    finally:
        finished.set()
        thread.join()
        os.close(reader)
    assert done.stdout.startswith("0 "), done.stdout
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    data = b"".join(received)
    assert data.startswith(b"\x80\x02" if kind == "snapshot" else b"{"), data[:40]
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]


@pytest.mark.parametrize("kind", ["report", "snapshot"])
def test_threads_writing_one_path_all_succeed(host_lib, tmp_path, kind):
    path = tmp_path / "out"
    done = run_python(WRITE, args=[kind, path, "threads"])
    assert done.stdout.startswith("0 "), done.stdout
    assert stat.S_ISREG(os.lstat(path).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary left behind
    if kind == "snapshot":
        import pickle
        with open(path, "rb") as f:
            assert "segments" in pickle.load(f)
    else:
        assert pathlib.Path(path).read_text().lstrip().startswith("{")
