"""The estream client: the SDK's entry point.

``client = await estream.connect("h:p,h:p,h:p")`` gives a :class:`Client` that talks to
the placement driver through :class:`~estream.net.pdclient.PDClient` (any node; it follows the
leader), caches stream metadata (by name, checked by id: a stream deleted and created
again is another stream, see :meth:`Client.forget_stream` and :mod:`estream.sdk.reader`),
and keeps one multiplexed connection per range server
(:class:`~estream.net.rpc.ConnectionPool`) shared by its writers and readers. Every network
wait has a timeout; errors are the typed :mod:`estream.wire.errors` classes, with ``retriable``.

Side effects: network connections.
"""

from __future__ import annotations

import asyncio
import enum
import math
import os
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Final, Literal

from estream.core.producer import check_writer_producer_id
from estream.core.writeeffects import WriterConfig
from estream.net.appendsender import AppendSender
from estream.net.clock import SYSTEM_CLOCK, Clock
from estream.net.objectstore import ObjectStore
from estream.net.pdclient import PDClient
from estream.net.rpc import ConnectionPool
from estream.net.security import client_context
from estream.net.transport import TCP, Network
from estream.sdk.leases import LeaseKeeper
from estream.sdk.objectreads import ObjectReads, ObjectReadStats
from estream.sdk.reader import (
    keyed_meta,
    read_stream,
    read_stream_batches,
    read_stream_views,
    stream_end_offset,
)
from estream.sdk.streamkeys import cached_entry_digest, check_key, stream_key_of
from estream.sdk.subscribe import Subscription
from estream.sdk.timelookup import offset_for_time
from estream.sdk.writer import Writer
from estream.sdk.writerticks import WriterTicks
from estream.sdk.writertimings import WRITER_TIMINGS, WriterTimings
from estream.wire import limits
from estream.wire.errors import (
    Closed,
    EstreamError,
    InvalidArgument,
    OffsetOutOfRange,
    StreamExists,
    StreamNotFound,
    Unauthenticated,
    Unavailable,
)
from estream.wire.meta import (
    ACK_COUNT_DEFAULT,
    DIGEST_DEFAULT,
    REPLICAS_DEFAULT,
    ServerInfo,
    StreamMeta,
)
from estream.wire.pdmessages import CreateStreamRequest
from estream.wire.record import (
    BatchColumns,
    BatchView,
    Record,
)

damage_reports_in_flight_max = 8  # reports of damaged objects on their way to PD at once


class _Unchanged(enum.Enum):
    UNCHANGED = "unchanged"


UNCHANGED: Final = _Unchanged.UNCHANGED  # set_retention: leave this limit as it is


