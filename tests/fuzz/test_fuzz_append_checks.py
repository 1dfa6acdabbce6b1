"""Fuzzing what a range server checks on APPEND before it stores a batch.

The property: a batch with a right checksum passes :func:`check_records` and
:func:`rangeserver.bounds.batch_error` exactly when every reader decodes it (and its
offsets fit int64); any other batch gets a typed error. So no replica acknowledges a
batch that readers cannot decode. Examples are bounded so the file runs in seconds.
"""

from __future__ import annotations

import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from estream.wire.errors import InvalidArgument, MalformedBatch
from estream.wire.record import (
    EncodedRecords,
    check_records,
    decode_batch,
    verify_batch,
    wrap_records,
)
from rangeserver import bounds

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PREFIX = struct.Struct("<qII")
int64s = st.integers(-(2**63), 2**63 - 1)


@st.composite
def sections(draw: st.DrawFn) -> tuple[bytes, int, int, int]:
    """A records section of record prefixes whose lengths may lie, headers that may not
    be msgpack, and header timestamps in any order."""
    count = draw(st.integers(1, 6))
    parts: list[bytes] = []
    stamps: list[int] = []
    for _ in range(count):
        stamp = draw(int64s)
        headers = draw(st.sampled_from(
            [b"", b"\x80", b"\x81\xa1k\xa1v", b"\xc1", b"\x81\x01\x02", b"\x92\x01\x02"]))
        value = draw(st.binary(max_size=20))
        headers_bytes = draw(st.sampled_from([len(headers), len(headers) + 1, 0, 70_000]))
        value_bytes = draw(st.sampled_from([len(value), len(value) + 3, 0]))
        parts.append(PREFIX.pack(stamp, headers_bytes, value_bytes) + headers + value)
        stamps.append(stamp)
    data = b"".join(parts) + draw(st.sampled_from([b"", b"\x00", b"tail"]))
    first = draw(st.sampled_from([stamps[0], stamps[0] - 1 if stamps[0] > -(2**63) else 0]))
    largest = draw(st.sampled_from([max(stamps), max(stamps) + 1 if max(stamps) < 2**63 - 1
                                    else 0]))
    return data, count, first, largest


@FUZZ
@given(sections(), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_a_batch_is_stored_only_if_readers_decode_it(
    section: tuple[bytes, int, int, int], base: int, epoch: int
) -> None:
    data, count, first, largest = section
    if base + count > 2**64 - 1:
        base = 0
    batch = wrap_records(EncodedRecords(data, count, first, largest), stream_id=9,
                         range_index=0, epoch=epoch, base_offset=base)
    header = verify_batch(batch)
    accepted = True
    try:
        bounds.check_batch(header)
        check_records(batch, header)
    except (InvalidArgument, MalformedBatch):
        accepted = False
    try:
        decoded = decode_batch(batch)
        readable = (len(decoded.records) == count and first <= largest
                    and base + count <= 2**63 - 1 and epoch <= 2**63 - 1)
    except MalformedBatch:
        readable = False
    assert accepted == readable
