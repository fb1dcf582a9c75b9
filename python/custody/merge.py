"""custody-merge from Python: merges per-rank tracking reports into a cross-rank table and a
Perfetto trace (`python -m custody.merge --help`, or the `custody-merge` command the package
installs). Runs the custody-merge program installed with the package (beside the interpreter,
in a venv activated or not), else the one on PATH."""

import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig

from ._library import CustodyError

__all__ = ["merge_program", "merge", "main"]


def _installed_beside_interpreter():
    """custody-merge where pip installed it with this package: the scripts directory of the
    running interpreter's environment (a venv's bin/, beside sys.executable), found whether or not
    that environment is activated (PATH is not asked)."""
    for directory in (pathlib.Path(sys.executable).parent, pathlib.Path(sysconfig.get_path("scripts"))):
        candidate = directory / "custody-merge"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def merge_program():
    """The path of the custody-merge program: $CUSTODY_MERGE, the package's, the one installed
    beside the running interpreter (a venv's bin/, activated or not), then PATH's."""
    explicit = os.environ.get("CUSTODY_MERGE")
    if explicit:
        return explicit
    bundled = pathlib.Path(__file__).resolve().parent / "custody-merge"
    if bundled.exists():
        return str(bundled)
    # Never this program itself (a custody-merge that runs custody.merge.main).
    for found in (_installed_beside_interpreter(), shutil.which("custody-merge")):
        if found and pathlib.Path(found).resolve() != pathlib.Path(sys.argv[0]).resolve():
            return found
    raise CustodyError("custody: custody-merge not found (not in the package, not beside %s, not on PATH); "
                       "set CUSTODY_MERGE" % sys.executable)


def merge(arguments, check=True):
    """Runs custody-merge with `arguments` (a list of strings); returns its CompletedProcess with
    stdout and stderr as text. Raises CustodyError with its output when it fails and `check`."""
    done = subprocess.run([merge_program(), *map(str, arguments)], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise CustodyError("custody-merge failed (%d): %s" % (done.returncode, done.stderr.strip() or done.stdout.strip()))
    return done


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        program = merge_program()
    except CustodyError as e:
        print(e, file=sys.stderr)
        return 2
    return subprocess.call([program, *argv])


if __name__ == "__main__":
    sys.exit(main())
