#!/usr/bin/env python3
"""Every test of suite cuda whose cases read the device's free memory (cudaMemGetInfo, the platform's
memory_info) runs alone (is_parallel: false): other test processes on the GPU would move what it
measures. Reads the build's introspection (meson-info/intro-tests.json and intro-targets.json). A
test that selects its program's cases by file (Catch2's -# with tags '[#stem]', as the cuda programs'
tests do) is judged by the files it selects; any other by every source of its program.

usage: run_alone_check.py BUILD_DIR"""
import json
import pathlib
import re
import sys

READS_FREE_MEMORY = re.compile(r"cudaMemGetInfo|memory_info\(|mem_get_info")
FILE_TAG = re.compile(r"\[#([^\]]+)\]")


def selected(test, files):
    """The sources a test's cases come from: those its '-#' tags name, else all of them."""
    args = test["cmd"][1:]
    if "-#" not in args:
        return files
    stems = {m for a in args for m in FILE_TAG.findall(a)}
    return [f for f in files if pathlib.Path(f).stem in stems]


def main(build):
    info = pathlib.Path(build) / "meson-info"
    tests = json.loads((info / "intro-tests.json").read_text())
    targets = json.loads((info / "intro-targets.json").read_text())
    sources = {}
    for t in targets:
        for output in t["filename"]:
            # A unity build lists its files under unity_sources.
            sources[output] = [s for group in t["target_sources"]
                               for s in group.get("sources", []) + group.get("unity_sources", [])]
    wrong = []
    for test in tests:
        if not any(s.endswith(":cuda") or s == "cuda" for s in test["suite"]) or not test["cmd"]:
            continue
        files = selected(test, sources.get(test["cmd"][0], []))
        reads = [f for f in files if READS_FREE_MEMORY.search(pathlib.Path(f).read_text(errors="replace"))]
        if reads and test["is_parallel"]:
            wrong.append("%s (reads the device's free memory in %s)" % (test["name"], ", ".join(reads)))
    for w in wrong:
        print("runs beside other GPU tests: " + w)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
