"""The frame codec: golden bytes per opcode, incremental decoding, and every bad prefix field."""

from __future__ import annotations

import struct

import msgpack
import pytest

from estream.wire import limits
from estream.wire.errors import FrameTooLarge, InvalidArgument, MalformedFrame, RangeSealed
from estream.wire.protocol import (
    FRAME_PREFIX_BYTES,
    Frame,
    FrameDecoder,
    FrameFlags,
    Opcode,
    encode_error,
    encode_frame,
    encode_frame_bytes,
)

_PREFIX = struct.Struct("<HBBHQII")
REQUEST_HEADER = {"stream_id": 7}  # msgpack: 81 a9 'stream_id' 07
REQUEST_HEADER_HEX = "81a973747265616d5f696407"
RESPONSE_HEADER = {"end": 5}  # msgpack: 81 a3 'end' 05
RESPONSE_HEADER_HEX = "81a3656e6405"


def expected_hex(opcode: int, flags: int, request_id: int, header_hex: str, payload: bytes) -> str:
    """The prefix spelled out field by field: magic, version, opcode, flags, id, lengths."""
    return "".join(
        [
            "f1e5",  # magic 0xE5F1
            "01",  # version
            f"{opcode:02x}",
            f"{flags:02x}00",
            (request_id).to_bytes(8, "little").hex(),
            (len(header_hex) // 2).to_bytes(4, "little").hex(),
            len(payload).to_bytes(4, "little").hex(),
            header_hex,
            payload.hex(),
        ]
    )


def test_golden_prefix_spelled_out() -> None:
    data = encode_frame_bytes(Opcode.READ, 5, {"a": 1}, b"xy")
    assert data.hex() == "f1e5010d00000500000000000000040000000200000081a161017879"


@pytest.mark.parametrize("opcode", list(Opcode))
def test_golden_request_frame_per_opcode(opcode: Opcode) -> None:
    data = encode_frame_bytes(opcode, 0x0102030405060708, REQUEST_HEADER, b"\xe5")
    assert data.hex() == expected_hex(opcode, 0, 0x0102030405060708, REQUEST_HEADER_HEX, b"\xe5")
    [frame] = FrameDecoder().feed(data)
    assert frame == Frame(opcode, FrameFlags.NONE, 0x0102030405060708,
                          bytes.fromhex(REQUEST_HEADER_HEX), b"\xe5")
    assert frame.header() == REQUEST_HEADER and not frame.is_response


@pytest.mark.parametrize("opcode", list(Opcode))
def test_golden_response_frame_per_opcode(opcode: Opcode) -> None:
    data = encode_frame_bytes(opcode, 9, RESPONSE_HEADER, flags=FrameFlags.RESPONSE)
    assert data.hex() == expected_hex(opcode, 1, 9, RESPONSE_HEADER_HEX, b"")
    [frame] = FrameDecoder().feed(data)
    assert frame.is_response and not frame.is_error
    assert frame.header() == RESPONSE_HEADER and frame.payload == b""


def test_opcode_numbers_are_the_documented_ones() -> None:
    assert {op.name: int(op) for op in Opcode} == {
        "PING": 1, "AUTH": 2, "CREATE_RANGE": 10, "APPEND": 11, "SEAL": 12, "READ": 13,
        "DESCRIBE_RANGE": 14, "FORCE": 15, "CONFIRM": 16, "LIST_RANGES": 17, "DROP_RANGE": 18,
        "TIME_INDEX": 19, "APPEND_MANY": 20, "DROP_STREAM": 21,
        "PD_REGISTER_SERVER": 40, "PD_HEARTBEAT": 41, "PD_CREATE_STREAM": 42,
        "PD_DESCRIBE_STREAM": 43, "PD_LIST_STREAMS": 44, "PD_DELETE_STREAM": 45,
        "PD_OPEN_WRITER": 46, "PD_SEAL_RANGE": 47, "PD_TRIM_STREAM": 48,
        "PD_LIST_SERVERS": 49, "PD_CLUSTER": 50, "PD_UPDATE_REPLICAS": 51,
        "PD_WRITER_KEEPALIVE": 52, "PD_WRITERS_KEEPALIVE": 53,
        "PD_DRAIN_SERVER": 65, "PD_FORGET_SERVER": 66, "PD_DESCRIBE_SERVERS": 67,
        "PD_COMMIT_CURSOR": 70, "PD_LIST_CURSORS": 71, "PD_TIME_RANGES": 72,
        "PD_SET_RETENTION": 73, "PD_DELETE_CURSOR": 74,
        "PD_REPORT_OBJECT_DAMAGE": 75,
        "PD_GROUP_JOIN": 90, "PD_GROUP_AWAIT_JOIN": 91, "PD_GROUP_SYNC": 92,
        "PD_GROUP_HEARTBEAT": 93, "PD_GROUP_LEAVE": 94, "PD_GROUP_COMMIT": 95,
        "PD_GROUP_OFFSETS": 96, "PD_GROUP_DESCRIBE": 97, "PD_GROUP_LIST": 98,
        "PD_GROUP_DELETE_OFFSETS": 99, "PD_GATEWAY_HEARTBEAT": 100,
    }


def test_error_frame_round_trip() -> None:
    err = RangeSealed("sealed", stream_id=1, range_index=2, end_offset=30)
    data = b"".join(bytes(p) for p in encode_error(Opcode.APPEND, 4, err))
    [frame] = FrameDecoder().feed(data)
    assert frame.is_response and frame.is_error and frame.request_id == 4
    assert frame.header() == {"error": err.to_wire()}


def test_empty_header_encodes_to_zero_bytes() -> None:
    data = encode_frame_bytes(Opcode.PING, 1)
    assert len(data) == FRAME_PREFIX_BYTES
    [frame] = FrameDecoder().feed(data)
    assert frame.header() == {}


def test_payload_is_a_separate_buffer() -> None:
    payload = memoryview(b"batch-bytes")
    parts = encode_frame(Opcode.APPEND, 1, {"deferred": False}, payload)
    assert len(parts) == 2 and parts[1] is payload


def test_a_payload_of_parts_is_written_as_they_are() -> None:
    """An APPEND_MANY's batches go as buffers of their own (no joined copy), and the frame
    is byte for byte the one of their joined payload."""
    batches = [b"first", memoryview(b"second"), b"3"]
    parts = encode_frame(Opcode.APPEND_MANY, 7, {"sizes": [5, 6, 1]}, batches)
    assert parts[1:] == batches and all(a is b for a, b in zip(parts[1:], batches, strict=True))
    joined = encode_frame_bytes(Opcode.APPEND_MANY, 7, {"sizes": [5, 6, 1]}, b"firstsecond3")
    assert b"".join(bytes(part) for part in parts) == joined
    assert encode_frame(Opcode.PING, 1, None, [])[1:] == []


def sample_frame(request_id: int = 3, payload: bytes = b"payload!") -> bytes:
    return encode_frame_bytes(Opcode.APPEND, request_id, {"deferred": True}, payload)


def test_cut_at_every_byte_is_incomplete_then_completes() -> None:
    data = sample_frame()
    [whole] = FrameDecoder().feed(data)
    for cut in range(len(data)):
        decoder = FrameDecoder()
        assert decoder.feed(data[:cut]) == []
        assert decoder.buffered_bytes == cut
        assert decoder.feed(data[cut:]) == [whole]
        assert decoder.buffered_bytes == 0


def test_fed_byte_by_byte() -> None:
    data = sample_frame() + sample_frame(4, b"")
    decoder = FrameDecoder()
    frames: list[Frame] = []
    for i in range(len(data)):
        frames += decoder.feed(data[i : i + 1])
    assert [f.request_id for f in frames] == [3, 4]
    assert [f.payload for f in frames] == [b"payload!", b""]


def test_several_frames_in_one_feed() -> None:
    data = b"".join(sample_frame(i, bytes([i]) * i) for i in range(1, 6))
    decoder = FrameDecoder()
    frames = decoder.feed(data + sample_frame(9)[:10])
    assert [f.request_id for f in frames] == [1, 2, 3, 4, 5]
    assert [f.payload for f in frames] == [bytes([i]) * i for i in range(1, 6)]
    assert decoder.buffered_bytes == 10


def prefix(**overrides: int) -> bytes:
    fields = dict(magic=0xE5F1, version=1, opcode=11, flags=0, request_id=1,
                  header_bytes=0, payload_bytes=0)
    fields.update(overrides)
    return _PREFIX.pack(*fields.values())


def test_bad_magic() -> None:
    with pytest.raises(MalformedFrame, match="magic"):
        FrameDecoder().feed(prefix(magic=0xE5F2))


def test_bad_version() -> None:
    with pytest.raises(MalformedFrame, match="version"):
        FrameDecoder().feed(prefix(version=2))


def test_unknown_flags() -> None:
    with pytest.raises(MalformedFrame, match="flags"):
        FrameDecoder().feed(prefix(flags=4))


def test_known_flags_accepted() -> None:
    data = prefix(flags=int(FrameFlags.RESPONSE | FrameFlags.ERROR))
    [frame] = FrameDecoder().feed(data)
    assert frame.is_response and frame.is_error


def test_header_length_over_limit_raised_from_the_prefix_alone() -> None:
    decoder = FrameDecoder()
    with pytest.raises(FrameTooLarge) as info:
        decoder.feed(prefix(header_bytes=limits.frame_header_bytes_max + 1))
    assert info.value.fields == {
        "size": limits.frame_header_bytes_max + 1, "limit": limits.frame_header_bytes_max
    }
    assert decoder.buffered_bytes <= FRAME_PREFIX_BYTES  # the body was never awaited


def test_total_over_limit_raised_from_the_prefix_alone() -> None:
    decoder = FrameDecoder()
    payload = limits.frame_bytes_max - FRAME_PREFIX_BYTES + 1
    with pytest.raises(FrameTooLarge) as info:
        decoder.feed(prefix(payload_bytes=payload))
    assert info.value.fields["size"] == limits.frame_bytes_max + 1
    assert decoder.buffered_bytes <= FRAME_PREFIX_BYTES


def test_maximal_frame_prefix_is_accepted_and_waits() -> None:
    decoder = FrameDecoder()
    payload = limits.frame_bytes_max - FRAME_PREFIX_BYTES
    assert decoder.feed(prefix(payload_bytes=payload)) == []


def test_small_limits_are_honoured() -> None:
    decoder = FrameDecoder(frame_bytes_max=64, header_bytes_max=8)
    with pytest.raises(FrameTooLarge):
        decoder.feed(prefix(header_bytes=9))
    decoder = FrameDecoder(frame_bytes_max=64, header_bytes_max=8)
    with pytest.raises(FrameTooLarge):
        decoder.feed(prefix(payload_bytes=64 - FRAME_PREFIX_BYTES + 1))


def test_malformed_msgpack_header_is_a_frame_error_not_a_stream_error() -> None:
    bad = b"\xc1"  # never-used msgpack byte
    data = prefix(header_bytes=len(bad)) + bad
    [frame] = FrameDecoder().feed(data)
    with pytest.raises(MalformedFrame):
        frame.header()


def test_truncated_msgpack_header() -> None:
    bad = msgpack.packb({"key": "value"})[:-2]
    [frame] = FrameDecoder().feed(prefix(header_bytes=len(bad)) + bad)
    with pytest.raises(MalformedFrame):
        frame.header()


@pytest.mark.parametrize("value", [[1, 2], "text", 5, None, b"raw"])
def test_non_map_header(value: object) -> None:
    raw = msgpack.packb(value)
    [frame] = FrameDecoder().feed(prefix(header_bytes=len(raw)) + raw)
    with pytest.raises(MalformedFrame, match="not a map"):
        frame.header()


def test_encode_rejects_oversize_header_and_frame() -> None:
    with pytest.raises(FrameTooLarge):
        encode_frame(Opcode.PING, 1, {"x": b"a" * limits.frame_header_bytes_max})
    with pytest.raises(FrameTooLarge):
        encode_frame(Opcode.APPEND, 1, None, b"a" * limits.frame_bytes_max)


@pytest.mark.parametrize("request_id", [-1, 2**64])
def test_encode_rejects_out_of_range_request_id(request_id: int) -> None:
    with pytest.raises(InvalidArgument):
        encode_frame(Opcode.PING, request_id)


def test_good_frame_before_bad_prefix_in_one_feed_is_returned_then_error_raised() -> None:
    good = encode_frame_bytes(Opcode.PING, 1, {"a": 1})
    bad = b"\x00" * FRAME_PREFIX_BYTES
    decoder = FrameDecoder()
    frames = decoder.feed(good + bad)
    assert [f.request_id for f in frames] == [1]
    assert isinstance(decoder.error, MalformedFrame)
    with pytest.raises(MalformedFrame):
        decoder.feed(b"")


# ------------------------------------------------- direct mode (large answers, in place)


def _stream_of_frames() -> tuple[bytes, list[tuple[int, bytes]]]:
    """A small frame, a large one, a small one, a large one: bytes and (id, payload)."""
    frames = [(1, b"small"), (2, bytes(range(256)) * 40), (3, b""), (4, b"\xab" * 9_000)]
    wire = b"".join(
        encode_frame_bytes(Opcode.READ, rid, {"end": rid}, payload, FrameFlags.RESPONSE)
        for rid, payload in frames
    )
    return wire, frames


def _summary(frames: list[Frame]) -> list[tuple[int, dict[str, object], bytes]]:
    return [(f.request_id, f.header(), bytes(f.payload)) for f in frames]


@pytest.mark.parametrize("chunk", [1, 7, 1000, 4096, 100_000])
def test_direct_mode_feed_gives_the_same_frames_and_views_for_large_ones(chunk: int) -> None:
    wire, frames = _stream_of_frames()
    decoder = FrameDecoder(direct_bytes_min=1024)
    out: list[Frame] = []
    for pos in range(0, len(wire), chunk):
        out += decoder.feed(wire[pos : pos + chunk])
    assert _summary(out) == [(rid, {"end": rid}, payload) for rid, payload in frames]
    assert decoder.buffered_bytes == 0
    for frame in out:
        if len(frame.payload) >= 1024 and chunk < len(wire):
            assert isinstance(frame.payload, memoryview) and frame.payload.readonly


@pytest.mark.parametrize("sizes", [[1], [5, 3000, 17], [65536], [22, 1, 10_240, 2]])
def test_direct_mode_receive_into_get_buffer(sizes: list[int]) -> None:
    """The BufferedProtocol path: bytes land in get_buffer's buffer, up to its size."""
    wire, frames = _stream_of_frames()
    decoder = FrameDecoder(direct_bytes_min=1024)
    out: list[Frame] = []
    pos = turn = 0
    while pos < len(wire):
        buffer = decoder.get_buffer()
        n = min(len(buffer), sizes[turn % len(sizes)], len(wire) - pos)
        buffer[:n] = wire[pos : pos + n]
        out += decoder.buffer_updated(n)
        pos, turn = pos + n, turn + 1
    assert _summary(out) == [(rid, {"end": rid}, payload) for rid, payload in frames]
    direct = [f.request_id for f in out if isinstance(f.payload, memoryview)]
    assert set(direct) <= {2, 4}  # a large frame received whole is decoded as usual
    if max(sizes) < 1024:
        assert direct == [2, 4]


def test_direct_mode_keeps_checking_the_prefix_after_a_direct_frame() -> None:
    big = encode_frame_bytes(Opcode.READ, 1, {}, b"x" * 5000, FrameFlags.RESPONSE)
    decoder = FrameDecoder(direct_bytes_min=1024)
    assert decoder.feed(big[:100]) == []
    frames = decoder.feed(big[100:] + b"\x00" * FRAME_PREFIX_BYTES)
    assert [bytes(f.payload) for f in frames] == [b"x" * 5000]
    with pytest.raises(MalformedFrame):
        decoder.feed(b"")


def test_without_direct_mode_payloads_stay_bytes() -> None:
    wire, _ = _stream_of_frames()
    decoder = FrameDecoder()
    out = [f for pos in range(0, len(wire), 100) for f in decoder.feed(wire[pos : pos + 100])]
    assert all(isinstance(f.payload, bytes) for f in out) and len(out) == 4
