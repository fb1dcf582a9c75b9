#!/usr/bin/env python3
"""Fuzz targets for what custody reads in Python: custody-import's PyTorch snapshot reader
(`pytorch`), its RMM log reader (`rmm`), and the Python package's parsing of the environment and
of options (`environment`).

  python_fuzz.py TARGET --corpus DIR [--runs N | --seconds S] [--dict FILE] [--artifacts DIR]

With atheris (pip install atheris) the target runs under libFuzzer with coverage of the Python code
it reaches, from seed 1, over a scratch folder and the seed corpus DIR (left as it is), with the
dictionary. Without it, a mutator of its own (bit flips, byte runs, dictionary tokens, cuts, copies
and splices of the seeds, from a fixed seed) feeds the same target: the runs are the same on every
machine, without coverage guidance. Either way a finding ends the run with exit status 1 and the
input in the artifacts folder.

What counts as a finding, besides an exception other than the documented refusal and more than
RSS_LIMIT_MIB of memory:
  pytorch, rmm  exit status other than 0 or 2; on 2, an output or a temporary file left behind; on
                0, a trace that custody's readers would refuse (checked by decoding it here as
                trace::reader and the replay compiler do: the format's limits, devices in
                -1 .. 2^31-1, every running sum in 0 .. 2^64-1) or a temporary left behind.
  environment   anything but a CustodyError naming the variable or option from resolve(),
                rank_info(), parse_bytes() and check_text(); a value accepted outside the range
                the library takes.
"""

import argparse
import contextlib
import importlib.machinery
import importlib.util
import io
import os
import random
import resource
import shutil
import sys
import tempfile
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from custody_output import output_file  # noqa: E402  (how every custody tool writes a file)

U64 = (1 << 64) - 1
INT_MAX = (1 << 31) - 1


class Finding(Exception):
    """A property of the target that did not hold."""


# ---- custody-import -------------------------------------------------------------------------------


def load_importer():
    path = os.path.join(ROOT, "tools", "custody-import")
    loader = importlib.machinery.SourceFileLoader("custody_import", path)
    spec = importlib.util.spec_from_loader("custody_import", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


class TraceDecoder:
    """Reads a trace as trace::reader does (docs/trace-format.md) and sums as the replay compiler
    does; raises Finding for what they would refuse."""

    def __init__(self, data):
        self.data, self.at = data, 0

    def byte(self):
        if self.at >= len(self.data):
            raise Finding("the trace ends early at byte %d" % self.at)
        self.at += 1
        return self.data[self.at - 1]

    def varint(self):
        value = shift = 0
        for _ in range(10):
            b = self.byte()
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                if value > U64:
                    raise Finding("a varint past 64 bits at byte %d" % self.at)
                return value
            shift += 7
        raise Finding("a varint of more than 10 bytes at byte %d" % self.at)

    def svarint(self):
        v = self.varint()
        return (v >> 1) ^ -(v & 1)

    def string(self):
        n = self.varint()
        if n > 1 << 20 or self.at + n > len(self.data):
            raise Finding("a string of %d bytes at byte %d" % (n, self.at))
        self.at += n

    def check(self):
        if self.data[:8] != b"CUSTODYT":
            raise Finding("no magic")
        self.at = 8
        if self.varint() != 1:
            raise Finding("version is not 1")
        events = threads = 0
        prev_device, prev_address = 0, 0
        reference, live = {}, {}
        while True:
            tag = self.byte()
            if tag == 0x01:
                if events:
                    raise Finding("metadata after an event")
                self.string()
                self.string()
            elif tag == 0x02:
                threads += 1
                if self.varint() != threads:
                    raise Finding("thread numbered out of order")
                self.varint()
                self.string()
            elif 0x10 <= tag <= 0x14:
                events += 1
                presence = self.byte()
                if presence & 0xC0:
                    raise Finding("presence bits 0x40/0x80")
                self.svarint()  # time: any difference, the reader's int64 wraps
                if presence & 0x01 and self.varint() > threads:
                    raise Finding("an undeclared thread")
                if presence & 0x02:
                    self.varint()
                if presence & 0x04:
                    prev_device = self.svarint()
                    if not -1 <= prev_device <= INT_MAX:
                        raise Finding("device %d out of range" % prev_device)
                size = self.varint()
                if presence & 0x08 and self.byte() > 40:
                    raise Finding("alignment above 2^40")
                prev_address = (prev_address + self.svarint()) & U64
                if presence & 0x10:
                    raise Finding("an owner the importer never declares")
                if presence & 0x20 and self.byte() & ~0x01:
                    raise Finding("unknown flag bits")
                kind, d = tag - 0x10, prev_device
                sums = reference if kind in (3, 4) else live if kind in (0, 1) else None
                if sums is not None:
                    sums[d] = sums.get(d, 0) + (size if kind in (0, 3) else -size)
                    if not 0 <= sums[d] <= U64:
                        raise Finding("a running sum of device %d leaves 0 .. 2^64-1 at event %d" % (d, events))
            elif tag == 0x7F:
                if self.varint() != events:
                    raise Finding("the end record's count differs")
                if self.at != len(self.data):
                    raise Finding("bytes after the end record")
                return events
            else:
                raise Finding("unknown record tag 0x%02x at byte %d" % (tag, self.at - 1))


class ImportTarget:
    """custody-import FORMAT on the input as a file; what it writes is judged as above."""

    def __init__(self, form):
        self.form = form
        self.importer = load_importer()
        self.dir = tempfile.mkdtemp(prefix="custody-fuzz-")
        self.input = os.path.join(self.dir, "input")
        self.output = os.path.join(self.dir, "out.ctrace")

    def __call__(self, data):
        with output_file(self.input) as f:
            f.write(data)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.output)
        with contextlib.redirect_stderr(io.StringIO()) as err:
            status = self.importer.main([self.form, self.input, "-o", self.output, "-q"])
        left = sorted(n for n in os.listdir(self.dir) if n not in ("input", "out.ctrace"))
        if left:
            raise Finding("files left behind: %s" % left)
        if status == 2:
            if os.path.exists(self.output):
                raise Finding("refused (%s) but wrote the output" % err.getvalue().strip())
            if "custody-import:" not in err.getvalue():
                raise Finding("refused without a message")
        elif status == 0:
            with open(self.output, "rb") as f:
                TraceDecoder(f.read()).check()
        else:
            raise Finding("exit status %r" % status)


