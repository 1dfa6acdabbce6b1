"""Hostile fields at a real PD (pd/validate.py): a 900 KiB name, 2**64, -2**63-1, a
10,000-element list, through each opcode and the admin API, are refused with
InvalidArgument (400) naming the field; nothing reaches Raft (the journal keeps its size)
and PD keeps serving."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any, Final

import pytest
from prometheus_client.parser import text_string_to_metric_families

import estream
from estream.devcluster.cluster import Cluster
from estream.devcluster.pd import http_json
from estream.net.pdclient import PDClient
from estream.wire import limits
from estream.wire.errors import InvalidArgument
from estream.wire.protocol import Opcode

pytestmark = [pytest.mark.integration, pytest.mark.cluster(pd_nodes=1, range_servers=3)]

HUGE: Final = "x" * (900 * 1024)
U64: Final = 2**64 - 1  # the largest integer msgpack carries; above int64
MANY: Final = ["rs"] * 10_000
STREAM: Final = "hostile"

CASES: Final[list[tuple[Opcode, dict[str, Any], str]]] = [
    (Opcode.PD_CREATE_STREAM, {"name": HUGE}, "name"),
    (Opcode.PD_CREATE_STREAM, {"name": "h2", "hints": MANY}, "hints"),
    (Opcode.PD_CREATE_STREAM, {"name": "h2", "retention_ms": U64}, "retention_ms"),
    (Opcode.PD_CREATE_STREAM, {"name": "h2", "request_id": HUGE}, "request_id"),
    (Opcode.PD_DESCRIBE_STREAM, {"name": HUGE}, "name"),
    (Opcode.PD_DELETE_STREAM, {"name": HUGE}, "name"),
    (Opcode.PD_OPEN_WRITER, {"name": HUGE}, "name"),
    (Opcode.PD_SEAL_RANGE, {"name": STREAM, "epoch": U64, "range_index": 0, "end": 0}, "epoch"),
    (Opcode.PD_SEAL_RANGE, {"name": STREAM, "epoch": 1, "range_index": 0, "end": U64}, "end"),
    (Opcode.PD_SEAL_RANGE, {"name": STREAM, "epoch": 1, "range_index": 0, "end": 0,
                            "exclude": MANY}, "exclude"),
    (Opcode.PD_TRIM_STREAM, {"name": STREAM, "start_offset": U64}, "start_offset"),
    (Opcode.PD_UPDATE_REPLICAS, {"name": STREAM, "range_index": 0, "replicas": MANY},
     "replicas"),
    (Opcode.PD_WRITER_KEEPALIVE, {"name": STREAM, "epoch": U64}, "epoch"),
    (Opcode.PD_COMMIT_CURSOR, {"name": STREAM, "cursor": HUGE, "offset": 0}, "cursor"),
    (Opcode.PD_COMMIT_CURSOR, {"name": STREAM, "cursor": "c", "offset": U64}, "offset"),
    (Opcode.PD_SET_RETENTION, {"name": STREAM, "retention_bytes": U64}, "retention_bytes"),
    (Opcode.PD_DELETE_CURSOR, {"name": STREAM, "cursor": HUGE}, "cursor"),
    (Opcode.PD_LIST_CURSORS, {"name": HUGE}, "name"),
    (Opcode.PD_TIME_RANGES, {"name": STREAM, "timestamp": U64}, "timestamp"),
    (Opcode.PD_REGISTER_SERVER, {"server_id": HUGE, "address": "127.0.0.1:1"}, "server_id"),
    (Opcode.PD_REGISTER_SERVER, {"server_id": "rs-x", "address": HUGE}, "address"),
    (Opcode.PD_HEARTBEAT, {"server_id": HUGE, "address": "127.0.0.1:1"}, "server_id"),
    (Opcode.PD_DRAIN_SERVER, {"server_id": HUGE}, "server_id"),
    (Opcode.PD_FORGET_SERVER, {"server_id": HUGE}, "server_id"),
    (Opcode.PD_DESCRIBE_SERVERS, {"server_id": HUGE}, "server_id"),
    (Opcode.PD_REPORT_OBJECT_DAMAGE, {"stream_id": U64, "range_index": 0, "object_key": "k",
                                      "reason": "checksum"}, "stream_id"),
]

HTTP_CASES: Final[list[tuple[str, str, dict[str, Any], str]]] = [
    ("POST", "/v1/streams", {"name": HUGE}, "name"),
    ("POST", "/v1/streams", {"name": "h3", "hints": MANY}, "hints"),
    ("POST", "/v1/streams", {"name": "h3", "retention_ms": -(2**63) - 1}, "retention_ms"),
    ("PATCH", f"/v1/streams/{STREAM}", {"retention_ms": 2**64}, "retention_ms"),
    ("PATCH", f"/v1/streams/{STREAM}", {"retention_bytes": 2**70}, "retention_bytes"),
    ("POST", f"/v1/streams/{STREAM}/trim", {"start_offset": 2**64}, "start_offset"),
    ("POST", f"/v1/streams/{STREAM}/cursors", {"cursor": "c", "offset": 2**64}, "offset"),
    ("POST", f"/v1/streams/{STREAM}/cursors", {"cursor": HUGE, "offset": 0}, "cursor"),
]


def journal_bytes(cluster: Cluster) -> int:
    data_dir: Path = cluster.pd.nodes[0].data_dir
    # Not "raft.journal.meta.tmp": the metadata's atomic rewrite (a commit index moving)
    # leaves it for an instant, and a size read then is not the journal's.
    return sum(p.stat().st_size for p in data_dir.glob("raft.journal*")
               if not p.name.endswith(".tmp"))


async def settled_journal(cluster: Cluster) -> None:
    """Wait (at most 5 s) until the journal's size holds still for 0.3 s: the stream's
    creation, and PD's own commands at start, are written."""
    last, still_since = journal_bytes(cluster), time.monotonic()
    deadline = still_since + 5.0
    while time.monotonic() < deadline and time.monotonic() - still_since < 0.3:
        await asyncio.sleep(0.05)
        now = journal_bytes(cluster)
        if now != last:
            last, still_since = now, time.monotonic()


