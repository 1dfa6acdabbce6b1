"""Batch system blocks (producer id and sequences) and per-stream entry digests (xxh3,
crc32c, hmac-sha256): round trips, old batches unchanged, forgery and misplacement refused."""

from __future__ import annotations

import pytest

from estream.wire.errors import (
    ChecksumMismatch,
    DigestKeyMissing,
    DigestMismatch,
    MalformedBatch,
)
from estream.wire.record import (
    BATCH_HEADER_BYTES,
    DIGEST_CRC32C,
    DIGEST_HMAC_SHA256,
    DIGEST_XXH3,
    Record,
    decode_batch,
    decode_columns,
    decode_header,
    decode_system,
    encode_batch,
    encode_records,
    restamp,
    stream_key,
    verify_batch,
    verify_digest,
    view_batch,
    wrap_records,
)

RECORDS = [Record(b"v%d" % i, {"k": str(i)} if i % 2 else {}, 1000 + i) for i in range(5)]
KEY = stream_key(b"cluster secret", 7)


def wrap(section, *, stream_id=7, range_index=2, base_offset=100, key=None):  # type: ignore[no-untyped-def]
    return wrap_records(section, stream_id=stream_id, range_index=range_index, epoch=3,
                        base_offset=base_offset, confirm_offset=90, key=key)


def test_plain_batches_are_unchanged_by_the_new_format() -> None:
    plain = encode_batch(RECORDS, stream_id=7, range_index=2, epoch=3, base_offset=100,
                         confirm_offset=90)
    assert plain == wrap(encode_records(RECORDS))
    assert plain[3] == 0 and decode_system(plain) is None
    verify_digest(plain, digest=DIGEST_XXH3, key=None, stream_id=7, range_index=2)


@pytest.mark.parametrize("sequences", [[10, 11, 12, 13, 14], [2, 5, 6, 90, 1 << 40]])
def test_producer_and_sequences_round_trip(sequences: list[int]) -> None:
    batch = wrap(encode_records(RECORDS, producer_id="p1", sequences=sequences))
    verify_batch(batch)
    system = decode_system(batch)
    assert system is not None and system.producer_id == "p1"
    assert [system.sequence(i) for i in range(5)] == sequences
    assert system.last_sequence == sequences[-1]
    assert (system.sequences is None) == (sequences == [10, 11, 12, 13, 14])
    decoded = decode_batch(batch)
    assert [r.value for r in decoded.records] == [r.value for r in RECORDS]
    assert [r.offset for r in decoded.records] == list(range(100, 105))
    assert decode_columns(batch, start=101, end=104).values() == [b"v1", b"v2", b"v3"]
    assert view_batch(batch).header.flags == 1


def test_sequences_must_increase_and_match_the_records() -> None:
    with pytest.raises(MalformedBatch):
        encode_records(RECORDS, producer_id="p", sequences=[1, 2, 2, 3, 4])
    with pytest.raises(MalformedBatch):
        encode_records(RECORDS, producer_id="p", sequences=[1, 2])
    with pytest.raises(MalformedBatch):
        encode_records(RECORDS, producer_id="p" * 256, sequences=[1, 2, 3, 4, 5])


def test_restamp_keeps_the_system_block() -> None:
    batch = wrap(encode_records(RECORDS, producer_id="p1", sequences=[4, 5, 6, 7, 9]))
    moved = restamp(batch, range_index=2, epoch=9, confirm_offset=101)
    header = verify_batch(moved)
    assert header.epoch == 9 and header.confirm_offset == 101
    assert decode_system(moved) == decode_system(batch)


def test_crc32c_digest() -> None:
    batch = wrap(encode_records(RECORDS, digest=DIGEST_CRC32C))
    header = verify_batch(batch)
    assert header.flags == DIGEST_CRC32C << 1 and decode_system(batch) is None
    verify_digest(batch, digest=DIGEST_CRC32C, key=None, stream_id=7, range_index=2)
    with pytest.raises(DigestMismatch):  # the stream says xxh3
        verify_digest(batch, digest=DIGEST_XXH3, key=None, stream_id=7, range_index=2)
    flipped = bytearray(batch)
    flipped[-1] ^= 1
    with pytest.raises(ChecksumMismatch):
        verify_batch(bytes(flipped))


