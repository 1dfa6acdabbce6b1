"""LIST_RANGES pages (rangeserver/listing.py), its request (estream/wire/rangemessages.py)
and the client that asks for every page."""

from __future__ import annotations

import random
from typing import Any

import msgpack
import pytest

from estream.net.rangeclient import RangeClient
from estream.wire.errors import InvalidArgument
from estream.wire.limits import frame_header_bytes_max
from estream.wire.protocol import Opcode
from estream.wire.rangemessages import ListRangesRequest
from rangeserver.listing import (
    ReplicaKeys,
    list_ranges_replicas_default,
    list_ranges_replicas_max,
)


def parse_page(header: dict[str, Any]) -> tuple[tuple[int, int] | None, int]:
    request = ListRangesRequest.from_header(header)
    return request.after, request.limit


def test_pages_walk_every_key_once_as_keys_come_and_go() -> None:
    rng = random.Random(7)
    keys, ref = ReplicaKeys(), set()
    for _ in range(3_000):
        key = (rng.randrange(50), rng.randrange(100))
        if rng.random() < 0.3:
            keys.discard(key)
            ref.discard(key)
        else:
            keys.add(key)
            ref.add(key)
    assert len(keys) == len(ref)
    for limit in (1, 7, 1000, 5000):
        seen, after, pages = [], None, 0
        while pages <= len(ref) + 1:
            page, more = keys.page(after, limit)
            pages += 1
            assert len(page) <= limit
            seen += page
            if not more:
                break
            after = page[-1]
        assert seen == sorted(ref)
    # after a key that is gone: from the next one
    gone = sorted(ref)[10]
    keys.discard(gone)
    assert keys.page(gone, 1)[0] == [sorted(ref)[11]]


def test_the_largest_page_fits_a_frame_header() -> None:
    big = 2**64 - 1
    entry = {"stream_id": big, "range_index": 2**32 - 1, "start": big, "end": big,
             "confirm": big, "epoch": big, "sealed": True, "sealed_end": big,
             "damaged": False, "digest": "hmac-sha256"}
    answer = {"ranges": [entry] * list_ranges_replicas_max, "more": True}
    assert len(msgpack.packb(answer)) < frame_header_bytes_max


@pytest.mark.parametrize(("header", "argument"), [
    ({"limit": 0}, "limit"), ({"limit": list_ranges_replicas_max + 1}, "limit"),
    ({"limit": "5"}, "limit"), ({"limit": True}, "limit"), ({"after": 5}, "after"),
    ({"after": [1]}, "after"), ({"after": [1, -1]}, "after"), ({"after": [1, "x"]}, "after"),
    ({"after": [2**64, 0]}, "after"),
])
def test_bad_page_arguments_are_refused(header: dict[str, Any], argument: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        parse_page(header)
    assert caught.value.fields["argument"] == argument


def test_defaults() -> None:
    assert parse_page({}) == (None, list_ranges_replicas_default)
    assert parse_page({"after": [3, 4], "limit": 9}) == ((3, 4), 9)


class PagingServer:
    """A fake pool answering LIST_RANGES a page of ``limit`` at a time."""

    def __init__(self, n: int, limit: int) -> None:
        self.keys = ReplicaKeys((i // 3, i % 3) for i in range(n))
        self.limit = limit
        self.headers: list[dict[str, Any]] = []

    async def call(self, address: str, opcode: int, header: dict[str, Any] | None = None,
                   payload: bytes = b"", *, timeout_s: float = 5.0) -> tuple[Any, bytes]:
        assert opcode == Opcode.LIST_RANGES
        h = dict(header or {})
        self.headers.append(h)
        after, _ = parse_page({k: v for k, v in h.items() if k != "server_id"})
        page, more = self.keys.page(after, self.limit)
        state = {"start": 0, "end": 0, "confirm": 0, "epoch": 1, "sealed": False,
                 "sealed_end": None, "damaged": False}
        return {"ranges": [{"stream_id": s, "range_index": r, **state} for s, r in page],
                "more": more}, b""

    def discard(self, address: str) -> None:
        pass


async def test_the_client_asks_for_every_page() -> None:
    server = PagingServer(2_500, 1000)
    listed = await RangeClient(server).list_ranges("a:1", server_id="s1")  # type: ignore[arg-type]
    assert [(r.stream_id, r.range_index) for r in listed] == [
        (i // 3, i % 3) for i in range(2_500)]
    assert [h.get("after") for h in server.headers] == [None, [333, 0], [666, 1]]
