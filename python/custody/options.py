"""Options of custody.torch.enable() and the environment variables that override them, so that
one script launched by torchrun can be tuned per job without editing it."""

import fractions
import os
import re

from ._library import CONFIGURE_RANGES, CustodyError, check_integer

__all__ = ["ENVIRONMENT", "parse_bytes", "resolve"]

# option -> the environment variable that overrides what the code passed
ENVIRONMENT = {
    "max_bytes": "CUSTODY_MAX_BYTES",
    "device_headroom": "CUSTODY_DEVICE_HEADROOM",
    "claim_device": "CUSTODY_CLAIM_DEVICE",
    "tracking": "CUSTODY_TRACKING",
    "stacks": "CUSTODY_STACKS",
    "backing": "CUSTODY_BACKING",
}
_BOOLEANS = {"claim_device": True, "tracking": False, "stacks": False}  # boolean options and their defaults
_CHOICES = {"backing": ("mapped", "chunked")}  # options that take one of a few words, the first the default

_UNITS = {"": 1, "k": 1000, "m": 1000 ** 2, "g": 1000 ** 3, "t": 1000 ** 4,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


_SIZE = re.compile(r"\s*([0-9]{1,30}(?:\.[0-9]{1,30})?)\s*([a-zA-Z]{0,3})\s*", re.ASCII)


def _shown(text):
    text = repr(text)
    return text if len(text) <= 48 else text[:45] + "..."


def parse_bytes(text, what="size", highest=CONFIGURE_RANGES["max_bytes"][1]):
    """'8GiB', '512 MiB', '2G' (decimal), '1.5GiB', '1048576' -> bytes, exactly (rounded down to a
    whole byte). Raises CustodyError naming `what` when `text` is not a size, or is above
    `highest` (what the library takes: 2^64-1 by default)."""
    match = _SIZE.fullmatch(text) if isinstance(text, str) else None
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise CustodyError("custody: %s=%s is not a size (examples: 8GiB, 512MiB, 2G, 1048576)" % (what, _shown(text)))
    value = int(fractions.Fraction(match.group(1)) * _UNITS[unit])
    if value > highest:
        raise CustodyError("custody: %s=%s is %d bytes, above the %d the library takes" % (what, _shown(text), value, highest))
    return value


def _parse_bool(text, what):
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise CustodyError("custody: %s=%s is not a boolean (1/0, true/false, yes/no, on/off)" % (what, _shown(text)))


def _parse_choice(text, what, choices):
    value = text.strip() if isinstance(text, str) else text
    if value not in choices:
        raise CustodyError("custody: %s=%s is not one of %s" % (what, _shown(text), ", ".join(choices)))
    return value


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
        if name in _CHOICES:
            if from_env not in (None, ""):
                value = _parse_choice(from_env, variable, _CHOICES[name])
            elif value is None:
                value = _CHOICES[name][0]
            else:
                value = _parse_choice(value, name, _CHOICES[name])
        elif name in _BOOLEANS:
            if from_env not in (None, ""):
                value = _parse_bool(from_env, variable)
            elif value is None:
                value = _BOOLEANS[name]
            elif isinstance(value, str):
                value = _parse_bool(value, name)
            else:
                value = bool(check_integer(int(value) if isinstance(value, bool) else value, name, 0, 1))
        else:
            lowest, highest = CONFIGURE_RANGES[name]
            if from_env not in (None, ""):
                value = parse_bytes(from_env, variable, highest)
            elif isinstance(value, str):
                value = parse_bytes(value, name, highest)
            elif value is not None:
                value = check_integer(value, name, lowest, highest)
        options[name] = value
    return options
