"""WAL entry framing and the recovery decisions: torn tail (truncate) vs mid-log damage."""

from __future__ import annotations

import pytest

from estream.wire.record import Record, encode_batch
from rangeserver import walformat as wf
from rangeserver.walformat import Verdict


def batch_bytes(base: int, n: int = 3, stream_id: int = 1, range_index: int = 0) -> bytes:
    records = [Record(bytes([65 + i]) * 20, {"k": str(i)}, 1000 + i) for i in range(n)]
    return encode_batch(
        records, stream_id=stream_id, range_index=range_index, epoch=1, base_offset=base
    )


def batch_entry(base: int, **kw: int) -> bytes:
    body = batch_bytes(base, **kw)
    return wf.batch_entry_header(body) + body


CONTROLS: list[wf.Control] = [
    wf.CreateRange(1, 0, 0, 1),
    wf.EpochRaised(1, 0, 4),
    wf.Sealed(1, 0, 4, 6),
    wf.Dropped(1, 0),
    wf.Confirmed(1, 0, 4, 9),
    wf.DamageMarked(1, 0),
]


def log_of(*entries: bytes) -> bytes:
    return b"".join(entries)


def sample_log() -> tuple[bytes, list[int]]:
    """A create, three batches and a seal; returns the bytes and each entry's start."""
    entries = [
        wf.encode_control(CONTROLS[0]),
        batch_entry(0),
        batch_entry(3),
        wf.encode_control(CONTROLS[1]),
        batch_entry(6),
    ]
    starts, pos = [], 0
    for entry in entries:
        starts.append(pos)
        pos += len(entry)
    return log_of(*entries), starts


def test_golden_entry_header() -> None:
    entry = wf.encode_control(wf.EpochRaised(1, 0, 4))
    assert entry[:8] == bytes.fromhex("a1e5030014000000")  # magic, type 3, length 20
    assert len(entry) == wf.ENTRY_HEADER_BYTES + 20


def test_golden_confirm_and_damaged_entries() -> None:
    """Type 6 CONFIRM {stream_id u64, range_index u32, epoch u64, confirm u64} and type 7
    DAMAGED {stream_id u64, range_index u32}, little-endian."""
    confirm = wf.encode_control(wf.Confirmed(0x0102, 3, 4, 0x0506))
    assert confirm[:8] == bytes.fromhex("a1e506001c000000")  # magic, type 6, length 28
    assert confirm[16:] == bytes.fromhex(
        "0201000000000000" "03000000" "0400000000000000" "0605000000000000"
    )
    assert wf.confirm_entry(0x0102, 3, 4, 0x0506) == confirm  # the confirm path's encoder
    damaged = wf.encode_control(wf.DamageMarked(0x0102, 3))
    assert damaged[:8] == bytes.fromhex("a1e507000c000000")  # magic, type 7, length 12
    assert damaged[16:] == bytes.fromhex("0201000000000000" "03000000")


@pytest.mark.parametrize("control", CONTROLS)
def test_control_round_trip(control: wf.Control) -> None:
    result = wf.scan(wf.encode_control(control))
    assert result.verdict is Verdict.CLEAN
    assert [e.control for e in result.entries] == [control]


def test_clean_log_yields_every_entry_in_order() -> None:
    data, starts = sample_log()
    result = wf.scan(data)
    assert result.verdict is Verdict.CLEAN
    assert result.valid_end == len(data)
    assert [e.position for e in result.entries] == starts
    batches = [e.batch.base_offset for e in result.entries if e.batch is not None]
    assert batches == [0, 3, 6]
    assert bytes(result.entries[1].body) == batch_bytes(0)


def test_empty_log_is_clean() -> None:
    assert wf.scan(b"") == wf.ScanResult([], 0, Verdict.CLEAN)


def test_torn_at_every_byte_of_the_last_entry_truncates_there() -> None:
    data, starts = sample_log()
    last = starts[-1]
    for cut in range(last + 1, len(data)):
        result = wf.scan(data[:cut])
        assert result.verdict is Verdict.TORN_TAIL, cut
        assert result.valid_end == last, cut
        assert len(result.entries) == len(starts) - 1
        assert not result.damage


