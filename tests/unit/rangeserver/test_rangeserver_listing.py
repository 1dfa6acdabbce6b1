"""LIST_RANGES pages (rangeserver/listing.py), its request (estream/wire/rangemessages.py)
and the client that asks for every page."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import msgpack
import pytest

from estream.net.rangeclient import RangeClient
from estream.wire.errors import InvalidArgument
from estream.wire.limits import frame_header_bytes_max
from estream.wire.protocol import Opcode
from estream.wire.rangeanswers import ListedRange, RangeState, listed_entries
from estream.wire.rangemessages import ListRangesRequest
from rangeserver.listing import (
    ReplicaKeys,
    list_ranges_replicas_default,
    list_ranges_replicas_max,
    page_entries,
)
from rangeserver.replica import ReplicaState


def parse_page(header: dict[str, Any]) -> tuple[tuple[int, int] | None, int]:
    request = ListRangesRequest.from_header(header)
    return request.after, request.limit


def held_replicas(n: int) -> dict[tuple[int, int], ReplicaState]:
    """Replica ``i`` of ``n``: key ``(i // 3, i % 3)``; every third one sealed at 4, every
    fifth damaged, the rest open and sound."""
    held = {}
    for i in range(n):
        state = ReplicaState.create(i // 3, i % 3, 0, epoch=1)
        held[state.key] = replace(state, end=4, written_end=4, confirm=4, sealed=i % 3 == 0,
                                  sealed_end=4 if i % 3 == 0 else 0, damaged=i % 5 == 0)
    return held


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
    # every field a replica's entry may hold, each at its largest (a striped one's too;
    # an unknown digest is its number as text, at most "255")
    entry = {"stream_id": big, "range_index": 2**32 - 1, "start": big, "end": big,
             "confirm": big, "epoch": big, "sealed": True, "sealed_end": big,
             "damaged": False, "digest": "hmac-sha256", "ensemble": 64, "replicas": 64,
             "position": 63, "last_batch": big, "batches": big}
    answer = {"ranges": [entry] * list_ranges_replicas_max, "more": True}
    assert len(msgpack.packb(answer)) < frame_header_bytes_max


@pytest.mark.parametrize(("header", "argument"), [
    ({"limit": 0}, "limit"), ({"limit": list_ranges_replicas_max + 1}, "limit"),
    ({"limit": "5"}, "limit"), ({"limit": True}, "limit"), ({"after": 5}, "after"),
    ({"after": [1]}, "after"), ({"after": [1, -1]}, "after"), ({"after": [1, "x"]}, "after"),
    ({"after": [2**64, 0]}, "after"), ({"compact": 1}, "compact"),
])
def test_bad_page_arguments_are_refused(header: dict[str, Any], argument: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        parse_page(header)
    assert caught.value.fields["argument"] == argument


def test_defaults() -> None:
    assert parse_page({}) == (None, list_ranges_replicas_default)
    assert parse_page({"after": [3, 4], "limit": 9}) == ((3, 4), 9)


class PagingServer:
    """A fake pool answering LIST_RANGES a page of ``limit`` at a time (``compact`` as
    the request asks, through the range server's own :func:`page_entries`)."""

    def __init__(self, n: int, limit: int) -> None:
        self.held = held_replicas(n)
        self.keys = ReplicaKeys(self.held)
        self.limit = limit
        self.headers: list[dict[str, Any]] = []

    async def call(self, address: str, opcode: int, header: dict[str, Any] | None = None,
                   payload: bytes = b"", *, timeout_s: float = 5.0) -> tuple[Any, bytes]:
        assert opcode == Opcode.LIST_RANGES
        h = dict(header or {})
        self.headers.append(h)
        asked = ListRangesRequest.from_header({k: v for k, v in h.items() if k != "server_id"})
        page, more = self.keys.page(asked.after, min(self.limit, asked.limit))
        return {"ranges": page_entries(page, self.held, compact=asked.compact),
                "more": more}, b""

    def discard(self, address: str) -> None:
        pass


async def test_the_client_asks_for_every_page() -> None:
    server = PagingServer(2_500, 1000)
    listed = await RangeClient(server).list_ranges("a:1", server_id="s1")  # type: ignore[arg-type]
    assert [(r.stream_id, r.range_index) for r in listed] == [
        (i // 3, i % 3) for i in range(2_500)]
    assert [h.get("after") for h in server.headers] == [None, [333, 0], [666, 1]]
    assert all("compact" not in h for h in server.headers)
    assert [r.state for r in listed] == [
        RangeState.from_header(server.held[r.stream_id, r.range_index].describe())
        for r in listed]


async def test_a_compact_listing_names_every_replica_and_states_the_sealed_and_damaged() -> None:
    """PD's reclaimer asks compact: every key, in order, across pages that end on a key
    alone; each sealed or damaged replica with its whole state, as a full listing has it;
    an open sound one by its key alone (no state to keep in sync)."""
    server = PagingServer(10_000, list_ranges_replicas_max)
    listing = await RangeClient(server).list_replicas(  # type: ignore[arg-type]
        "a:1", server_id="s1")
    assert list(listing.keys) == [(i // 3, i % 3) for i in range(10_000)]
    assert all(h["compact"] is True and h.get("limit") == list_ranges_replicas_max
               for h in server.headers)
    assert len(server.headers) == 3  # 10,000 replicas: three pages of the most one holds
    full = {(r.stream_id, r.range_index): r
            for r in await RangeClient(server).list_ranges(  # type: ignore[arg-type]
                "a:1", server_id="s1")}
    whole = [k for k, r in full.items() if r.state.sealed or r.state.damaged]
    assert [(r.stream_id, r.range_index) for r in listing.ranges] == whole
    assert list(listing.ranges) == [full[k] for k in whole]
    assert 0 < len(whole) < 10_000


def test_page_entries_list_an_open_sound_replica_by_key_only_when_compact() -> None:
    held = held_replicas(30)
    keys = sorted(held)
    entries = page_entries(keys, held, compact=True)
    for key, entry in zip(keys, entries, strict=True):
        state = held[key]
        if state.sealed or state.damaged:
            assert entry == {"stream_id": key[0], "range_index": key[1], **state.describe()}
        else:
            assert entry == [key[0], key[1]]
    assert page_entries(keys, held) == [
        {"stream_id": k[0], "range_index": k[1], **held[k].describe()} for k in keys]


def test_an_older_servers_full_answer_to_a_compact_request_is_read_whole() -> None:
    held = held_replicas(6)
    keys: list[tuple[int, int]] = []
    ranges: list[ListedRange] = []
    listed_entries(page_entries(sorted(held), held), keys, ranges)
    assert keys == sorted(held) and [(r.stream_id, r.range_index) for r in ranges] == keys