@pytest.fixture
async def stream(cluster: Cluster) -> str:
    async with await estream.connect(cluster.pd_addresses) as client:
        with contextlib.suppress(estream.StreamExists):  # made by an earlier test
            await client.create_stream(STREAM)
    await settled_journal(cluster)
    return STREAM


@pytest.mark.parametrize(("opcode", "header", "field"), CASES,
                         ids=[f"{op.name.lower()}-{field}" for op, _, field in CASES])
async def test_each_opcode_refuses_a_hostile_field_before_raft(
        cluster: Cluster, stream: str, opcode: Opcode, header: dict[str, Any],
        field: str) -> None:
    members = cluster.member_pool()  # member opcodes among them: as a member sends them
    try:
        async with PDClient(cluster.pd_addresses, timeout_s=10, pool=members) as pd:
            for attempt in range(2):
                before = journal_bytes(cluster)
                with pytest.raises(InvalidArgument) as info:
                    await pd.call(opcode, header)
                assert info.value.argument == field
                assert len(str(info.value)) < 1024  # the answer does not echo the input
                if journal_bytes(cluster) == before or attempt:
                    break
                await settled_journal(cluster)  # (a command of PD's own landed meanwhile)
            assert journal_bytes(cluster) == before
            assert (await pd.describe_stream(stream)).name == stream  # still serving
    finally:
        await members.close()


@pytest.mark.parametrize(("method", "path", "body", "field"), HTTP_CASES,
                         ids=[f"{m}-{p.rpartition('/')[2]}-{f}" for m, p, _, f in HTTP_CASES])
def test_the_admin_api_refuses_a_hostile_field_before_raft(
        cluster: Cluster, stream: str, method: str, path: str, body: dict[str, Any],
        field: str) -> None:
    before = journal_bytes(cluster)
    status, answer = http_json(cluster.pd.nodes[0].url + path, method, body)
    assert status == 400, answer
    assert field in str(answer["error"]["message"]) or answer["error"].get("field") == field
    assert journal_bytes(cluster) == before
    status, _ = http_json(cluster.pd.nodes[0].url + f"/v1/streams/{stream}")
    assert status == 200


def leader_gauges(cluster: Cluster) -> dict[str, float]:
    status, text = http_json(cluster.pd.nodes[0].url + "/metrics")
    assert status == 200 and isinstance(text, str)
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def keepalive_gauges(cluster: Cluster) -> tuple[float, float]:
    """The PD leader's ``estream_pd_keepalive_sessions`` and ``..._session_writers``."""
    found = leader_gauges(cluster)
    return found["estream_pd_keepalive_sessions"], found["estream_pd_keepalive_session_writers"]