@pytest.mark.parametrize("zeros", [1, 15, 16, 17, 4096])
def test_zero_filled_tail_is_torn(zeros: int) -> None:
    data, _ = sample_log()
    result = wf.scan(data + bytes(zeros))
    assert result.verdict is Verdict.TORN_TAIL
    assert result.valid_end == len(data)
    assert len(result.entries) == 5


def test_garbage_tail_with_nothing_valid_after_is_torn() -> None:
    data, _ = sample_log()
    result = wf.scan(data + b"\xa1\xe5garbage that is not an entry" * 10)
    assert result.verdict is Verdict.TORN_TAIL
    assert result.valid_end == len(data)


def test_last_entry_overwritten_by_zeros_is_torn() -> None:
    data, starts = sample_log()
    torn = data[: starts[-1]] + bytes(len(data) - starts[-1])
    result = wf.scan(torn)
    assert result.verdict is Verdict.TORN_TAIL and result.valid_end == starts[-1]


def test_flipped_byte_in_every_position_of_a_middle_entry_is_damage() -> None:
    data, starts = sample_log()
    first, end = starts[2], starts[3]  # the batch at offset 3
    for i in range(first, end):
        flipped = bytearray(data)
        flipped[i] ^= 0x40
        result = wf.scan(bytes(flipped))
        assert result.verdict is Verdict.DAMAGED, i
        assert [(d.start, d.end) for d in result.damage] == [(first, end)], i
        assert result.valid_end == len(data), "nothing truncated"
        assert [e.position for e in result.entries] == starts[:2] + starts[3:], i


def test_damage_names_the_batch_when_its_header_is_readable() -> None:
    data, starts = sample_log()
    flipped = bytearray(data)
    flipped[starts[3] - 5] ^= 0xFF  # inside the records of the batch at offset 3
    (damage,) = wf.scan(bytes(flipped)).damage
    assert damage.batch is not None and damage.batch.base_offset == 3
    assert "batch" in damage.reason


def test_damaged_length_field_resynchronises_on_the_next_valid_entry() -> None:
    data, starts = sample_log()
    broken = bytearray(data)
    broken[starts[1] + 4 : starts[1] + 8] = (10**6).to_bytes(4, "little")
    result = wf.scan(bytes(broken))
    assert result.verdict is Verdict.DAMAGED
    assert result.damage[0].start == starts[1] and result.damage[0].end == starts[2]
    assert [e.position for e in result.entries] == [starts[0], *starts[2:]]


def test_damage_followed_by_a_torn_tail() -> None:
    data, starts = sample_log()
    broken = bytearray(data[:-3])  # torn last entry
    broken[starts[1] + 30] ^= 1  # and damage in the middle
    result = wf.scan(bytes(broken))
    assert result.verdict is Verdict.DAMAGED
    assert result.valid_end == starts[-1]
    assert len(result.damage) == 1


def test_two_damaged_entries() -> None:
    data, starts = sample_log()
    broken = bytearray(data)
    broken[starts[1] + 20] ^= 1
    broken[starts[3] + 20] ^= 1
    result = wf.scan(bytes(broken))
    assert [d.start for d in result.damage] == [starts[1], starts[3]]
    assert [e.position for e in result.entries] == [starts[0], starts[2], starts[4]]


@pytest.mark.parametrize("after", [0, 4096], ids=["at the end", "before zeros"])
def test_flipped_byte_in_every_position_of_the_last_entry_is_tail_damage(after: int) -> None:
    """A whole last entry that fails its checks was written and then changed (a torn
    write leaves an all-zero sector or ends early): tail damage, named by its batch
    header when that still reads, and still cut at ``valid_end`` (the caller decides)."""
    data, starts = sample_log()
    last = starts[-1]
    for i in range(last, len(data)):
        flipped = bytearray(data + bytes(after))
        flipped[i] ^= 0x40
        result = wf.scan(bytes(flipped))
        assert result.verdict is Verdict.DAMAGED, i
        assert result.valid_end == last and not result.damage, i
        tail = result.tail_damage
        assert tail is not None and tail.start == last, i
        if i >= last + wf.ENTRY_HEADER_BYTES + 72:  # in the records: the header names it
            assert tail.names == (1, 0) and tail.batch is not None, i
            assert tail.batch.base_offset == 6 and tail.end == len(data), i


