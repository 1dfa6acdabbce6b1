"""Fuzzing the two decoders of untrusted bytes: frames and record batches.

Each may only ever raise its typed errors, never hang, and never accept a corrupted batch.
Examples are bounded so the file runs in a few seconds.
"""

from __future__ import annotations

import struct

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from estream.wire.errors import ChecksumMismatch, EstreamError, MalformedBatch
from estream.wire.protocol import (
    FRAME_PREFIX_BYTES,
    Frame,
    FrameDecoder,
    FrameFlags,
    Opcode,
    encode_frame_bytes,
)
from estream.wire.record import (
    Record,
    decode_batch,
    decode_columns,
    encode_batch,
    iter_batches,
)

FUZZ = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:], strict=False)]


def feed_all(decoder: FrameDecoder, chunks: list[bytes]) -> int:
    """Feed chunks; returns the frames decoded before any error. Touches each header."""
    frames = 0
    for chunk in chunks:
        try:
            decoded = decoder.feed(chunk)
        except EstreamError:
            return frames  # a bad prefix: the connection would be closed here
        for frame in decoded:
            frames += 1
            try:
                frame.header()
            except EstreamError:
                pass
    return frames


@FUZZ
@given(data=st.binary(max_size=512), cuts=st.lists(st.integers(0, 512), max_size=8))
def test_frame_decoder_on_arbitrary_bytes(data: bytes, cuts: list[int]) -> None:
    decoder = FrameDecoder(frame_bytes_max=1024, header_bytes_max=256)
    feed_all(decoder, chunked(data, cuts))
    assert decoder.buffered_bytes <= len(data)


@FUZZ
@given(
    opcode=st.integers(0, 255),
    flags=st.integers(0, 2**16 - 1),
    request_id=st.integers(0, 2**64 - 1),
    header_bytes=st.integers(0, 2**32 - 1) | st.integers(0, 64),
    payload_bytes=st.integers(0, 2**32 - 1) | st.integers(0, 64),
    body=st.binary(max_size=256),
    cuts=st.lists(st.integers(0, 300), max_size=6),
)
def test_frame_decoder_on_valid_magic_and_arbitrary_fields(
    opcode: int, flags: int, request_id: int, header_bytes: int, payload_bytes: int,
    body: bytes, cuts: list[int],
) -> None:
    prefix = struct.pack("<HBBHQII", 0xE5F1, 1, opcode, flags, request_id, header_bytes,
                         payload_bytes)
    decoder = FrameDecoder(frame_bytes_max=1024, header_bytes_max=256)
    feed_all(decoder, chunked(prefix + body, cuts))
    assert decoder.buffered_bytes <= FRAME_PREFIX_BYTES + len(body)


headers_st = st.dictionaries(
    st.text(max_size=6),
    st.one_of(st.integers(-(2**63), 2**64 - 1), st.text(max_size=6), st.binary(max_size=6),
              st.booleans(), st.none()),
    max_size=4,
)


@FUZZ
@given(
    frames=st.lists(
        st.tuples(st.sampled_from(list(Opcode)), st.integers(0, 2**64 - 1), headers_st,
                  st.binary(max_size=64), st.sampled_from(list(FrameFlags))),
        min_size=1, max_size=5,
    ),
    cuts=st.lists(st.integers(0, 2048), max_size=10),
)
def test_valid_frames_in_arbitrary_chunks_decode_exactly(
    frames: list[tuple[Opcode, int, dict[str, object], bytes, FrameFlags]], cuts: list[int]
) -> None:
    data = b"".join(encode_frame_bytes(op, rid, h, p, f) for op, rid, h, p, f in frames)
    decoder = FrameDecoder()
    decoded = []
    for chunk in chunked(data, cuts):
        decoded += decoder.feed(chunk)
    assert decoder.buffered_bytes == 0
    assert [(f.opcode, f.request_id, f.header(), f.payload, f.flags) for f in decoded] == [
        (op, rid, msgpack.unpackb(msgpack.packb(h)) if h else {}, p, f)
        for op, rid, h, p, f in frames
    ]


