"""Linux native asynchronous I/O (``io_submit``) through ctypes: the log's direct writes.

Why: a writer thread costs two GIL hand-overs per group commit, and on two shared cores
each can wait a whole switch interval: that wait made append latency's tail
(benchmarks/RESULTS.md, "Range server"). With ``O_DIRECT`` the event loop submits a write
and goes on; the kernel signals completion on an ``eventfd`` the loop watches. Needs
buffers, offsets and lengths aligned to :data:`BLOCK_BYTES`, ``O_DIRECT`` on the
filesystem and ``io_setup`` (:func:`probe` says; callers fall back to a thread). Only the
kernel ABI (``linux/aio_abi.h``, x86-64 and arm64), not libaio.

Side effects: the AIO context, the eventfd, and the writes it submits.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
from dataclasses import dataclass
from typing import Final

BLOCK_BYTES: Final = 4096  # alignment of O_DIRECT buffers, offsets and lengths

_SYSCALLS: Final = {  # io_setup, io_destroy, io_getevents, io_submit
    "x86_64": (206, 207, 208, 209),
    "aarch64": (0, 1, 4, 2),
}
_IOCB_CMD_PWRITE: Final = 1
_IOCB_FLAG_RESFD: Final = 1
_RWF_DSYNC: Final = 2  # linux/fs.h; os.RWF_DSYNC where Python has it
_EFD_NONBLOCK: Final = os.O_NONBLOCK
_EFD_CLOEXEC: Final = os.O_CLOEXEC

_libc = ctypes.CDLL(None, use_errno=True)


class _Iocb(ctypes.Structure):
    _fields_ = [
        ("aio_data", ctypes.c_uint64),
        ("aio_key", ctypes.c_uint32),
        ("aio_rw_flags", ctypes.c_int32),
        ("aio_lio_opcode", ctypes.c_uint16),
        ("aio_reqprio", ctypes.c_int16),
        ("aio_fildes", ctypes.c_uint32),
        ("aio_buf", ctypes.c_uint64),
        ("aio_nbytes", ctypes.c_uint64),
        ("aio_offset", ctypes.c_int64),
        ("aio_reserved2", ctypes.c_uint64),
        ("aio_flags", ctypes.c_uint32),
        ("aio_resfd", ctypes.c_uint32),
    ]


class _IoEvent(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_uint64),
        ("obj", ctypes.c_uint64),
        ("res", ctypes.c_int64),
        ("res2", ctypes.c_int64),
    ]


assert ctypes.sizeof(_Iocb) == 64 and ctypes.sizeof(_IoEvent) == 32  # the kernel ABI


def _syscall(number: int, *args: object) -> int:
    result: int = _libc.syscall(number, *args)
    if result < 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))
    return result


def aligned_buffer(size: int) -> mmap.mmap:
    """Anonymous memory of ``size`` bytes rounded up to whole blocks: page-aligned, so
    usable as an O_DIRECT buffer."""
    return mmap.mmap(-1, max(BLOCK_BYTES, -(-size // BLOCK_BYTES) * BLOCK_BYTES))


def buffer_address(buffer: mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))


@dataclass(frozen=True, slots=True)
class Completion:
    """One finished write: its ``token`` and the kernel's result (bytes written, or a
    negative errno)."""

    token: int
    result: int


class AioContext:
    """One kernel AIO context whose completions are signalled on :attr:`eventfd`.

    At most ``depth`` writes in flight. Not thread-safe: one event loop owns it.
    """

    def __init__(self, depth: int = 4) -> None:
        numbers = _SYSCALLS.get(platform.machine())
        if numbers is None:
            raise OSError(0, f"no native AIO system call numbers for {platform.machine()}")
        self._setup, self._destroy, self._getevents, self._submit = numbers
        self.depth = depth
        context = ctypes.c_ulong(0)
        _syscall(self._setup, depth, ctypes.byref(context))
        self._context = context
        fd = _libc.eventfd(0, _EFD_NONBLOCK | _EFD_CLOEXEC)
        if fd < 0:
            error = ctypes.get_errno()
            _syscall(self._destroy, self._context)
            raise OSError(error, os.strerror(error))
        self.eventfd: int = fd
        self._events = (_IoEvent * depth)()
        self._inflight: dict[int, _Iocb] = {}  # token -> its iocb, kept alive until done

    def submit_write(
        self, token: int, fd: int, address: int, size: int, offset: int, *, dsync: bool
    ) -> None:
        """Queue one write of ``size`` bytes from ``address`` at ``offset`` of ``fd``;
        with ``dsync`` it completes only once durable (``RWF_DSYNC``)."""
        iocb = _Iocb()
        iocb.aio_data = token
        iocb.aio_lio_opcode = _IOCB_CMD_PWRITE
        iocb.aio_fildes = fd
        iocb.aio_buf = address
        iocb.aio_nbytes = size
        iocb.aio_offset = offset
        iocb.aio_rw_flags = _RWF_DSYNC if dsync else 0
        iocb.aio_flags = _IOCB_FLAG_RESFD
        iocb.aio_resfd = self.eventfd
        pointers = (ctypes.POINTER(_Iocb) * 1)(ctypes.pointer(iocb))
        _syscall(self._submit, self._context, 1, pointers)
        self._inflight[token] = iocb

    def completions(self) -> list[Completion]:
        """The writes finished since the last call (never blocks)."""
        try:
            os.read(self.eventfd, 8)
        except BlockingIOError:
            pass
        return self._reap(wait=False)

    def wait_all(self) -> list[Completion]:
        """Block until every write in flight has finished (shutdown only)."""
        return self._reap(wait=True)

    def _reap(self, *, wait: bool) -> list[Completion]:
        """Collect finished writes; with ``wait``, until none is in flight."""
        done: list[Completion] = []
        while self._inflight:
            count = _syscall(
                self._getevents, self._context, 1 if wait else 0, self.depth, self._events, None
            )
            if count == 0:
                break
            for event in self._events[:count]:
                self._inflight.pop(event.data, None)
                done.append(Completion(event.data, event.res))
        return done

    def close(self) -> None:
        """Wait for the writes in flight, then release the context and the eventfd."""
        self.wait_all()
        _syscall(self._destroy, self._context)
        os.close(self.eventfd)


def probe(directory: str) -> str | None:
    """Why direct asynchronous writes cannot be used in ``directory`` (None: they can):
    opens a scratch file with O_DIRECT and writes one block through a new context."""
    path = os.path.join(directory, ".direct-io-probe")
    context: AioContext | None = None
    fd = -1
    try:
        context = AioContext(depth=1)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o600)
        block = aligned_buffer(BLOCK_BYTES)
        context.submit_write(1, fd, buffer_address(block), BLOCK_BYTES, 0, dsync=True)
        (done,) = context.wait_all()
        if done.result != BLOCK_BYTES:
            return f"probe write answered {done.result}"
        return None
    except OSError as exc:
        return f"{exc.strerror or exc}"
    finally:
        if fd >= 0:
            os.close(fd)
        if context is not None:
            context.close()
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
