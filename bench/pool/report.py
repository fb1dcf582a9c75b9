#!/usr/bin/env python3
"""Turns the JSON output of bench_pool (--benchmark_format=json) into the markdown tables of
docs/benchmarks.md: each peer's time divided by the pool's, so a ratio above 1 means the pool is
faster. With --benchmark_repetitions, each figure is the median of the repetitions.
Single-threaded rows use CPU time (the figures of a shared machine), multi-threaded rows
wall time (what scaling is about)."""
import json
import sys
from collections import defaultdict

PEERS = ["malloc", "pmr_unsync", "pmr_sync"]


def load(path):
    with open(path) as f:
        data = json.load(f)
    rows, medians = {}, {}
    for b in data["benchmarks"]:
        if b.get("run_type", "iteration") == "iteration":
            rows[b.get("run_name", b["name"])] = b
        elif b.get("aggregate_name") == "median":  # with --benchmark_repetitions: the median run
            medians[b["run_name"]] = b
    rows.update(medians)
    return data["context"], rows


def split(name):
    # <scenario>/<resource>/<args...>
    parts = name.split("/")
    return parts[0], parts[1], "/".join(parts[2:])


def fmt_time(ns):
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f} µs"
    return f"{ns:.1f} ns"


def to_ns(b, field):
    unit = {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}[b["time_unit"]]
    return b[field] * unit


def main(path):
    context, rows = load(path)
    table = defaultdict(dict)  # (scenario, args) -> resource -> benchmark
    for name, b in rows.items():
        scenario, resource, args = split(name)
        table[(scenario, args)][resource] = b
    print("| scenario | args | pool | " + " | ".join(PEERS) + " | " + " | ".join(p + " / pool" for p in PEERS) + " | fragmentation (pool, pmr_sync) |")
    print("| --- | --- | ---: | " + " | ".join("---:" for _ in PEERS) + " | " + " | ".join("---:" for _ in PEERS) + " | --- |")
    order = ["pair", "churn", "trace", "trace_unbucketed", "pair_mt", "churn_mt"]

    def key(k):
        scenario, args = k
        nums = [int(x.split(":")[-1]) if x.split(":")[-1].isdigit() else 0 for x in args.split("/") if x]
        return (order.index(scenario) if scenario in order else 99, nums)

    for k in sorted(table, key=key):
        scenario, args = k
        res = table[k]
        if "pool" not in res:
            continue
        field = "real_time" if scenario.endswith("_mt") else "cpu_time"
        pool_ns = to_ns(res["pool"], field)
        cells = [fmt_time(pool_ns)]
        ratios = []
        for p in PEERS:
            if p in res:
                t = to_ns(res[p], field)
                cells.append(fmt_time(t))
                ratios.append(f"{t / pool_ns:.2f}")
            else:
                cells.append("–")
                ratios.append("–")
        frag = ""
        if "fragmentation" in res["pool"]:
            frag = f"{res['pool']['fragmentation']:.3f}, {res.get('pmr_sync', {}).get('fragmentation', float('nan')):.2f}"
        args_shown = args.replace("real_time/", "")
        print(f"| {scenario} | {args_shown} | " + " | ".join(cells) + " | " + " | ".join(ratios) + f" | {frag} |")


if __name__ == "__main__":
    main(sys.argv[1])
