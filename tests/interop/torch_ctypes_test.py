#!/usr/bin/env python3
"""Drives the host build of custody_torch_allocator through ctypes with the structure and
signatures examples/torch_pluggable.py uses, so the example's Python side is checked without
PyTorch or a GPU. Usage: torch_ctypes_test.py EXAMPLES_DIR LIBRARY"""
import ctypes
import sys

sys.path.insert(0, sys.argv[1])
from torch_pluggable import CustodyStats  # noqa: E402  (the example imports torch lazily)

lib = ctypes.CDLL(sys.argv[2])
lib.custody_alloc.restype = ctypes.c_void_p
lib.custody_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
lib.custody_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
lib.custody_stats.argtypes = [ctypes.c_int, ctypes.POINTER(CustodyStats)]
lib.custody_report.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
lib.custody_report.restype = ctypes.c_size_t
lib.custody_trim.restype = ctypes.c_size_t
lib.custody_platform.restype = ctypes.c_char_p
lib.custody_last_error.restype = ctypes.c_char_p

assert lib.custody_platform() == b"host", lib.custody_platform()
ptr = lib.custody_alloc(3 << 20, 2, None)
assert ptr, lib.custody_last_error()
ctypes.memset(ptr, 0x5A, 3 << 20)
stats = CustodyStats()
assert lib.custody_stats(2, ctypes.byref(stats)) == 0
assert stats.live_bytes == 3 << 20 and stats.live_allocations == 1 and stats.allocations == 1, stats.live_bytes
lib.custody_free(ptr, 3 << 20, 2, None)
lib.custody_trim(-1)
assert lib.custody_stats(2, ctypes.byref(stats)) == 0
assert (stats.live_bytes, stats.peak_live_bytes, stats.deallocations, stats.reserved_bytes) == (0, 3 << 20, 1, 0)
size = lib.custody_report(None, 0)
buffer = ctypes.create_string_buffer(size + 1)
assert lib.custody_report(buffer, size + 1) == size
assert b"custody device 2 (mapped: the default): live 0 B in 0 blocks, peak live 3145728 B" in buffer.value, buffer.value
assert not lib.custody_alloc(10, 42, None)
assert b"out of range" in lib.custody_last_error()
print("ctypes view of custody_torch_allocator: ok")