async def test_a_new_session_name_per_keepalive_leaves_one_session_per_lease(
        cluster: Cluster) -> None:
    """Adversarial review (issue 27): a client sending its writers' whole list under a
    new session name each time made the leader keep a session per request (each with its
    list) until 16 s idle. Sessions held follow leases held: 300 names, 2 leases, at most
    2 sessions; a name replayed after its writers moved on renews nothing; the fields at
    the protocol's worst are refused naming the field."""
    async with PDClient(cluster.pd_addresses, timeout_s=10) as pd:
        writers = []
        for name in ("ka-0", "ka-1"):
            with contextlib.suppress(estream.StreamExists):
                await pd.create_stream(name)
            meta = await pd.open_writer(name)
            writers.append((name, meta.id, meta.epoch))
        for i in range(300):
            answers, held = await pd.keepalive_session(f"h/{i}", 0, writers, len(writers))
            assert answers == [(), ()] and held
        sessions, listed = keepalive_gauges(cluster)
        assert sessions <= len(writers) and listed <= len(writers) * len(writers)
        # An old name replayed: not held (its leases are bound to h/299): send the list.
        assert await pd.keepalive_session("h/0", 0, None, len(writers)) is None
        # Its writers fenced (a newer epoch): the newest session is let go at once.
        for name, _, _ in writers:
            await pd.open_writer(name)
        answers, held = await pd.keepalive_session("h/299", 1, writers, len(writers))
        assert all(isinstance(a, estream.Fenced) for a in answers) and not held
        assert keepalive_gauges(cluster) == (0, 0)
        # A stream deleted and made again: the old incarnation's session renews nothing.
        with contextlib.suppress(estream.StreamExists):
            await pd.create_stream("ka-2")
        old = await pd.open_writer("ka-2")
        mine = [("ka-2", old.id, old.epoch)]
        assert await pd.keepalive_session("d/0", 0, mine, 1) == ([()], True)
        await pd.delete_stream("ka-2")
        await pd.create_stream("ka-2")
        new = await pd.open_writer("ka-2")
        replayed = await pd.keepalive_session("d/0", 0, None, 1)
        assert replayed is None or isinstance(replayed[0][0], estream.StreamNotFound)
        answers, held = await pd.keepalive_session("d/0", 1, mine, 1)
        assert isinstance(answers[0], estream.StreamNotFound) and not held
        assert await pd.keepalive_session("d/1", 0, [("ka-2", new.id, new.epoch)], 1) == (
            [()], True)
        for header, field in [({"session": "s", "generation": g}, "generation")
                              for g in (-1, 2**63, 2**64 - 1, True, 1.5, "0", None)] + [
                ({"session": s, "generation": 0}, "session")
                for s in ("", "x" * 65, 7, ["s"], None)]:
            with pytest.raises(InvalidArgument) as info:
                await pd.call(Opcode.PD_WRITERS_KEEPALIVE, {**header, "writers": []})
            assert info.value.argument == field, header
        answers, held = await pd.keepalive_session("x" * 64, 2**63 - 1, [], 0)
        assert answers == [] and not held  # (the bounds themselves: accepted, nothing bound)


