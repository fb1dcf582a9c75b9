#!/usr/bin/env python3
"""Switch PyTorch to custody's allocator and compare it with PyTorch's own on a forward pass.

    python3 examples/torch_pluggable.py --lib build/plugins/torch/libcustody_torch_allocator.so

Runs the same model twice, each in a fresh process (PyTorch accepts a pluggable allocator only
before its first CUDA allocation): once with PyTorch's caching allocator, once with custody's
through torch.cuda.memory.CUDAPluggableAllocator. Prints peak reserved memory and the median
step time of each, and their ratios. `--mode custody` or `--mode torch` runs one side only.
"""
import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys


class CustodyStats(ctypes.Structure):
    """custody_torch_stats of plugins/torch/custody_torch_allocator.h."""
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "live_bytes", "peak_live_bytes", "reserved_bytes", "peak_reserved_bytes",
        "live_allocations", "allocations", "deallocations", "num_ooms", "held_bytes")]


def load_custody(lib_path):
    """Makes custody PyTorch's CUDA allocator; returns the library for its statistics."""
    import torch
    allocator = torch.cuda.memory.CUDAPluggableAllocator(lib_path, "custody_torch_malloc", "custody_free")
    torch.cuda.memory.change_current_allocator(allocator)
    lib = ctypes.CDLL(lib_path)  # the same loaded library: dlopen returns the existing handle
    lib.custody_stats.argtypes = [ctypes.c_int, ctypes.POINTER(CustodyStats)]
    lib.custody_report.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    lib.custody_report.restype = ctypes.c_size_t
    lib.custody_trim.restype = ctypes.c_size_t
    lib.custody_platform.restype = ctypes.c_char_p
    assert lib.custody_platform() == b"cuda", "load the CUDA build of the library, not the host one"
    return lib


def build_model(torch, width, depth):
    """A transformer-like MLP stack: enough layers and activations to exercise an allocator."""
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width),
                   torch.nn.LayerNorm(width)]
    return torch.nn.Sequential(*layers).cuda().half().eval()


def run(mode, lib_path, steps, width, depth):
    import torch
    lib = load_custody(lib_path) if mode == "custody" else None
    torch.manual_seed(0)
    model = build_model(torch, width, depth)
    # Batch sizes vary as in serving, so blocks of many sizes are allocated and freed.
    batches = [1, 8, 32, 64, 16, 4, 128, 2]
    times = []
    with torch.no_grad():
        for step in range(steps):
            batch = batches[step % len(batches)]
            x = torch.randn(batch, 256, width, device="cuda", dtype=torch.half)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            y = model(x)
            end.record()
            end.synchronize()
            if step >= len(batches):  # the first round warms up both allocators
                times.append(start.elapsed_time(end))
            del x, y
    torch.cuda.synchronize()
    result = {"mode": mode, "device": torch.cuda.get_device_name(0), "steps": len(times),
              "median_step_ms": statistics.median(times), "torch": torch.__version__}
    if lib is not None:
        stats = CustodyStats()
        lib.custody_stats(0, ctypes.byref(stats))
        result["peak_reserved_bytes"] = stats.peak_reserved_bytes
        result["peak_live_bytes"] = stats.peak_live_bytes
        size = lib.custody_report(None, 0)
        buffer = ctypes.create_string_buffer(size + 1)
        lib.custody_report(buffer, size + 1)
        result["report"] = buffer.value.decode()
        result["trimmed_bytes"] = lib.custody_trim(-1)
    else:
        result["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(0)
        result["peak_live_bytes"] = torch.cuda.max_memory_allocated(0)
    print(json.dumps(result))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", default=os.path.join("build", "plugins", "torch", "libcustody_torch_allocator.so"),
                        help="the CUDA build of custody_torch_allocator")
    parser.add_argument("--mode", choices=["both", "custody", "torch"], default="both")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=8)
    args = parser.parse_args()
    lib_path = os.path.abspath(args.lib)
    if args.mode != "both":
        run(args.mode, lib_path, args.steps, args.width, args.depth)
        return
    results = {}
    for mode in ("torch", "custody"):
        out = subprocess.run([sys.executable, __file__, "--mode", mode, "--lib", lib_path, "--steps", str(args.steps),
                              "--width", str(args.width), "--depth", str(args.depth)],
                             check=True, capture_output=True, text=True).stdout
        results[mode] = json.loads(out.strip().splitlines()[-1])
    t, c = results["torch"], results["custody"]
    print(f"device: {t['device']}  torch {t['torch']}  steps: {t['steps']} (median over them)")
    print(f"{'allocator':<10} {'peak reserved MiB':>18} {'peak live MiB':>14} {'median step ms':>15}")
    for name, r in (("pytorch", t), ("custody", c)):
        print(f"{name:<10} {r['peak_reserved_bytes'] / 2**20:>18.1f} {r['peak_live_bytes'] / 2**20:>14.1f} "
              f"{r['median_step_ms']:>15.3f}")
    print(f"custody/pytorch: peak reserved {c['peak_reserved_bytes'] / max(t['peak_reserved_bytes'], 1):.3f}x, "
          f"step time {c['median_step_ms'] / t['median_step_ms']:.3f}x")
    print(c["report"], end="")


if __name__ == "__main__":
    main()
