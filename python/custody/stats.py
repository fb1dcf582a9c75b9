"""custody's counters under PyTorch's names (torch.cuda.memory_stats), and a summary table.

The keys are those of PyTorch's caching allocator (as PyTorch 2.11 names them) that custody's pools
have a true value for; a dashboard reading `allocated_bytes.all.current`, `reserved_bytes.all.peak`
or `num_ooms` keeps working. Keys PyTorch has and custody does not (the small/large pool split,
cumulative byte totals, peaks of counts, inactive splits, retries) are absent rather than made
up."""

from ._library import library

__all__ = ["memory_stats", "memory_summary", "PYTORCH_KEYS", "BACKING_KEY"]

# PyTorch key -> how to compute it from custody_torch_stats.
PYTORCH_KEYS = {
    "allocated_bytes.all.current": lambda s: s["live_bytes"],
    "allocated_bytes.all.peak": lambda s: s["peak_live_bytes"],
    "requested_bytes.all.current": lambda s: s["live_bytes"],
    "requested_bytes.all.peak": lambda s: s["peak_live_bytes"],
    "reserved_bytes.all.current": lambda s: s["reserved_bytes"],
    "reserved_bytes.all.peak": lambda s: s["peak_reserved_bytes"],
    # Active: allocated, or freed but held until the streams it was recorded on finish.
    "active_bytes.all.current": lambda s: s["live_bytes"] + s["held_bytes"],
    "allocation.all.current": lambda s: s["live_allocations"],
    "allocation.all.allocated": lambda s: s["allocations"],
    "allocation.all.freed": lambda s: s["deallocations"],
    # Active blocks: allocated, or freed and held for other streams.
    "active.all.current": lambda s: s["live_allocations"] + s["held_blocks"],
    # Segments: the chunks the pool holds from the device and those taken and given back (chunked),
    # or the granules it has mapped and those mapped and unmapped (mapped).
    "segment.all.current": lambda s: s["segments"],
    "num_device_alloc": lambda s: s["device_allocations"],
    "num_device_free": lambda s: s["device_frees"],
    "num_ooms": lambda s: s["num_ooms"],
}


# custody's own key beside PyTorch's: what backs the device's pool ("mapped" or "chunked", see
# Library.backing), a text where PyTorch's values are all numbers.
BACKING_KEY = "custody.backing"


def memory_stats(device=0, lib=None):
    """A dict of `device`'s counters under PyTorch's key names (sorted, as PyTorch returns them),
    and custody.backing: "mapped" or "chunked"."""
    lib = lib or library()
    raw = lib.stats(device)
    stats = {key: PYTORCH_KEYS[key](raw) for key in sorted(PYTORCH_KEYS)}
    stats[BACKING_KEY] = lib.backing(device)[0]
    return stats


def _bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n /= 1024.0
    return "%d B" % n


def memory_summary(device=0, lib=None):
    """A text table of `device`'s counters (what torch.cuda.memory_summary prints, for custody)."""
    lib = lib or library()
    s = lib.stats(device)
    rows = [
        ("Allocated memory", _bytes(s["live_bytes"]), _bytes(s["peak_live_bytes"])),
        ("Reserved memory", _bytes(s["reserved_bytes"]), _bytes(s["peak_reserved_bytes"])),
        ("Held for other streams", _bytes(s["held_bytes"]), ""),
        ("Live allocations", str(s["live_allocations"]), ""),
        ("Allocations / frees", "%d / %d" % (s["allocations"], s["deallocations"]), ""),
        ("Out-of-memory errors", str(s["num_ooms"]), ""),
    ]
    width = 72
    lines = ["=" * width,
             "custody memory summary, device %d (%s build)" % (device, lib.platform),
             "backing: %s (%s)" % lib.backing(device),
             "-" * width,
             "%-34s %18s %18s" % ("Metric", "Current", "Peak"),
             "-" * width]
    lines += ["%-34s %18s %18s" % row for row in rows]
    lines.append("=" * width)
    return "\n".join(lines) + "\n"
