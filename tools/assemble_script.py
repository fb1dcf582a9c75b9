"""assemble_script.py SCRIPT MODULE OUT INTERPRETER: writes the Python tool SCRIPT to OUT as the one
file that is installed: its first line INTERPRETER ("#!python" for a wheel, which every wheel
installer replaces with the interpreter it installs for, so venv/bin/custody-plot runs the venv's
Python activated or not; "#!/usr/bin/env python3" for meson install), and the module MODULE
(custody_output.py) in place of the lines between "# [custody_output]" and "# [end custody_output]"
that import it in the source tree. Nothing but the tools lands in bin/ then: a module there would
be on PATH as if it were a command. OUT is made executable (the wheel copies its mode), and written as
every file custody writes (custody_output)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from custody_output import output_file  # noqa: E402  (beside this script)

source, module, out, interpreter = sys.argv[1:5]
with open(source, encoding="utf-8") as f:
    first, rest = f.read().split("\n", 1)
if not first.startswith("#!") or "python" not in first:
    sys.exit("%s: the first line is not a Python interpreter line: %r" % (source, first))
begin, end = "# [custody_output]", "# [end custody_output]"
if rest.count(begin) != 1 or rest.count(end) != 1:
    sys.exit("%s: no single '%s' ... '%s' block to put %s in" % (source, begin, end, module))
head, tail = rest.split(begin, 1)
tail = tail.split(end, 1)[1].split("\n", 1)[1]
with open(module, encoding="utf-8") as f:
    body = f.read()
inlined = "# ---- %s, as installed with the tool ----\n%s# ---- end of %s ----\n" % (
    os.path.basename(module), body.replace("\n__all__ = ", "\n_custody_output_all = ", 1), os.path.basename(module))
with output_file(out, mode=0o755) as f:
    f.write((interpreter + "\n" + head + inlined + tail).encode("utf-8"))
