#!/usr/bin/env python3
"""Instructions per allocation or free, counted by callgrind, for the pool and its peers on the
workloads of bench/pool/scenarios.hpp: the figures the machine's load does not move.

Each (workload, peer, streams) runs bench_pool_ops under
`valgrind --tool=callgrind --collect-atstart=no --toggle-collect='*measured*'`; the workload's own
instructions (the peer `none`, which keeps nothing) are subtracted, and the rest is divided by the
operations measured. A pair row counts one allocate + free (two operations).

    bench/pool/instructions.py BUILD_DIR [--peers pool,jemalloc,...] [--scenarios pair:256,llm,...]
                               [--streams 1,4] [--json OUT]

Prints a markdown table: instructions per pair (pair rows) or per operation (the rest), each peer's
figure, the ratio of four streams in one thread to one (custody's pool), and the checked mode's, the
capture query's and a kept capture-private block's cost over the pool. Peers that are not installed are left out (a dash).
Needs valgrind. Build with NDEBUG (meson -Db_ndebug=true) for the figures in docs/benchmarks.md.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from custody_output import output_file  # noqa: E402  (tools/: how every custody tool writes a file)

PAIR_SIZES = [64, 256, 4096, 65536, 1 << 20, 2 << 20, 16 << 20, 64 << 20]
SCENARIOS = [f"pair:{n}" for n in PAIR_SIZES] + ["churn", "trace", "trace_unbucketed", "llm"]
PEERS = ["pool", "pool_checked", "pool_capture_calls", "pool_graph_kept", "malloc", "pmr_unsync", "pmr_sync", "jemalloc", "mimalloc", "lifo"]
STREAM_PEERS = {"pool", "pool_checked", "pool_capture_calls", "pool_graph_kept"}
# jemalloc's TLS is initial-exec: dlopen needs glibc to keep static TLS for it (see peers.hpp).
TUNABLE = "glibc.rtld.optional_static_tls=16384"


def collected(binary, scenario, peer, streams):
    """(instructions in measured(), operations), or None when the peer is not installed."""
    env = dict(os.environ)
    tunables = env.get("GLIBC_TUNABLES", "")
    if "optional_static_tls" not in tunables:
        env["GLIBC_TUNABLES"] = f"{tunables}:{TUNABLE}" if tunables else TUNABLE
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        r = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--collect-atstart=no",
             "--toggle-collect=*measured*", binary, scenario, peer, str(streams)],
            capture_output=True, text=True, env=env)
    if r.returncode == 77:
        return None
    if r.returncode != 0:
        sys.exit(f"{scenario} {peer} {streams}: exit {r.returncode}\n{r.stderr}")
    ir = re.search(r"Collected : (\d+)", r.stderr)
    ops = re.search(r"^ops (\d+)", r.stdout, re.M)
    if not ir or not ops:
        sys.exit(f"{scenario} {peer} {streams}: no count in the output\n{r.stdout}\n{r.stderr}")
    return int(ir.group(1)), int(ops.group(1))


def per_op(binary, scenario, peer, streams, cache):
    key = (scenario, peer, streams)
    if key not in cache:
        got = collected(binary, scenario, peer, streams)
        none = ("none", scenario, streams)
        if none not in cache:
            cache[none] = collected(binary, scenario, "none", streams)
        base = cache[none]
        if got is None:
            cache[key] = None
        else:
            ops = got[1]
            scale = 2 if scenario.startswith("pair:") else 1  # a pair is two operations
            cache[key] = (got[0] - base[0]) * scale / ops
    return cache[key]


def label(scenario):
    if not scenario.startswith("pair:"):
        return scenario, ""
    n = int(scenario[5:])
    text = f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n >> 10} KiB" if n >= 1024 else f"{n} B"
    return "pair", text


def fmt(x):
    return "–" if x is None else f"{x:.1f}" if x < 100 else f"{x:.0f}"


def ratio(a, b):
    return "–" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build_dir")
    ap.add_argument("--peers", default=",".join(PEERS))
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--streams", default="1,4", help="stream counts for custody's pool (the first is the reference)")
    ap.add_argument("--json", help="also write every figure to this file")
    args = ap.parse_args()
    binary = os.path.join(args.build_dir, "bench", "pool", "bench_pool_ops")
    if not os.access(binary, os.X_OK):
        sys.exit(f"{binary}: not built (ninja -C {args.build_dir} bench/pool/bench_pool_ops)")
    peers = [p for p in args.peers.split(",") if p]
    scenarios = [s for s in args.scenarios.split(",") if s]
    streams = [int(s) for s in args.streams.split(",") if s]
    cache = {}
    rows = []
    for scenario in scenarios:
        row = {"scenario": scenario}
        for peer in peers:
            for s in streams if peer in STREAM_PEERS else streams[:1]:
                row[f"{peer}/{s}"] = per_op(binary, scenario, peer, s, cache)
                print(f"  {scenario} {peer} streams:{s}: {fmt(row[f'{peer}/{s}'])}", file=sys.stderr)
        rows.append(row)
    one = streams[0]
    head = ["scenario", "size"] + [p for p in peers]
    extra = []
    if "pool" in peers:
        extra += [f"pool, {s} streams / {one}" for s in streams[1:]]
        if "pool_checked" in peers:
            extra.append("pool_checked / pool")
        if "pool_capture_calls" in peers:
            extra.append("pool_capture_calls / pool")
        if "pool_graph_kept" in peers:
            extra.append("pool_graph_kept / pool")
    print("| " + " | ".join(head + extra) + " |")
    print("| --- | --- | " + " | ".join("---:" for _ in head[2:] + extra) + " |")
    for row in rows:
        name, size = label(row["scenario"])
        cells = [name, size] + [fmt(row.get(f"{p}/{one}")) for p in peers]
        if "pool" in peers:
            cells += [ratio(row.get(f"pool/{s}"), row.get(f"pool/{one}")) for s in streams[1:]]
            if "pool_checked" in peers:
                cells.append(ratio(row.get(f"pool_checked/{one}"), row.get(f"pool/{one}")))
            if "pool_capture_calls" in peers:
                cells.append(ratio(row.get(f"pool_capture_calls/{one}"), row.get(f"pool/{one}")))
            if "pool_graph_kept" in peers:
                cells.append(ratio(row.get(f"pool_graph_kept/{one}"), row.get(f"pool/{one}")))
        print("| " + " | ".join(cells) + " |")
    if args.json:
        with output_file(args.json) as f:
            f.write(json.dumps(rows, indent=1).encode())


if __name__ == "__main__":
    main()
