"""The hmac-sha256 MAC of a batch: what it covers (mac_version 1: the header's confirm
offset and first/max timestamps too, never the epoch), legacy mac_version 0 batches still
verifying as they did, unknown versions refused, and the range server's check
(:func:`verify_mac`)."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from estream.wire.errors import DigestMismatch, MalformedBatch
from estream.wire.record import (
    BATCH_HEADER_BYTES,
    DIGEST_HMAC_SHA256,
    DIGEST_XXH3,
    MAC_BYTES,
    MAC_VERSION,
    Record,
    compute_checksum,
    decode_header,
    decode_system,
    encode_batch,
    encode_records,
    is_hmac_batch,
    records_at,
    restamp,
    stream_key,
    verify_batch,
    verify_digest,
    verify_mac,
    wrap_records,
)

RECORDS = [Record(b"value-%d" % i, {"h": str(i)}, 5000 + i) for i in range(4)]
KEY = stream_key(b"cluster secret", 9)


def hmac_batch(*, confirm: int = 40, key: bytes = KEY, producer: str = "p") -> bytes:
    section = encode_records(RECORDS, producer_id=producer, sequences=[0, 1, 2, 3],
                             digest=DIGEST_HMAC_SHA256)
    return wrap_records(section, stream_id=9, range_index=1, epoch=4, base_offset=50,
                        confirm_offset=confirm, key=key)


def rechecksum(batch: bytearray) -> bytes:
    batch[64:72] = compute_checksum(bytes(batch)).to_bytes(8, "little")
    verify_batch(bytes(batch))
    return bytes(batch)


def check(batch: bytes) -> None:
    verify_digest(batch, digest=DIGEST_HMAC_SHA256, key=KEY, stream_id=9, range_index=1)


def test_writers_write_mac_version_1_and_it_verifies() -> None:
    batch = hmac_batch()
    system = decode_system(batch)
    assert system is not None and system.mac_version == MAC_VERSION == 1
    assert len(system.mac) == MAC_BYTES
    check(batch)
    verify_mac(batch, KEY)
    assert is_hmac_batch(batch)
    assert not is_hmac_batch(encode_batch(RECORDS, stream_id=9, range_index=1, epoch=4,
                                          base_offset=50))


@pytest.mark.parametrize(("field", "at", "size", "value"), [
    ("confirm_offset", 36, 8, 49),
    ("first_timestamp", 44, 8, 1),
    ("max_timestamp", 52, 8, 2**40),
    ("base_offset", 24, 8, 51),
    ("range_index", 12, 4, 2),
    ("stream_id", 4, 8, 10),
])
def test_every_header_field_but_the_epoch_is_covered(
    field: str, at: int, size: int, value: int
) -> None:
    """A party without the key changes one field and fixes up the checksum: the batch is
    still well formed, and its MAC no longer verifies (on APPEND, and for a reader)."""
    tampered = bytearray(hmac_batch())
    tampered[at : at + size] = value.to_bytes(size, "little")
    forged = rechecksum(tampered)
    assert getattr(decode_header(forged), field) == value
    with pytest.raises(DigestMismatch):
        verify_mac(forged, KEY)
    with pytest.raises(DigestMismatch):
        check(forged)


def test_the_epoch_is_not_covered_so_copies_restamp_it_without_the_key() -> None:
    batch = hmac_batch()
    again = restamp(batch, range_index=1, epoch=77, confirm_offset=40)
    assert decode_header(again).epoch == 77
    verify_mac(again, KEY)
    check(again)
    with pytest.raises(MalformedBatch):  # a restamp cannot change the covered confirm
        restamp(batch, range_index=1, epoch=77, confirm_offset=41)


def test_records_and_system_block_are_covered() -> None:
    batch = hmac_batch()
    header = decode_header(batch)
    for at in (BATCH_HEADER_BYTES + 24, records_at(batch, header) + 20, len(batch) - 1):
        tampered = bytearray(batch)
        tampered[at] ^= 0x01
        with pytest.raises(DigestMismatch):
            verify_mac(rechecksum(tampered), KEY)


def test_a_wrong_key_is_refused() -> None:
    forged = hmac_batch(key=stream_key(b"another secret", 9))
    verify_batch(forged)  # right checksum
    with pytest.raises(DigestMismatch):
        verify_mac(forged, KEY)
    with pytest.raises(DigestMismatch):  # nor is another stream's key right
        verify_mac(hmac_batch(key=stream_key(b"cluster secret", 8)), KEY)


def legacy_batch(confirm: int = 40) -> bytes:
    """A batch as writers wrote it before mac_version existed: byte 7 of the system block
    0, the MAC over stream, range, base offset, count and flags only."""
    unkeyed = bytearray(hmac_batch(key=b"x"))
    header = decode_header(bytes(unkeyed))
    unkeyed[BATCH_HEADER_BYTES + 7] = 0
    unkeyed[36:44] = confirm.to_bytes(8, "little")
    end = records_at(bytes(unkeyed), header)
    mac = hmac.new(KEY, (9).to_bytes(8, "little") + (1).to_bytes(4, "little")
                   + (50).to_bytes(8, "little") + (4).to_bytes(4, "little")
                   + bytes([header.flags]), hashlib.sha256)
    mac.update(bytes(unkeyed[BATCH_HEADER_BYTES : end - MAC_BYTES]))
    mac.update(bytes(unkeyed[end:]))
    unkeyed[end - MAC_BYTES : end] = mac.digest()
    return rechecksum(unkeyed)


def test_legacy_mac_version_0_batches_still_verify_as_they_did() -> None:
    old = legacy_batch()
    system = decode_system(old)
    assert system is not None and system.mac_version == 0
    verify_mac(old, KEY)
    check(old)
    # What version 0 never covered still is not covered for it (its documented limit).
    again = restamp(old, range_index=1, epoch=5, confirm_offset=44)
    verify_mac(again, KEY)
    # ... while a version 1 batch cannot be passed off as a version 0 one: the version
    # byte is under the MAC.
    downgraded = bytearray(hmac_batch())
    downgraded[BATCH_HEADER_BYTES + 7] = 0
    with pytest.raises(DigestMismatch):
        verify_mac(rechecksum(downgraded), KEY)


def test_an_unknown_mac_version_is_malformed() -> None:
    future = bytearray(hmac_batch())
    future[BATCH_HEADER_BYTES + 7] = 2
    batch = rechecksum(future)
    with pytest.raises(MalformedBatch):
        decode_system(batch)
    with pytest.raises(MalformedBatch):
        verify_mac(batch, KEY)
    # Without a MAC the byte stays 0.
    plain = bytearray(wrap_records(encode_records(RECORDS, producer_id="p"), stream_id=9,
                                   range_index=1, epoch=4, base_offset=50))
    plain[BATCH_HEADER_BYTES + 7] = 1
    with pytest.raises(MalformedBatch):
        decode_system(rechecksum(plain))


def test_verify_mac_refuses_a_batch_that_is_not_hmac() -> None:
    plain = wrap_records(encode_records(RECORDS, digest=DIGEST_XXH3), stream_id=9,
                         range_index=1, epoch=4, base_offset=50)
    with pytest.raises(MalformedBatch):
        verify_mac(plain, KEY)