class Client:
    """A connection to an estream cluster. Also ``async with estream.Client(pd) as c``."""

    def __init__(
        self,
        pd: str | Sequence[str],
        *,
        timeout_s: float = 5.0,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        token: str | None = None,
        secret: str | bytes | None = None,
        network: Network = TCP,
        clock: Clock = SYSTEM_CLOCK,
        writer_timings: WriterTimings = WRITER_TIMINGS,
    ) -> None:
        # TLS when a CA or a client certificate is given (estream.net.security); ``token`` is
        # sent (AUTH) on every new connection, to PD and to range servers alike. ``network``
        # and ``clock``: the ports (estream.net.transport, estream.net.clock) every
        # connection and time read of this client and its writers and readers go through.
        # ``writer_timings``: every wait and timeout of its writers (estream/sdk/writertimings.py).
        tls = client_context(tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key)
        self.clock = clock
        self.pd = PDClient(pd, timeout_s=timeout_s, ssl=tls, token=token, network=network)
        self.pool = ConnectionPool(ssl=tls, token=token, network=network)
        self.writer_timings = writer_timings
        # Its writers' batches share requests.
        self.appends = AppendSender(self.pool,
                                    timeout_s=writer_timings.request_timeout_ms / 1000)
        self.timeout_s = timeout_s
        self._streams: dict[str, StreamMeta] = {}
        self._writers: list[Writer] = []
        self.leases = LeaseKeeper(self.pd, clock=clock)  # every writer's keepalive, in one request
        self._closed = False
        # The cluster secret that per-stream MAC keys derive from (hmac-sha256 digests);
        # never sent anywhere. Default: the ESTREAM_SECRET environment variable.
        if secret is None:
            secret = os.environ.get("ESTREAM_SECRET") or None
        self._secret = secret.encode() if isinstance(secret, str) else secret
        self._object_reads: ObjectReads | None = None  # once PD named an object store
        self._reports: set[asyncio.Task[None]] = set()  # damage reports on their way to PD
        self.writer_ticks = WriterTicks()  # its writers' one timer

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- streams --------------------------------------------------------------------------

    async def create_stream(
        self,
        name: str,
        replicas: int = REPLICAS_DEFAULT,
        ack_count: int = ACK_COUNT_DEFAULT,
        *,
        type: str = "",
        hints: Sequence[str] = (),
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        digest: str | None = None,
        ensemble: int | None = None,
        exist_ok: bool = False,
    ) -> StreamMeta:
        """Create ``name``. ``retention_ms``/``retention_bytes``: the PD leader trims whole
        sealed ranges older or beyond the limit (``pd/retention.py``; a range a named cursor
        has not read is held); None: kept until trimmed or deleted. ``digest``: the entry
        digest, ``"xxh3"`` (default), ``"crc32c"`` or ``"hmac-sha256"`` (a MAC keyed per
        stream from the cluster secret, ``connect(secret=)``, verified by every reader).
        ``exist_ok``: a stream of that name with exactly these settings is returned as it
        is; with other settings (or without ``exist_ok``) it raises ``StreamExists``.
        ``ensemble``: each range's servers, ``replicas`` (None) up to 64 (striping,
        ``estream/wire/stripe.py``: batch k on ``replicas`` of them)."""
        request = CreateStreamRequest(
            name=name, replicas=replicas, ack_count=ack_count, type=type, hints=tuple(hints),
            request_id=uuid.uuid4().hex, retention_ms=retention_ms,
            retention_bytes=retention_bytes, digest=digest or DIGEST_DEFAULT,
            ensemble=ensemble)
        try:
            meta = await self.pd.create(request)
        except StreamExists:
            if not exist_ok:
                raise
            meta = await self.describe_stream(name)
            differ = meta.settings_differ(
                replicas=request.replicas, ack_count=request.ack_count, type=request.type,
                hints=request.hints, retention_ms=request.retention_ms,
                retention_bytes=request.retention_bytes, digest=request.digest,
                ensemble=request.ensemble)
            if differ:
                shown = ", ".join(f"{k}={getattr(meta, k)!r}" for k in differ)
                raise StreamExists(f"stream {name!r} exists with other settings ({shown})",
                                   stream=name) from None
            return meta
        self._streams[name] = meta
        return meta

    async def describe_stream(self, name: str) -> StreamMeta:
        """The stream as PD has it now, with its last ranges
        (``limits.stream_ranges_per_answer_default``, whatever the stream's length;
        ``ranges_omitted``: how many earlier ones it leaves out, so their sum is the range
        count; ``client.pd.describe_stream(name, offset=N)`` or ``index=I`` has others,
        ``client.pd.iter_ranges(name)`` every one)."""
        return await self.stream_meta(name, refresh=True)

    async def list_streams(self) -> list[StreamMeta]:
        """Every stream in name order (PD answers them a page at a time; this asks for
        every page). A stream with many ranges comes with its last ones only: describe
        it for the others."""
        return await self.pd.list_streams()

    def iter_streams(self, page_size: int | None = None, *, after: str = ""
                     ) -> AsyncIterator[StreamMeta]:
        """Every stream (named after ``after``) in name order, asking PD for one page
        (``page_size`` streams, PD's default without) at a time: ``async for meta in
        client.iter_streams()``; stop iterating to ask for no more pages."""
        return self.pd.iter_streams(page_size, after=after)

    async def delete_stream(self, name: str, *, stream_id: int = 0) -> int:
        """Delete stream ``name``; with ``stream_id`` (a ``StreamMeta.id``), only that
        incarnation of the name: ``StreamNotFound`` if the name was deleted and created
        again since. Answers the id of the stream deleted (0 from an older PD). A retry
        after an unknown outcome (a timeout, a PD leader lost) never deletes a stream
        someone created under the name meanwhile, nor fails for a delete that landed."""
        self._streams.pop(name, None)
        return await self.pd.delete_stream(name, stream_id=stream_id)

    async def trim(self, name: str, start_offset: int) -> StreamMeta:
        """Drop the records below ``start_offset``: reads start there from now on, and
        the stream's cursors below it move to it.

        Raises :class:`OffsetOutOfRange` when ``start_offset`` is past the stream's
        confirmed end (it would drop records not written yet; PD alone cannot tell, as
        only the range servers know where the open range ends)."""
        end = await self.end_offset(name)
        checked = await self.stream_meta(name)  # (just read by end_offset)
        if start_offset > end:
            raise OffsetOutOfRange(
                f"cannot trim stream {name!r} to {start_offset}: its end is {end}",
                offset=start_offset, start=checked.start_offset, end=end,
            )
        # Only the stream whose end was checked: not one created again meanwhile.
        meta = await self.pd.trim_stream(name, start_offset, stream_id=checked.id)
        self._streams[name] = meta
        return meta

    async def offset_for_time(self, name: str, timestamp_ms: int) -> int:
        """The first offset whose record timestamp is at or after ``timestamp_ms`` (ms since
        the epoch), else the stream's end (exact also when writers' clocks went back)."""
        self._check_open()
        return await offset_for_time(self, name, timestamp_ms)

    async def commit_cursor(self, name: str, cursor: str, offset: int, *, stream_id: int = 0
                            ) -> None:
        """Store the named ``cursor`` of stream ``name`` at ``offset`` (the next offset its
        consumer reads) in the catalog: it survives PD leader changes; with ``stream_id``
        (the id of the stream read), only on that incarnation of the name. Raises
        ``StreamNotFound`` (also for another incarnation), ``InvalidArgument`` (negative
        offset, a bad or too long name: letters, digits, '.', '_', '-', at most 200) or
        ``OffsetOutOfRange`` (past the stream's readable end)."""
        self._check_open()
        await self.pd.commit_cursor(name, cursor, offset, stream_id=stream_id)

    async def delete_cursor(self, name: str, cursor: str) -> None:
        """Forget the named ``cursor`` of stream ``name``: the ranges it had not read no
        longer hold retention. Raises ``StreamNotFound``, or ``InvalidArgument``
        (argument ``"cursor"``) when the stream has no such cursor."""
        self._check_open()
        await self.pd.delete_cursor(name, cursor)

    async def set_retention(
        self,
        name: str,
        *,
        retention_ms: int | None | Literal[_Unchanged.UNCHANGED] = UNCHANGED,
        retention_bytes: int | None | Literal[_Unchanged.UNCHANGED] = UNCHANGED,
    ) -> StreamMeta:
        """Change the retention limits of stream ``name``: an integer > 0 is the new
        limit, None removes it, and a limit not passed (``UNCHANGED``) stays as it is
        (``set_retention("s", retention_ms=None)`` keeps ``retention_bytes``). The PD
        leader trims by the new limits from its next retention round. Returns the
        stream; raises ``StreamNotFound``, or ``InvalidArgument`` for a limit of 0 or
        below, or when neither limit is passed."""
        self._check_open()
        changes = {k: v for k, v in (("retention_ms", retention_ms),
                                     ("retention_bytes", retention_bytes))
                   if v is not UNCHANGED}
        for key, value in changes.items():
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value <= 0):
                raise InvalidArgument(f"{key} must be an integer > 0, or None for no limit",
                                      argument=key)
        if not changes:
            raise InvalidArgument("set_retention: pass retention_ms, retention_bytes or both",
                                  argument="retention_ms")
        meta = await self.pd.set_retention(name, changes)
        self._streams[name] = meta
        return meta

    async def cursor_offset(self, name: str, cursor: str) -> int | None:
        """The committed offset of ``cursor`` on stream ``name``; None if never committed."""
        self._check_open()
        _, cursors = await self.pd.list_cursors(name)
        found = [c["offset"] for c in cursors if c.get("cursor") == cursor]
        return int(found[0]) if found else None

    async def list_cursors(self, name: str) -> list[dict[str, int | str]]:
        """Every cursor of ``name``: ``[{"cursor", "offset", "lag"}]`` (lag: the stream's
        readable end minus the offset)."""
        self._check_open()
        return (await self.pd.list_cursors(name))[1]

    async def stream_meta(
        self, name: str, *, refresh: bool = False, offset: int | None = None
    ) -> StreamMeta:
        """The stream's metadata, from the cache unless ``refresh`` (raises StreamNotFound).
        PD answers a window of a long stream's ranges (its last ones); with ``offset``,
        the answer holds the range of ``offset`` (asked for from there when the cached
        window starts past it). Only windows reaching the last range are cached."""
        self._check_open()
        meta = None if refresh else self._streams.get(name)
        if meta is not None and offset is not None and not meta.holds_offset(offset):
            meta = None
        if meta is None:
            try:
                meta = await self.pd.describe_stream(name, offset=offset)
            except StreamNotFound:
                self._streams.pop(name, None)
                raise
            if not meta.ranges_more:
                self._streams[name] = meta
        return meta

    def forget_stream(self, name: str, stream_id: int) -> None:
        """Drop the cached metadata of stream ``stream_id`` (named ``name``): it was
        deleted, maybe created again (another id), and the next lookup asks PD. A cached
        entry of another id (already the new stream) is kept."""
        cached = self._streams.get(name)
        if cached is not None and cached.id == stream_id:
            del self._streams[name]

    # -- writing and reading --------------------------------------------------------------

    async def open_writer(
        self,
        name: str,
        *,
        deferred_sync: bool = False,
        linger_ms: int = limits.linger_ms,
        batch_bytes: int = limits.writer_batch_bytes,
        delivery_timeout_s: float = limits.delivery_timeout_ms / 1000,
        producer_id: str | None = None,
    ) -> Writer:
        """A writer for ``name`` with a new epoch: every earlier writer is fenced. A last
        range left open by a dead writer is recovered first (``docs/ARCHITECTURE.md`` 2.7).

        ``delivery_timeout_s`` bounds every append (one not acknowledged in time raises
        :class:`estream.Timeout`, and the writer takes no more appends) and this call's
        recovery (:class:`estream.Unavailable` when it cannot be done safely in time).

        ``producer_id``: an idempotent producer (``estream/core/producer.py``): its
        appends carry sequences, ``writer.last_sequence`` is its highest one durably
        stored (found at open), and an append whose sequence is not above it is not
        stored again. Ids starting ``__kafka/`` are refused: the Kafka gateways'."""
        self._check_open()
        if (isinstance(delivery_timeout_s, bool)
                or not isinstance(delivery_timeout_s, int | float)
                or not math.isfinite(delivery_timeout_s) or delivery_timeout_s <= 0):
            raise InvalidArgument(f"delivery_timeout_s must be a finite number of seconds > 0, "
                                  f"got {delivery_timeout_s!r:.40}", argument="delivery_timeout_s")
        if producer_id is not None:
            check_writer_producer_id(producer_id)  # before any I/O
        config = WriterConfig(
            linger_ms=linger_ms,
            batch_bytes=batch_bytes,
            confirm_idle_ms=max(1, linger_ms),
            deferred=deferred_sync,
            delivery_timeout_ms=max(1, round(delivery_timeout_s * 1000)),
        )
        meta = await keyed_meta(self, name, await self.stream_meta(name))
        # DigestKeyMissing, or DigestMismatch for a key that is not the stream's, before
        # fencing anyone.
        await check_key(self.pool, meta, self.stream_key(meta))
        writer = await Writer.open(self, name, config, producer_id)
        self._streams[name] = writer.stream
        self._writers = [w for w in self._writers if not w.closed]
        self._writers.append(writer)
        return writer

    def read(
        self, name: str, start: int = 0, end: int | None = None, follow: bool = False, *,
        replica: str | None = None, stream_id: int = 0,
    ) -> AsyncIterator[Record]:
        """Records with offsets in ``[start, end)``; see :mod:`estream.sdk.reader`. With
        ``stream_id`` (a :class:`StreamMeta`'s id), of that incarnation of ``name`` only:
        ``StreamNotFound`` once the name is another stream's."""
        self._check_open()
        return read_stream(self, name, start, end, follow, replica, clock=self.clock,
                           stream_id=stream_id)

    def subscribe(self, group: str, streams: Sequence[str], *,
                  session_timeout_ms: int = 10_000, rebalance_timeout_ms: int = 30_000,
                  heartbeat_s: float = 1.0) -> Subscription:
        """Join consumer group ``group`` over ``streams``: an async iterator of
        :class:`~estream.sdk.subscribe.GroupRecord` with ``commit()`` and ``close()``
        (see :mod:`estream.sdk.subscribe`; Kafka's groups share its state and offsets)."""
        self._check_open()
        return Subscription(self, group, list(streams), session_timeout_ms=session_timeout_ms,
                            rebalance_timeout_ms=rebalance_timeout_ms, heartbeat_s=heartbeat_s)

    def read_batches(
        self, name: str, start: int = 0, end: int | None = None, follow: bool = False, *,
        replica: str | None = None, stream_id: int = 0,
    ) -> AsyncIterator[BatchColumns]:
        """:meth:`read` by batch: the same records as :class:`BatchColumns` (offsets,
        timestamps, values in one buffer, headers), one per stored batch, the first and
        last trimmed to ``[start, end)``. Same failover, confirm-offset and range rules."""
        self._check_open()
        return read_stream_batches(self, name, start, end, follow, replica, clock=self.clock,
                                   stream_id=stream_id)

    def read_batch_views(
        self, name: str, start: int = 0, end: int | None = None, follow: bool = False, *,
        replica: str | None = None, stream_id: int = 0,
    ) -> AsyncIterator[list[BatchView]]:
        """:meth:`read_batches` undecoded: per READ answer, its batches (checksums
        verified) as :class:`BatchView` windows of the answer's bytes, to be decoded many
        at once with :func:`estream.wire.record.decode_views` (one copy of the values). Same
        failover, confirm-offset and range rules."""
        self._check_open()
        return read_stream_views(self, name, start, end, follow, replica, clock=self.clock,
                                 stream_id=stream_id)

    async def end_offset(self, name: str) -> int:
        """The confirmed (readable) end of the stream right now."""
        self._check_open()
        return await stream_end_offset(self, name)

    # -- cluster --------------------------------------------------------------------------

    async def list_servers(self) -> list[ServerInfo]:
        return await self.pd.list_servers()

    async def cluster(self) -> dict:  # type: ignore[type-arg]
        return await self.pd.cluster()

    async def object_reads(self) -> ObjectReads | None:
        """Reads from the object tier's store, the one PD's cluster answer names (asked
        until it names one: a tier may be configured later); None without a tier.
        Credentials for ``s3://`` come from this process's ``AWS_*`` variables."""
        if self._object_reads is None:
            named = (await self.pd.cluster()).get("object_store")
            if isinstance(named, dict) and named.get("url"):
                endpoint = named.get("endpoint")
                store = ObjectStore.from_url(str(named["url"]), str(endpoint) if endpoint else None)
                self._object_reads = ObjectReads(store, report=self._report_damage)
        return self._object_reads

    def object_read_stats(self) -> ObjectReadStats:
        """This client's reads from the object store so far: requests by outcome, bytes,
        latency (:class:`~estream.sdk.objectreads.ObjectReadStats`; zeros before any)."""
        return ObjectReadStats() if self._object_reads is None else self._object_reads.stats()

    def _report_damage(self, stream_id: int, range_index: int, key: str, reason: str) -> None:
        """Tell PD about a damaged object in the background: the read never waits for it,
        and a report that fails is dropped (a later read reports again)."""
        if self._closed or len(self._reports) >= damage_reports_in_flight_max:
            return

        async def send() -> None:
            try:
                await asyncio.wait_for(self.pd.report_object_damage(
                    stream_id, range_index, key, reason), self.timeout_s)
            except (EstreamError, TimeoutError):
                pass

        task = asyncio.ensure_future(send())
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for writer in self._writers:
            try:
                await asyncio.wait_for(writer.close(), self.timeout_s)
            except (TimeoutError, EstreamError):
                pass
        await self.leases.close()
        if self._object_reads is not None:
            await self._object_reads.close()  # the GETs of windows read ahead
        for task in list(self._reports):
            task.cancel()
        await asyncio.gather(*self._reports, return_exceptions=True)
        await self.pool.close()
        await self.pd.close()

    def _check_open(self) -> None:
        if self._closed:
            raise Closed("the client is closed")

    def stream_key(self, meta: StreamMeta) -> bytes | None:
        """The MAC key of a stream whose digest is ``hmac-sha256`` (None for other
        digests), derived from this client's cluster secret; :class:`DigestKeyMissing`
        when the client has none."""
        return stream_key_of(self._secret, meta)

    def entry_digest(self, stream_id: int) -> tuple[int, bytes | None] | None:
        """The digest kind and MAC key of a cached stream, by id (None if not cached):
        what a reader checks every batch against."""
        return cached_entry_digest(self._streams.values(), stream_id, self._secret)


async def connect(
    pd: str | Sequence[str],
    *,
    timeout_s: float = 5.0,
    tls_ca: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    token: str | None = None,
    secret: str | bytes | None = None,
) -> Client:
    """Connect to the placement driver at ``pd`` ("h:p,h:p,h:p" or a list).

    ``tls_ca`` (PEM file) turns TLS on and verifies the servers against that CA;
    ``tls_cert``/``tls_key`` present a client certificate; ``token`` authenticates every
    connection; ``secret`` is the cluster secret that MAC keys of ``hmac-sha256`` streams
    derive from (default ``ESTREAM_SECRET``). Raises :class:`Unavailable` if no PD node
    answers within ``timeout_s``,
    :class:`Unauthenticated` if the cluster refuses the token (or its absence).
    """
    client = Client(pd, timeout_s=timeout_s, tls_ca=tls_ca, tls_cert=tls_cert,
                    tls_key=tls_key, token=token, secret=secret)
    try:
        await client.pd.cluster()
    except EstreamError as exc:
        await client.close()
        if isinstance(exc, Unavailable | Unauthenticated):
            raise
        raise Unavailable(f"cannot reach the placement driver at {pd}: {exc}") from exc
    return client


__all__ = ["Client", "connect"]
