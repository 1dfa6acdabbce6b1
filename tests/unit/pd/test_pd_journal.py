"""The PD's checksummed Raft journal: record codec, torn tail vs damage, the file."""

from __future__ import annotations

import pytest

from estream.wire.errors import ChecksumMismatch
from pd.shell.journal import (
    HEADER,
    decode_checked,
    encode_checked,
    encode_record,
    scan,
)

ENTRIES = [(b"command-%d" % i * (i + 1), i, 1 + i // 3) for i in range(1, 8)]


def journal_bytes(entries: list[tuple[bytes, int, int]] = ENTRIES) -> bytes:
    return HEADER + b"".join(encode_record(*e) for e in entries)


def test_records_round_trip() -> None:
    found = scan(journal_bytes())
    assert found.entries == ENTRIES
    assert found.torn == "" and found.valid_end == len(journal_bytes())


def test_a_last_record_cut_at_any_byte_is_a_torn_tail() -> None:
    data = journal_bytes()
    last_start = len(journal_bytes(ENTRIES[:-1]))
    for cut in range(last_start + 1, len(data)):
        found = scan(data[:cut])
        assert found.entries == ENTRIES[:-1], cut
        assert found.valid_end == last_start and found.torn, cut


def test_zeros_after_the_last_record_are_a_torn_tail() -> None:
    found = scan(journal_bytes() + bytes(4096))
    assert found.entries == ENTRIES and found.torn == "zero fill"


def test_a_changed_byte_in_the_last_record_is_a_torn_tail() -> None:
    data = bytearray(journal_bytes())
    data[-1] ^= 0xFF
    found = scan(bytes(data))
    assert found.entries == ENTRIES[:-1] and found.torn == "checksum mismatch"


@pytest.mark.parametrize("which", range(len(ENTRIES) - 1))
def test_a_changed_byte_before_the_last_record_is_damage(which: int) -> None:
    data = bytearray(journal_bytes())
    start = len(journal_bytes(ENTRIES[:which]))
    for offset in (0, 5, 13, 20, len(encode_record(*ENTRIES[which])) - 1):
        damaged = bytearray(data)
        damaged[start + offset] ^= 0x01
        with pytest.raises(ChecksumMismatch, match=f"damaged record at byte {start}"):
            scan(bytes(damaged))


def test_a_foreign_or_future_file_is_refused() -> None:
    with pytest.raises(ChecksumMismatch, match="bad header"):
        scan(b"PYSYNCOBJ" + bytes(40))
    with pytest.raises(ChecksumMismatch, match="version 2"):
        scan(b"ESPDJRNL" + (2).to_bytes(4, "little") + bytes(4))


def test_checked_maps_detect_every_changed_byte() -> None:
    data = encode_checked({"term": 7, "voted_for": "127.0.0.1:7110", "commit_index": 42})
    assert decode_checked(data, "meta")["term"] == 7
    for i in range(len(data)):
        damaged = bytearray(data)
        damaged[i] ^= 0x40
        with pytest.raises(ChecksumMismatch):
            decode_checked(bytes(damaged), "meta")
    with pytest.raises(ChecksumMismatch):
        decode_checked(b"", "meta")


@pytest.mark.parametrize("byte", [1, 2, 3])
def test_a_damaged_length_field_does_not_hide_the_records_after_it(byte: int) -> None:
    """A length made larger runs past the end of the file, like a torn write; the valid
    records after it make it damage."""
    data = bytearray(journal_bytes())
    start = len(journal_bytes(ENTRIES[:2]))
    data[start + byte] ^= 0x10
    with pytest.raises(ChecksumMismatch, match="a valid record at byte"):
        scan(bytes(data))
