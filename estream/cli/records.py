"""``estream append NAME`` (stdin lines -> records) and ``estream read NAME``.

``append`` reads standard input on a thread of its own, so the event loop (and the
writer's linger and acknowledgements) runs while it waits for a line: ``tail -f log |
estream append s`` sends each line when it comes, and whenever standard input has nothing
more ready it waits for what was sent and flushes (the records are then acknowledged and
visible to readers), rather than holding lines until ``APPEND_WINDOW`` of them came.

``read`` starts at the stream's first kept offset (``start_offset``: records below it were
trimmed) unless ``--from`` says otherwise: an offset, ``start``, ``end`` (only what comes
next, with ``--follow``) or ``-N`` (the last N records). An offset below the first kept
one is refused with an explanation (``OffsetOutOfRange``), not silently moved.

Side effects: reads standard input, writes standard output, talks to the cluster through
the SDK.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
import threading
from collections.abc import Iterable, Iterator
from typing import IO, Any, Final

from estream.cli.output import emit_json
from estream.server.config import INT64_MAX, non_negative_int
from estream.wire.errors import EstreamError

APPEND_WINDOW = 256  # appends in flight at once
stdin_queue_lines_max: Final = 4 * APPEND_WINDOW  # lines read ahead of the writer


def parse_headers(items: Iterable[str]) -> dict[str, str]:
    """``["k=v", "a=b=c"]`` -> ``{"k": "v", "a": "b=c"}``; ValueError without ``=``. Pure."""
    headers: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--headers expects KEY=VALUE, got {item!r}")
        headers[key] = value
    return headers


def header_arg(text: str) -> str:
    try:
        parse_headers([text])
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def stdin_lines(stream: Any) -> Iterator[bytes]:
    for line in stream:
        yield line[:-1] if line.endswith(b"\n") else line


class StdinLines:
    """Lines of a stream read ahead by a daemon thread (at most ``stdin_queue_lines_max``
    waiting; None at EOF). The thread hands each line to the loop with
    ``call_soon_threadsafe`` and waits for room on a semaphore: it makes no coroutine, so a
    command that ends early (its stream not found) leaves none unawaited behind (a
    ``Queue.put`` coroutine whose scheduling the closing loop dropped printed a
    RuntimeWarning into the one-line error)."""

    def __init__(self, stream: IO[bytes], loop: asyncio.AbstractEventLoop) -> None:
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._room = threading.Semaphore(stdin_queue_lines_max)
        self._loop = loop
        self.thread = threading.Thread(target=self._run, args=(stream,), name="estream-stdin",
                                       daemon=True)
        self.thread.start()

    def empty(self) -> bool:
        return self._queue.empty()

    async def get(self) -> bytes | None:
        line = await self._queue.get()
        self._room.release()
        return line

    def _put(self, line: bytes | None) -> None:
        self._room.acquire()
        self._loop.call_soon_threadsafe(self._queue.put_nowait, line)

    def _run(self, stream: IO[bytes]) -> None:
        try:
            try:
                for line in stdin_lines(stream):
                    self._put(line)
            finally:
                self._put(None)  # EOF, or a read that failed: the command ends there
        except RuntimeError:
            return  # the event loop is closed (the command ended early)


async def append(client: Any, ns: argparse.Namespace) -> int:
    """One record per line of stdin. A line the writer refuses (a value past the record
    limit) ends the command there: the lines before it are appended (the summary says
    which), none after it, and the error names its line."""
    headers = parse_headers(ns.headers or [])
    offsets: list[int] = []
    refused: tuple[int, EstreamError] | None = None  # (line number, why)
    lines = StdinLines(sys.stdin.buffer, asyncio.get_running_loop())
    async with await client.open_writer(ns.name) as writer:
        pending: list[asyncio.Future[int]] = []
        number = 0
        while True:
            if pending and lines.empty():
                # Nothing more ready on stdin: wait for what was sent, make it visible.
                offsets += await asyncio.gather(*pending)
                pending = []
                await writer.flush()
            value = await lines.get()
            if value is None:
                break
            number += 1
            appended = writer.append(value, headers=headers or None)  # (submitted at the call)
            error = appended.exception() if appended.done() else None
            if isinstance(error, EstreamError):  # refused at the call: nothing after it
                refused = number, error
                break
            pending.append(appended)
            if len(pending) >= APPEND_WINDOW:
                offsets += await asyncio.gather(*pending)
                pending = []
        offsets += await asyncio.gather(*pending)
    _print_appended(ns, offsets)
    if refused is not None:
        number, error = refused
        raise type(error)(f"line {number}: {error.message} (stopped there; lines appended "
                          f"before it: {len(offsets)}, none after it)", **error.fields)
    return 0


def _print_appended(ns: argparse.Namespace, offsets: list[int]) -> None:
    summary = {
        "stream": ns.name,
        "count": len(offsets),
        "first": offsets[0] if offsets else None,
        "last": offsets[-1] if offsets else None,
    }
    if ns.json:
        emit_json(summary)
    elif offsets:
        print(f"appended {len(offsets)} records to {ns.name} (offsets {offsets[0]}..{offsets[-1]})")
    else:
        print(f"appended 0 records to {ns.name}")


def record_json(record: Any) -> str:
    """One record as a JSON line. ``value`` is always there: the text of a UTF-8 value, else
    its base64, as ``value_encoding`` (``"utf-8"`` or ``"base64"``) says; ``key`` and
    ``key_encoding`` likewise for a record with a key (a Kafka record's). Pure."""
    line: dict[str, Any] = {
        "offset": record.offset,
        "timestamp": record.timestamp,
        "headers": dict(record.headers),
    }
    try:
        line["value"] = bytes(record.value).decode("utf-8")
        line["value_encoding"] = "utf-8"
    except UnicodeDecodeError:
        line["value"] = base64.b64encode(bytes(record.value)).decode("ascii")
        line["value_encoding"] = "base64"
    key = getattr(record, "key", None)
    if key is not None:
        try:
            line["key"], line["key_encoding"] = bytes(key).decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            line["key"] = base64.b64encode(bytes(key)).decode("ascii")
            line["key_encoding"] = "base64"
    return json.dumps(line, sort_keys=True)


def from_arg(text: str) -> str:
    """``--from``: an offset, ``start``, ``end`` or ``-N`` (N and the offset at most
    2**63-1). Pure."""
    if text in ("start", "end") or (text.lstrip("-").isdigit()
                                    and abs(int(text)) <= INT64_MAX):
        return text
    raise argparse.ArgumentTypeError(f"--from expects OFFSET, start, end or -N, got {text!r}")


def start_offset(spec: str | None, first: int, end: int) -> int:
    """Where ``read`` starts: ``first`` is the stream's first kept offset, ``end`` its
    readable end. Raises OffsetOutOfRange below ``first``. Pure.

    >>> start_offset(None, 10, 50), start_offset("end", 10, 50), start_offset("-5", 10, 50)
    (10, 50, 45)
    >>> start_offset("-100", 10, 50), start_offset("12", 10, 50)
    (10, 12)
    """
    from estream.wire.errors import OffsetOutOfRange

    if spec is None or spec == "start":
        return first
    if spec == "end":
        return end
    if spec.startswith("-"):
        return max(first, end - int(spec[1:]))
    offset = int(spec)
    if offset < first:
        raise OffsetOutOfRange(
            f"offset {offset} was trimmed: the stream's first kept offset is {first} "
            f"(omit --from to start there)", offset=offset, start=first, end=end)
    return offset


async def read(client: Any, ns: argparse.Namespace) -> int:
    as_json = ns.format == "json" or ns.json
    out = sys.stdout.buffer
    count = 0
    if ns.max == 0:
        return 0
    end = ns.to
    meta = await client.describe_stream(ns.name)
    readable = 0
    if ns.from_ is not None and (ns.from_ == "end" or ns.from_.startswith("-")):
        readable = await client.end_offset(ns.name)
    start = start_offset(ns.from_, meta.start_offset, readable)
    async for record in client.read(ns.name, start=start, end=end, follow=ns.follow):
        if as_json:
            out.write(record_json(record).encode() + b"\n")
        else:
            out.write(bytes(record.value) + b"\n")
        count += 1
        if ns.follow:
            out.flush()
        if ns.max is not None and count >= ns.max:
            break
    out.flush()
    return 0


def time_arg(text: str) -> int:
    """``--from-time``: milliseconds since the epoch, or an ISO 8601 time (without a zone:
    UTC). Pure.

    >>> time_arg("1700000000000"), time_arg("2023-11-14T22:13:20Z")
    (1700000000000, 1700000000000)
    >>> time_arg("2023-11-14T23:13:20+01:00"), time_arg("2023-11-14 22:13:20.5")
    (1700000000000, 1700000000500)
    """
    import datetime

    if text.isdigit():
        if int(text) > INT64_MAX:
            raise argparse.ArgumentTypeError(f"--from-time: at most {INT64_MAX} ms, got {text}")
        return int(text)
    try:
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--from-time expects milliseconds since the epoch or an ISO 8601 time "
            f"(e.g. 2024-05-01T09:00:00Z), got {text!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return round(when.timestamp() * 1000)


async def read_from_time(client: Any, ns: argparse.Namespace) -> int:
    """``read`` from the first record at or after ``--from-time`` (``offset_for_time``:
    the first offset whose timestamp is at or after it; nothing but new records when none
    is), else as ``read``."""
    if getattr(ns, "from_time", None) is not None:
        if ns.from_ not in (None, 0):
            raise ValueError("give either --from or --from-time, not both")
        offset = await client.offset_for_time(ns.name, ns.from_time)
        ns.from_ = offset if isinstance(ns.from_, int) else str(offset)
    return await read(client, ns)


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "append", parents=[common], help="append standard input, one record per line"
    )
    p.add_argument("name", help="the stream to append to")
    p.add_argument(
        "--headers",
        action="append",
        type=header_arg,
        metavar="K=V",
        help="header on every record (repeatable)",
    )
    p.set_defaults(handler=append)
    p = sub.add_parser("read", parents=[common], help="print records (to the end, or --follow)")
    p.add_argument("name", help="the stream to read")
    p.add_argument("--from", dest="from_", type=from_arg, default=None, metavar="OFFSET",
                   help="OFFSET, start (default: the first kept offset), end, or -N "
                        "(the last N records)")
    p.add_argument("--to", type=non_negative_int, default=None, metavar="OFFSET",
                   help="stop before OFFSET")
    p.add_argument("--from-time", type=time_arg, default=None, metavar="ISO8601|MS",
                   help="start at the first record whose timestamp is at or after this "
                        "time (ms since the epoch, or ISO 8601; no zone: UTC)")
    p.add_argument("--follow", action="store_true", help="keep reading new records")
    p.add_argument("--format", choices=["raw", "json"], default="raw",
                   help="raw: each value on a line (default); json: a JSON object a line "
                        "(offset, timestamp, headers, value, value_encoding)")
    p.add_argument("--max", type=non_negative_int, default=None, metavar="N",
                   help="stop after N records (0: none)")
    p.set_defaults(handler=read_from_time)