def test_a_whole_batch_behind_a_broken_entry_header_is_tail_damage() -> None:
    data, starts = sample_log()
    broken = bytearray(data)
    broken[starts[-1]] ^= 0xFF  # the magic
    tail = wf.scan(bytes(broken)).tail_damage
    assert tail is not None and tail.names == (1, 0) and "whole" in tail.reason
    assert tail.end == len(data)


def test_flipped_byte_in_a_last_control_entry_names_its_replica() -> None:
    data = wf.encode_control(CONTROLS[0]) + wf.encode_control(wf.Confirmed(5, 2, 4, 9))
    broken = bytearray(data)
    broken[-1] ^= 0x01  # inside the confirm offset
    result = wf.scan(bytes(broken))
    assert result.verdict is Verdict.DAMAGED and result.valid_end == len(data) - 44
    assert result.tail_damage is not None and result.tail_damage.names == (5, 2)
    assert result.tail_damage.control == wf.Confirmed(5, 2, 4, 9 ^ (1 << 56))


def big_log() -> tuple[bytes, int]:
    """A create and a batch of about 5 KiB: the batch spans several 512-byte sectors."""
    records = [Record(f"value-{i:05d}".encode() * 2, {"k": str(i)}, 1000 + i) for i in range(200)]
    body = encode_batch(records, stream_id=1, range_index=0, epoch=1, base_offset=0)
    entries = wf.encode_control(CONTROLS[0]) + wf.batch_entry_header(body) + body
    return entries, len(wf.encode_control(CONTROLS[0]))


def sector_zeroed(data: bytes, sector: int, base: int = 0) -> bytes:
    """``data`` (at file offset ``base``) with file sector ``sector`` zeroed."""
    at = sector * wf.torn_sector_bytes - base
    return data[:at] + bytes(wf.torn_sector_bytes) + data[at + wf.torn_sector_bytes :]


def test_a_last_entry_with_an_unwritten_sector_is_torn_not_damaged() -> None:
    """A crash may write some sectors of a group and not others; those read as zeros."""
    data, last = big_log()
    assert len(data) > 8 * wf.torn_sector_bytes
    for sector in (1, 4, len(data) // wf.torn_sector_bytes - 1):
        result = wf.scan(sector_zeroed(data, sector))
        assert result.verdict is Verdict.TORN_TAIL, sector
        assert result.valid_end == last and result.tail_damage is None, sector


def test_a_last_entry_written_only_in_part_is_torn() -> None:
    """A write cut at a sector boundary inside a full-size segment: zeros after it."""
    data, last = big_log()
    cut = 3 * wf.torn_sector_bytes
    result = wf.scan(data[:cut] + bytes(len(data) - cut + 4096))
    assert result.verdict is Verdict.TORN_TAIL and result.tail_damage is None
    assert result.valid_end == last


def test_sectors_are_aligned_in_the_file_not_in_the_buffer() -> None:
    """Recovery scans from a checkpoint position: ``base`` says where the buffer is."""
    data, last = big_log()
    base = 100  # the buffer starts at file offset 100
    torn = sector_zeroed(data, 3, base)
    assert wf.scan(torn, base=base).verdict is Verdict.TORN_TAIL
    # The same bytes taken as starting at offset 0: that zero run is not a whole sector.
    shifted = wf.scan(torn)
    assert shifted.verdict is Verdict.DAMAGED and shifted.tail_damage is not None


def test_scan_accepts_a_memoryview_slice() -> None:
    data, starts = sample_log()
    result = wf.scan(memoryview(b"xx" + data)[2:])
    assert [e.position for e in result.entries] == starts
