"""glibc malloc's arenas for a server process: few, set once as it starts.

glibc gives threads that allocate at the same time arenas of their own, up to eight per
core, and each arena keeps the free space of its own peaks. A PD leader with a ``file://``
object store runs its requests on obstore's blocking pool, about 200 threads in the soak:
they spread over 15 arenas holding about 7 MiB, most of it free, and growing
(``benchmarks/RESULTS.md``, "Soak"). :func:`limit_arenas` caps them at ``arenas_max`` (the
main arena and one that every other thread shares), before any thread is started. Threads
here mostly hold the GIL, so they seldom wait on a shared arena's lock.

No effect where ``mallopt`` is missing (not glibc) or ``MALLOC_ARENA_MAX`` is set (the
operator's choice stands). Side effects: the process's allocator setting.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Any, Final

arenas_max: Final = 2
M_ARENA_MAX: Final = -8  # mallopt's parameter (glibc malloc.h)
ENV: Final = "MALLOC_ARENA_MAX"


def limit_arenas(libc: Any = None) -> bool:
    """Cap malloc's arenas at ``arenas_max``; whether it was set (``libc``: for tests)."""
    if os.environ.get(ENV):
        return False
    if libc is None:
        name = ctypes.util.find_library("c")
        libc = ctypes.CDLL(name) if name else None
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    return bool(mallopt(M_ARENA_MAX, arenas_max))
