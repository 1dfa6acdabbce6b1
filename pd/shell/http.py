"""The PD admin HTTP API (aiohttp): JSON views of the catalog, create/delete streams.

Endpoints and shapes: :mod:`pd.openapi` and ``docs/PROTOCOL.md``. Writes go through the
same :class:`~pd.shell.service.PdService` as the RPC port (so through Raft: any node accepts
them). Errors are ``{"error": {"code", "message"}}`` with 400 (bad input), 404 (unknown),
409 (conflict) or 503 (no leader reachable, no range servers to place on).

With tokens configured, the write endpoints (POST, PATCH, DELETE) need ``Authorization: Bearer
<token>`` (or a client certificate verified against the cluster CA) and answer 401
``UNAUTHENTICATED`` without; reads stay open unless ``protect_reads`` (``/healthz`` and
``/readyz`` always stay open, for load balancers, probes and supervisors).

Health: ``/healthz`` is liveness (200 while the process serves HTTP, whatever Raft says);
``/readyz`` is 200 only while this node knows a leader and has applied everything a leader
told it was committed since it started, else 503 (a probe then takes it out of a load
balancer: a leaderless or replaying node can neither commit nor answer reads).
``/metrics`` is the Prometheus text of ``prometheus-client`` (``pd/metrics.py`` records,
``estream/server/metrics.py`` exposes), ``process_*`` metrics included.

``GET /v1/streams/{name}`` adds the stream's figures (:mod:`pd.streamfigures`: end offset,
record count, bytes, first and last timestamps), asking the open range's replicas for its
end (DESCRIBE_RANGE, 1 s each; none answering: the open range's start), and for a stream
named ``T-p`` (partition p of Kafka topic T) ``"kafka": {"topic", "partition"}``. ``POST
/v1/streams/{name}/trim {"start_offset"}`` trims as the RPC does (400 past what readers can
read). ``PATCH /v1/streams/{name} {"retention_ms", "retention_bytes"}`` changes the
retention limits (a field left out is unchanged, null removes the limit; any other field
is a 400); ``DELETE /v1/streams/{name}/cursors/{cursor}`` forgets a named cursor (404 when
the stream has no such cursor).

Side effects: an HTTP listening socket.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any, Final

from aiohttp import web

from estream.net.objectstore import ObjectStore
from estream.net.security import bearer_token, token_role, verified_peer_cert
from estream.server.metrics import FamiliesCollector, metrics_response, new_registry
from estream.wire import limits
from estream.wire.errors import (
    Conflict,
    DigestKeyMissing,
    ErrorCode,
    EstreamError,
    Fenced,
    InvalidArgument,
    NoPlacement,
    OffsetOutOfRange,
    RangeNotFound,
    RangeSealed,
    ServerNotFound,
    StreamExists,
    StreamNotFound,
    Unavailable,
)
from estream.wire.fields import streams_page_default
from estream.wire.kafkanames import kafka_field
from estream.wire.pdmessages import (
    RETENTION_FIELDS,
    CreateStreamRequest,
    CursorRequest,
    DeleteStreamRequest,
    DescribeStreamRequest,
    ListStreamsRequest,
    SetRetentionRequest,
    TrimStreamRequest,
    retention_changes,
)
from estream.wire.roles import ALL_ROLES, certificate_role, http_action, permits_any
from pd.crosssite import cross_site_refusal
from pd.metrics import COMMIT_HELP, COMMIT_SECONDS, Family, counter_family, histogram_family
from pd.openapi import OPENAPI
from pd.paging import ranges_window, stream_answer
from pd.retention import cursor_rows
from pd.routeinputs import refused_input
from pd.shell.console import RangesReport, add_operator_routes, with_drain_outlooks
from pd.shell.groups import add_group_routes
from pd.shell.raft import RaftStatus
from pd.shell.service import PdService
from pd.validate import check_request

_STATUS: dict[type[EstreamError], int] = {
    InvalidArgument: 400,
    StreamNotFound: 404,
    RangeNotFound: 404,
    ServerNotFound: 404,
    StreamExists: 409,
    Conflict: 409,
    Fenced: 409,
    RangeSealed: 409,
    NoPlacement: 503,
    Unavailable: 503,  # includes Timeout
}
_STATUS[OffsetOutOfRange] = 400  # a cursor past the readable end
_STATUS[DigestKeyMissing] = 403  # the record browser on an hmac-sha256 stream (no secret)

log = logging.getLogger(__name__)
_cert_warnings_max: Final = 16  # distinct certificate warnings logged (then silent)


def error_response(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


def _status_of(exc: EstreamError) -> int:
    for cls in type(exc).__mro__:
        if cls in _STATUS:
            return _STATUS[cls]
    return 500


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


_READ_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
_ALWAYS_OPEN: Final = frozenset({"/healthz", "/readyz"})


def needs_token(method: str, path: str, protect_reads: bool) -> bool:
    """Whether a request must authenticate when tokens are configured. Pure."""
    if path in _ALWAYS_OPEN:
        return False
    return protect_reads or method.upper() not in _READ_METHODS


def build_app(
    service: PdService, *, tokens: Collection[str] | Mapping[str, str] = (),
    protect_reads: bool = False,
    ranges_report: RangesReport | None = None, object_store: ObjectStore | None = None,
    admin_hosts: Collection[str] = (),
) -> web.Application:
    """The aiohttp application serving the admin API of one PD node.

    ``tokens``: bearer tokens the write endpoints (and with ``protect_reads`` the reads)
    need, with their roles (:mod:`estream.wire.roles`: deleting or trimming a stream and
    draining or forgetting a server need ``admin``, other writes ``client``; a collection:
    every role); none: the API is open (the default, as before). A request over a
    verified client certificate (mutual TLS) has the role it names, tokens or not
    (:func:`estream.wire.roles.certificate_role`). Cross-site requests
    are refused with 403 (:mod:`pd.crosssite`; ``admin_hosts``: the names ``Host`` may
    give besides IP addresses and localhost).
    """
    names = frozenset(admin_hosts)

    @web.middleware
    async def same_site(request: web.Request, handler: Handler) -> web.StreamResponse:
        content_type = request.headers.get("Content-Type", "").partition(";")[0].strip()
        refusal = cross_site_refusal(
            request.method, request.headers.get("Host"), request.headers.get("Origin"),
            content_type, scheme=request.scheme, names=names)
        if refusal is not None:
            return error_response(403, "CROSS_SITE_REFUSED", refusal)
        return await handler(request)

    accepted = (dict(tokens) if isinstance(tokens, Mapping)
                else dict.fromkeys(tokens, ALL_ROLES))

    warned: set[str] = set()

    def cert_roles(request: web.Request) -> set[str]:
        """The role a verified client certificate names (mutual TLS), if one was shown."""
        cert = verified_peer_cert(request.transport)
        if cert is None:
            return set()
        role, problem = certificate_role(cert)
        if problem is not None and problem not in warned and len(warned) < _cert_warnings_max:
            warned.add(problem)
            log.warning("admin API: %s", problem)
        return {role}

    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not needs_token(request.method, request.path, protect_reads):
            return await handler(request)
        roles = cert_roles(request)
        if not accepted and not roles:
            return await handler(request)  # no tokens, no certificate: open, as before
        presented = bearer_token(request.headers.get("Authorization"))
        role = token_role(accepted, presented)
        if role is not None:
            roles.add(role)  # with a certificate's: either one's grants
        if not roles:
            response = error_response(
                401, "UNAUTHENTICATED",
                "this endpoint needs 'Authorization: Bearer <token>'"
                + (" (a token was given but is not valid)" if presented else ""))
            response.headers["WWW-Authenticate"] = 'Bearer realm="estream"'
            return response
        action = http_action(request.method, request.path)
        if not permits_any(roles, action):
            return error_response(
                403, "PERMISSION_DENIED",
                f"{request.method} {request.path} needs a token or certificate whose role "
                f"may {action.value} (this request's role: {', '.join(sorted(roles))})")
        return await handler(request)

    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        ok = False
        route = request.match_info.route.resource
        op = f"{request.method} {route.canonical if route is not None else 'unmatched'}"
        try:
            response = await handler(request)
            ok = response.status < 400
            return response
        except EstreamError as exc:
            return error_response(_status_of(exc), ErrorCode(exc.code).name, exc.message)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return error_response(exc.status, exc.reason.upper().replace(" ", "_"), exc.reason)
        except Exception:  # a bug: logged whole, answered as JSON like every other error
            log.exception("admin API %s failed", op)
            return error_response(500, "INTERNAL", f"internal error in {op} (logged)")
        finally:
            service.metrics.observe("http", op, time.perf_counter() - started, ok)

    @web.middleware
    async def inputs(request: web.Request, handler: Handler) -> web.StreamResponse:
        route = request.match_info.route.resource
        if route is not None:
            given = [name for name, _ in request.query.items()]  # (a name given twice: twice)
            refusal = refused_input(request.method, route.canonical, given,
                                    request.body_exists)
            if refusal is not None:
                raise refusal
        return await handler(request)

    app = web.Application(middlewares=[same_site, errors, authenticate, inputs],
                          client_max_size=1024 * 1024)
    views = _Views(service)
    app.router.add_get("/v1/cluster", views.cluster)
    app.router.add_get("/v1/streams", views.list_streams)
    app.router.add_post("/v1/streams", views.create_stream)
    app.router.add_get("/v1/streams/{name}", views.describe_stream)
    app.router.add_get("/v1/streams/{name}/cursors", views.list_cursors)
    app.router.add_post("/v1/streams/{name}/trim", views.trim_stream)
    app.router.add_post("/v1/streams/{name}/cursors", views.commit_cursor)
    app.router.add_delete("/v1/streams/{name}/cursors/{cursor}", views.delete_cursor)
    app.router.add_patch("/v1/streams/{name}", views.set_retention)
    app.router.add_delete("/v1/streams/{name}", views.delete_stream)
    app.router.add_get("/v1/rangeservers", views.rangeservers)
    add_operator_routes(app, service, ranges_report,  # drain, forget, /v1/ranges, /ui,
                        views._gauges, object_store)  # records, samples
    add_group_routes(app, service)  # GET /v1/groups, /v1/groups/{name}
    app.router.add_get("/v1/openapi.json", views.openapi)
    app.router.add_get("/healthz", views.healthz)
    app.router.add_get("/readyz", views.readyz)
    app.router.add_get("/metrics", views.metrics)
    return app


class _Views:
    def __init__(self, service: PdService) -> None:
        self.service = service
        self.registry = new_registry()
        self.registry.register(FamiliesCollector(self._families))

    async def cluster(self, request: web.Request) -> web.Response:
        return web.json_response(self.service.cluster())

    async def list_streams(self, request: web.Request) -> web.Response:
        page_asked = ListStreamsRequest.from_header({"after": request.query.get("after"),
                                                     "limit": _query_int(request.query, "limit")})
        after, limit = page_asked.after, page_asked.limit or streams_page_default
        page = await self.service.list_streams_with_figures(after, limit)
        return web.json_response({"streams": list(page.streams), "next": page.next})

    async def create_stream(self, request: web.Request) -> web.Response:
        body = _json_object(await request.read(), CreateStreamRequest.BODY_FIELDS)
        stream = await self.service.create_stream(CreateStreamRequest.from_body(body))
        return web.json_response(stream.to_dict() | {"ensemble": stream.ensemble}, status=201)

    async def list_cursors(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        end, cursors = await self.service.list_cursors(name)
        return web.json_response({"stream": name, "end": end,
                                  "cursors": cursor_rows(end, cursors)})

    async def commit_cursor(self, request: web.Request) -> web.Response:
        body = _json_object(await request.read(), CursorRequest.BODY_FIELDS)
        commit = CursorRequest.from_body(request.match_info["name"], body)
        assert commit.offset is not None
        await self.service.commit_cursor(commit.name, commit.cursor, commit.offset)
        return web.json_response({"cursor": commit.cursor, "offset": commit.offset})

    async def delete_cursor(self, request: web.Request) -> web.Response:
        name, cursor = request.match_info["name"], request.match_info["cursor"]
        try:
            await self.service.delete_cursor(name, cursor)
        except InvalidArgument as exc:
            if exc.fields.get("argument") != "cursor":
                raise
            return error_response(404, "NOT_FOUND", exc.message)  # no such cursor
        return web.json_response({"stream": name, "deleted": cursor})

    async def set_retention(self, request: web.Request) -> web.Response:
        body = _json_object(await request.read(), RETENTION_FIELDS)
        stream = await self.service.set_retention(SetRetentionRequest(
            name=request.match_info["name"], changes=retention_changes(body)))
        return web.json_response(stream_answer(stream))

    async def describe_stream(self, request: web.Request) -> web.Response:
        asked = DescribeStreamRequest.from_header(
            {"name": request.match_info["name"]} | {k: _query_int(request.query, k) for k in
                                                    ("offset", "index", "limit")
                                                    if k in request.query})
        stream = await self.service.describe_stream(asked.name)
        limit = asked.limit or limits.stream_ranges_per_answer_default
        shown = ranges_window(stream, asked.offset, limit, index=asked.index)  # figures: whole
        # 1 s per open-range replica at most
        kafka = kafka_field(stream.name)  # partition p of topic T (estream kafka)
        return web.json_response(shown.to_dict() | {"ensemble": stream.ensemble}
                                 | await self.service.figures(stream)
                                 | ({"kafka": kafka} if kafka else {}))

    async def trim_stream(self, request: web.Request) -> web.Response:
        body = _json_object(await request.read(), TrimStreamRequest.BODY_FIELDS)
        trim = TrimStreamRequest.from_body(request.match_info["name"], body)
        stream = await self.service.trim_stream(trim.name, trim.start_offset)
        return web.json_response(stream_answer(stream))

    async def delete_stream(self, request: web.Request) -> web.Response:
        """``?id=``: only that incarnation of the name (another: 404). ``?request_id=``: the
        client's id of this delete, the same on every retry of it: a retry of one that
        landed answers the id it deleted and deletes nothing (not a stream created under
        the name since), as the RPC's ``request_id``."""
        query = request.query
        header = {"name": request.match_info["name"]} | (
            {"stream_id": _query_int(query, "id")} if "id" in query else {}) | (
            {"request_id": query["request_id"]} if "request_id" in query else {})
        check_request(header)
        asked = DeleteStreamRequest.from_header(header)
        if not asked.request_id:  # (a retry's name may be gone: the deleter answers it)
            # 404 without a Raft round for unknown names (and for another incarnation)
            (await self.service.read_view()).stream(asked.name, asked.stream_id)
        deleted = await self.service.delete_stream(asked.name, stream_id=asked.stream_id,
                                                   request_id=asked.request_id)
        return web.json_response({"deleted": asked.name, "id": deleted})

    async def rangeservers(self, request: web.Request) -> web.Response:
        servers = await with_drain_outlooks(self.service, await self.service.server_details())
        return web.json_response({"rangeservers": servers})

    async def openapi(self, request: web.Request) -> web.Response:
        return web.json_response(OPENAPI)

    async def healthz(self, request: web.Request) -> web.Response:
        status = self.service.raft.status()
        return web.json_response({"status": "ok", "role": status.role, "leader": status.leader})

    async def readyz(self, request: web.Request) -> web.Response:
        raft = self.service.raft
        status = raft.status()
        problem = not_ready_reason(status, raft.ready())
        if problem is None:
            return web.json_response({"status": "ready", "role": status.role,
                                      "leader": status.leader})
        response = error_response(503, "UNAVAILABLE", problem)
        response.headers["Retry-After"] = "1"
        return response

    async def metrics(self, request: web.Request) -> web.Response:
        return metrics_response(self.registry)

    def _families(self) -> list[Family]:
        raft = self.service.raft
        return self.service.metrics.families(self._gauges(), [
            counter_family("estream_pd_raft_proposals_total",
                           "Commands proposed by this node.", raft.proposals),
            histogram_family(COMMIT_SECONDS, COMMIT_HELP, raft.commit_seconds),
        ])

    def _gauges(self) -> dict[str, tuple[str, float]]:
        status = self.service.raft.status()
        view = self.service.view()
        servers = self.service.servers()
        roles = {"follower": 0, "candidate": 1, "leader": 2}
        return {
            "estream_pd_raft_role": ("Raft role: 0 follower, 1 candidate, 2 leader.",
                                     roles.get(status.role, 0)),
            "estream_pd_raft_is_leader": ("1 on the leader.", float(status.role == "leader")),
            "estream_pd_raft_term": ("Current Raft term.", status.term),
            "estream_pd_raft_commit_index": ("Raft commit index.", status.commit_index),
            "estream_pd_raft_last_applied": ("Last applied Raft index.", status.last_applied),
            "estream_pd_raft_log_entries": ("Entries in the Raft journal.", status.log_entries),
            "estream_pd_streams": ("Streams in the catalog.", len(view.streams)),
            "estream_pd_ranges": ("Ranges in the catalog.", view.range_count()),
            "estream_pd_rangeservers": ("Registered range servers.", len(servers)),
            "estream_pd_rangeservers_live": ("Range servers alive (per this node).",
                                             sum(1 for s in servers if s.alive)),
            "estream_pd_raft_has_leader": ("1 while this node knows a leader.",
                                           float(status.leader is not None)),
            "estream_pd_ready": ("1 while /readyz answers 200 (a leader known, caught up).",
                                 float(not_ready_reason(status, self.service.raft.ready())
                                       is None)),
            "estream_pd_writer_leases": ("Writer leases the leader holds (0 on followers).",
                                         len(self.service.leases)),
            "estream_pd_keepalive_sessions": (
                "Writer keepalive sessions the leader holds (each holds a lease: at most the "
                "leases held; 0 on followers).", len(self.service.keepalive_sessions)),
            "estream_pd_keepalive_session_writers": (
                "Writers listed in those sessions (at most keepalive_writers_max each).",
                self.service.keepalive_sessions.writers()),
            "estream_pd_ranges_under_replicated": (
                "Ranges kept on range servers with fewer live replicas than the stream's "
                "replica count (per this node's liveness view).",
                self.service.replica_totals.under_replicated(
                    view.streams, {s.id for s in servers if s.alive})),
        }


