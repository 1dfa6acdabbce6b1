"""``estream stream create|list|describe|delete|trim|set`` and ``estream cursor
list|describe|commit|delete`` (named cursors: a consumer's committed position, kept by PD).

``stream set NAME --retention-ms MS --retention-bytes BYTES`` changes the limits of an
existing stream: a positive integer is the new limit, ``none`` removes it, a flag left out
keeps it; at least one flag is needed (usage error, exit 2).

Side effects: PD calls through the SDK client; output on stdout.
"""

from __future__ import annotations

import argparse
import urllib.parse
from typing import Any

from estream.cli.admin import admin_get
from estream.cli.output import emit_json, human_bytes, iso_ms, key_values, print_tables, table
from estream.core.stripedread import holding
from estream.server.config import int_in, non_negative_int, positive_int
from estream.wire.fields import streams_page_max
from estream.wire.meta import ACK_COUNT_DEFAULT, DIGEST_DEFAULT, REPLICAS_DEFAULT
from estream.wire.record import DIGESTS


def _servers(stream: dict[str, Any], rng: dict[str, Any]) -> str:
    """A range's servers; for a striped stream each with how much of the range it holds
    (:func:`~estream.core.stripedread.holding`: of the batch count once sealed with one,
    else its share, R/E)."""
    servers = [str(x.get("address")) for x in rng.get("replicas", [])]
    ensemble, replicas = stream.get("ensemble") or 0, stream.get("replicas") or 0
    if isinstance(ensemble, int) and isinstance(replicas, int) and ensemble > replicas > 0:
        batches = rng.get("batches") if isinstance(rng.get("batches"), int) else None
        servers = [f"{s} ({holding(ensemble, replicas, p, batches)})"
                   for p, s in enumerate(servers)]
    return ", ".join(servers) or "-"


def _ranges_table(stream: dict[str, Any]) -> Any:
    rows = [
        (
            r.get("index"),
            r.get("start"),
            r.get("end"),
            r.get("state"),
            r.get("tier", "local"),
            _servers(stream, r),
        )
        for r in stream.get("ranges", [])
    ]
    left = [f"{stream['ranges_omitted']} earlier"] if stream.get("ranges_omitted") else []
    left += ["later ones"] if stream.get("ranges_more") else []
    title = "ranges" + (f" (left out: {', '.join(left)}; --offset N or --index N shows others)"
                        if left else "")
    return table(title, ["index", "start", "end", "state", "tier", "replicas"], rows)


def show_stream(stream: dict[str, Any], as_json: bool) -> None:
    if as_json:
        emit_json(stream)
        return
    fields = {k: stream.get(k) for k in ("name", "id", "replicas", "ack_count", "epoch")}
    fields["ensemble"] = stream.get("ensemble", stream.get("replicas"))
    fields["start_offset"] = stream.get("start_offset")
    fields["type"] = stream.get("type") or "-"
    fields["hints"] = ", ".join(stream.get("hints") or ()) or "-"
    if "end_offset" in stream:
        fields["end_offset"] = stream["end_offset"]
    for figure in ("records", "bytes", "first_timestamp", "last_timestamp", "figures_exact"):
        if figure in stream:  # pd/streamfigures.py says what is approximate
            value = stream[figure]
            fields[figure] = "-" if value is None else (
                iso_ms(value) if figure.endswith("_timestamp") else value)
    for limit in ("retention_ms", "retention_bytes"):
        if stream.get(limit) is not None:
            fields[limit] = stream[limit]
    fields["digest"] = stream.get("digest", DIGEST_DEFAULT)
    print_tables(key_values(f"stream {stream.get('name')}", fields), _ranges_table(stream))


async def create(client: Any, ns: argparse.Namespace) -> int:
    retention = {k: v for k, v in (("retention_ms", ns.retention_ms),
                                   ("retention_bytes", ns.retention_bytes)) if v is not None}
    if ns.digest is not None:
        retention["digest"] = ns.digest  # the entry digest (estream/wire/record.py)
    if ns.ensemble is not None:
        retention["ensemble"] = ns.ensemble  # striping (estream/wire/stripe.py)
    meta = await client.create_stream(ns.name, replicas=ns.replicas, ack_count=ns.ack_count,
                                      exist_ok=ns.exist_ok, **retention)
    show_stream(meta.to_dict(), ns.json)
    return 0


