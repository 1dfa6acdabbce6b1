"""The PD offloader (pd/shell/offloader.py) under faults, step by step, with a real catalog,
a real ``file://`` object store and scripted range servers and Raft (no processes: every
fault lands exactly where the test puts it).

- Sources: a damaged replica, then one that holds less than the range, are skipped; the
  object comes from the sound one (which holds a batch past the catalog's end, left out)
  and holds exactly the catalog's ``[start, end)``.
- The store down: the upload backs off, the range stays local with its replicas, and it
  is offloaded once the store answers again.
- A commit whose outcome is unknown (leader lost): not applied, the next attempt uploads
  again under the same prepared key (overwriting its object) and commits it, or, once the
  record expired, the expiry deletes the first object and a new key is committed;
  applied, nothing is uploaded again and the named object is never swept.
- A crash of the uploader (the PD leader) right after each step (prepare, PUT, check,
  commit, drop), then a new leader in time to reuse the prepared key or after its
  deadline: catalog and store agree after every round (a committed range has its whole
  object, an uncommitted one its replicas, every object is named by a range or a prepared
  record), and in the end exactly the committed object is left. A PUT that lands after
  its record expired is deleted by the listing sweep (the backstop). A leader that
  crashed proposes nothing more (the rig's Raft refuses its term): a release that
  reaches Raft after the crash, before the crash cancels it, lands nothing.
- A slow store (a PUT, then a GET, hanging past the store's deadline): the round returns
  after the deadline, the upload backs off with the local copies kept, other work goes
  on meanwhile, the errors are counted; the check before a release hanging keeps the
  replicas.
- A commit refused (another key won; the stream deleted meanwhile) deletes its own object.
- Release after the retention: the catalog lists no replicas, DROP_RANGE reaches every
  server that answers (one that fails is left to the reclaimer).
- Pipelining: the next pack is read while one is put (two packs in memory at most); a
  crash after each step of one upload while the next pack is in memory or going out, and
  a crash in one release while others check their objects, leave catalog and store
  agreeing, and a new leader finishes; releases go on while a PUT hangs; the next round
  comes at once while due work is left, else when the next upload or release is due.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import pd.compaction
from estream.net.objectstore import ObjectStore
from estream.wire.errors import (
    EstreamError,
    ObjectStoreError,
    ReplicaDamaged,
    Timeout,
    Unavailable,
)
from estream.wire.meta import StreamMeta
from estream.wire.objectformat import decode_object, iter_object_batches
from estream.wire.protocol import Opcode
from estream.wire.record import Record, decode_batch, encode_batch, verify_batch
from pd.catalog import Catalog
from pd.commands import (
    Command,
    CommitObject,
    CreateStream,
    DeleteStream,
    OpenWriter,
    RegisterServer,
    SealRange,
    TrimStream,
)
from pd.metrics import Metrics
from pd.offload import Upload, object_key
from pd.shell.offloader import Offloader, clock_gap_ms_max
from tests.unit.pd.test_pd_metrics import scrape

SERVERS = ("rs1", "rs2", "rs3")
PREPARE_TTL_MS = 60_000
STORE_TIMEOUT_S = 0.3  # every store call's deadline (the slow-store test hangs past it)
Body = bytes | memoryview | Sequence[bytes | memoryview]


def batches(start: int, end: int, stream_id: int) -> list[bytes]:
    out = []
    for base in range(start, end, 10):
        n = min(10, end - base)
        out.append(encode_batch([Record(f"v{base + i}".encode(), {}, 1000 + base + i)
                                 for i in range(n)], stream_id=stream_id, range_index=0,
                                epoch=1, base_offset=base))
    return out


@dataclass
class Status:
    term: int = 3
    role: str = "leader"


class FakeRaft:
    """A catalog behind a scripted propose: ``fail`` maps a command kind to the errors
    its next proposals raise; ``apply_then_fail`` applies the command, then raises. A
    leader that crashed (:meth:`stop`: a :class:`Crash` here or in the store) proposes
    nothing more in its term: its other tasks of the round, cancelled only once the
    crash reaches the round, must not land a command a stopped process never sends."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.fail: dict[str, list[EstreamError]] = {}
        self.apply_then_fail: dict[str, Exception] = {}
        self.proposed: list[Command] = []
        self.term = Status().term
        self.stopped_term: int | None = None

    def status(self) -> Status:
        return Status(self.term)

    def caught_up(self) -> bool:
        return True

    def stop(self) -> None:
        """The leader of this term crashed."""
        self.stopped_term = self.term

    async def propose(self, command: Command) -> Any:
        if self.stopped_term == self.term:
            raise Crash(f"{command.kind} after the leader stopped")
        self.proposed.append(command)
        errors = self.fail.get(command.kind)
        if errors:
            raise errors.pop(0)
        result = self.catalog.apply(command)
        late = self.apply_then_fail.pop(command.kind, None)
        if late is not None:
            if isinstance(late, Crash):
                self.stop()
            raise late
        return result


class Liveness:
    def alive(self, server_id: str, now_ms: int) -> bool:
        return True

    def load(self, server_id: str) -> dict[str, object]:
        return {}  # no server full (pd.placement.full)


@dataclass
class FakeService:
    raft: FakeRaft
    now_ms: int = 1_000_000
    metrics: Metrics = field(default_factory=Metrics)
    liveness: Liveness = field(default_factory=Liveness)

    def clock_ms(self) -> int:
        return self.now_ms

    def view(self) -> Any:
        return self.raft.catalog.view()


class FakePool:
    """Range servers by address: ``replies[address]`` is what READ answers (a payload of
    batches, or an error); DROP_RANGE succeeds unless the address is in ``drop_fails``."""

    def __init__(self) -> None:
        self.replies: dict[str, bytes | EstreamError] = {}
        self.reads: list[str] = []
        self.drops: list[str] = []
        self.drop_fails: set[str] = set()
        self.end = 0
        # (stream id, range index) -> (start, batches): what every server answers for
        # another range than the rig's range 0
        self.ranges: dict[tuple[int, int], tuple[int, bytes]] = {}

    async def call(self, address: str, opcode: int, header: Any = None, payload: Any = b"",
                   *, timeout_s: float = 5.0) -> tuple[dict[str, Any], bytes]:
        if opcode == Opcode.READ:
            self.reads.append(address)
            other = self.ranges.get((header["stream_id"], header["range_index"]))
            if other is not None:
                start, data = other
                return {"end": start, "sealed": True}, data if header["offset"] == start else b""
            reply = self.replies[address]
            if isinstance(reply, EstreamError):
                raise reply
            return {"end": self.end, "sealed": True}, reply if header["offset"] == 0 else b""
        if opcode == Opcode.DROP_RANGE:
            if address in self.drop_fails:
                raise Timeout("no answer", address=address)
            self.drops.append(address)
            return {"dropped": True}, b""
        raise AssertionError(f"unexpected opcode {opcode}")

    def discard(self, address: str) -> None:
        pass

    async def close(self) -> None:
        pass


