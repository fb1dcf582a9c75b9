#!/usr/bin/env python3
"""compile_cost.py: what including each public custody header costs a translation unit, beside
the standard headers every C++ program pays for: preprocessed lines, and the compiler's CPU time
for a syntax check (-fsyntax-only: parsing and instantiating, no code generation), each as a
ratio to <vector> and to <memory_resource>.

    bench/compile_cost.py [--compiler c++] [--repeat 3] [--markdown] [--include DIR] [HEADER...]

HEADER is a path under include/ (custody/pool/stream_ordered_pool.hpp); without one, every public
header (none under detail/) and a few translation units an engine writes. Each measurement is a TU
that includes the header alone, compiled --repeat times; the least CPU time is kept (the machine's
other work only ever adds). Runs niced (--nice, default 10): the machine may be shared.
Headers that need the CUDA Toolkit, NCCL or libdw are measured where those are found; a TU that
does not compile is reported as not measured, with the compiler's first error. Python standard
library only."""
import argparse
import os
import pathlib
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from custody_output import output_file  # noqa: E402  (how every custody tool writes a file)

INCLUDE = ROOT / "include"
CUDA = pathlib.Path(os.environ.get("CUDA_PATH", "/usr/local/cuda"))

# Translation units as an inference engine writes them: what a TU with several parts pays.
COMBINATIONS = {
    "pool + staging ring + tracker": ["custody/pool/stream_ordered_pool.hpp", "custody/staging/staging_ring.hpp",
                                      "custody/debug/tracking_resource.hpp"],
    "custody/custody.hpp (everything)": ["custody/custody.hpp"],
}
BASELINES = {"<vector>": ["vector"], "<memory_resource>": ["memory_resource"]}


def public_headers():
    """Every header under include/custody/ but the detail/ ones, sorted."""
    return sorted(str(p.relative_to(INCLUDE)) for p in INCLUDE.rglob("*.hpp") if "detail" not in p.parts)


def set_include(directory):
    """Measures the headers of another tree (another checkout's include/), to compare."""
    global INCLUDE
    INCLUDE = pathlib.Path(directory).resolve()


def translation_unit(directory, includes):
    tu = pathlib.Path(directory) / "tu.cpp"
    with output_file(tu) as f:
        f.write(("".join("#include <%s>\n" % h for h in includes) + "int main() { return 0; }\n").encode())
    return tu


def compile_flags(compiler):
    """`compiler` is a command ("c++", "g++-13 -m64"), split as a shell would."""
    flags = shlex.split(compiler) + ["-std=c++20", "-I%s" % INCLUDE]
    if (CUDA / "include").is_dir():
        flags += ["-isystem", str(CUDA / "include"), "-isystem", str(CUDA / "include" / "cccl")]
    return flags


def child_cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def first_error(stderr):
    """The compiler's first error line, shortened: why a TU was not measured."""
    lines = [line for line in stderr.splitlines() if "error" in line] or stderr.splitlines() or ["(no message)"]
    line = lines[0]
    return line[line.find("error"):].strip()[:120] if "error" in line else line.strip()[:120]


def measure(compiler, includes, repeat):
    """(preprocessed lines, least syntax-check CPU seconds), or the compiler's first error (a
    string) when the TU does not compile."""
    with tempfile.TemporaryDirectory() as directory:
        tu = translation_unit(directory, includes)
        pre = subprocess.run(compile_flags(compiler) + ["-E", "-P", str(tu)], capture_output=True, text=True)
        if pre.returncode != 0:
            return first_error(pre.stderr)
        lines = sum(1 for line in pre.stdout.splitlines() if line.strip())
        best = None
        for _ in range(repeat):
            before = child_cpu_seconds()
            done = subprocess.run(compile_flags(compiler) + ["-fsyntax-only", str(tu)], capture_output=True, text=True)
            spent = child_cpu_seconds() - before
            if done.returncode != 0:
                return first_error(done.stderr)
            best = spent if best is None else min(best, spent)
        return lines, best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("headers", nargs="*", help="headers under include/ (default: every public one)")
    parser.add_argument("--compiler", default=os.environ.get("CXX", "c++"))
    parser.add_argument("--repeat", type=int, default=3, help="syntax checks per TU; the least CPU time is kept")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--nice", type=int, default=10, help="niceness to run at (default 10: the machine may be shared)")
    parser.add_argument("--include", default=str(INCLUDE), help="the include/ directory to measure (default: this tree's)")
    args = parser.parse_args()
    set_include(args.include)
    if not shlex.split(args.compiler) or shutil.which(shlex.split(args.compiler)[0]) is None:
        sys.exit("compile_cost.py: no compiler '%s'" % args.compiler)
    os.nice(args.nice)

    base = {}
    for name, includes in BASELINES.items():
        m = measure(args.compiler, includes, args.repeat)
        if isinstance(m, str):
            sys.exit("compile_cost.py: %s does not compile with %s: %s" % (name, args.compiler, m))
        base[name] = m
    rows = [(name, base[name]) for name in BASELINES]
    targets = [(h, [h]) for h in (args.headers or public_headers())]
    if not args.headers:
        targets += list(COMBINATIONS.items())
    for name, includes in targets:
        rows.append((name, measure(args.compiler, includes, args.repeat)))

    vec, mr = base["<vector>"], base["<memory_resource>"]
    if args.markdown:
        print("| TU includes | lines | x `<vector>` | x `<memory_resource>` | syntax check | x `<vector>` | x `<memory_resource>` |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    else:
        print("%-52s %8s %6s %6s %8s %6s %6s" % ("TU includes", "lines", "x vec", "x mr", "CPU s", "x vec", "x mr"))
    for name, m in rows:
        if isinstance(m, str):
            why = "not measured: " + m
            print("| `%s` | %s |||||" % (name, why.replace("|", "\\|")) if args.markdown else "%-52s %s" % (name, why))
            continue
        lines, cpu = m
        values = (lines, lines / vec[0], lines / mr[0], cpu, cpu / vec[1], cpu / mr[1])
        if args.markdown:
            print("| `%s` | %d | %.1f | %.1f | %.2f s | %.1f | %.1f |" % ((name,) + values))
        else:
            print("%-52s %8d %6.1f %6.1f %8.2f %6.1f %6.1f" % ((name,) + values))
    return 0


if __name__ == "__main__":
    sys.exit(main())