async def list_(client: Any, ns: argparse.Namespace) -> int:
    """Every stream with its figures (end offset, records, bytes, last record time: the
    admin API's ``GET /v1/streams``, a page at a time), or with ``--limit`` one page of
    them after ``--after`` and the name the next page starts after."""
    streams: list[dict[str, Any]] = []
    after, nxt = ns.after, None
    while True:
        limit = ns.limit or list_page_streams
        page, _ = await admin_get(client, ns, f"/v1/streams?limit={limit}&after="
                                              f"{urllib.parse.quote(after)}")
        streams += page["streams"]
        nxt = page.get("next")
        if ns.limit is not None or not nxt or nxt <= after:
            break
        after = nxt
    if ns.json:
        emit_json({"streams": streams} | ({} if ns.limit is None else {"next": nxt}))
        return 0
    rows = [(s.get("name"), s.get("replicas"), s.get("ack_count"), s.get("end_offset"),
             s.get("records"), human_bytes(s.get("bytes")),
             "-" if s.get("last_timestamp") is None else iso_ms(s["last_timestamp"]),
             s.get("retention_ms") or "-",
             len(s.get("ranges") or ()) + int(s.get("ranges_omitted", 0)))
            for s in streams]
    columns = ["name", "replicas", "acks", "end offset", "records", "bytes", "last record",
               "retention ms", "ranges"]
    more = f" (next page: --after {nxt})" if ns.limit is not None and nxt else ""
    print_tables(table(f"{len(rows)} streams{more}", columns, rows))
    return 0


async def describe(client: Any, ns: argparse.Namespace) -> int:
    """The admin API's ``GET /v1/streams/{name}``: the stream's last ranges (8 unless
    ``--limit`` says more, at most 1,000; ``--offset``: those from the one holding it,
    ``--index``: those from that range on), and its figures, open range included."""
    asked = {k: getattr(ns, k) for k in ("offset", "index", "limit") if getattr(ns, k) is not None}
    query = ("?" + urllib.parse.urlencode(asked)) if asked else ""
    stream, _ = await admin_get(client, ns, f"/v1/streams/{urllib.parse.quote(ns.name)}"
                                            f"{query}")
    show_stream(stream, ns.json)
    return 0


async def delete(client: Any, ns: argparse.Namespace) -> int:
    deleted = await client.delete_stream(ns.name, stream_id=ns.id or 0)
    if ns.json:
        emit_json({"deleted": ns.name, "id": deleted})
    else:
        print(f"deleted stream {ns.name} (id {deleted})")
    return 0


async def trim(client: Any, ns: argparse.Namespace) -> int:
    meta = await client.trim(ns.name, ns.offset)
    if ns.json:
        emit_json(meta.to_dict())
    else:
        print(f"trimmed stream {ns.name}: start offset now {meta.start_offset}")
    return 0


async def set_(client: Any, ns: argparse.Namespace) -> int:
    changes = {k: None if v == "none" else v
               for k, v in (("retention_ms", ns.retention_ms),
                            ("retention_bytes", ns.retention_bytes)) if v is not None}
    meta = await client.set_retention(ns.name, **changes)
    if ns.json:
        emit_json(meta.to_dict())
    else:
        limits = ", ".join(f"{k} {'-' if v is None else v}" for k, v in (
            ("retention_ms", meta.retention_ms), ("retention_bytes", meta.retention_bytes)))
        print(f"stream {ns.name}: {limits}")
    return 0


list_page_streams = 500  # stream list: streams per admin API page (their figures asked at once)
_NAME = "the stream's name"
_CURSOR = "the cursor's name (letters, digits, '.', '_', '-')"


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    stream = sub.add_parser("stream", help="create, list, describe, delete, trim streams")
    ssub = stream.add_subparsers(dest="stream_command", metavar="COMMAND", required=True)
    p = ssub.add_parser("create", parents=[common], help="create a stream")
    p.add_argument("name", help=_NAME)
    p.add_argument("--replicas", type=positive_int, default=REPLICAS_DEFAULT,
                   help=f"replica count (default {REPLICAS_DEFAULT})")
    p.add_argument("--ack-count", type=positive_int, default=ACK_COUNT_DEFAULT,
                   help=f"acks per append (default {ACK_COUNT_DEFAULT})")
    p.add_argument("--ensemble", type=positive_int, default=None, metavar="E",
                   help="servers per range, at least --replicas (default: --replicas); batch "
                        "k on --replicas of them from k mod E (striping)")
    p.add_argument("--retention-ms", type=positive_int, default=None, metavar="MS",
                   help="trim whole sealed ranges whose records are all older than this")
    p.add_argument("--retention-bytes", type=positive_int, default=None, metavar="BYTES",
                   help="trim the oldest sealed ranges while the rest hold at least this")
    p.add_argument("--digest", choices=tuple(DIGESTS), default=None,
                   help=f"entry digest (default {DIGEST_DEFAULT}); hmac-sha256: a MAC keyed per "
                        "stream from the cluster secret (ESTREAM_SECRET), checked by every "
                        "reader")
    p.add_argument("--exist-ok", action="store_true",
                   help="succeed if the stream exists with these settings (other settings: "
                        "still an error)")
    p.set_defaults(handler=create)
    p = ssub.add_parser("list", parents=[common], help="list streams")
    p.add_argument("--limit", type=int_in(1, streams_page_max), default=None,
                   help=f"one page of at most this many streams, up to {streams_page_max} "
                        "(default: every stream)")
    p.add_argument("--after", default="", help="with --limit: the page after this name")
    p.set_defaults(handler=list_)
    p = ssub.add_parser("describe", parents=[common], help="a stream's settings and ranges")
    p.add_argument("name", help=_NAME)
    p.add_argument("--offset", type=non_negative_int, default=None,
                   help="the ranges from the one holding this offset on (default: the last)")
    p.add_argument("--index", type=non_negative_int, default=None,
                   help="the ranges from this range index on (not with --offset)")
    p.add_argument("--limit", type=positive_int, default=None,
                   help="show this many ranges (default 8, at most 1000)")
    p.set_defaults(handler=describe)
    p = ssub.add_parser("delete", parents=[common], help="delete a stream")
    p.add_argument("name", help=_NAME)
    p.add_argument("--id", type=positive_int, default=None,
                   help="only the stream of this id (its describe's id): refused if the "
                        "name was deleted and created again since")
    p.set_defaults(handler=delete)
    p = ssub.add_parser("trim", parents=[common], help="drop records below OFFSET")
    p.add_argument("name", help=_NAME)
    p.add_argument("offset", type=non_negative_int, help="the stream's new first offset")
    p.set_defaults(handler=trim)
    p = ssub.add_parser("set", parents=[common],
                        help="change a stream's retention limits (none: no limit)")
    p.add_argument("name", help=_NAME)
    p.add_argument("--retention-ms", type=_limit, default=None, metavar="MS|none",
                   help="the new time limit (left out: unchanged)")
    p.add_argument("--retention-bytes", type=_limit, default=None, metavar="BYTES|none",
                   help="the new size limit (left out: unchanged)")
    p.set_defaults(handler=set_, check=_check_set)
    _add_cursor_parsers(sub, common)


