"""Advice to the kernel about mapped memory, which the oneDNN packing and the packed store share:
forget a range's pages (``MADV_DONTNEED``) or map them all in one call (``MADV_POPULATE_READ``)."""

from __future__ import annotations

import ctypes
import mmap
import sys

MADV_DONTNEED, MADV_POPULATE_READ = 4, 22
LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def madvise(start: int, end: int, advice: int) -> None:
    """``madvise`` the whole pages inside [start, end) (Linux; elsewhere nothing). Populating fails
    harmlessly (EINVAL) before Linux 5.14."""
    page = mmap.PAGESIZE
    lo, hi = -(-start // page) * page, end // page * page
    if LIBC is not None and hi > lo:
        LIBC.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), advice)
