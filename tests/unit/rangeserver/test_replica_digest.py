"""A replica's recorded digest (rangeserver/replica.py, walformat.py, replay.py and the
checkpoint's pure codec): APPEND refuses a batch of another digest than the one its
CREATE_RANGE recorded; logs and checkpoints written before digests were recorded still
replay, their replicas accepting any digest as before."""

from __future__ import annotations

import pytest

from estream.wire.errors import DigestMismatch
from estream.wire.record import (
    DIGEST_CRC32C,
    DIGEST_HMAC_SHA256,
    DIGEST_XXH3,
    BatchHeader,
    Record,
    decode_header,
    encode_records,
    stream_key,
    wrap_records,
)
from rangeserver import replica as rp
from rangeserver import walformat as wf
from rangeserver.index import RangeIndex
from rangeserver.refusals import append_refusal
from rangeserver.replay import Replay
from rangeserver.replica import ReplicaState
from rangeserver.retention import Span
from rangeserver.shell import checkpoint as ckpt

KEY = (7, 2)


def header(digest: int, base: int = 0, count: int = 1) -> BatchHeader:
    section = encode_records([Record(b"v", {}, 1)] * count, digest=digest)
    raw = wrap_records(section, stream_id=KEY[0], range_index=KEY[1], epoch=1,
                       base_offset=base, key=stream_key(b"s", KEY[0]))
    return decode_header(raw)


def created(digest: int | None) -> ReplicaState:
    outcome = rp.decide_create(None, *KEY, 0, 1, digest)
    assert isinstance(outcome, rp.Create)
    return outcome.state


# ------------------------------------------------------------------------------ decide


@pytest.mark.parametrize("recorded", [DIGEST_XXH3, DIGEST_CRC32C, DIGEST_HMAC_SHA256])
@pytest.mark.parametrize("sent", [DIGEST_XXH3, DIGEST_CRC32C, DIGEST_HMAC_SHA256])
def test_append_takes_the_recorded_digest_only(recorded: int, sent: int) -> None:
    outcome = rp.decide_append(created(recorded), header(sent))
    if sent == recorded:
        assert isinstance(outcome, rp.Accept) and outcome.state.digest == recorded
    else:
        assert outcome == rp.WrongDigest(recorded, sent, 0)


@pytest.mark.parametrize("sent", [DIGEST_XXH3, DIGEST_CRC32C, DIGEST_HMAC_SHA256])
def test_a_replica_without_a_recorded_digest_accepts_any(sent: int) -> None:
    assert isinstance(rp.decide_append(created(None), header(sent)), rp.Accept)


def test_the_digest_row_comes_first() -> None:
    """Not acknowledged as a duplicate, nor answered sealed or damaged: refused."""
    state = created(DIGEST_HMAC_SHA256)
    accepted = rp.decide_append(state, header(DIGEST_HMAC_SHA256, count=3))
    assert isinstance(accepted, rp.Accept)
    for s in (accepted.state, rp.mark_damaged(state), rp.replay_seal(state, 1, 0)):
        assert isinstance(rp.decide_append(s, header(DIGEST_XXH3)), rp.WrongDigest)


def test_the_refusal_is_a_typed_digest_mismatch() -> None:
    error = append_refusal(KEY, rp.WrongDigest(DIGEST_HMAC_SHA256, DIGEST_XXH3, 40))
    assert isinstance(error, DigestMismatch)
    assert error.fields == {"stream_id": 7, "range_index": 2, "base_offset": 40}
    assert "xxh3" in error.message and "hmac-sha256" in error.message


def test_an_unknown_recorded_digest_refuses_every_batch() -> None:
    """A code written by a later version: nothing this one sends matches; reads still
    work (the replica is not damaged)."""
    state = created(5)
    for sent in (DIGEST_XXH3, DIGEST_CRC32C, DIGEST_HMAC_SHA256):
        assert isinstance(rp.decide_append(state, header(sent)), rp.WrongDigest)
    assert not state.damaged and state.describe()["digest"] == "5"


def test_create_records_the_digest_and_an_existing_replica_keeps_its_own() -> None:
    state = created(DIGEST_HMAC_SHA256)
    assert state.digest == DIGEST_HMAC_SHA256
    assert state.describe()["digest"] == "hmac-sha256"
    assert rp.decide_create(state, *KEY, 0, 1, DIGEST_HMAC_SHA256) == rp.Exists(state, False)
    assert rp.decide_create(state, *KEY, 0, 1, None) == rp.Exists(state, False)
    assert rp.decide_create(state, *KEY, 0, 1, DIGEST_XXH3) == rp.DigestConflict(
        DIGEST_HMAC_SHA256, DIGEST_XXH3)
    # Fencing and start conflicts come first, as before.
    assert isinstance(rp.decide_create(state, *KEY, 0, 0, DIGEST_XXH3), rp.StaleEpoch)
    assert isinstance(rp.decide_create(state, *KEY, 5, 1, DIGEST_XXH3), rp.StartConflict)
    # A replica recorded without one stays so (its log entry says nothing).
    legacy = created(None)
    raised = rp.decide_create(legacy, *KEY, 0, 2, DIGEST_HMAC_SHA256)
    assert isinstance(raised, rp.Exists) and raised.state.digest is None
    assert "digest" not in legacy.describe()