class Crash(Exception):
    """The uploader (the PD leader) stops here: not an EstreamError, nothing handles it."""


class FlakyStore(ObjectStore):
    """A ``file://`` store whose next ``put_failures`` PUTs fail as if it were down, whose
    next ``hang_puts`` / ``hang_gets`` PUTs / ranged GETs hang past the store's deadline,
    and which crashes its caller right after the next PUT (``crash_after_put``) or ranged
    GET (``crash_after_get``) has landed."""

    put_failures = 0
    hang_puts = 0
    hang_gets = 0
    crash_after_put = False
    crash_after_get = False
    crash_after_delete = False
    raft: FakeRaft | None = None  # stopped by a crash here (FakeRaft.stop)

    def _crash(self, where: str) -> Crash:
        if self.raft is not None:
            self.raft.stop()
        return Crash(where)

    async def put(self, key: str, data: Body) -> None:
        if self.put_failures:
            self.put_failures -= 1
            raise ObjectStoreError("connection refused", key=key, not_found=False)
        if self.hang_puts:
            self.hang_puts -= 1
            await self._call(key, asyncio.Event().wait())
        await super().put(key, data)
        if self.crash_after_put:
            self.crash_after_put = False
            raise self._crash("after the PUT")

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        if self.hang_gets:
            self.hang_gets -= 1
            await self._call(key, asyncio.Event().wait())
        data = await super().get_range(key, start, end)
        if self.crash_after_get:
            self.crash_after_get = False
            raise self._crash("after the check")
        return data


    async def delete(self, key: str) -> None:
        await super().delete(key)
        if self.crash_after_delete:
            self.crash_after_delete = False
            raise self._crash("after the DELETE")


@dataclass
class Rig:
    service: FakeService
    pool: FakePool
    store: FlakyStore
    offloader: Offloader
    root: Path
    stream: StreamMeta
    data: list[bytes]

    @property
    def raft(self) -> FakeRaft:
        return self.service.raft

    def range0(self) -> Any:
        return self.raft.catalog.stream("s").ranges[0]

    def objects(self) -> set[str]:
        return {str(p.relative_to(self.root)) for p in self.root.rglob("*.eso")}

    async def round_at(self, ms: int) -> None:
        self.service.now_ms += ms
        await self.offloader.round()


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    catalog = Catalog()
    for i, sid in enumerate(SERVERS):
        catalog.apply(RegisterServer(sid, f"127.0.0.1:{7001 + i}", "ssd"))
    catalog.apply(CreateStream("s", 3, 2, "", (), SERVERS))
    catalog.apply(OpenWriter("s"))
    catalog.apply(SealRange("s", 1, 0, 35, SERVERS))
    stream = catalog.stream("s")
    data = batches(0, 35, stream.id)
    service = FakeService(FakeRaft(catalog))
    pool = FakePool()
    pool.end = 35
    for i in range(3):
        pool.replies[f"127.0.0.1:{7001 + i}"] = b"".join(data)
    root = tmp_path / "objects"
    store = FlakyStore.from_url(f"file://{root}", timeout_s=STORE_TIMEOUT_S)
    assert isinstance(store, FlakyStore)
    store.raft = service.raft
    offloader = leader(service, store, pool)
    offloader.term = Status().term  # leading in this term, range 0 seen sealed now
    offloader.sealed_since = {(stream.id, 0): service.now_ms}
    return Rig(service, pool, store, offloader, root, stream, data)


def leader(service: FakeService, store: FlakyStore, pool: FakePool) -> Offloader:
    """A PD leader's offloader: nothing in memory; the wall clock moves with
    ``service.now_ms`` from the real time on (objects' modification times are real)."""
    started = service.now_ms
    offloader = Offloader(service, store,  # type: ignore[arg-type]
                          offload_delay_ms=1_000, local_retention_ms=5_000,
                          orphan_grace_ms=0, sweep_interval_ms=10**9,  # sweeps: by hand
                          prepare_ttl_ms=PREPARE_TTL_MS,
                          wall_ms=lambda: int(time.time() * 1000) + service.now_ms - started)
    offloader.pool = pool  # type: ignore[assignment]
    offloader.next_sweep_ms = 10**12
    return offloader


def values_of(rig: Rig, key: str) -> list[bytes]:
    """The records of range 0 in object ``key`` (checked whole: every batch's checksum)."""
    data = (rig.root / key).read_bytes()
    index = decode_object(data)
    (entries,) = [e for sid, ri, e in index.ranges() if (sid, ri) == (rig.stream.id, 0)]
    assert (entries[0].base_offset, entries[-1].end_offset) == (0, 35)
    lo, hi = entries[0].position, entries[-1].position + entries[-1].length
    return [r.value for _, raw in iter_object_batches(data[lo:hi])
            for r in decode_batch(raw).records]


EXPECTED = [f"v{i}".encode() for i in range(35)]


async def test_damaged_and_short_replicas_are_skipped(rig: Rig) -> None:
    rig.pool.replies["127.0.0.1:7001"] = ReplicaDamaged("damaged", stream_id=1, range_index=0)
    rig.pool.replies["127.0.0.1:7002"] = rig.data[0]  # holds [0, 10) only
    past_end = batches(35, 45, rig.stream.id)[0]  # never acknowledged: not the range's
    rig.pool.replies["127.0.0.1:7003"] = b"".join([*rig.data, past_end])
    await rig.round_at(0)
    assert rig.range0().tier == "local"  # sealed just now: not due yet
    await rig.round_at(1_000)
    r = rig.range0()
    assert r.tier == "object" and r.object_key is not None
    assert rig.pool.reads[:2] == ["127.0.0.1:7001", "127.0.0.1:7002"]
    assert rig.pool.reads[-1] == "127.0.0.1:7003"
    assert values_of(rig, r.object_key) == EXPECTED
    assert rig.service.metrics.counter("estream_offload_errors_total", stage="read") == 2


async def test_no_sound_replica_keeps_the_range_local(rig: Rig) -> None:
    for address in list(rig.pool.replies):
        rig.pool.replies[address] = rig.data[0] + rig.data[2]  # a gap
    await rig.round_at(1_000)
    assert rig.range0().tier == "local" and rig.objects() == set()


async def test_store_down_backs_off_and_keeps_local_copies(rig: Rig) -> None:
    rig.store.put_failures = 2
    await rig.round_at(1_000)
    assert rig.range0().tier == "local" and len(rig.range0().replicas) == 3
    await rig.round_at(500)  # inside the 1 s backoff: not tried
    assert rig.store.put_failures == 1
    await rig.round_at(600)  # second failure: 2 s backoff now
    await rig.round_at(1_500)
    assert rig.range0().tier == "local" and rig.store.put_failures == 0
    await rig.round_at(600)
    assert rig.range0().tier == "object"
    assert rig.service.metrics.counter("estream_object_requests_total", op="put",
                                       outcome="error") == 2


