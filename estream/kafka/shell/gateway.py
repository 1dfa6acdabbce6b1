"""The Kafka gateway's server: Kafka connections served through the SDK.

One :class:`Gateway` per process holds one SDK :class:`~estream.sdk.client.Client`, a
writer per partition it has produced to (``produce.py``) and the request counters. Each connection
reads frames (:class:`~estream.kafka.protocol.FrameDecoder`), starts one task per request
and answers them strictly in order (Kafka clients match answers by order), reading on
while its requests in flight leave room (:mod:`estream.kafka.inflight`). A request
it does not serve gets an UNSUPPORTED_VERSION answer, a body that does not decode an
INVALID_REQUEST answer; a frame past the size limit or shorter than a header is answered
(when its header can be read) and the connection closed: the stream cannot be resynced.
The process keeps serving every other connection. When the peer closes, its requests that
only wait (:data:`~estream.kafka.protocol.WAITING_APIS`: a JoinGroup at its barrier for up
to 300 s, a Fetch's long poll) are cancelled, the others run to their end unanswered (nothing
more is written to a connection whose peer left or that is closing); a cancelled join leaves
its member in PD as a crashed client would (each PD call is one command), until its session
times out.
At stop (:meth:`Gateway.close`) every connection stops reading as if its peer had closed
it, answers what it has in flight (its writers still open) and closes; the gateway waits
for each connection's task to end, so the loop's shutdown has none to cancel.

Side effects: the listening socket, the SDK's connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, cast

from kio.schema.errors import ErrorCode

from estream.kafka import protocol as kp
from estream.kafka.configs import create_configs
from estream.kafka.inflight import InFlight
from estream.kafka.sasl import Session
from estream.kafka.shell import auth
from estream.kafka.shell.admin import TopicAdmin, topic_counts
from estream.kafka.shell.fetch import Fetch, fetch_wait_ms_max
from estream.kafka.shell.groups import CONNECTION_HOST, REQUEST_CLIENT_ID, GroupApis
from estream.kafka.shell.membership import Membership, now_ms
from estream.kafka.shell.produce import Produce
from estream.kafka.shell.reads import Reads
from estream.kafka.topics import (
    ack_count_for,
    check_partitions,
    check_topic,
    replicas_for,
    stream_name,
)
from estream.net.security import token_role
from estream.sdk.client import Client
from estream.sdk.groups import GroupClient
from estream.wire import limits
from estream.wire.errors import (
    EstreamError,
    FrameTooLarge,
    MalformedFrame,
    NoPlacement,
    StreamNotFound,
)
from estream.wire.roles import ALL_ROLES

log = logging.getLogger("estream.kafka")
_Answering = tuple[asyncio.Task[bytes | None], bool]  # a request's task, whether a Produce

connections_max: Final = 1024  # open Kafka connections; one past it is closed at once
close_wait_ms_max: Final = 10_000  # at stop, how long connections may take to answer what
#   they have in flight; past it their tasks are cancelled (and end quietly)
read_chunk_bytes: Final = 256 * 1024
NODE_ID: Final = 0
CLUSTER_ID: Final = "estream"
TOPIC_TYPE: Final = "kafka"  # the stream type CreateTopics gives partitions


class Gateway(Reads, Fetch, Produce):
    """Serves Kafka connections for the streams of one cluster."""

    def __init__(self, client: Client, advertise: tuple[str, int],
                 token_roles: Mapping[str, str] | None = None) -> None:
        """``token_roles``: token -> role; given, every connection must authenticate
        (SASL PLAIN with a token, or a client certificate): ``estream/kafka/sasl.py``."""
        self.client = client
        self.advertise = advertise
        self.token_roles: Mapping[str, str] = token_roles or {}
        self.requests: Counter[tuple[str, str]] = Counter()  # (api, error) -> count
        self.bytes_in = 0
        self.bytes_out = 0
        self.connections = 0
        self.in_flight = 0  # requests being served, every connection
        # Each open connection's task -> its reader and writer (ended at close()).
        self._connections: dict[asyncio.Task[Any], tuple[asyncio.StreamReader,
                                                         asyncio.StreamWriter]] = {}
        self._locks: dict[str, asyncio.Lock] = {}  # per stream while its writer opens
        self._background: set[asyncio.Task[Any]] = set()
        self._stopping = False  # close() ends the connections: they still answer
        self._init_produce()
        self._init_fetch()
        self._handlers: dict[int, Callable[[Any, int], Awaitable[Any]]] = {
            kp.API_VERSIONS: self._api_versions,
            kp.METADATA: self._metadata,
            kp.PRODUCE: self._produce,
            kp.FETCH: self._fetch,
            kp.LIST_OFFSETS: self._list_offsets,
            kp.CREATE_TOPICS: self._create_topics,
            kp.DELETE_TOPICS: self._delete_topics,
            kp.INIT_PRODUCER_ID: self._init_producer_id,
        }
        admin = TopicAdmin(client, TOPIC_TYPE)
        self._handlers.update({
            kp.CREATE_PARTITIONS: admin.create_partitions,
            kp.DESCRIBE_CONFIGS: admin.describe_configs,
            kp.ALTER_CONFIGS: admin.alter_configs,
            kp.INCREMENTAL_ALTER_CONFIGS: admin.incremental_alter_configs,
        })
        self._handlers.update(GroupApis(GroupClient(client.pd), lambda: self.advertise,
                                        self.node_id).handlers())
        # Registered in PD (lead()): the partitions this gateway leads among the live
        # ones (estream/kafka/leaders.py). None: a gateway alone, leading everything.
        self.membership: Membership | None = None

    # -- leadership (estream/kafka/leaders.py) ------------------------------------------

    async def lead(self, tls: bool = False) -> None:
        """Register in PD under the advertised address and lead this gateway's share of
        the partitions from now on (call once it listens). Gateways share partitions
        with those that authenticate as they do (``tls``, tokens): their pool."""
        me = f"{self.advertise[0]}:{self.advertise[1]}"
        pool = {(False, False): "plaintext", (True, False): "sasl", (False, True): "ssl",
                (True, True): "sasl_ssl"}[(bool(self.token_roles), tls)]
        self.membership = Membership(self.client.pd, me, pool, self._leaders_changed)
        await self.membership.start()

    def leads(self, stream: str) -> bool:
        """Whether this gateway may write ``stream`` now (else NOT_LEADER_OR_FOLLOWER)."""
        return self.membership is None or self.membership.leadership.owns(stream, now_ms())

    def node_id(self) -> int:
        if self.membership is None:
            return NODE_ID
        leadership = self.membership.leadership
        return leadership.brokers()[leadership.me]

    def _leaders_changed(self) -> None:
        """The live gateways changed: close the writers of partitions led elsewhere now."""
        for name, writer in list(self._writers.items()):
            if not self.leads(name):
                self._drop_writer(name, writer)

    # -- connections --------------------------------------------------------------------

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection, until the peer closes it, sends a frame that cannot be
        delimited or the gateway stops. Cancelled (a stop that outwaited
        :data:`close_wait_ms_max`, the loop's shutdown), it ends quietly: asyncio's
        server logs a connection task that ends cancelled as an error."""
        if self.connections >= connections_max:
            self.requests[("connection", "REFUSED")] += 1
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = (reader, writer)
        self.connections += 1
        peer = writer.get_extra_info("peername")
        CONNECTION_HOST.set(f"/{peer[0]}" if isinstance(peer, tuple) else "")  # (its tasks')
        try:
            await self._serve(reader, writer)
        except asyncio.CancelledError:
            writer.transport.abort()
        finally:
            self.connections -= 1
            del self._connections[task]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                     ) -> None:
        session = auth.open_session(bool(self.token_roles), writer)
        decoder = kp.FrameDecoder()
        answers: asyncio.Queue[_Answering | None] = asyncio.Queue()
        load, room = InFlight(), asyncio.Event()  # (room: set by the sender as it frees)
        peer_left = asyncio.Event()  # nobody to answer: nothing more is written
        sender = asyncio.ensure_future(self._send_in_order(answers, writer, session, load,
                                                           room, peer_left))
        deadline = (asyncio.ensure_future(self._auth_deadline(session, writer))
                    if session.required and not session.roles else None)
        waiting: set[asyncio.Task[bytes | None]] = set()  # WAITING_APIS requests, unanswered
        peer_gone = False
        try:
            while not sender.done():
                data = await reader.read(read_chunk_bytes)
                if not data:
                    peer_gone = True
                    break
                self.bytes_in += len(data)
                decoder.limit = (kp.unauthenticated_frame_bytes_max
                                 if session.required and not session.roles
                                 else kp.frame_bytes_max)
                for frame in decoder.feed(data):
                    produce = kp.peek_header(frame)[0] == kp.PRODUCE
                    while not load.room(produce) and not sender.done():
                        room.clear()
                        await room.wait()
                    answers.put_nowait((self._start(frame, session, waiting, load, produce),
                                        produce))
                if decoder.failed is not None:
                    load.started(0, False)
                    answers.put_nowait((_charged(asyncio.ensure_future(
                        self._refuse_stream(decoder.head(), decoder.failed)), 0, load), False))
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            peer_gone = True
        finally:
            if peer_gone:  # nobody to answer: its waits end now, not at their timeouts
                if not self._stopping:  # (at a stop the peer is there: answered)
                    peer_left.set()
                for task in list(waiting):
                    task.cancel()
            answers.put_nowait(None)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(sender), fetch_wait_ms_max / 1000 + 5)
            sender.cancel()
            for task in list(waiting):  # (the connection is closing: none is answered)
                task.cancel()
            if deadline is not None:
                deadline.cancel()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _start(self, frame: bytes, session: Session, waiting: set[asyncio.Task[bytes | None]],
               load: InFlight, produce: bool) -> asyncio.Task[bytes | None]:
        """The task answering ``frame``, counted in :attr:`in_flight` while it runs and
        in its connection's ``load`` until its answer is written; one of
        :data:`~estream.kafka.protocol.WAITING_APIS` is kept in ``waiting``."""
        load.started(len(frame), produce)
        task = _charged(asyncio.ensure_future(self._answer(frame, session)), len(frame), load)
        self.in_flight += 1
        if kp.peek_header(frame)[0] in kp.WAITING_APIS:
            waiting.add(task)

        def done(task: asyncio.Task[bytes | None]) -> None:
            self.in_flight -= 1
            waiting.discard(task)

        task.add_done_callback(done)
        return task

    async def _auth_deadline(self, session: Session, writer: asyncio.StreamWriter) -> None:
        """Close a connection still unauthenticated after ``connection_auth_ms_max`` (as
        estream's RPC ports do): an idle unauthenticated client holds no slot for long."""
        await asyncio.sleep(limits.connection_auth_ms_max / 1000)
        if not session.roles:
            self.requests[("connection", "AUTH_TIMEOUT")] += 1
            session.closing = True
            writer.close()

    async def _send_in_order(
        self, answers: asyncio.Queue[_Answering | None],
        writer: asyncio.StreamWriter, session: Session, load: InFlight, room: asyncio.Event,
        peer_left: asyncio.Event,
    ) -> None:
        """Each request's answer in the order they came, each freeing its ``load`` once
        written (``room`` set when the connection may read on; also when this ends). Once
        ``peer_left`` is set or the connection is closing, answers are dropped unwritten."""
        try:
            while True:
                item = await answers.get()
                if item is None:
                    return
                task, produce = item
                if not task.done():  # (one done already is written in this turn: no wait)
                    # (wait, not await: this task's cancellation must not cancel the request's)
                    await asyncio.wait((task,))
                answer = _answer_of(task)
                try:
                    if answer is not None and not (peer_left.is_set() or writer.is_closing()):
                        writer.write(answer)
                        self.bytes_out += len(answer)
                        await writer.drain()
                finally:
                    load.written(0 if answer is None else len(answer), produce)
                    room.set()  # (the reader checks whether its next request fits)
                if session.closing:  # a failed authentication: answered, then closed
                    writer.close()
                    return
        finally:
            room.set()  # (a reader waiting for room sees this task done)

    async def _refuse_stream(self, data: bytes, exc: EstreamError) -> bytes | None:
        """The answer to a frame that cannot be delimited (too large, too short; ``data``:
        its first bytes): the API's error answer when its header arrived, else none (the
        connection closes)."""
        error = ErrorCode.message_too_large if isinstance(exc, FrameTooLarge) else (
            ErrorCode.invalid_request)
        self.requests[("frame", error.name.upper())] += 1
        log.info("closing a Kafka connection: %s", exc)
        if len(data) < 4 + kp.frame_bytes_min:
            return None
        key, version, correlation = kp.peek_header(data[4:])
        return kp.error_response(key, version, correlation, error)

    async def _answer(self, frame: bytes, session: Session) -> bytes | None:
        key, version, correlation = kp.peek_header(frame)
        api = kp.API_NAMES.get(key, str(key))
        header = kp.RequestHeader(key, version, correlation, None, 0)
        refusal = session.refusal(key)
        # Not authenticated yet (SASL_AUTHENTICATION_FAILED): refused whatever its version or
        # body; one that decodes is answered per topic or partition it names, as below.
        unauthenticated = refusal == ErrorCode.sasl_authentication_failed
        if not header.supported:
            error = ErrorCode.sasl_authentication_failed if unauthenticated else (
                ErrorCode.unsupported_version)
            self.requests[(api, error.name.upper())] += 1
            return kp.error_response(key, version, correlation, error)
        try:
            header = kp.parse_header(frame)
            REQUEST_CLIENT_ID.set(header.client_id or "")  # (this request's task only)
            request = kp.decode_request(header, frame)
        except MalformedFrame as exc:
            error = ErrorCode.sasl_authentication_failed if unauthenticated else (
                ErrorCode.invalid_request)
            self.requests[(api, error.name.upper())] += 1
            log.info("invalid %s request: %s", api, exc)
            return kp.error_response(key, version, correlation, error)
        if refusal is not None:  # not authenticated, or its roles do not allow this API
            self.requests[(api, refusal.name.upper())] += 1
            refused = auth.refused(key, version, request, refusal)
            if refused is None:
                return kp.error_response(key, version, correlation, refusal)
            return kp.encode_response(key, correlation, refused)
        try:
            if key == kp.SASL_HANDSHAKE:
                body = auth.handshake(session, request, version)
            elif key == kp.SASL_AUTHENTICATE:
                body = auth.authenticate(session, request, version, self._role_of)
            else:
                body = await self._handlers[key](request, version)
        except Exception:  # noqa: BLE001 - a bug answers an error, the others go on
            log.exception("serving a %s v%d request", api, version)
            self.requests[(api, "UNKNOWN_SERVER_ERROR")] += 1
            return kp.error_response(key, version, correlation,
                                     ErrorCode.unknown_server_error)
        error = getattr(body, "error_code", ErrorCode.none)  # the top-level one, if any
        self.requests[(api, error.name.upper() if isinstance(error, ErrorCode) else "NONE")] += 1
        if body is None:  # Produce with acks=0: no answer
            return None
        if type(body) is kp.ProduceAnswer:  # (encoded by hand: the hot answer)
            return body.frame(correlation)
        return kp.encode_response(key, correlation, body)

    def _role_of(self, password: str) -> str | None:
        """The role of a SASL PLAIN password: its token's; a gateway without tokens
        takes any password (every role, as estream's open ports take any AUTH)."""
        if not self.token_roles:
            return ALL_ROLES
        return token_role(self.token_roles, password)

    # -- ApiVersions, Metadata ----------------------------------------------------------

    async def _api_versions(self, request: Any, version: int) -> Any:
        return kp.api_versions_response(version)

    async def _metadata(self, request: Any, version: int) -> Any:
        schema = kp.response_schema(kp.METADATA, version)
        topic_cls = kp.nested(schema, "MetadataResponseTopic")
        part_cls = kp.nested(schema, "MetadataResponsePartition")
        asked = request.topics
        all_topics = asked is None or (version == 0 and not asked)
        counts = await topic_counts(self.client, None if all_topics else
                                    [t.name for t in asked])
        nodes = self._brokers()
        if all_topics:
            names = list(counts)
        else:
            names = list(dict.fromkeys(t.name for t in asked))  # (each answered once,
            #   as Kafka's: a topic of n partitions named k times is not k * n answers)
        topics = []
        for name in names:
            if name is None:  # v12 asks by topic id: estream's topics have none
                topics.append(kp.build(topic_cls, name=None,
                                       error_code=ErrorCode.unknown_topic_id, partitions=()))
                continue
            count = counts.get(name or "", 0)
            if not count:
                topics.append(kp.build(topic_cls, name=name or "",
                                       error_code=ErrorCode.unknown_topic_or_partition,
                                       partitions=()))
                continue
            partitions = tuple(
                kp.build(part_cls, error_code=ErrorCode.none, partition_index=p,
                         leader_id=leader, leader_epoch=0, replica_nodes=(leader,),
                         isr_nodes=(leader,), offline_replicas=())
                for p, leader in enumerate(self._leaders(name or "", count, nodes)))
            topics.append(kp.build(topic_cls, error_code=ErrorCode.none, name=name,
                                   is_internal=False, partitions=partitions,
                                   topic_authorized_operations=-2147483648))
        broker_cls = kp.nested(schema, "MetadataResponseBroker")
        brokers = tuple(kp.build(broker_cls, node_id=node, host=address.rpartition(":")[0],
                                 port=int(address.rpartition(":")[2]), rack=None)
                        for address, node in nodes.items())
        return kp.build(schema, throttle_time=0, brokers=brokers, cluster_id=CLUSTER_ID,
                        controller_id=self.node_id(), topics=tuple(topics),
                        cluster_authorized_operations=-2147483648)

    def _brokers(self) -> dict[str, int]:
        """Every gateway Metadata names (address -> node id)."""
        if self.membership is None:
            return {f"{self.advertise[0]}:{self.advertise[1]}": NODE_ID}
        return self.membership.leadership.brokers()

    def _leaders(self, topic: str, count: int, nodes: Mapping[str, int]) -> list[int]:
        """The node id leading each partition of ``topic``."""
        if self.membership is None:
            return [NODE_ID] * count
        leadership = self.membership.leadership
        return [nodes[leadership.leader(stream_name(topic, p))] for p in range(count)]

    # -- CreateTopics, DeleteTopics -----------------------------------------------------

    async def _create_topic(self, topic: Any, validate_only: bool) -> tuple[ErrorCode, str]:
        try:
            check_topic(topic.name)
            partitions = 1 if topic.num_partitions == -1 else int(topic.num_partitions)
            check_partitions(partitions)
            replicas = replicas_for(int(topic.replication_factor))
            retention = create_configs((c.name, c.value) for c in topic.configs)
            if await self._exists(stream_name(topic.name, 0)):
                return ErrorCode.topic_already_exists, f"topic {topic.name!r} exists"
            if validate_only:
                return ErrorCode.none, ""
            for p in range(partitions):
                await self.client.create_stream(
                    stream_name(topic.name, p), replicas, ack_count_for(replicas),
                    type=TOPIC_TYPE, exist_ok=True, retention_ms=retention["retention_ms"],
                    retention_bytes=retention["retention_bytes"])
            return ErrorCode.none, ""
        except NoPlacement as exc:  # more replicas than live range servers (Kafka's too)
            return ErrorCode.invalid_replication_factor, str(exc)[:200]
        except (EstreamError, TimeoutError) as exc:
            return kp.error_code(exc), str(exc)[:200]

    async def _exists(self, name: str) -> bool:
        try:
            await self.client.describe_stream(name)
        except StreamNotFound:
            return False
        return True

    async def _create_topics(self, request: Any, version: int) -> Any:
        schema = kp.response_schema(kp.CREATE_TOPICS, version)
        result_cls = kp.nested(schema, "CreatableTopicResult")
        results = []
        for topic in request.topics:
            error, message = await self._create_topic(topic, bool(request.validate_only))
            results.append(kp.build(
                result_cls, name=topic.name, error_code=error, error_message=message or None,
                topic_config_error_code=ErrorCode.none,
                num_partitions=topic.num_partitions, replication_factor=topic.replication_factor,
                configs=()))
        return kp.build(schema, throttle_time=0, topics=tuple(results))

    async def _delete_topics(self, request: Any, version: int) -> Any:
        schema = kp.response_schema(kp.DELETE_TOPICS, version)
        result_cls = kp.nested(schema, "DeletableTopicResult")
        counts = await topic_counts(self.client, request.topic_names)
        results = []
        for name in request.topic_names:
            error, message = ErrorCode.none, None
            if name not in counts:
                error = ErrorCode.unknown_topic_or_partition
            else:
                try:  # the last partition first: one that fails keeps those below it,
                    #   so the topic still lists them and deleting it again finishes
                    for p in reversed(range(counts[name])):
                        stream = stream_name(name, p)
                        writer = self._writers.get(stream)
                        if writer is not None:
                            self._drop_writer(stream, writer)
                        self.tail.forget(stream)
                        await self.client.delete_stream(stream)
                except (EstreamError, TimeoutError) as exc:
                    error, message = kp.error_code(exc), str(exc)[:200]
            results.append(kp.build(result_cls, name=name, error_code=error,
                                    error_message=message))
        return kp.build(schema, throttle_time=0, responses=tuple(results))

    async def close(self) -> None:
        """Stop: end every connection (:meth:`_end_connections`), then close the
        partitions' writers and leave PD."""
        await self._end_connections()
        await self._close_writers()
        if self.membership is not None:  # its partitions move now, not after the TTL
            await self.membership.leave()
        for task in list(self._background):
            task.cancel()

    async def _end_connections(self) -> None:
        """Every connection stops reading, as when its peer closes it (its long polls
        cancelled, its other requests answered), and closes; its task is awaited (at most
        :data:`close_wait_ms_max`, then cancelled)."""
        self._stopping = True
        for reader, writer in list(self._connections.values()):
            with contextlib.suppress(Exception):
                cast(asyncio.Transport, writer.transport).pause_reading()  # (no data
                #   after the end fed below: a StreamReader refuses it)
            reader.feed_eof()
        tasks = list(self._connections)
        if not tasks:
            return
        _, late = await asyncio.wait(tasks, timeout=close_wait_ms_max / 1000)
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late)


def _answer_of(task: asyncio.Task[bytes | None]) -> bytes | None:
    """A finished request's answer: None when it has none (acks=0), was cancelled (its
    connection closed while it waited) or failed (logged: a handler's bug must not end the
    connection's other requests)."""
    if task.cancelled():
        return None
    if task.exception() is not None:
        log.error("a Kafka request failed", exc_info=task.exception())
        return None
    return task.result()


def _charged(task: asyncio.Task[bytes | None], frame_bytes: int, load: InFlight
             ) -> asyncio.Task[bytes | None]:
    """``task``, whose request holds ``frame_bytes`` of ``load`` until its answer is ready,
    then the answer's bytes (until :meth:`Gateway._send_in_order` writes it)."""

    def ready(task: asyncio.Task[bytes | None]) -> None:
        answer = None if task.cancelled() or task.exception() is not None else task.result()
        load.answered(frame_bytes, 0 if answer is None else len(answer))

    task.add_done_callback(ready)
    return task
