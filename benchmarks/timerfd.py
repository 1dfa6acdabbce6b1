"""Periodic Linux timers (timerfd) for open-loop load generators.

asyncio's timers (uvloop's included) have a resolution of one millisecond, so a loop
that sleeps between sends at thousands per second sends in bursts, one per millisecond.
A timerfd with a microsecond period, watched with ``loop.add_reader``, wakes the loop at
each tick instead. Python 3.13 has ``os.timerfd_create``; 3.11 reaches it through ctypes.
"""

from __future__ import annotations

import ctypes
import os
import struct

_CLOCK_MONOTONIC = 1
_libc = ctypes.CDLL(None, use_errno=True)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def periodic(interval_s: float) -> int:
    """A non-blocking timerfd that expires every ``interval_s`` seconds from now."""
    fd = _libc.timerfd_create(_CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "timerfd_create")
    ns = max(1, int(interval_s * 1e9))
    every = _Timespec(ns // 10**9, ns % 10**9)
    if _libc.timerfd_settime(fd, 0, ctypes.byref(_Itimerspec(every, every)), None) != 0:
        error = ctypes.get_errno()
        os.close(fd)
        raise OSError(error, "timerfd_settime")
    return fd


def expirations(fd: int) -> int:
    """How many periods passed since the last call (0 if none)."""
    try:
        return int(struct.unpack("Q", os.read(fd, 8))[0])
    except BlockingIOError:
        return 0
