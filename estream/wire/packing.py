"""msgpack encoding without a new 256 KiB buffer for every call.

``msgpack.packb`` makes a ``Packer`` for each call, which mallocs a 256 KiB buffer and frees
it at the end. Once glibc has raised its mmap threshold (at its first free of a mapped
block) these come from the main heap, where what lives past each one pins the space it
leaves: the PD leader, encoding over a thousand a second (frame headers, Raft commands),
grew its heap in steps never given back (``benchmarks/RESULTS.md``, "Soak").

:func:`packb` gives ``msgpack.packb``'s bytes and errors on a reused ``Packer`` taken from an
idle list (``pop``/``append`` are atomic under the GIL: threads never share one) and put
back after (at most ``idle_packers_max``). One whose answer outgrew ``buffer_bytes``, or that
raised, is dropped: memory stays bounded whatever was once encoded.

Not I/O; its only state is the lists of idle packers.
"""

from __future__ import annotations

from typing import Any, Final

import msgpack

buffer_bytes: Final = 16 * 1024  # a Packer's buffer; longer answers are not kept
idle_packers_max: Final = 4  # packers kept idle for each unicode_errors

_idle: Final[dict[str, list[msgpack.Packer]]] = {"strict": [], "surrogateescape": []}


def packb(value: Any, *, unicode_errors: str = "strict") -> bytes:
    """``msgpack.packb(value)`` (bin type for bytes, str as UTF-8, ``unicode_errors``
    ("strict" or "surrogateescape") for strings that are not valid UTF-8) on a reused
    ``Packer``."""
    idle = _idle[unicode_errors]
    try:
        packer = idle.pop()
    except IndexError:
        packer = msgpack.Packer(unicode_errors=unicode_errors, buf_size=buffer_bytes)
    out: bytes = packer.pack(value)
    if len(out) <= buffer_bytes and len(idle) < idle_packers_max:
        idle.append(packer)
    return out
