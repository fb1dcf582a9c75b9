"""How custody's Python tools write a file (the rule of custody/core/detail/output_file.hpp, in
Python): all of it or none of it, and never through a link someone planted. The file is created new
beside its name (tempfile.mkstemp: O_CREAT | O_EXCL | O_NOFOLLOW, an unpredictable name) and renamed
into place once complete; rename replaces whatever had the name (a symbolic link, a hard link to
someone's file) without touching what it pointed to. A character device or a pipe (/dev/null,
/dev/stdout, a named pipe), named directly or through a link of this user or root, is written in
place. Standard library only; installed beside the tools, which import it from their own directory.
"""

import contextlib
import errno
import os
import stat
import tempfile

__all__ = ["output_file"]


def _open_device_or_pipe(path):
    """A descriptor open for writing when `path` names a character device or a pipe (directly, or
    through a link of this user or root); None when the name is to be given a new file (nothing
    there, a regular file, a link to anything else, anything of another user). The kind is checked
    on the opened descriptor, so a name swapped in between is never written through."""
    try:
        name = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISREG(name.st_mode):
        return None
    if stat.S_ISDIR(name.st_mode):
        raise IsADirectoryError(errno.EISDIR, "it is a directory", path)
    if name.st_uid not in (os.geteuid(), 0):
        return None  # planted by another user: replaced, never opened
    link = stat.S_ISLNK(name.st_mode)
    flags = os.O_WRONLY | os.O_NOCTTY | os.O_CLOEXEC | os.O_NONBLOCK | (0 if link else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        if link:
            return None  # a dangling link: replaced
        raise
    kind = os.fstat(fd).st_mode
    if stat.S_ISCHR(kind) or stat.S_ISFIFO(kind):
        os.set_blocking(fd, True)
        return fd
    os.close(fd)
    if link:
        return None  # a link to a regular file: replaced, never written through
    raise OSError(errno.EINVAL, "not a regular file, a character device or a pipe", path)


@contextlib.contextmanager
def output_file(path, suffix="", mode=0o644):
    """A binary file object to write `path` through: renamed to `path` when the block ends without
    an exception, removed otherwise (a device or a pipe is written in place). `suffix` ends the
    temporary name. `mode` less the umask (0644: as open() would give; 0755 for a script). Raises
    OSError naming the file when it cannot be written."""
    fd = _open_device_or_pipe(path)
    if fd is not None:
        with os.fdopen(fd, "wb") as f:
            yield f
        return
    directory = os.path.dirname(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(prefix=os.path.basename(path) + ".partial-", suffix=suffix, dir=directory)
    try:
        umask = os.umask(0o022)
        os.umask(umask)
        os.fchmod(fd, mode & ~umask)
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
