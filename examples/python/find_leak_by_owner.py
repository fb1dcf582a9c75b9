"""Finds a leak by owner across ranks. Each rank runs a decode loop: activations come and go,
KV-cache pages are kept, and rank 1 forgets to evict its old pages. A LeakWatch raises the alarm on
the rank whose cache keeps growing; each rank writes its report; custody-merge puts the ranks side
by side, owner by owner.

On GPUs (the CUDA build, with PyTorch):  torchrun --nproc-per-node 2 find_leak_by_owner.py REPORTS
then:                                     custody-merge REPORTS/rank-*.json
Without a GPU (the host build):           python find_leak_by_owner.py --ranks 2 REPORTS
(launches the ranks as torchrun would, then merges)."""
import argparse
import os
import pathlib
import subprocess
import sys

import custody
import custody.merge
import custody.torch


def make_allocate(lib, device):
    """A function that allocates `n` bytes and returns what keeps them alive."""
    if lib.platform == "cuda":
        import torch

        custody.torch.enable(tracking=True)
        torch.cuda.set_device(device)
        return lambda n: torch.empty(n, dtype=torch.uint8, device="cuda")
    custody.configure_tracking()

    class Block:  # host build: a block of a virtual device, given back when dropped
        def __init__(self, n):
            self.n, self.address = n, lib.alloc(n, device)

        def __del__(self):
            lib.free(self.address, self.n, device)

    return Block


def run_rank(report_dir, steps=8):
    rank, local_rank, world = custody.rank_info()
    allocate = make_allocate(custody.library(), local_rank)
    alarms = []
    watch = custody.LeakWatch(growth_checks=3, callback=alarms.append)
    kv_cache = []
    for step in range(steps):
        with custody.owner("decode"):
            with custody.owner("activations"):
                activations = allocate(64 << 10)
            with custody.owner("kv_cache"):
                kv_cache.append(allocate(256 << 10))
            del activations
            if rank != 1:  # rank 1 never evicts: its cache grows with every step
                del kv_cache[:-2]
        watch.check()
    for alarm in alarms:
        print("rank %d: alarm: %s holds %d bytes, %s" % (rank, alarm["owner"], alarm["live_bytes"], alarm["reason"]))
    print("rank %d: report %s" % (rank, custody.write_report(report_dir)))


def launch(ranks, report_dir):
    """Runs `ranks` copies of this script with torchrun's variables, then merges their reports."""
    for rank in range(ranks):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ranks))
        subprocess.run([sys.executable, __file__, str(report_dir)], env=env, check=True)
    reports = sorted(pathlib.Path(report_dir).glob("rank-*.json"))
    print(custody.merge.merge([str(r) for r in reports]).stdout)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", help="the directory of the per-rank reports")
    parser.add_argument("--ranks", type=int, help="launch this many ranks here (no torchrun), then merge")
    args = parser.parse_args()
    if args.ranks:
        launch(args.ranks, args.reports)
    else:
        run_rank(args.reports)