def _check_set(ns: argparse.Namespace) -> str | None:
    """The usage error of ``stream set`` without a limit to change, or None."""
    if ns.retention_ms is None and ns.retention_bytes is None:
        return "stream set: give --retention-ms, --retention-bytes or both"
    return None


def _limit(text: str) -> int | str:
    return "none" if text.lower() == "none" else positive_int(text)


async def cursor_list(client: Any, ns: argparse.Namespace) -> int:
    cursors = await client.list_cursors(ns.name)
    if ns.json:
        emit_json({"stream": ns.name, "cursors": cursors})
        return 0
    rows = [(c["cursor"], c["offset"], c["lag"]) for c in cursors]
    print_tables(table(f"{len(rows)} cursors of {ns.name}", ["cursor", "offset", "lag"], rows))
    return 0


async def cursor_describe(client: Any, ns: argparse.Namespace) -> int:
    found = [c for c in await client.list_cursors(ns.name) if c["cursor"] == ns.cursor]
    if not found:
        from estream.wire.errors import InvalidArgument

        raise InvalidArgument(f"stream {ns.name!r} has no cursor {ns.cursor!r}",
                              argument="cursor")
    if ns.json:
        emit_json({"stream": ns.name, **found[0]})
    else:
        print_tables(key_values(f"cursor {ns.cursor} of {ns.name}", dict(found[0])))
    return 0


async def cursor_commit(client: Any, ns: argparse.Namespace) -> int:
    await client.commit_cursor(ns.name, ns.cursor, ns.offset)
    if ns.json:
        emit_json({"stream": ns.name, "cursor": ns.cursor, "offset": ns.offset})
    else:
        print(f"cursor {ns.cursor} of stream {ns.name} committed at {ns.offset}")
    return 0


async def cursor_delete(client: Any, ns: argparse.Namespace) -> int:
    await client.delete_cursor(ns.name, ns.cursor)
    if ns.json:
        emit_json({"stream": ns.name, "deleted": ns.cursor})
    else:
        print(f"deleted cursor {ns.cursor} of stream {ns.name}")
    return 0


def _add_cursor_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    cursor = sub.add_parser("cursor", help="list, describe, commit, delete named cursors")
    csub = cursor.add_subparsers(dest="cursor_command", metavar="COMMAND", required=True)
    p = csub.add_parser("list", parents=[common],
                        help="a stream's cursors with their lag (readable end - offset)")
    p.add_argument("name", help=_NAME)
    p.set_defaults(handler=cursor_list)
    p = csub.add_parser("describe", parents=[common], help="one cursor's offset and lag")
    p.add_argument("name", help=_NAME)
    p.add_argument("cursor", help=_CURSOR)
    p.set_defaults(handler=cursor_describe)
    p = csub.add_parser("commit", parents=[common],
                        help="store CURSOR at OFFSET (the next offset its consumer reads)")
    p.add_argument("name", help=_NAME)
    p.add_argument("cursor", help=_CURSOR)
    p.add_argument("offset", type=non_negative_int, help="the next offset the consumer reads")
    p.set_defaults(handler=cursor_commit)
    p = csub.add_parser("delete", parents=[common],
                        help="forget CURSOR (it no longer holds retention)")
    p.add_argument("name", help=_NAME)
    p.add_argument("cursor", help=_CURSOR)
    p.set_defaults(handler=cursor_delete)
