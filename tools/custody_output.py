"""How custody's Python tools write a file (the rule of custody/core/detail/output_file.hpp, in
Python): all of it or none of it, and never through a link someone planted. The file is created new
beside its name (tempfile.mkstemp: O_CREAT | O_EXCL | O_NOFOLLOW, an unpredictable name) and renamed
into place once complete; rename replaces whatever had the name (a symbolic link, a hard link to
someone's file) without touching what it pointed to. Standard library only; installed beside the
tools, which import it from their own directory."""

import contextlib
import os
import tempfile

__all__ = ["output_file"]


@contextlib.contextmanager
def output_file(path, suffix=""):
    """A binary file object to write `path` through: renamed to `path` when the block ends without
    an exception, removed otherwise. `suffix` ends the temporary name (a plotting library that
    reads the format from it). Mode 0644 less the umask, as open() would give. Raises OSError
    naming the file when the directory cannot take it."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(prefix=os.path.basename(path) + ".partial-", suffix=suffix, dir=directory)
    try:
        umask = os.umask(0o022)
        os.umask(umask)
        os.fchmod(fd, 0o644 & ~umask)
        with os.fdopen(fd, "wb") as f:
            fd = -1
            yield f
        os.replace(temporary, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
