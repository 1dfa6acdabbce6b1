"""The MAC keys of ``hmac-sha256`` streams, on the client's side: each stream's key from
the client's cluster secret (:func:`stream_key_of`), the digest and key a reader checks a
cached stream's batches against (:func:`cached_entry_digest`), and the check at
``open_writer`` that the client's key is the one the stream's entries were written with
(:func:`check_key`). :class:`~estream.sdk.client.Client` keeps the secret and calls these.

Side effects: :func:`check_key` READs a range's first batch from its replicas.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from estream.net.rangeclient import RangeClient
from estream.net.rpc import ConnectionPool
from estream.wire.errors import DigestKeyMissing, DigestMismatch, EstreamError
from estream.wire.meta import DIGEST_DEFAULT, RangeMeta, StreamMeta
from estream.wire.record import (
    DIGEST_HMAC_SHA256,
    DIGEST_XXH3,
    DIGESTS,
    iter_batches,
    stream_key,
    verify_batch,
    verify_digest,
)

key_check_timeout_s: Final = 2.0  # each READ of open_writer's key check (an hmac-sha256 stream)


def stream_key_of(secret: bytes | None, meta: StreamMeta) -> bytes | None:
    """The MAC key of a stream whose digest is ``hmac-sha256`` (None for other digests),
    derived from the cluster ``secret``; :class:`DigestKeyMissing` without one."""
    if getattr(meta, "digest", DIGEST_DEFAULT) != "hmac-sha256":
        return None
    if not secret:
        raise DigestKeyMissing(
            f"stream {meta.name!r} is MACed (hmac-sha256): connect with secret= (or "
            "set ESTREAM_SECRET) to the cluster secret", stream=meta.name)
    return stream_key(secret, meta.id)


def cached_entry_digest(cached: Iterable[StreamMeta], stream_id: int, secret: bytes | None
                        ) -> tuple[int, bytes | None] | None:
    """The digest kind and MAC key of the stream of id ``stream_id`` among ``cached``
    (None if not there): what a reader checks every batch against."""
    for meta in cached:
        if meta.id == stream_id:
            digest = DIGESTS.get(getattr(meta, "digest", DIGEST_DEFAULT), DIGEST_XXH3)
            try:
                return digest, stream_key_of(secret, meta)
            except DigestKeyMissing:
                return digest, None
    return None


async def check_key(pool: ConnectionPool, meta: StreamMeta, key: bytes | None) -> None:
    """Check ``key`` against the first stored batch of the stream's last non-empty range
    (one writer session wrote all of a range; its first batch is there however far the
    range got): :class:`DigestMismatch` when it verifies on no replica and fails on one.
    So a writer with another cluster secret fails at open instead of fencing the stream's
    writer and then having its appends refused (by range servers holding the secret) or
    stored for readers to refuse (by servers without it), and no writer appends behind a
    range of forged entries. Inconclusive (no replica answers, or nothing is stored yet):
    the range servers' own check remains."""
    if key is None:
        return
    ranges = [r for r in meta.ranges if r.end is None or r.end > r.start]
    for rng in reversed(ranges[-2:]):
        if rng.end is not None and rng.end <= meta.start_offset:
            return
        verified = await _check_key_on(pool, meta, rng, key)
        if verified is not None:
            return


async def _check_key_on(pool: ConnectionPool, meta: StreamMeta, rng: RangeMeta, key: bytes
                        ) -> bool | None:
    """True: the range's first batch verifies under ``key`` on a replica; None: no replica
    had one to check; raises :class:`DigestMismatch` when one refused it."""
    reads = RangeClient(pool)
    refused: DigestMismatch | None = None
    for ref in rng.replicas:
        try:
            answer = await reads.read(
                ref.address, server_id=ref.id, stream_id=meta.id, range_index=rng.index,
                offset=rng.start, max_bytes=1, unconfirmed=True, timeout_s=key_check_timeout_s)
            for header, raw in iter_batches(answer.payload):
                verify_batch(raw)
                verify_digest(raw, digest=DIGEST_HMAC_SHA256, key=key, stream_id=meta.id,
                              range_index=rng.index, header=header)
                return True
        except DigestMismatch as exc:
            refused = exc
        except EstreamError:
            continue  # down, damaged or behind: another replica may tell
    if refused is not None:
        raise DigestMismatch(
            f"stream {meta.name!r}: its stored entries do not verify under this client's "
            "key: the cluster secret (connect(secret=), ESTREAM_SECRET) is not the one "
            f"they were written with, or range {rng.index} holds forged entries "
            f"({refused.message})", **refused.fields)
    return None
