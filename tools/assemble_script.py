"""script_for_wheel.py SCRIPT OUT: writes the Python script SCRIPT to OUT with "#!python" as its
first line, executable. In a wheel's scripts, every installer (pip, uv, installer) replaces that
line with the interpreter it installs for, so the script runs with that environment's Python
whether or not the environment is activated. (The wheel copies the file's mode from OUT.)"""
import os
import stat
import sys

source, out = sys.argv[1], sys.argv[2]
with open(source, encoding="utf-8") as f:
    first, rest = f.read().split("\n", 1)
if not first.startswith("#!") or "python" not in first:
    sys.exit("%s: the first line is not a Python interpreter line: %r" % (source, first))
with open(out, "w", encoding="utf-8") as f:
    f.write("#!python\n" + rest)
os.chmod(out, os.stat(out).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