def test_hmac_digest_verifies_and_refuses_forgery_and_misplacement() -> None:
    section = encode_records(RECORDS, producer_id="p1", sequences=[1, 2, 3, 4, 5],
                             digest=DIGEST_HMAC_SHA256)
    with pytest.raises(DigestKeyMissing):
        wrap(section)
    batch = wrap(section, key=KEY)
    verify_batch(batch)
    verify_digest(batch, digest=DIGEST_HMAC_SHA256, key=KEY, stream_id=7, range_index=2)
    assert decode_batch(batch).records[4].value == b"v4"
    with pytest.raises(DigestKeyMissing):
        verify_digest(batch, digest=DIGEST_HMAC_SHA256, key=None, stream_id=7, range_index=2)
    # Forged: right checksum, wrong key.
    forged = wrap(section, key=stream_key(b"another secret", 7))
    verify_batch(forged)
    with pytest.raises(DigestMismatch):
        verify_digest(forged, digest=DIGEST_HMAC_SHA256, key=KEY, stream_id=7, range_index=2)
    # Replayed into another range or stream (restamped by a server: checksum fixed up).
    for stream_id, range_index in ((7, 3), (8, 2)):
        head = bytearray(batch)
        head[4:12] = stream_id.to_bytes(8, "little")
        head[12:16] = range_index.to_bytes(4, "little")
        from estream.wire.record import compute_checksum
        head[64:72] = compute_checksum(bytes(head)).to_bytes(8, "little")
        verify_batch(bytes(head))
        with pytest.raises(DigestMismatch):
            verify_digest(bytes(head), digest=DIGEST_HMAC_SHA256, key=KEY,
                          stream_id=stream_id, range_index=range_index)
        with pytest.raises(DigestMismatch):  # and asked for the original place
            verify_digest(bytes(head), digest=DIGEST_HMAC_SHA256, key=KEY,
                          stream_id=7, range_index=2)
    # Moved to other offsets.
    with pytest.raises(DigestMismatch):
        moved = bytearray(batch)
        moved[24:32] = (200).to_bytes(8, "little")
        moved[64:72] = compute_checksum(bytes(moved)).to_bytes(8, "little")
        verify_digest(bytes(moved), digest=DIGEST_HMAC_SHA256, key=KEY, stream_id=7,
                      range_index=2)
    # A downgrade (a plain batch where the stream says hmac) is refused too.
    plain = wrap(encode_records(RECORDS))
    with pytest.raises(DigestMismatch):
        verify_digest(plain, digest=DIGEST_HMAC_SHA256, key=KEY, stream_id=7, range_index=2)
    # Restamping the epoch (recovery, repair) keeps the MAC valid; the range and the
    # confirm offset are covered, so a restamp (which has no key) may not change them.
    confirm = decode_header(batch).confirm_offset
    again = restamp(batch, range_index=2, epoch=11, confirm_offset=confirm)
    assert decode_header(again).epoch == 11
    verify_digest(again, digest=DIGEST_HMAC_SHA256, key=KEY, stream_id=7, range_index=2)
    with pytest.raises(MalformedBatch):
        restamp(batch, range_index=3, epoch=11, confirm_offset=confirm)
    with pytest.raises(MalformedBatch):
        restamp(batch, range_index=2, epoch=11, confirm_offset=confirm + 5)


def test_unknown_flags_and_bad_system_blocks_are_malformed() -> None:
    batch = bytearray(wrap(encode_records(RECORDS, producer_id="p", sequences=[1, 2, 3, 4, 5])))
    bad = bytearray(batch)
    bad[3] = 0x10  # 0x08 is KEYED since record keys; 0x10 is unknown
    with pytest.raises(MalformedBatch):
        decode_header(bytes(bad))
    bad = bytearray(batch)
    bad[3] = DIGEST_HMAC_SHA256 << 1  # hmac needs a system block
    with pytest.raises(MalformedBatch):
        decode_header(bytes(bad))
    bad = bytearray(batch)
    bad[BATCH_HEADER_BYTES:BATCH_HEADER_BYTES + 4] = (10**6).to_bytes(4, "little")
    with pytest.raises(MalformedBatch):
        decode_system(bytes(bad))
    with pytest.raises(MalformedBatch):
        decode_batch(bytes(bad), verify=False)
