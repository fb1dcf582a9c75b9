"""This process's rank, as torchrun (and most launchers) set it, and the claim of its GPU that
makes a second rank on the same GPU fail at start, naming both ranks."""

import os
import re

from ._library import INT_MAX, CustodyError, library

__all__ = ["rank_info", "claim_device"]


_DIGITS = re.compile(r"[0-9]{1,10}", re.ASCII)


def _count(name, text):
    """A launcher's count as the library reads it (core/rank.hpp): ASCII digits only, the whole
    text, at most 2^31-1."""
    if not _DIGITS.fullmatch(text) or int(text) > INT_MAX:
        shown = repr(text) if len(text) <= 24 else repr(text[:21]) + "..."
        raise CustodyError("custody: %s=%s is not an integer in 0 .. %d" % (name, shown, INT_MAX))
    return int(text)


def rank_info(environ=None):
    """(rank, local_rank, world_size) from RANK, LOCAL_RANK and WORLD_SIZE (torchrun's), or
    (0, 0, 1) outside a launched job. Raises CustodyError when the set is incomplete or malformed."""
    environ = os.environ if environ is None else environ
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
    present = [n for n in names if environ.get(n) not in (None, "")]
    if not present:
        return 0, 0, 1
    if len(present) != len(names):
        missing = [n for n in names if n not in present]
        raise CustodyError("custody: %s set but %s not (as torchrun sets them all)" % (", ".join(present), ", ".join(missing)))
    rank, local_rank, world = (_count(n, environ[n]) for n in names)
    if not (0 <= rank < world and 0 <= local_rank < world):
        raise CustodyError("custody: RANK=%d and LOCAL_RANK=%d do not fit WORLD_SIZE=%d (each must be below it)"
                           % (rank, local_rank, world))
    return rank, local_rank, world


def claim_device(device_id, device, rank=None, lib=None):
    """Claims the GPU `device_id` (its UUID) for this process's rank until it exits. Raises
    CustodyError naming both ranks when another process of the host holds it."""
    if rank is None:
        rank = rank_info()[0]
    (lib or library()).claim_device(str(device_id), int(rank), int(device))