# ------------------------------------------------------------------------------- log


def test_golden_create_range_entries_old_and_new() -> None:
    """Version 0 (28-byte body, no digest) is written exactly as before; version 1 adds
    the digest byte (29 bytes)."""
    old = wf.encode_control(wf.CreateRange(0x0102, 3, 4, 5))
    assert old[:8] == bytes.fromhex("a1e502001c000000")  # magic, type 2, length 28
    assert old[16:] == bytes.fromhex(
        "0201000000000000" "03000000" "0400000000000000" "0500000000000000")
    new = wf.encode_control(wf.CreateRange(0x0102, 3, 4, 5, DIGEST_HMAC_SHA256))
    assert new[:8] == bytes.fromhex("a1e502001d000000")  # length 29
    assert new[16:] == old[16:] + b"\x02"
    for entry, digest in ((old, None), (new, DIGEST_HMAC_SHA256)):
        result = wf.scan(entry)
        assert result.verdict is wf.Verdict.CLEAN
        assert result.entries[0].control == wf.CreateRange(0x0102, 3, 4, 5, digest)


def batch_entry(digest: int, base: int) -> bytes:
    section = encode_records([Record(b"r%d" % base, {}, 1)], digest=digest)
    body = wrap_records(section, stream_id=KEY[0], range_index=KEY[1], epoch=1,
                        base_offset=base, key=stream_key(b"s", KEY[0]))
    return wf.batch_entry_header(body) + body


@pytest.mark.parametrize("digest", [None, DIGEST_XXH3, DIGEST_HMAC_SHA256])
def test_replay_restores_the_recorded_digest(digest: int | None) -> None:
    data = wf.encode_control(wf.CreateRange(*KEY, 0, 1, digest)) + batch_entry(
        DIGEST_HMAC_SHA256 if digest is None else digest, 0)
    replay = Replay()
    replay.segment(0, 0, data, len(data), last=True)
    replay.finish()
    state = replay.replicas[KEY]
    assert state.digest == digest and state.end == 1 and not state.damaged
    if digest is not None:  # after a restart, the replica still refuses other digests
        other = DIGEST_CRC32C
        assert isinstance(rp.decide_append(state, header(other, base=1)), rp.WrongDigest)
    else:  # an old log: any digest, as before
        assert isinstance(rp.decide_append(state, header(DIGEST_CRC32C, base=1)), rp.Accept)


def test_a_log_mixing_old_and_new_create_range_entries_replays() -> None:
    other = (8, 0)
    data = b"".join([
        wf.encode_control(wf.CreateRange(*KEY, 0, 1)),  # written before digests
        batch_entry(DIGEST_XXH3, 0),
        wf.encode_control(wf.CreateRange(*other, 0, 1, DIGEST_HMAC_SHA256)),
        wf.encode_control(wf.Sealed(*KEY, 1, 1)),
    ])
    replay = Replay()
    _, cut = replay.segment(0, 0, data, len(data), last=True)
    replay.finish()
    assert cut is None and replay.report == []
    assert replay.replicas[KEY].digest is None and replay.replicas[KEY].sealed
    assert replay.replicas[other].digest == DIGEST_HMAC_SHA256


def test_a_damaged_last_new_create_range_is_cut_like_a_torn_tail() -> None:
    """Its body still names the replica: as for the old entry, a CREATE_RANGE of a
    replica holding nothing yet is cut and marks nothing."""
    entry = bytearray(wf.encode_control(wf.CreateRange(*KEY, 0, 1, DIGEST_HMAC_SHA256)))
    entry[-1] ^= 0x01
    replay = Replay()
    _, cut = replay.segment(0, 0, bytes(entry), len(entry), last=True)
    replay.finish()
    assert cut is not None and cut.position == 0 and cut.marks == b""
    assert replay.replicas == {}


# ------------------------------------------------------------------------ checkpoint


def checkpoint_of(state: ReplicaState) -> ckpt.Checkpoint:
    return ckpt.Checkpoint(0, 0, {state.key: state}, {state.key: RangeIndex()},
                           {state.key: Span(0, 0)}, [])


@pytest.mark.parametrize("digest", [None, DIGEST_CRC32C, DIGEST_HMAC_SHA256])
def test_a_checkpoint_keeps_the_digest(digest: int | None) -> None:
    state = created(digest)
    decoded = ckpt.decode(ckpt.encode(checkpoint_of(state)))
    assert decoded.replicas[KEY] == state


def test_a_checkpoint_written_before_digests_loads_without_one() -> None:
    """The same bytes an older version wrote: no "digest" key."""
    import msgpack
    import xxhash

    state = created(None)
    data = ckpt.encode(checkpoint_of(state))
    raw = msgpack.unpackb(data[:-8], strict_map_key=False)
    assert "digest" not in raw["replicas"][0]  # a replica without one is written as before
    decoded = ckpt.decode(data)
    assert decoded.replicas[KEY].digest is None
    raw["replicas"][0]["digest"] = "hmac-sha256"  # not a code: an invalid checkpoint
    body = msgpack.packb(raw)
    with pytest.raises(ValueError, match="digest"):
        ckpt.decode(body + xxhash.xxh3_64_intdigest(body).to_bytes(8, "little"))