async def test_commits_at_the_worst_numbers_and_other_incarnations_are_refused(
        cluster: Cluster) -> None:
    """Adversarial review: PD_COMMIT_CURSOR's ``stream_id`` and PD_GROUP_COMMIT's entries
    ``[stream, offset, stream_id?]`` at the worst the protocol allows are refused naming
    the field before Raft; a stream id of another stream, or of a deleted one, commits
    nothing; PD keeps serving."""
    async with PDClient(cluster.pd_addresses, timeout_s=10) as pd:
        for name in ("c-a", "c-b"):
            with contextlib.suppress(estream.StreamExists):
                await pd.create_stream(name)
        a, b = await pd.describe_stream("c-a"), await pd.describe_stream("c-b")
        for stream_id, field in [(2**63, "stream_id"), (2**64 - 1, "stream_id"),
                                 (-1, "stream_id"), (True, "stream_id"),
                                 (1.5, "stream_id"), ("1", "stream_id")]:
            with pytest.raises(InvalidArgument) as info:
                await pd.call(Opcode.PD_COMMIT_CURSOR, {"name": "c-a", "cursor": "c",
                                                        "offset": 0, "stream_id": stream_id})
            assert info.value.argument == field, stream_id
        with pytest.raises(estream.StreamNotFound):  # another stream's id
            await pd.call(Opcode.PD_COMMIT_CURSOR, {"name": "c-a", "cursor": "c",
                                                    "offset": 0, "stream_id": b.id})
        for entry in (["c-a", 2**63], ["c-a", -1], ["c-a", True], ["c-a", 1.5],
                      ["c-a", 0, 2**63], ["c-a", 0, -1], ["c-a", 0, False], ["c-a"],
                      ["c-a", 0, a.id, 0], [7, 0], "c-a"):
            with pytest.raises(InvalidArgument) as info:
                await pd.call(Opcode.PD_GROUP_COMMIT, {"group": "g", "offsets": [entry]})
            assert info.value.argument == "offsets", entry
        with pytest.raises(InvalidArgument) as info:
            await pd.call(Opcode.PD_GROUP_COMMIT, {"group": "g",
                                                   "offsets": [["c-a", 0]] * 10_000})
        assert info.value.argument == "offsets"
        answer = await pd.call(Opcode.PD_GROUP_COMMIT, {"group": "g", "offsets": [
            ["c-a", 0, b.id], ["c-a", 0, a.id], ["c-b", 0, b.id]]})
        assert answer["errors"] == ["unknown_topic_or_partition", "", ""]
        await pd.delete_stream("c-b")
        await pd.create_stream("c-b")
        answer = await pd.call(Opcode.PD_GROUP_COMMIT, {"group": "g", "offsets": [
            ["c-b", 0, b.id]]})
        assert answer["errors"] == ["unknown_topic_or_partition"]
        _, cursors = await pd.list_cursors("c-b")
        assert cursors == []  # the old incarnation's commit left nothing on the new one


async def test_lists_padded_with_writers_that_renew_nothing_are_not_kept(
        cluster: Cluster) -> None:
    """Adversarial review (issue 27): a session holding one lease could list 4,095 more
    writers that renew nothing (no such stream), each list kept: memory leases x 4,096.
    The writers the leader keeps listed stay within twice its leases plus one list; a
    list past that is answered (the lease renewed) but not kept."""
    async with PDClient(cluster.pd_addresses, timeout_s=10) as pd:
        padding = [(f"none-{i}", 10**9 + i, 1) for i in range(limits.keepalive_writers_max - 1)]
        for i in range(3):
            name = f"pad-{i}"
            with contextlib.suppress(estream.StreamExists):
                await pd.create_stream(name)
            meta = await pd.open_writer(name)
            answers, _ = await pd.keepalive_session(
                f"pad/{i}", 0, [(name, meta.id, meta.epoch), *padding], len(padding) + 1)
            assert answers[0] == () and all(
                isinstance(a, estream.StreamNotFound) for a in answers[1:])
        found = leader_gauges(cluster)
        leases = found["estream_pd_writer_leases"]
        assert 1 <= found["estream_pd_keepalive_sessions"] <= 3 and 3 <= leases
        assert found["estream_pd_keepalive_session_writers"] <= (
            2 * leases + limits.keepalive_writers_max)


async def test_a_lease_bound_away_by_another_client_is_never_answered_as_renewed(
        cluster: Cluster) -> None:
    """Adversarial review (issue 27): a writer-role client listing another client's writer
    (same stream id and epoch) under its own session binds that lease to itself; the
    victim's short keepalive (its session still holding its other writers' leases) was
    still answered "renewed" for it from its record though it no longer renewed that
    lease (had the thief stopped, the lease would have run out under a writer told all
    was well). Now the victim's record is dropped at once: its next keepalive is asked
    for its list, which takes the lease back: every answer true, the lease renewed."""
    async with PDClient(cluster.pd_addresses, timeout_s=10) as pd:
        mine = []
        for name in ("stolen-0", "stolen-1"):
            with contextlib.suppress(estream.StreamExists):
                await pd.create_stream(name)
            meta = await pd.open_writer(name)
            mine.append((name, meta.id, meta.epoch))

        async def short(session: str) -> list[Any] | None:  # the session alone
            got = await pd.keepalive_session(session, 0, None, len(mine))
            return None if got is None else got[0]

        assert await pd.keepalive_session("victim/0", 0, mine, 2) == ([(), ()], True)
        assert await short("victim/0") == [(), ()]
        assert await pd.keepalive_session("thief/0", 0, mine[:1], 1) == ([()], True)
        assert await short("victim/0") is None  # send the list
        assert await pd.keepalive_session("victim/0", 0, mine, 2) == ([(), ()], True)
        assert await pd.keepalive_session("thief/0", 0, None, 1) is None
        assert await short("victim/0") == [(), ()]
