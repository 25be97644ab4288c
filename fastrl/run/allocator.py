"""The C allocator's settings for a training process on CPU.

An eager CPU step allocates and frees the same few hundred temporaries every step. glibc serves blocks from 128 KiB up
(a ``[3, 256, 64]`` float32 activation is 192 KiB) with fresh ``mmap`` pages and returns them with ``munmap`` on free,
so every step pays page faults and zeroing for memory it just gave back; its dynamic threshold raises the limit only
for blocks freed at the current threshold, which a step's mix of sizes rarely does. ``keep_freed_memory`` serves
blocks up to ``MMAP_THRESHOLD`` from the heap and keeps freed heap memory for reuse (the trim threshold), as
jemalloc or tcmalloc would: three CartPole members' eager update (the zoo's settings, 20 hand-derived steps) took
31-35 ms an iteration with it against 40-50 without it (2-core Intel Xeon, 2026-12-05). Larger blocks (pixel rollout
buffers) still come from ``mmap``.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 2 ** 20
TRIM_THRESHOLD = 256 * 2 ** 20


@functools.cache
def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds (see the module docstring) once per process. Returns whether they are set:
    False off glibc (macOS, musl, Windows), where nothing changes."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
            libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    except (OSError, AttributeError):
        return False
