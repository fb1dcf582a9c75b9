"""custody from Python: its allocator library through ctypes (no PyTorch needed), and
custody.torch to make it PyTorch's CUDA allocator.

    import torch, custody.torch
    custody.torch.enable()          # before the first CUDA allocation
"""

from ._library import CustodyError, Library, OutOfMemoryError, library, library_choice, library_path
from .memory_snapshot import dump_snapshot, memory_snapshot, record_history
from .ranks import claim_device, rank_info
from .stats import memory_stats, memory_summary
from .tracking import (LeakWatch, Snapshot, configure_tracking, current_owner, describe_trend, diff, owner,
                       snapshot, write_report)

__version__ = "0.1.0"
__all__ = ["CustodyError", "OutOfMemoryError", "Library", "library", "library_path", "library_choice",
           "dump_snapshot", "memory_snapshot", "record_history", "memory_stats",
           "memory_summary", "claim_device", "rank_info", "LeakWatch", "Snapshot", "configure_tracking",
           "current_owner", "describe_trend", "diff", "owner", "snapshot", "write_report"]