# ---- the Python package's environment and options -------------------------------------------------

VARIABLES = ("CUSTODY_MAX_BYTES", "CUSTODY_DEVICE_HEADROOM", "CUSTODY_TRACKING", "CUSTODY_CLAIM_DEVICE",
             "RANK", "LOCAL_RANK", "WORLD_SIZE")


class EnvironmentTarget:
    """The input's NUL-separated fields, decoded as the operating system gives environment values
    to Python (UTF-8, undecodable bytes as lone surrogates): the seven variables, then an option
    given in code as text, a size, an owner name."""

    def __init__(self):
        from custody import _library, options, ranks
        self.library, self.options, self.ranks = _library, options, ranks

    def refused_naming(self, call, names):
        try:
            return call(), None
        except self.library.CustodyError as e:
            if not any(n in str(e) for n in names):
                raise Finding("CustodyError names none of %s: %s" % (names, e))
            return None, e

    def __call__(self, data):
        fields = data.decode("utf-8", "surrogateescape").split("\0") + [""] * 10
        environ = {name: value for name, value in zip(VARIABLES, fields) if value}
        given_text, size_text, owner = fields[7], fields[8], fields[9]
        options = self.options
        chosen, _ = self.refused_naming(lambda: options.resolve(environ=environ), VARIABLES)
        if chosen is not None:
            for name, highest in (("max_bytes", U64), ("device_headroom", U64 - 1)):
                v = chosen[name]
                if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= highest):
                    raise Finding("%s accepted as %r" % (name, v))
            if not isinstance(chosen["tracking"], bool) or not isinstance(chosen["claim_device"], bool):
                raise Finding("a boolean option accepted as %r" % chosen)
        self.refused_naming(lambda: options.resolve(environ={}, max_bytes=given_text, tracking=given_text),
                            ("max_bytes", "tracking"))
        value, _ = self.refused_naming(lambda: options.parse_bytes(size_text, "SIZE"), ("SIZE",))
        if value is not None and not 0 <= value <= U64:
            raise Finding("parse_bytes(%r) = %r" % (size_text, value))
        ranks, _ = self.refused_naming(lambda: self.ranks.rank_info(environ), ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
        if ranks is not None:
            r, local, world = ranks
            if ranks != (0, 0, 1) and not (0 <= r < world <= INT_MAX and 0 <= local < world):
                raise Finding("rank_info accepted %r" % (ranks,))
        text, _ = self.refused_naming(lambda: self.library.check_text(owner, "owner name"), ("owner name",))
        if text is not None and (b"\0" in text or text.decode("utf-8") != owner):
            raise Finding("check_text(%r) gave %r" % (owner, text))


# ---- the drivers: atheris, or a mutator of our own -------------------------------------------------


def make_target(name):
    if name == "environment":
        return EnvironmentTarget()
    return ImportTarget(name)


def target_modules(target):
    """The modules whose code the target exercises (the ones atheris instruments)."""
    if isinstance(target, EnvironmentTarget):
        return [target.library, target.options, target.ranks]
    return [target.importer]


def instrument(atheris, modules):
    """Coverage for the functions and methods of `modules` only (instrumenting everything loaded
    takes minutes)."""
    def functions(namespace, module_name):
        for value in list(vars(namespace).values()):
            if isinstance(value, type) and value.__module__ == module_name:
                yield from functions(value, module_name)
            elif callable(value) and getattr(value, "__module__", None) == module_name and hasattr(value, "__code__"):
                yield value
    for module in modules:
        for function in functions(module, module.__name__):
            atheris.instrument_func(function)


# An input of at most 16 KiB that takes this much memory is a finding (the targets need about 50 MiB).
RSS_LIMIT_MIB = 512


def one_input(target, artifacts):
    def run(data):
        try:
            target(bytes(data))
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
            if peak > RSS_LIMIT_MIB:
                raise Finding("the process reached %d MiB (limit %d)" % (peak, RSS_LIMIT_MIB))
        except Exception as e:  # a finding: keep the input, then let the driver stop
            os.makedirs(artifacts, exist_ok=True)
            path = os.path.join(artifacts, "finding-%d" % (hash(bytes(data)) & 0xFFFFFFFF))
            with output_file(path) as f:
                f.write(bytes(data))
            sys.stderr.write("python_fuzz: finding (input kept in %s):\n%s" % (path, traceback.format_exc()))
            raise Finding(str(e)) from e
    return run


def read_dictionary(path):
    tokens = []
    if not path:
        return tokens
    with open(path, encoding="latin-1") as f:
        for line in f:
            line = line.strip()
            if line.startswith('"') and line.endswith('"'):
                tokens.append(line[1:-1].encode("latin-1").decode("unicode_escape").encode("latin-1"))
    return tokens


def mutate(rng, data, seeds, tokens, max_len):
    data = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        choice = rng.randrange(8)
        at = rng.randint(0, len(data))
        if choice == 0 and data:
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
        elif choice == 1 and data:
            data[rng.randrange(len(data))] = rng.choice((0, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        elif choice == 2 and tokens:
            data[at:at] = rng.choice(tokens)
        elif choice == 3 and data:
            end = min(len(data), at + rng.randint(1, 32))
            del data[at:end]
        elif choice == 4 and data:
            start = rng.randrange(len(data))
            data[at:at] = data[start:start + rng.randint(1, 64)]
        elif choice == 5:
            other = rng.choice(seeds)
            start = rng.randrange(len(other)) if other else 0
            data[at:at] = other[start:start + rng.randint(1, 128)]
        elif choice == 6:
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif choice == 7 and data:
            data[at:at] = data[at:at + 1] * rng.randint(1, 256)  # runs (deep nesting, long numbers)
    return bytes(data[:max_len])


def own_mutator(run, corpus, tokens, runs, seconds, max_len):
    import time
    seeds = [open(os.path.join(corpus, n), "rb").read() for n in sorted(os.listdir(corpus))] or [b""]
    rng = random.Random(1)
    deadline = time.monotonic() + seconds if seconds else None
    done = 0
    for seed in seeds:
        run(seed)
        done += 1
    while (runs is None or done < runs) and (deadline is None or time.monotonic() < deadline):
        run(mutate(rng, rng.choice(seeds), seeds, tokens, max_len))
        done += 1
    print("python_fuzz: %d inputs, no finding (own mutator, seed 1)" % done)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", choices=("pytorch", "rmm", "environment"))
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--runs", type=int)
    parser.add_argument("--seconds", type=int)
    parser.add_argument("--dict")
    parser.add_argument("--artifacts", default=os.path.join(tempfile.gettempdir(), "custody-python-fuzz"))
    parser.add_argument("--max-len", type=int, default=16384)
    parser.add_argument("--own-mutator", action="store_true", help="do not use atheris even where it is installed")
    args = parser.parse_args(argv)
    if args.runs is None and args.seconds is None:
        parser.error("give --runs or --seconds")
    target = make_target(args.target)
    run = one_input(target, args.artifacts)
    try:
        import atheris
    except ImportError:
        atheris = None
    if atheris is None or args.own_mutator:
        try:
            own_mutator(run, args.corpus, read_dictionary(args.dict), args.runs, args.seconds, args.max_len)
        except Finding:
            return 1
        return 0
    # New inputs go to a scratch folder beside the artifacts (libFuzzer ends the process itself,
    # so it is emptied at the next start instead of at the end).
    scratch = os.path.join(args.artifacts, "scratch-corpus")
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    # A finding exits 1, as with the own mutator (libFuzzer's own 77 is "skipped" to meson).
    flags = ["-seed=1", "-timeout=30", "-error_exitcode=1", "-timeout_exitcode=1",
             "-rss_limit_mb=%d" % RSS_LIMIT_MIB, "-max_len=%d" % args.max_len,
             "-artifact_prefix=%s/" % args.artifacts, "-print_final_stats=1"]
    flags += ["-runs=%d" % args.runs] if args.runs is not None else []
    flags += ["-max_total_time=%d" % args.seconds] if args.seconds is not None else []
    flags += ["-dict=%s" % args.dict] if args.dict else []
    instrument(atheris, target_modules(target))
    atheris.Setup([sys.argv[0]] + flags + [scratch, args.corpus], run)
    atheris.Fuzz()  # exits the process: 0 when the runs are done, non-zero on a finding


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
