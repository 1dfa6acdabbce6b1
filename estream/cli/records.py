"""``estream append NAME`` (stdin lines -> records) and ``estream read NAME``.

Side effects: reads standard input, writes standard output, talks to the cluster through
the SDK.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from estream.cli.output import emit_json

APPEND_WINDOW = 256  # appends in flight at once


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


async def append(client: Any, ns: argparse.Namespace) -> int:
    headers = parse_headers(ns.headers or [])
    offsets: list[int] = []
    async with await client.open_writer(ns.name) as writer:
        pending: list[asyncio.Future[int]] = []
        for value in stdin_lines(sys.stdin.buffer):
            pending.append(asyncio.ensure_future(writer.append(value, headers=headers or None)))
            if len(pending) >= APPEND_WINDOW:
                offsets += await asyncio.gather(*pending)
                pending = []
        offsets += await asyncio.gather(*pending)
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
    return 0


def record_json(record: Any) -> str:
    """One record as a JSON line; a non-UTF-8 value goes as ``value_b64``. Pure."""
    line: dict[str, Any] = {
        "offset": record.offset,
        "timestamp": record.timestamp,
        "headers": dict(record.headers),
    }
    try:
        line["value"] = bytes(record.value).decode("utf-8")
    except UnicodeDecodeError:
        line["value_b64"] = base64.b64encode(bytes(record.value)).decode("ascii")
    return json.dumps(line, sort_keys=True)


async def read(client: Any, ns: argparse.Namespace) -> int:
    as_json = ns.format == "json" or ns.json
    out = sys.stdout.buffer
    count = 0
    end = ns.to
    async for record in client.read(ns.name, start=ns.from_, end=end, follow=ns.follow):
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


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "append", parents=[common], help="append standard input, one record per line"
    )
    p.add_argument("name")
    p.add_argument(
        "--headers",
        action="append",
        type=header_arg,
        metavar="K=V",
        help="header on every record (repeatable)",
    )
    p.set_defaults(handler=append)
    p = sub.add_parser("read", parents=[common], help="print records (to the end, or --follow)")
    p.add_argument("name")
    p.add_argument("--from", dest="from_", type=int, default=0, metavar="OFFSET")
    p.add_argument("--to", type=int, default=None, metavar="OFFSET", help="stop before OFFSET")
    p.add_argument("--follow", action="store_true", help="keep reading new records")
    p.add_argument("--format", choices=["raw", "json"], default="raw")
    p.add_argument("--max", type=int, default=None, help="stop after this many records")
    p.set_defaults(handler=read)