async def test_commit_outcome_unknown_not_applied(rig: Rig) -> None:
    rig.raft.fail["commit_pack"] = [Timeout("leader lost")]
    await rig.round_at(1_000)
    assert rig.range0().tier == "local"
    (first,) = rig.objects()  # kept: its commit may have landed
    assert set(rig.raft.catalog.view().prepared) == {first}
    await rig.round_at(1_000)  # the retry: the same prepared key, overwritten, committed
    r = rig.range0()
    assert r.tier == "object" and r.object_key == first
    assert rig.objects() == {first} and not rig.raft.catalog.view().prepared
    assert [c.kind for c in rig.raft.proposed].count("prepare_pack") == 1
    await rig.offloader._sweep()
    assert rig.objects() == {first}
    assert values_of(rig, first) == EXPECTED


async def test_commit_outcome_unknown_then_the_record_expires(rig: Rig) -> None:
    rig.raft.fail["commit_pack"] = [Timeout("leader lost")]
    await rig.round_at(1_000)
    (first,) = rig.objects()
    rig.offloader.retry_at.clear()
    await rig.round_at(PREPARE_TTL_MS)  # past the deadline: expired and deleted first...
    r = rig.range0()  # ...then uploaded under a new prepared key and committed
    assert r.tier == "object" and r.object_key not in (None, first)
    assert rig.objects() == {r.object_key} and not rig.raft.catalog.view().prepared
    assert [c.kind for c in rig.raft.proposed].count("expire_prepared") == 1
    assert values_of(rig, r.object_key) == EXPECTED


async def test_commit_outcome_unknown_but_applied(rig: Rig) -> None:
    rig.raft.apply_then_fail["commit_pack"] = Timeout("answer lost")
    await rig.round_at(1_000)
    r = rig.range0()
    assert r.tier == "object" and rig.objects() == {r.object_key}
    await rig.round_at(1_000)
    await rig.round_at(1_000)
    assert [c.kind for c in rig.raft.proposed].count("commit_pack") == 1
    await rig.offloader._sweep()
    assert rig.objects() == {r.object_key}  # named: never swept


async def test_refused_commits_delete_their_own_object(rig: Rig) -> None:
    # Another key won (a previous leader's upload committed meanwhile).
    rig.raft.catalog.apply(CommitObject("s", rig.stream.id, 0, 0, 35, "elsewhere.eso"))
    # (an upload the planner would no longer start, forced: as if it began before)
    await rig.offloader._offload(
        [Upload("s", rig.stream.id, 0, 0, 35, rig.stream.ranges[0].replicas)])
    assert rig.objects() == set() and rig.range0().object_key == "elsewhere.eso"


async def test_stream_deleted_during_the_upload(rig: Rig) -> None:
    real_propose = rig.raft.propose

    async def delete_first(command: Command) -> Any:
        if command.kind == "commit_pack":
            rig.raft.catalog.apply(DeleteStream("s"))
        return await real_propose(command)

    rig.raft.propose = delete_first  # type: ignore[method-assign]
    await rig.round_at(1_000)
    assert rig.objects() == set()
    assert "s" not in rig.raft.catalog.view().streams


async def test_release_after_the_retention(rig: Rig) -> None:
    await rig.round_at(1_000)
    key = rig.range0().object_key
    assert key is not None and len(rig.range0().replicas) == 3
    rig.pool.drop_fails = {"127.0.0.1:7002"}
    await rig.round_at(100)  # seen committed now
    await rig.round_at(4_800)
    assert len(rig.range0().replicas) == 3  # not yet
    await rig.round_at(200)
    assert rig.range0().replicas == () and rig.range0().object_key == key
    assert sorted(rig.pool.drops) == ["127.0.0.1:7001", "127.0.0.1:7003"]
    assert rig.objects() == {key}
    assert rig.service.metrics.counter("estream_offload_released_ranges_total") == 1
    await rig.round_at(10_000)  # released once: nothing more to do
    assert [c.kind for c in rig.raft.proposed].count("drop_local_replicas") == 1


async def test_a_new_term_starts_the_clocks_again(rig: Rig) -> None:
    await rig.round_at(500)
    rig.offloader.term = 2  # as if this node just became leader in term 3
    await rig.round_at(600)
    assert rig.range0().tier == "local"  # its clock restarted at the new term
    await rig.round_at(1_000)
    assert rig.range0().tier == "object"


def backlog_gauges(rig: Rig) -> dict[str, tuple[float, float]]:
    """PD's offload backlog gauges by stage: (ranges, age of the oldest in seconds)."""
    seen = scrape(rig.service.metrics)
    return {stage: (seen["estream_pd_offload_backlog_ranges"][(("stage", stage),)],
                    seen["estream_pd_offload_backlog_age_seconds"][(("stage", stage),)])
            for stage in ("upload", "release")}


async def test_the_backlog_gauges_show_each_stage_on_the_leader(rig: Rig) -> None:
    await rig.round_at(400)
    assert backlog_gauges(rig) == {"upload": (1, 0.4), "release": (0, 0)}
    await rig.round_at(700)  # uploaded: waits for the release now
    assert backlog_gauges(rig) == {"upload": (0, 0), "release": (1, 0)}
    await rig.round_at(2_000)
    assert backlog_gauges(rig) == {"upload": (0, 0), "release": (1, 2.0)}
    rig.offloader._follow()
    assert backlog_gauges(rig) == {"upload": (0, 0), "release": (0, 0)}, "the leader's"


async def test_a_new_leader_that_followed_keeps_the_clocks(rig: Rig) -> None:
    """Elections under load came every few seconds: a leader that starts the clocks
    again at each one never lets a release fall due. A node that kept them up from its
    own catalog while it followed uses them (later than the old leader's, never
    earlier)."""
    rig.service.now_ms += 500
    rig.offloader._follow()  # a follower, caught up: range 0 seen sealed since the start
    rig.raft.term += 1  # ...then leader
    await rig.round_at(600)  # 1.1 s after the seal, 0.6 s into the new term
    assert rig.range0().tier == "object"


