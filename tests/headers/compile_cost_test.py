"""compile_cost_test.py SCRIPT COMPILER...: two checks on what a header costs a translation unit.

1. bench/compile_cost.py (SCRIPT) measures a header beside <vector> and <memory_resource>, its
   ratios are its own figures divided by theirs, and a header it cannot compile is reported with
   the compiler's reason instead of stopping the table.
2. The core headers every custody TU includes (concepts, statistics, platform) do not pull in
   <algorithm>: they use nothing of it, and with C++20's ranges algorithms it is about a third of
   what they cost. Skipped for a standard library whose own headers already bring it in.

A few seconds of one core: one syntax check per TU (--repeat 1)."""
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile

SCRIPT = pathlib.Path(sys.argv[1])
COMPILER = sys.argv[2:]
INCLUDE = SCRIPT.resolve().parents[1] / "include"
LIGHT = ["custody/core/concepts.hpp", "custody/core/statistics.hpp", "custody/platform/platform.hpp"]
failures = []


def check(condition, message):
    if not condition:
        failures.append(message)


def rows_of(output):
    """{TU name: [cells]} from the script's Markdown table."""
    rows = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > 1 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def the_table_measures_and_says_why_not():
    done = subprocess.run([sys.executable, str(SCRIPT), "--repeat", "1", "--markdown", "--compiler",
                           shlex.join(COMPILER), "custody/core/statistics.hpp", "custody/no/such_header.hpp"],
                          capture_output=True, text=True, timeout=300)
    check(done.returncode == 0, "compile_cost.py failed (%d): %s" % (done.returncode, done.stderr))
    rows = rows_of(done.stdout)
    for name in ("<vector>", "<memory_resource>", "custody/core/statistics.hpp"):
        check(name in rows and re.fullmatch(r"\d+", rows[name][0] or ""), "no line count for %s in:\n%s" % (name, done.stdout))
    if failures:
        return
    vector_lines, header_lines = int(rows["<vector>"][0]), int(rows["custody/core/statistics.hpp"][0])
    check(rows["<vector>"][1] == "1.0", "<vector>'s own ratio is %s, not 1.0" % rows["<vector>"][1])
    check(rows["custody/core/statistics.hpp"][1] == "%.1f" % (header_lines / vector_lines),
          "the header's ratio to <vector> is %s, not its lines over <vector>'s" % rows["custody/core/statistics.hpp"][1])
    check(re.fullmatch(r"\d+\.\d\d s", rows["custody/core/statistics.hpp"][3]),
          "no syntax-check time for the header: %s" % rows["custody/core/statistics.hpp"])
    missing = rows.get("custody/no/such_header.hpp", [""])[0]
    check(missing.startswith("not measured:") and "such_header.hpp" in missing,
          "a header that does not exist is not reported with the compiler's reason: %r" % missing)


def dependencies(text):
    """The files a TU of `text` reads (the compiler's -M list)."""
    with tempfile.TemporaryDirectory() as directory:
        tu = pathlib.Path(directory) / "tu.cpp"
        tu.write_text(text)
        done = subprocess.run(COMPILER + ["-std=c++20", "-I%s" % INCLUDE, "-M", str(tu)], capture_output=True,
                              text=True, timeout=120)
        if done.returncode != 0:
            sys.exit("the compiler cannot list the files of %r: %s" % (text, done.stderr))
        return [pathlib.Path(p) for p in done.stdout.replace("\\\n", " ").split()[1:]]


def the_core_headers_include_no_algorithm():
    for header in LIGHT:
        files = dependencies("#include <%s>\n" % header)
        # The standard headers the custody headers of this TU name themselves, <algorithm> left out:
        # what the TU would read if none of them included <algorithm>.
        named = set()
        for f in files:
            if INCLUDE in f.resolve().parents:
                named |= set(re.findall(r"^#include <([a-z_]+)>", f.read_text(), re.M))
        named.discard("algorithm")
        baseline = dependencies("".join("#include <%s>\n" % n for n in sorted(named)))
        if any(f.name == "algorithm" for f in baseline):
            print("skipped for %s: this standard library's own headers (%s) include <algorithm>" % (header, sorted(named)))
            continue
        check(not any(f.name == "algorithm" for f in files),
              "%s pulls in <algorithm>, which its standard headers %s do not: an include it does not use?"
              % (header, sorted(named)))


the_table_measures_and_says_why_not()
the_core_headers_include_no_algorithm()
for f in failures:
    print("FAILED: " + f)
sys.exit(1 if failures else 0)
