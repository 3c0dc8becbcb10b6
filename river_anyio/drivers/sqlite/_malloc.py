"""glibc's allocator thresholds, raised once for SQLite's writes to River's schema.

Every statement that writes a job's ``state`` evaluates the table's CHECK constraints, whose
``IN`` lists SQLite tests through temporary b-trees: the statement allocates and frees 200 to
500 KB. Under glibc's defaults (blocks from 128 KB are mapped, free memory above 128 KB at the
top of a heap goes back to the kernel), that memory is returned after every statement and
faulted in again by the next: about 100 page faults a job at 200 jobs a second, and two to five
times the CPU of the statement itself on a virtual machine.

glibc raises both thresholds by itself the first time it frees a mapped block above them
(mallopt(3), M_MMAP_THRESHOLD). :func:`settle_allocator` does that once per process, with a
1 MiB block: blocks under 1 MiB then come from the heap, and up to 2 MiB of free memory stays
at a heap's top. A process whose thresholds are already higher, or fixed by the user
(``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``), or not on glibc, is left as it is.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Final

__all__ = ["BLOCK", "settle_allocator"]

#: The block freed: glibc's new mmap threshold (its trim threshold becomes twice this).
BLOCK: Final = 1 << 20


@functools.cache
def settle_allocator() -> None:
    """Raise glibc's mmap and trim thresholds the way its own adjustment does (see the module)."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only (musl, macOS: nothing to do)
    except (OSError, AttributeError, TypeError):
        return
    malloc = libc.malloc
    malloc.restype = ctypes.c_void_p
    malloc.argtypes = [ctypes.c_size_t]
    free = libc.free
    free.restype = None
    free.argtypes = [ctypes.c_void_p]
    block = malloc(BLOCK)
    if block:
        free(block)
