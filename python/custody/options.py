"""Options of custody.torch.enable() and the environment variables that override them, so that
one script launched by torchrun can be tuned per job without editing it."""

import os
import re

from ._library import CustodyError

__all__ = ["ENVIRONMENT", "parse_bytes", "resolve"]

# option -> the environment variable that overrides what the code passed
ENVIRONMENT = {
    "max_bytes": "CUSTODY_MAX_BYTES",
    "device_headroom": "CUSTODY_DEVICE_HEADROOM",
    "claim_device": "CUSTODY_CLAIM_DEVICE",
    "tracking": "CUSTODY_TRACKING",
    "stacks": "CUSTODY_STACKS",
}
_BOOLEANS = {"claim_device": True, "tracking": False, "stacks": False}  # boolean options and their defaults

_UNITS = {"": 1, "k": 1000, "m": 1000 ** 2, "g": 1000 ** 3, "t": 1000 ** 4,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_bytes(text, what="size"):
    """'8GiB', '512 MiB', '2G' (decimal), '1048576' -> bytes. Raises CustodyError naming `what`."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise CustodyError("custody: %s=%r is not a size (examples: 8GiB, 512MiB, 2G, 1048576)" % (what, text))
    return int(float(match.group(1)) * _UNITS[unit])


def _parse_bool(text, what):
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise CustodyError("custody: %s=%r is not a boolean (1/0, true/false, yes/no, on/off)" % (what, text))


def resolve(environ=None, **given):
    """The options to use: those `given` (None: the default), each replaced by its environment
    variable when that is set. Returns a dict with every option; sizes in bytes, None where
    neither the code nor the environment set one."""
    environ = os.environ if environ is None else environ
    unknown = set(given) - set(ENVIRONMENT)
    if unknown:
        raise TypeError("custody: unknown option(s) %s (known: %s)" % (", ".join(sorted(unknown)),
                                                                      ", ".join(sorted(ENVIRONMENT))))
    options = {}
    for name, variable in ENVIRONMENT.items():
        value = given.get(name)
        from_env = environ.get(variable)
        if name in _BOOLEANS:
            if from_env not in (None, ""):
                value = _parse_bool(from_env, variable)
            else:
                value = _BOOLEANS[name] if value is None else bool(value)
        elif from_env not in (None, ""):
            value = parse_bytes(from_env, variable)
        elif value is not None:
            value = parse_bytes(value, name) if isinstance(value, str) else int(value)
            if value < 0:
                raise CustodyError("custody: %s must not be negative (got %d)" % (name, value))
        options[name] = value
    return options