def not_ready_reason(status: RaftStatus, caught_up: bool) -> str | None:
    """Why this node is not ready, or None. Pure.

    A follower that lost every peer keeps naming its last leader (pysyncobj starts an
    election only while connected to someone), so a leader counts only while this node is
    it or is connected to it; a leader without a majority steps down by itself."""
    if status.leader is None:
        return "this PD node knows no leader (no majority reachable, or an election)"
    if status.leader != status.self_address and not status.peers_connected.get(status.leader):
        return f"this PD node is not connected to its last known leader {status.leader}"
    if not caught_up:
        return "this PD node has not applied everything committed yet (catching up)"
    return None


def _query_int(query: Mapping[str, str], name: str) -> object:
    """A query parameter as an integer when it is one (digits only), else as given (the
    check that follows refuses it naming ``name``); None when absent."""
    raw = query.get(name)
    if raw is not None and raw.isascii() and raw.isdigit() and len(raw) < 20:
        return int(raw)
    return raw


def _json_object(raw: bytes, fields: Collection[str]) -> dict[str, Any]:
    """A request body: a JSON object of only ``fields`` (an unknown one, a misspelt
    ``retenion_ms`` say, is refused naming it rather than ignored), each within its bounds."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise InvalidArgument(f"request body is not JSON: {exc}", argument="body") from None
    if not isinstance(body, dict):
        raise InvalidArgument("request body must be a JSON object", argument="body")
    unknown = sorted(str(k)[:64] for k in body if k not in fields)
    if unknown:
        raise InvalidArgument(f"unknown field {unknown[0]!r}: this request takes "
                              f"{', '.join(sorted(fields))}", argument=unknown[0])
    check_request(body)  # every field's bounds (pd/validate.py), as the RPC port's
    return body