@FUZZ
@given(
    good=st.binary(max_size=64),
    pos=st.integers(0, 200),
    noise=st.binary(min_size=1, max_size=8),
    cuts=st.lists(st.integers(0, 300), max_size=6),
)
def test_mutated_frame_streams_raise_only_estream_errors(
    good: bytes, pos: int, noise: bytes, cuts: list[int]
) -> None:
    data = bytearray(encode_frame_bytes(Opcode.APPEND, 1, {"deferred": True}, good) * 2)
    pos = min(pos, len(data) - 1)
    data[pos : pos + len(noise)] = noise
    decoder = FrameDecoder(frame_bytes_max=4096, header_bytes_max=512)
    feed_all(decoder, chunked(bytes(data), cuts))


@FUZZ
@given(data=st.binary(max_size=FRAME_PREFIX_BYTES * 4))
def test_frame_header_of_arbitrary_bytes(data: bytes) -> None:
    frame = Frame(1, FrameFlags.NONE, 1, data, b"")
    try:
        assert isinstance(frame.header(), dict)
    except EstreamError:
        pass


def _decode_only_typed_errors(data: bytes) -> None:
    try:
        decode_batch(data)
    except (MalformedBatch, ChecksumMismatch):
        pass
    try:
        decode_batch(data, verify=False)
    except MalformedBatch:
        pass
    try:
        for _header, _view in iter_batches(data):
            pass
    except MalformedBatch:
        pass


@FUZZ
@given(data=st.binary(max_size=512))
def test_batch_decoder_on_arbitrary_bytes(data: bytes) -> None:
    _decode_only_typed_errors(data)


records_st = st.lists(
    st.builds(
        Record,
        value=st.binary(max_size=32),
        headers=st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=3),
        timestamp=st.integers(-(2**63), 2**63 - 1),
        key=st.none() | st.binary(max_size=8),
    ),
    min_size=1,
    max_size=6,
)
# Kafka header values are bytes: shown as str decoded with surrogateescape.
escaped_st = st.binary(max_size=6).map(lambda b: b.decode("utf-8", "surrogateescape"))
kafka_records_st = st.lists(
    st.builds(
        Record,
        value=st.binary(max_size=32),
        headers=st.dictionaries(escaped_st, escaped_st, max_size=3),
        timestamp=st.integers(-(2**63), 2**63 - 1),
        key=st.none() | st.binary(max_size=8),
    ),
    min_size=1,
    max_size=6,
)


@FUZZ
@given(records=kafka_records_st)
def test_keys_and_bytes_headers_round_trip(records: list[Record]) -> None:
    batch = encode_batch(records, stream_id=1, range_index=2, epoch=3, base_offset=4)
    decoded = decode_batch(batch).records
    assert [(r.value, dict(r.headers), r.timestamp, r.key) for r in decoded] == [
        (r.value, dict(r.headers), r.timestamp, r.key) for r in records]
    assert decode_columns(batch).records() == list(decoded)


@FUZZ
@given(
    records=records_st,
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1,
                   max_size=4),
    truncate=st.one_of(st.none(), st.integers(0, 10_000)),
)
def test_batch_decoder_on_mutated_valid_batches(
    records: list[Record], edits: list[tuple[int, int]], truncate: int | None
) -> None:
    original = encode_batch(records, stream_id=1, range_index=2, epoch=3, base_offset=4)
    data = bytearray(original)
    for pos, value in edits:
        data[pos % len(data)] = value
    if truncate is not None:
        del data[truncate % len(data) :]
    mutated = bytes(data)
    _decode_only_typed_errors(mutated)
    if mutated != original:
        try:
            decode_batch(mutated)
        except (MalformedBatch, ChecksumMismatch):
            return
        raise AssertionError("a changed batch was accepted")  # pragma: no cover