async def test_a_follower_that_was_behind_starts_the_clocks_again(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    rig.service.now_ms += 500
    monkeypatch.setattr(rig.raft, "caught_up", lambda: False)
    rig.offloader._follow()  # behind, and never looked as a follower
    monkeypatch.undo()
    rig.raft.term += 1
    await rig.round_at(600)
    assert rig.range0().tier == "local"  # its clock restarted at the new term
    await rig.round_at(1_000)
    assert rig.range0().tier == "object"


async def test_an_election_keeps_the_clocks_unless_the_last_look_is_old(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    rig.service.now_ms += 200
    rig.offloader._follow()  # looked, caught up
    monkeypatch.setattr(rig.raft, "caught_up", lambda: False)
    rig.service.now_ms += 200
    rig.offloader._follow()  # an election: no look, the clocks kept
    monkeypatch.undo()
    rig.service.now_ms += clock_gap_ms_max  # ...for longer than the gap allows
    rig.raft.term += 1
    await rig.round_at(0)
    assert rig.range0().tier == "local"  # started again: it may have changed unseen
    await rig.round_at(1_000)
    assert rig.range0().tier == "object"


def test_unavailable_is_retriable() -> None:
    assert Unavailable.retriable and ObjectStoreError.retriable


async def test_the_sweep_pages_through_a_large_store(rig: Rig,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import pd.shell.objectcleanup as cleanup_module
    monkeypatch.setattr(cleanup_module, "sweep_list_max", 2)
    orphans = {object_key(rig.stream.id, 0, f"t1-{i}") for i in range(3)}
    for key in orphans:
        await rig.store.put(key, b"abandoned")
    for i in range(20):  # kept forever: without paging, a sweep could see only these
        await rig.store.put(f"foreign/{i:02d}", b"not estream's")
    for _ in range(40):  # 2 keys a sweep, wrapping around at the end
        if not rig.objects():
            break
        await rig.offloader._sweep()
    assert rig.objects() == set()
    assert rig.service.metrics.counter("estream_objects_deleted_total") == 3
    assert len(await rig.store.list("foreign")) == 20


async def test_offload_metrics_pass_promtool(rig: Rig) -> None:
    import subprocess

    from estream.server.metrics import FamiliesCollector, exposition, new_registry
    from tests.system_tools import require_tool

    promtool = require_tool("promtool", package="prometheus")  # CI: missing fails
    rig.store.put_failures = 1
    await rig.round_at(1_000)  # a failed PUT
    await rig.round_at(1_100)  # offloaded
    await rig.round_at(100)
    await rig.round_at(5_000)  # released
    await rig.offloader._sweep()
    registry = new_registry()
    registry.register(FamiliesCollector(rig.service.metrics.families))
    text = exposition(registry)
    for name in ("estream_offload_bytes_total", "estream_offload_ranges_total",
                 "estream_offload_lag_seconds", "estream_object_requests_total",
                 "estream_offload_errors_total", "estream_offload_released_ranges_total"):
        assert name.encode() in text, name
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                             timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize("harm", ["deleted", "flipped"])
async def test_an_object_harmed_behind_our_back_is_uploaded_again_before_release(
    rig: Rig, harm: str
) -> None:
    await rig.round_at(1_000)
    first = rig.range0().object_key
    assert first is not None
    path = rig.root / first
    if harm == "deleted":
        path.unlink()
    else:
        data = bytearray(path.read_bytes())
        data[100] ^= 0x01  # inside the first batch's records
        path.write_bytes(bytes(data))
    await rig.round_at(100)  # seen committed
    await rig.round_at(5_000)  # due for release: the check fails, uploaded again instead
    r = rig.range0()
    assert len(r.replicas) == 3 and r.object_key not in (None, first)
    assert values_of(rig, r.object_key) == EXPECTED
    assert rig.service.metrics.counter("estream_offload_errors_total", stage="check") == 1
    assert [c.kind for c in rig.raft.proposed].count("object_damaged") == 1
    assert rig.service.metrics.counter("estream_object_damage_repaired_ranges_total") == 1
    await rig.round_at(100)  # the old key, unreferenced, is deleted; the new one kept
    assert rig.objects() == {r.object_key}
    await rig.round_at(4_800)  # the new object's retention is not over yet
    assert len(rig.range0().replicas) == 3
    await rig.round_at(200)  # it checks out: released now
    assert rig.range0().replicas == () and rig.range0().object_key == r.object_key
    await rig.offloader._sweep()
    assert rig.objects() == {r.object_key}


# -- a crash after every step, and a slow store ----------------------------------------------

STEPS = ("prepare", "put", "verify", "commit", "drop")


def agree(rig: Rig) -> None:
    """Catalog and store agree: a committed range has its object, whole (every batch's
    checksum, exactly the range's records); a range not yet committed keeps its replicas;
    every object in the store is named by a range or by a prepared record."""
    view = rig.raft.catalog.view()
    r = rig.range0()
    named = {r.object_key} if r.object_key else set()
    if r.object_key is not None:
        assert (rig.root / r.object_key).exists(), "a committed range without its object"
        for _, raw in iter_object_batches((rig.root / r.object_key).read_bytes()[
                : decode_object((rig.root / r.object_key).read_bytes()).footer.index_position]):
            verify_batch(raw)
        assert values_of(rig, r.object_key) == EXPECTED
    else:
        assert r.tier == "local" and len(r.replicas) == 3, "local copies lost before a commit"
    assert rig.objects() <= named | set(view.prepared) | set(view.unreferenced), (
        "an object the catalog does not know")


async def crash_at(rig: Rig, step: str) -> None:
    """Drive the first leader until it stops right after ``step``."""
    if step in ("prepare", "commit", "drop"):
        rig.raft.apply_then_fail[f"{step}_pack" if step != "drop" else
                                 "drop_local_replicas"] = Crash(f"after {step}")
    elif step == "put":
        rig.store.crash_after_put = True
    else:
        rig.store.crash_after_get = True  # the check of the object just put
    with pytest.raises(Crash):
        await rig.round_at(1_000)  # the upload (the drop's step comes later)
        await rig.round_at(100)  # seen committed
        await rig.round_at(5_000)  # the release
    agree(rig)


@pytest.mark.parametrize("packed", [False, True], ids=["alone", "packed"])
@pytest.mark.parametrize("late", [False, True], ids=["in-time", "after-the-deadline"])
@pytest.mark.parametrize("step", STEPS)
async def test_a_crash_after_every_step_leaves_catalog_and_store_agreeing(
    rig: Rig, step: str, late: bool, packed: bool
) -> None:
    if packed:  # a second stream's range in the same object
        second_stream(rig)
    await crash_at(rig, step)
    crashed_with = set(rig.raft.catalog.view().prepared)
    # A new leader (a new term, nothing in memory), in time to reuse a prepared key, or
    # after its deadline: then it is expired, its object deleted, and a new key prepared.
    rig.raft.term += 1
    successor = leader(rig.service, rig.store, rig.pool)
    if late:
        rig.service.now_ms += PREPARE_TTL_MS + 1
    for _ in range(12):
        rig.service.now_ms += 1_000
        await successor.round()
        agree(rig)
    await successor._sweep()
    agree(rig)
    r = rig.range0()
    view = rig.raft.catalog.view()
    assert r.tier == "object" and r.object_key is not None and r.replicas == ()
    assert rig.objects() == {r.object_key} and not view.prepared
    if crashed_with and not late:  # the prepared upload was retried under its own key
        assert r.object_key in crashed_with
    if step == "drop":  # released by the catalog before the crash: DROP_RANGE is the
        # reclaimer's ("moved"), nothing re-uploaded (a packed range released later is
        # dropped on its three servers)
        assert len(rig.pool.drops) == (3 if packed else 0)
    kinds = [c.kind for c in rig.raft.proposed]
    assert kinds.count("commit_pack") == 1  # a commit that landed is never made again
    assert kinds.count("drop_local_replicas") == (2 if packed else 1)
    if packed:  # both ranges committed by that one command, in the one object left
        t0 = rig.raft.catalog.stream("t").ranges[0]
        assert t0.object_key == r.object_key and t0.replicas == ()
        assert values_of_part(rig, r.object_key, t0_id(rig)) == [
            f"v{i}".encode() for i in range(20)]


async def test_a_release_reaching_raft_after_the_crash_lands_nothing(rig: Rig) -> None:
    """The packed crash after "drop" with its race pinned: the other range's release
    reaches its ``drop_local_replicas`` after the crash and before the crash, on its way
    up, cancels it (its check of the shared object ended meanwhile: the packed cases
    above failed so about 1 run in 10-20, both ranges released by the stopped leader and
    neither dropped on a server). A stopped leader sends nothing more: only the crashed
    command landed, and the new leader releases the other range on its three servers."""
    second_stream(rig)
    await rig.round_at(1_000)  # both committed in one object
    await rig.round_at(100)  # seen committed
    real_propose = rig.raft.propose
    arrived, crashed = asyncio.Event(), asyncio.Event()
    reached = 0

    async def propose(command: Command) -> Any:
        nonlocal reached
        if command.kind != "drop_local_replicas":
            return await real_propose(command)
        reached += 1
        if reached == 1:  # the first waits for the other's, then crashes
            await asyncio.wait_for(arrived.wait(), 5)
            try:
                return await real_propose(command)
            finally:
                crashed.set()
        arrived.set()
        await crashed.wait()
        return await real_propose(command)

    rig.raft.apply_then_fail["drop_local_replicas"] = Crash("after drop")
    rig.raft.propose = propose  # type: ignore[method-assign]
    with pytest.raises(Crash):
        await rig.round_at(5_000)
    assert reached == 2
    assert [c.kind for c in rig.raft.proposed].count("drop_local_replicas") == 1
    agree(rig)
    rig.raft.propose = real_propose  # type: ignore[method-assign]
    rig.raft.term += 1
    successor = leader(rig.service, rig.store, rig.pool)
    for _ in range(8):
        rig.service.now_ms += 1_000
        await successor.round()
        agree(rig)
    view = rig.raft.catalog.view()
    assert all(view.stream(n).ranges[0].replicas == () for n in "st")
    assert len(rig.pool.drops) == 3  # the range the new leader released
    assert [c.kind for c in rig.raft.proposed].count("drop_local_replicas") == 2


def t0_id(rig: Rig) -> int:
    return rig.raft.catalog.stream("t").id


async def test_a_put_landing_after_its_record_expired_is_swept(rig: Rig) -> None:
    rig.store.put_failures = 1  # the PUT "failed" (timed out) but lands later, below
    await rig.round_at(1_000)
    (key,) = rig.raft.catalog.view().prepared
    rig.service.now_ms += PREPARE_TTL_MS
    rig.offloader.retry_at.clear()
    await rig.round_at(1_000)  # expired (nothing to delete yet), then a new key committed
    assert key not in rig.raft.catalog.view().prepared and rig.range0().object_key != key
    await ObjectStore.put(rig.store, key, b"a late PUT of the expired attempt")
    await rig.offloader._sweep()  # the backstop: an object the catalog never names
    assert rig.objects() == {rig.range0().object_key}
    agree(rig)


async def test_a_slow_store_backs_off_and_keeps_local_copies(rig: Rig) -> None:
    ticks = 0

    async def appends() -> None:  # stands for the data path: it never waits for the store
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.ensure_future(appends())
    try:
        rig.store.hang_puts = 1
        started = time.monotonic()
        await rig.round_at(1_000)  # the PUT hangs past its deadline: Timeout, backoff
        took = time.monotonic() - started
        assert took < STORE_TIMEOUT_S + 2 and ticks >= 5
        r = rig.range0()
        assert r.tier == "local" and len(r.replicas) == 3
        (key,) = rig.raft.catalog.view().prepared
        m = rig.service.metrics
        assert m.counter("estream_offload_errors_total", stage="put") == 1
        assert m.counter("estream_object_requests_total", op="put", outcome="error") == 1
        assert rig.offloader.retry_at[(rig.stream.id, 0)] > rig.service.now_ms
        await rig.round_at(500)  # inside the backoff: not tried
        assert rig.range0().tier == "local"
        rig.store.hang_gets = 1  # now the check after the PUT hangs
        await rig.round_at(600)
        assert rig.range0().tier == "local"
        assert m.counter("estream_offload_errors_total", stage="verify") == 1
        await rig.round_at(2_100)  # the store answers again: the same prepared key
        assert rig.range0().tier == "object" and rig.range0().object_key == key
        rig.store.hang_gets = 1  # the check before the release hangs: replicas kept
        await rig.round_at(100)
        await rig.round_at(5_000)
        assert len(rig.range0().replicas) == 3
        assert m.counter("estream_offload_errors_total", stage="check") == 1
        await rig.round_at(100)
        assert rig.range0().replicas == ()
        agree(rig)
    finally:
        ticker.cancel()


# -- packed objects and references ----------------------------------------------------------


def second_stream(rig: Rig, name: str = "t", end: int = 20) -> StreamMeta:
    """Another stream with a sealed range 0 ``[0, end)`` that every server serves, seen
    sealed now (packed with the rig's range 0 in the next upload)."""
    catalog = rig.raft.catalog
    catalog.apply(CreateStream(name, 3, 2, "", (), SERVERS))
    catalog.apply(OpenWriter(name))
    catalog.apply(SealRange(name, 1, 0, end, SERVERS))
    other = catalog.stream(name)
    rig.pool.ranges[(other.id, 0)] = (0, b"".join(batches(0, end, other.id)))
    rig.offloader.sealed_since[(other.id, 0)] = rig.service.now_ms
    return other


async def test_ranges_of_two_streams_share_one_object_committed_at_once(rig: Rig) -> None:
    other = second_stream(rig)
    await rig.round_at(1_000)
    key = rig.range0().object_key
    t0 = rig.raft.catalog.stream("t").ranges[0]
    assert key is not None and t0.object_key == key and rig.objects() == {key}
    assert [c.kind for c in rig.raft.proposed].count("commit_pack") == 1
    assert rig.raft.catalog.view().object_refs[key] == {(rig.stream.id, 0), (other.id, 0)}
    assert values_of_part(rig, key, other.id) == [f"v{i}".encode() for i in range(20)]
    agree(rig)


def values_of_part(rig: Rig, key: str, stream_id: int) -> list[bytes]:
    data = (rig.root / key).read_bytes()
    (entries,) = [e for s, _, e in decode_object(data).ranges() if s == stream_id]
    lo, hi = entries[0].position, entries[-1].position + entries[-1].length
    return [r.value for _, raw in iter_object_batches(data[lo:hi])
            for r in decode_batch(raw).records]


async def test_a_pack_is_closed_at_its_size_or_its_age(rig: Rig) -> None:
    rig.offloader.object_max_age_ms = 3_000
    rig.offloader.object_size_bytes = 10**9
    second_stream(rig)
    await rig.round_at(1_000)  # both read into the open pack: it waits
    assert rig.range0().tier == "local" and rig.objects() == set()
    assert len(rig.offloader.pending) == 2 and not rig.raft.catalog.view().prepared
    await rig.round_at(2_000)
    assert rig.range0().tier == "local"
    await rig.round_at(1_000)  # three seconds in the pack: closed
    assert rig.range0().tier == "object"
    assert rig.raft.catalog.stream("t").ranges[0].object_key == rig.range0().object_key
    rig.offloader.object_size_bytes = 1  # every range its own object at once
    third = second_stream(rig, "u")
    await rig.round_at(1_000)
    assert rig.raft.catalog.stream("u").ranges[0].object_key not in (
        None, rig.range0().object_key)
    assert rig.raft.catalog.view().object_refs[
        rig.raft.catalog.stream("u").ranges[0].object_key or ""] == {(third.id, 0)}


async def test_a_new_leader_loses_the_open_pack_and_uploads_again(rig: Rig) -> None:
    rig.offloader.object_max_age_ms = 10**9
    rig.offloader.object_size_bytes = 10**9
    second_stream(rig)
    await rig.round_at(1_000)
    assert len(rig.offloader.pending) == 2
    rig.raft.term += 1  # the open pack was only memory: nothing to clean up
    successor = leader(rig.service, rig.store, rig.pool)
    for _ in range(3):
        rig.service.now_ms += 1_000
        await successor.round()
    assert rig.range0().tier == "object" and rig.objects() == {rig.range0().object_key}


DELETE_STEPS = ("none", "delete", "forget")


@pytest.mark.parametrize("crash", DELETE_STEPS)
async def test_an_object_is_deleted_once_its_last_reference_goes(rig: Rig, crash: str) -> None:
    second_stream(rig)
    await rig.round_at(1_000)
    key = rig.range0().object_key
    assert key is not None
    catalog = rig.raft.catalog
    catalog.apply(DeleteStream("t"))
    await rig.round_at(100)
    assert rig.objects() == {key} and not catalog.view().unreferenced  # s/0 still needs it
    catalog.apply(TrimStream("s", 35))  # the last reference gone
    assert catalog.view().unreferenced == (key,)
    agree(rig)
    if crash == "delete":  # deleted from the store, the leader lost before telling
        rig.store.crash_after_delete = True
    elif crash == "forget":  # objects_deleted applied, the answer lost with the leader
        rig.raft.apply_then_fail["objects_deleted"] = Crash("after objects_deleted")
    if crash == "none":
        await rig.round_at(100)
    else:
        with pytest.raises(Crash):
            await rig.round_at(100)
        agree(rig)
        rig.raft.term += 1
        successor = leader(rig.service, rig.store, rig.pool)
        rig.service.now_ms += 1_000
        await successor.round()
    assert rig.objects() == set() and not catalog.view().unreferenced
    assert "objects_deleted" in [c.kind for c in rig.raft.proposed]
    agree_after_trim(rig)


def agree_after_trim(rig: Rig) -> None:
    view = rig.raft.catalog.view()
    assert not view.object_refs and not view.unreferenced and not view.prepared


# -- compaction ------------------------------------------------------------------------------


async def two_released_objects(rig: Rig) -> tuple[str, str]:
    """s/0 and t/0 each in an object of its own, their replicas released."""
    rig.offloader.object_size_bytes = 1  # every range its own object
    second_stream(rig)
    await rig.round_at(1_000)
    await rig.round_at(100)
    await rig.round_at(5_000)
    s0, t0 = rig.range0(), rig.raft.catalog.stream("t").ranges[0]
    assert s0.replicas == () and t0.replicas == ()
    assert s0.object_key and t0.object_key and s0.object_key != t0.object_key
    rig.offloader.object_size_bytes = 64 * 1024 * 1024  # both are small objects now
    return s0.object_key, t0.object_key


def stored_agree(rig: Rig) -> None:
    """Every range's object exists and holds it; every object is named, prepared or
    listed to delete."""
    view = rig.raft.catalog.view()
    named = {r.object_key for s in view.streams.values() for r in s.ranges if r.object_key}
    assert named <= rig.objects(), "a range without its object"
    assert rig.objects() <= named | set(view.prepared) | set(view.unreferenced)
    if rig.range0().object_key:
        assert values_of(rig, rig.range0().object_key) == EXPECTED


async def test_compaction_merges_small_objects_and_deletes_the_old_ones(rig: Rig) -> None:
    old_s, old_t = await two_released_objects(rig)
    await rig.offloader._compact()
    s0, t0 = rig.range0(), rig.raft.catalog.stream("t").ranges[0]
    assert s0.object_key == t0.object_key and s0.object_key not in (old_s, old_t)
    assert set(rig.raft.catalog.view().unreferenced) == {old_s, old_t}
    stored_agree(rig)
    await rig.round_at(100)  # the deletion step
    assert rig.objects() == {s0.object_key} and not rig.raft.catalog.view().unreferenced
    assert values_of_part(rig, s0.object_key or "", t0_id(rig)) == [
        f"v{i}".encode() for i in range(20)]
    assert rig.service.metrics.counter("estream_objects_compacted_total") == 2
    await rig.offloader._compact()  # one object now: nothing more to gain
    assert rig.range0().object_key == s0.object_key


async def test_a_node_that_stops_leading_frees_the_planner_and_builds_it_once_back(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    """Off the leader, the compaction planner's index and the object sizes learnt go
    (they would go stale and never be freed); leading again, the first compaction builds
    the index from the catalog once, the next looks at what changed only (nothing)."""
    await two_released_objects(rig)
    rig.offloader.object_size_bytes = 1  # (nothing worth rewriting: the index stays)
    await rig.offloader._compact()
    assert rig.offloader.compaction.index() and rig.offloader.object_sizes
    rig.offloader._follow()
    assert not rig.offloader.compaction.index() and not rig.offloader.object_sizes
    rig.raft.term += 1
    await rig.round_at(0)  # (a new term: its first round sets the compaction's time)
    built: list[int] = []
    real = pd.compaction.Move

    def counted(*fields: Any) -> Any:
        built.append(1)
        return real(*fields)

    monkeypatch.setattr(pd.compaction, "Move", counted)
    await rig.offloader._compact()
    assert len(built) == 2 and rig.offloader.object_sizes  # s/0 and t/0, once
    await rig.offloader._compact()
    assert len(built) == 2


async def test_a_trim_during_compaction_wins(rig: Rig) -> None:
    old_s, old_t = await two_released_objects(rig)
    real_propose = rig.raft.propose

    async def trim_first(command: Command) -> Any:
        if command.kind == "commit_pack":
            rig.raft.catalog.apply(TrimStream("s", 35))
        return await real_propose(command)

    rig.raft.propose = trim_first  # type: ignore[method-assign]
    await rig.offloader._compact()
    rig.raft.propose = real_propose  # type: ignore[method-assign]
    view = rig.raft.catalog.view()
    new = view.stream("t").ranges[0].object_key
    assert new not in (None, old_t) and view.stream("s").ranges[0].object_key is None
    assert set(view.unreferenced) == {old_s, old_t}
    await rig.round_at(100)
    assert rig.objects() == {new}


@pytest.mark.parametrize("step", ["prepare", "put", "verify"])
async def test_a_crash_during_compaction_leaves_the_old_objects(rig: Rig, step: str) -> None:
    old_s, old_t = await two_released_objects(rig)
    if step == "prepare":
        rig.raft.apply_then_fail["prepare_pack"] = Crash("after prepare")
    elif step == "put":
        rig.store.crash_after_put = True
    else:
        rig.store.crash_after_get = True
    with pytest.raises(Crash):
        await rig.offloader._compact()
    stored_agree(rig)
    assert rig.range0().object_key == old_s
    rig.raft.term += 1
    successor = leader(rig.service, rig.store, rig.pool)
    successor.compact_interval_ms = 10**9  # not again: the record must expire
    rig.service.now_ms += PREPARE_TTL_MS + 10_000  # (its wall clock starts at its start)
    for _ in range(3):
        rig.service.now_ms += 1_000
        await successor.round()
        stored_agree(rig)
    view = rig.raft.catalog.view()
    assert not view.prepared and rig.objects() == {old_s, old_t}


async def test_a_new_object_damaged_after_its_put_is_never_committed(rig: Rig) -> None:
    """A compaction's new object altered between its PUT and its read-back (its size and
    index still check out): nothing is committed, the old objects stay and read whole, and
    the next attempt, once the store is sound, compacts."""
    old_s, old_t = await two_released_objects(rig)
    real_put = rig.store.put

    async def put_then_flip(key: str, data: Body) -> None:
        await real_put(key, data)
        path = rig.root / key
        raw = bytearray(path.read_bytes())
        first = decode_object(bytes(raw)).entries[0]
        raw[first.position + first.length // 2] ^= 0x01  # inside the first batch
        path.write_bytes(bytes(raw))

    rig.store.put = put_then_flip  # type: ignore[method-assign]
    await rig.offloader._compact()
    rig.store.put = real_put  # type: ignore[method-assign]
    view = rig.raft.catalog.view()
    assert rig.range0().object_key == old_s
    assert view.stream("t").ranges[0].object_key == old_t
    assert not view.unreferenced and len(view.prepared) == 1
    assert rig.service.metrics.counter("estream_offload_errors_total", stage="verify") == 1
    await rig.round_at(100)  # the deletion step: nothing to delete
    assert {old_s, old_t} <= rig.objects()
    assert values_of(rig, old_s) == EXPECTED
    assert values_of_part(rig, old_t, t0_id(rig)) == [f"v{i}".encode() for i in range(20)]
    await rig.offloader._compact()  # tried again, the store sound now
    new = rig.range0().object_key
    assert new not in (old_s, old_t) and rig.raft.catalog.stream("t").ranges[0].object_key == new
    assert values_of_part(rig, new or "", t0_id(rig)) == [f"v{i}".encode() for i in range(20)]


# -- pipelined uploads, releases side by side -------------------------------------------------


def agree_all(rig: Rig) -> None:
    """:func:`agree` for every range of every stream: a committed range's object holds
    exactly its records; a range not committed keeps its three replicas; every object is
    named by a range, a prepared record or the list to delete."""
    view = rig.raft.catalog.view()
    named = set()
    for s in view.streams.values():
        for r in s.ranges:
            if r.object_key is None:
                assert r.tier == "local" and len(r.replicas) == 3, "local copies lost"
                continue
            named.add(r.object_key)
            assert (rig.root / r.object_key).exists(), "a committed range without its object"
            assert values_of_part(rig, r.object_key, s.id) == [
                f"v{i}".encode() for i in range(r.start, r.end or r.start)]
    assert rig.objects() <= named | set(view.prepared) | set(view.unreferenced), (
        "an object the catalog does not know")


def three_packs(rig: Rig) -> list[tuple[int, int]]:
    """s/0, t/0 and u/0 due, each a pack of its own (in that order)."""
    rig.offloader.object_size_bytes = 1
    t, u = second_stream(rig), second_stream(rig, "u", end=25)
    return [(rig.stream.id, 0), (t.id, 0), (u.id, 0)]


def record_order(rig: Rig) -> list[str]:
    """What reaches the range servers and the store, in order: ``read S``, ``put S``
    (S the stream id of the range read or of the pack's first range)."""
    order: list[str] = []
    real_call, real_put = rig.pool.call, rig.store.put

    async def call(address: str, opcode: int, header: Any = None, payload: Any = b"",
                   *, timeout_s: float = 5.0) -> tuple[dict[str, Any], bytes]:
        if opcode == Opcode.READ:
            order.append(f"read {header['stream_id']}")
        return await real_call(address, opcode, header, payload, timeout_s=timeout_s)

    async def put(key: str, data: Body) -> None:
        order.append(f"put {key.split('/')[1]}")
        await real_put(key, data)

    rig.pool.call = call  # type: ignore[method-assign]
    rig.store.put = put  # type: ignore[method-assign]
    return order


async def test_the_next_pack_is_read_while_one_is_put(rig: Rig) -> None:
    s, t, u = (sid for sid, _ in three_packs(rig))
    order = record_order(rig)
    await rig.round_at(1_000)
    # t/0 is read while s/0 goes out, and put beside it; u/0 is read only once s/0 is
    # done: never more than two packs in memory
    assert order == [f"read {s}", f"read {t}", f"put {s}", f"put {t}", f"read {u}",
                     f"put {u}"]
    view = rig.raft.catalog.view()
    keys = {view.stream(n).ranges[0].object_key for n in "stu"}
    assert None not in keys and len(keys) == 3 and rig.objects() == keys
    assert not rig.offloader.busy and not rig.offloader.pending_data
    agree_all(rig)


async def test_small_ranges_are_read_side_by_side_into_one_pack(rig: Rig) -> None:
    t, u = second_stream(rig), second_stream(rig, "u", end=25)
    order = record_order(rig)
    counted = rig.pool.call
    reading, most = 0, 0

    async def call(address: str, opcode: int, header: Any = None, payload: Any = b"",
                   *, timeout_s: float = 5.0) -> tuple[dict[str, Any], bytes]:
        nonlocal reading, most
        reading += 1
        most = max(most, reading)
        await asyncio.sleep(0.01)
        try:
            return await counted(address, opcode, header, payload, timeout_s=timeout_s)
        finally:
            reading -= 1

    rig.pool.call = call  # type: ignore[method-assign]
    await rig.round_at(1_000)
    # All three fit in one read each and in one pack: read side by side, then one PUT.
    assert sorted(order[:3]) == sorted(f"read {i}" for i in (rig.stream.id, t.id, u.id))
    assert order[3:] == [f"put {rig.stream.id}"]
    assert most == 3, "the reads went one after another"
    keys = {rig.raft.catalog.stream(n).ranges[0].object_key for n in "stu"}
    assert len(keys) == 1 and None not in keys
    agree_all(rig)


@pytest.mark.parametrize("step", ("prepare", "put", "verify", "commit"))
async def test_a_crash_with_the_next_pack_in_memory(rig: Rig, step: str) -> None:
    """The leader stops after a step of s/0's upload while t/0 is read already (in
    memory, or being put beside it): catalog and store agree; a new leader offloads and
    releases all."""
    u = three_packs(rig)[2][0]
    order = record_order(rig)
    mine = f"/{rig.stream.id}/0/"  # s/0's object keys (t/0's upload may come first)
    real_propose, real_put, real_get = rig.raft.propose, rig.store.put, rig.store.get_range

    async def propose(command: Command) -> Any:
        result = await real_propose(command)
        if command.kind == f"{step}_pack" and mine in getattr(command, "object_key", ""):
            raise Crash(f"after {step}")
        return result

    async def put(key: str, data: Body) -> None:
        await real_put(key, data)
        if step == "put" and mine in key:
            raise Crash("after the PUT")

    async def get_range(key: str, start: int, end: int) -> bytes:
        data = await real_get(key, start, end)
        if step == "verify" and mine in key:
            raise Crash("after the check")
        return data

    rig.raft.propose = propose  # type: ignore[method-assign]
    rig.store.put = put  # type: ignore[method-assign]
    rig.store.get_range = get_range  # type: ignore[method-assign]
    with pytest.raises(Crash):
        await rig.round_at(1_000)
    assert order[:2] == [f"read {rig.stream.id}", f"read {t0_id(rig)}"]
    assert f"read {u}" not in order  # (two packs in memory at most)
    assert not rig.offloader.busy  # the upload beside it was cancelled, or done
    agree_all(rig)
    rig.raft.propose = real_propose  # type: ignore[method-assign]
    rig.store.put, rig.store.get_range = real_put, real_get  # type: ignore[method-assign]
    rig.raft.term += 1
    successor = leader(rig.service, rig.store, rig.pool)
    successor.object_size_bytes = 1
    for _ in range(10):
        rig.service.now_ms += 1_000
        await successor.round()
        agree_all(rig)
    await successor._sweep()
    agree_all(rig)
    view = rig.raft.catalog.view()
    ranges = [view.stream(n).ranges[0] for n in "stu"]
    assert all(r.tier == "object" and r.replicas == () for r in ranges)
    assert rig.objects() == {r.object_key for r in ranges} and not view.prepared
    kinds = [c.kind for c in rig.raft.proposed]
    assert kinds.count("commit_pack") == 3 and kinds.count("drop_local_replicas") == 3


async def test_a_crash_in_one_release_while_others_run(rig: Rig) -> None:
    """Three releases check their objects side by side; the leader stops right after the
    first one's ``drop_local_replicas``: the others are cancelled mid-check, the catalog
    and store agree, and a new leader releases the rest."""
    three_packs(rig)
    await rig.round_at(1_000)
    await rig.round_at(100)
    assert all(rig.raft.catalog.stream(n).ranges[0].tier == "object" for n in "stu")
    rig.raft.apply_then_fail["drop_local_replicas"] = Crash("after drop")
    in_check = 0
    real_get = rig.store.get_range
    checks_at_once = 0

    async def get_range(key: str, start: int, end: int) -> bytes:
        nonlocal in_check, checks_at_once
        in_check += 1
        checks_at_once = max(checks_at_once, in_check)
        try:
            # s/0's check is quick, the others' are still running when it crashes
            await asyncio.sleep(0.01 if key.split("/")[1] == str(rig.stream.id) else 2.0)
            return await real_get(key, start, end)
        finally:
            in_check -= 1

    rig.store.get_range = get_range  # type: ignore[method-assign]
    with pytest.raises(Crash):
        await rig.round_at(5_000)
    assert checks_at_once == 3  # the read-backs overlapped
    assert [c.kind for c in rig.raft.proposed].count("drop_local_replicas") == 1
    assert not rig.offloader.busy  # the cancelled releases let go of their ranges
    agree_all(rig)
    rig.store.get_range = real_get  # type: ignore[method-assign]
    rig.raft.term += 1
    successor = leader(rig.service, rig.store, rig.pool)
    for _ in range(8):
        rig.service.now_ms += 1_000
        await successor.round()
        agree_all(rig)
    view = rig.raft.catalog.view()
    assert all(view.stream(n).ranges[0].replicas == () for n in "stu")
    assert [c.kind for c in rig.raft.proposed].count("drop_local_replicas") == 3


async def test_releases_go_on_while_a_put_hangs(rig: Rig) -> None:
    """s/0 is due for release while t/0's PUT hangs (until the store's deadline): s/0 is
    released meanwhile, not after the upload phase."""
    rig.offloader.object_size_bytes = 1
    await rig.round_at(1_000)
    await rig.round_at(100)
    second_stream(rig)
    rig.service.now_ms += 1_000  # t/0 due for upload (sealed a second ago)...
    rig.store.hang_puts = 1
    putting = False
    real_put, real_propose = rig.store.put, rig.raft.propose
    dropped_while_putting: list[bool] = []

    async def put(key: str, data: Body) -> None:
        nonlocal putting
        putting = True
        try:
            await real_put(key, data)
        finally:
            putting = False

    async def propose(command: Command) -> Any:
        if command.kind == "drop_local_replicas":
            dropped_while_putting.append(putting)
        return await real_propose(command)

    rig.store.put = put  # type: ignore[method-assign]
    rig.raft.propose = propose  # type: ignore[method-assign]
    await rig.round_at(4_000)  # ...and s/0 due for release (5 s after its commit)
    assert dropped_while_putting == [True] and rig.range0().replicas == ()
    assert rig.raft.catalog.stream("t").ranges[0].tier == "local"  # its PUT timed out
    agree_all(rig)


async def test_the_next_round_comes_as_soon_as_work_is_due(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pd.shell.offloadupload as upload_module
    assert await rig.offloader.round() == 1_000  # s/0 due in 1 s (the delay)
    rig.service.now_ms += 400
    assert await rig.offloader.round() == 600
    monkeypatch.setattr(upload_module, "uploads_per_round_max", 1)
    second_stream(rig)
    rig.offloader.sealed_since[(t0_id(rig), 0)] = rig.service.now_ms - 1_000
    rig.offloader.object_size_bytes = 1
    rig.service.now_ms += 600
    assert await rig.offloader.round() == 0  # t/0 due but left: the next round at once
    assert await rig.offloader.round() == 1_000  # both committed; releases in 5 s (> 1 s)
    rig.service.now_ms += 4_500
    assert await rig.offloader.round() == 500
