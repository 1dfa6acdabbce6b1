"""The reader's pure helpers: replica order and decoding a READ answer."""

from __future__ import annotations

import pytest

from estream.sdk.reader import decode_answer, replica_order
from estream.wire.errors import ChecksumMismatch
from estream.wire.meta import RangeMeta, ReplicaRef
from estream.wire.record import Record, encode_batch


def answer() -> bytes:
    one = encode_batch(
        [Record(b"a"), Record(b"b")], stream_id=1, range_index=0, epoch=1, base_offset=10
    )
    two = encode_batch(
        [Record(b"c"), Record(b"d")], stream_id=1, range_index=0, epoch=1, base_offset=12
    )
    return one + two


def test_decode_answer_skips_below_the_offset_and_stops_at_end() -> None:
    assert [r.offset for r in decode_answer(answer(), 10, None)] == [10, 11, 12, 13]
    assert [r.value for r in decode_answer(answer(), 11, 13)] == [b"b", b"c"]
    assert decode_answer(answer(), 14, None) == []


def test_decode_answer_rejects_a_flipped_byte() -> None:
    raw = bytearray(answer())
    raw[-1] ^= 0xFF
    with pytest.raises(ChecksumMismatch):
        decode_answer(bytes(raw), 10, None)


def test_replica_order_puts_the_preferred_first() -> None:
    rng = RangeMeta(
        0, 0, None, (ReplicaRef("a", "h:1"), ReplicaRef("b", "h:2"), ReplicaRef("c", "h:3"))
    )
    assert [r.id for r in replica_order(rng, "c")] == ["c", "a", "b"]
    assert [r.id for r in replica_order(rng, None)] == ["a", "b", "c"]
    assert [r.id for r in replica_order(rng, "zz")] == ["a", "b", "c"]
