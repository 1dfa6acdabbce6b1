"""The typed range-server client (estream/net/rangeclient.py) over a fake pool: the request
headers per opcode (docs/PROTOCOL.md), typed answers, the timeout policy,
and the one copy loop's rules (verify, continue exactly, never past the end, restamp up
to the target's epoch, create lazily, source failures apart from target failures)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from estream.net.rangeclient import (
    CopyProgress,
    Created,
    Endpoint,
    ListedRange,
    PingAnswer,
    RangeClient,
    RangeState,
    ReadAnswer,
    SealAnswer,
    SourceFailed,
    TimeAnswer,
    copy_range,
)
from estream.wire.errors import (
    ChecksumMismatch,
    EstreamError,
    MalformedFrame,
    OffsetGap,
    StorageError,
    Timeout,
    Unavailable,
)
from estream.wire.protocol import Opcode, Payload
from estream.wire.record import Record, decode_header, encode_batch, verify_batch

Call = tuple[str, Opcode, dict[str, Any], bytes, float]


def joined(payload: Payload) -> bytes:
    """A request's payload as one ``bytes`` (an APPEND_MANY's comes as its batches)."""
    return b"".join(payload) if isinstance(payload, list) else bytes(payload)


class FakePool:
    """Answers each call with ``answers[opcode]`` (a header, or an error to raise)."""

    def __init__(self, answers: dict[Opcode, Any] | None = None) -> None:
        self.answers = answers or {}
        self.calls: list[Call] = []
        self.discarded: list[str] = []

    async def call(self, address: str, opcode: int, header: dict[str, Any] | None = None,
                   payload: Payload = b"", *, timeout_s: float = 5.0,
                   ) -> tuple[dict[str, Any], bytes | memoryview]:
        op = Opcode(opcode)
        self.calls.append((address, op, dict(header or {}), joined(payload), timeout_s))
        answer = self.answers.get(op, {})
        if isinstance(answer, EstreamError):
            raise answer
        if isinstance(answer, tuple):
            return answer
        return answer, b""

    def start_call(self, address: str, opcode: int, header: dict[str, Any] | None,
                   payload: Payload, done: Any, *, timeout_s: float = 5.0) -> None:
        """As ``call``, answered on the event loop's next turn."""
        op = Opcode(opcode)
        self.calls.append((address, op, dict(header or {}), joined(payload), timeout_s))
        answer = self.answers.get(op, {})
        loop = asyncio.get_running_loop()
        if isinstance(answer, EstreamError):
            loop.call_soon(done, None, answer)
        else:
            loop.call_soon(done, answer[0] if isinstance(answer, tuple) else answer, None)

    def discard(self, address: str) -> None:
        self.discarded.append(address)


STATE = {"start": 10, "end": 30, "confirm": 25, "epoch": 3, "sealed": False,
         "sealed_end": None, "damaged": False}
IDS = {"stream_id": 7, "range_index": 2}


async def test_every_opcode_sends_its_schema_and_names_the_server() -> None:
    pool = FakePool({
        Opcode.PING: {"server_id": "s1", "address": "a:1", "wal_spares": 2, "wal_io": "direct"},
        Opcode.CREATE_RANGE: {"start": 10, "end": 10, "epoch": 3, "sealed": False},
        Opcode.APPEND: {"end": 14},
        Opcode.SEAL: {"end": 30, "sealed": True},
        Opcode.READ: ({"end": 30, "sealed": False}, b"xyz"),
        Opcode.DESCRIBE_RANGE: STATE,
        Opcode.LIST_RANGES: {"ranges": [{**IDS, **STATE}, "junk", {"stream_id": 1}]},
        Opcode.DROP_RANGE: {"dropped": True},
    })
    c = RangeClient(pool)
    s = {"server_id": "s1"}
    sid = "s1"
    assert await c.ping("a:1") == PingAnswer("s1", "a:1", 2, "direct")
    created = await c.create_range("a:1", server_id=sid, stream_id=7, range_index=2,
                                   start=10, epoch=3)
    assert created == Created(10, 10, 3, False)
    assert await c.append("a:1", server_id=sid, batch=b"B", deferred=True) == 14
    sealed = await c.seal("a:1", server_id=sid, stream_id=7, range_index=2, epoch=3, end=30)
    assert sealed == SealAnswer(30, True)
    read = await c.read("a:1", server_id=sid, stream_id=7, range_index=2, offset=12,
                        unconfirmed=True)
    assert read == ReadAnswer(30, False, b"xyz")
    state = await c.describe_range("a:1", server_id=sid, stream_id=7, range_index=2)
    assert state == RangeState(10, 30, 25, 3, False, None, False)
    await c.force("a:1", server_id="s1")
    await c.confirm("a:1", server_id="s1", stream_id=7, range_index=2, epoch=3, confirm=25)
    listed = await c.list_ranges("a:1", server_id="s1")
    assert listed == (ListedRange(7, 2, RangeState.from_header(STATE)),)
    assert listed[0].to_header() == {**IDS, **STATE}
    assert await c.drop_range("a:1", server_id="s1", stream_id=7, range_index=2) is True
    headers = [(op, h) for _, op, h, _, _ in pool.calls]
    assert headers == [
        (Opcode.PING, {}),
        (Opcode.CREATE_RANGE, {**IDS, "start": 10, "epoch": 3, **s}),
        (Opcode.APPEND, {"deferred": True, **s}),
        (Opcode.SEAL, {**IDS, "epoch": 3, "end": 30, **s}),
        (Opcode.READ, {**IDS, "offset": 12, "max_bytes": 8 * 1024 * 1024, "wait_ms": 0,
                       "unconfirmed": True, **s}),
        (Opcode.DESCRIBE_RANGE, {**IDS, **s}),
        (Opcode.FORCE, s),
        (Opcode.CONFIRM, {**IDS, "epoch": 3, "confirm": 25, **s}),
        (Opcode.LIST_RANGES, s),
        (Opcode.DROP_RANGE, {**IDS, **s}),
    ]
    assert pool.calls[2][3] == b"B"  # the batch is the payload


async def test_without_a_known_server_id_none_is_sent() -> None:
    pool = FakePool({Opcode.READ: {"end": 0, "sealed": False}, Opcode.SEAL: {"end": 4}})
    c = RangeClient(pool)
    await c.read("a:1", server_id=None, stream_id=7, range_index=2, offset=0)
    await c.seal("a:1", server_id=None, stream_id=7, range_index=2, epoch=1, end=None)
    assert all("server_id" not in h for _, _, h, _, _ in pool.calls)
    assert pool.calls[1][2]["end"] is None  # a fence: SEAL without an end


async def test_time_index_statistics_and_lookups() -> None:
    stats = {"min_timestamp": 90, "max_timestamp": 150, "bytes": 4096, "end": 30,
             "sealed": True}
    pool = FakePool({Opcode.TIME_INDEX: stats})
    c = RangeClient(pool)
    answer = await c.time_index("a:1", server_id="s1", stream_id=7, range_index=2)
    assert answer == TimeAnswer(90, 150, 4096, 30, True) and answer.complete
    pool.answers[Opcode.TIME_INDEX] = {**stats, "offset": 12, "searched_end": 30}
    found = await c.time_index("a:1", server_id="s1", stream_id=7, range_index=2,
                               timestamp_ms=120, end=30)
    assert (found.offset, found.searched_end) == (12, 30)
    open_range = await c.time_index("a:1", server_id=None, stream_id=7, range_index=2,
                                    timestamp_ms=120)
    assert open_range.offset == 12
    assert [h for _, _, h, _, _ in pool.calls] == [
        {**IDS, "server_id": "s1"},
        {**IDS, "timestamp": 120, "end": 30, "server_id": "s1"},
        {**IDS, "timestamp": 120},  # open: searched below the confirm offset
    ]
    partial = {"min_timestamp": None, "max_timestamp": None, "bytes": None, "end": 30}
    pool.answers[Opcode.TIME_INDEX] = partial
    answer = await c.time_index("a:1", server_id="s1", stream_id=7, range_index=2)
    assert not answer.complete and answer.offset is None
    with pytest.raises(MalformedFrame):  # a lookup answered without where it searched
        await c.time_index("a:1", server_id="s1", stream_id=7, range_index=2,
                           timestamp_ms=120)


async def test_one_timeout_policy() -> None:
    pool = FakePool({Opcode.READ: {"end": 0, "sealed": False}, Opcode.APPEND: {"end": 1}})
    c = RangeClient(pool, timeout_s=3.0)
    await c.append("a:1", server_id="s", batch=b"B")
    await c.append("a:1", server_id="s", batch=b"B", timeout_s=0.5)
    await c.read("a:1", server_id="s", stream_id=7, range_index=2, offset=0, wait_ms=2_000)
    await c.read("a:1", server_id="s", stream_id=7, range_index=2, offset=0, wait_ms=2_000,
                 timeout_s=1.0)
    assert [t for *_, t in pool.calls] == [3.0, 0.5, 5.0, 3.0]


async def test_a_timed_out_append_discards_the_connection_other_requests_do_not() -> None:
    pool = FakePool({Opcode.APPEND: Timeout("slow"), Opcode.DESCRIBE_RANGE: Timeout("slow")})
    c = RangeClient(pool)
    with pytest.raises(Timeout):
        await c.append("a:1", server_id="s", batch=b"B")
    with pytest.raises(Timeout):
        await c.describe_range("a:2", server_id="s", stream_id=7, range_index=2)
    assert pool.discarded == ["a:1"]


@pytest.mark.parametrize("body", [{}, {"end": "3"}, {"end": True}])
async def test_a_malformed_answer_is_a_typed_error(body: dict[str, Any]) -> None:
    c = RangeClient(FakePool({Opcode.SEAL: body}))
    with pytest.raises(MalformedFrame):
        await c.seal("a:1", server_id="s", stream_id=7, range_index=2, epoch=1, end=None)


# -- copy_range ----------------------------------------------------------------------------


def batch(base: int, count: int, epoch: int = 1, confirm: int = 0) -> bytes:
    return encode_batch([Record(f"r{base + i}".encode()) for i in range(count)],
                        stream_id=7, range_index=2, epoch=epoch, base_offset=base,
                        confirm_offset=confirm)


class CopyPool(FakePool):
    """A source serving ``batches`` (from the one holding the offset, ``per_read`` at a
    time) and a target recording what it is sent (``target_error`` fails it)."""

    def __init__(self, batches: list[bytes], *, per_read: int = 2,
                 target_error: EstreamError | None = None) -> None:
        super().__init__()
        self.batches = batches
        self.per_read = per_read
        self.target_error = target_error
        self.appended: list[bytes] = []

    async def call(self, address: str, opcode: int, header: dict[str, Any] | None = None,
                   payload: bytes | memoryview = b"", *, timeout_s: float = 5.0,
                   ) -> tuple[dict[str, Any], bytes | memoryview]:
        await super().call(address, opcode, header, payload, timeout_s=timeout_s)
        assert header is not None
        if opcode == Opcode.READ:
            assert address == "src" and header["unconfirmed"] and header["wait_ms"] == 0
            offset = header["offset"]
            held = [b for b in self.batches if decode_header(b).end_offset > offset]
            return {"end": 0, "sealed": False}, b"".join(held[: self.per_read])
        assert address == "dst" and header["server_id"] == "t"
        if self.target_error is not None:
            raise self.target_error
        if opcode == Opcode.APPEND:
            assert header["deferred"] is False
            self.appended.append(bytes(payload))
            return {"end": decode_header(payload).end_offset}, b""
        return {"start": 0, "end": 0, "epoch": header["epoch"], "sealed": False}, b""


SRC, DST = Endpoint("src", "s"), Endpoint("dst", "t")


async def copy(pool: CopyPool, progress: CopyProgress, end: int) -> None:
    await copy_range(RangeClient(pool), stream_id=7, range_index=2, source=SRC, target=DST,
                     end=end, progress=progress)


async def test_copies_from_the_offset_to_the_end_restamping_older_epochs_up() -> None:
    pool = CopyPool([batch(0, 3), batch(3, 2, epoch=4, confirm=3), batch(5, 4), batch(9, 1)])
    progress = CopyProgress(offset=3, epoch=4)  # the target holds [0, 3)
    await copy(pool, progress, end=9)
    heads = [verify_batch(b) for b in pool.appended]
    assert [(h.base_offset, h.end_offset, h.epoch) for h in heads] == [(3, 5, 4), (5, 9, 4)]
    assert heads[0].confirm_offset == 3 and pool.appended[0] == batch(3, 2, epoch=4, confirm=3)
    assert progress.offset == 9 and progress.copied_bytes == sum(map(len, pool.appended))
    assert all(h.stream_id == 7 and h.range_index == 2 for h in heads)


async def test_a_batch_newer_than_the_target_is_appended_unchanged() -> None:
    pool = CopyPool([batch(0, 2, epoch=5)])
    await copy(pool, CopyProgress(0, epoch=3), end=2)
    assert pool.appended == [batch(0, 2, epoch=5)]


async def test_a_new_target_is_created_at_the_first_batchs_epoch() -> None:
    pool = CopyPool([batch(0, 2, epoch=2), batch(2, 2, epoch=1)])
    progress = CopyProgress(0, epoch=0, create_start=0)
    await copy(pool, progress, end=4)
    creates = [h for _, op, h, _, _ in pool.calls if op == Opcode.CREATE_RANGE]
    assert creates == [{"stream_id": 7, "range_index": 2, "start": 0, "epoch": 2,
                        "server_id": "t"}]
    assert progress.create_start is None and progress.epoch == 2
    assert verify_batch(pool.appended[1]).epoch == 2  # the older one restamped up


async def test_a_damaged_batch_fails_the_source_before_anything_of_its_answer_lands() -> None:
    bad = bytearray(batch(2, 2))
    bad[-1] ^= 0xFF
    pool = CopyPool([batch(0, 2), bytes(bad)])
    with pytest.raises(SourceFailed) as info:
        await copy(pool, CopyProgress(0, 1), end=4)
    assert isinstance(info.value.__cause__, ChecksumMismatch)
    assert pool.appended == [] and info.value.fields["source"] == "s"


@pytest.mark.parametrize(("batches", "end"), [
    ([batch(0, 2), batch(3, 2)], 5),  # a gap: [2, 3) missing
    ([batch(0, 2), batch(2, 4)], 4),  # a batch crossing the end
])
async def test_a_source_that_does_not_continue_the_copy_fails(
    batches: list[bytes], end: int
) -> None:
    pool = CopyPool(batches, per_read=1)
    progress = CopyProgress(0, 1)
    with pytest.raises(SourceFailed) as info:
        await copy(pool, progress, end)
    assert isinstance(info.value.__cause__, OffsetGap)
    assert progress.offset == 2 and len(pool.appended) == 1  # the first one landed


async def test_nothing_to_serve_fails_the_source_and_the_next_source_resumes() -> None:
    pool = CopyPool([batch(0, 2)])
    progress = CopyProgress(0, 1)
    with pytest.raises(SourceFailed):
        await copy(pool, progress, end=4)
    assert progress.offset == 2
    pool.batches = [batch(0, 2), batch(2, 2)]  # another source holding everything
    await copy(pool, progress, end=4)
    assert progress.offset == 4 and len(pool.appended) == 2


async def test_nothing_at_or_past_the_end_is_copied() -> None:
    pool = CopyPool([batch(0, 2), batch(2, 2), batch(4, 2)], per_read=3)
    await copy(pool, CopyProgress(0, 1), end=4)
    assert [verify_batch(b).end_offset for b in pool.appended] == [2, 4]
    assert [op for _, op, *_ in pool.calls].count(Opcode.READ) == 1


async def test_a_target_error_is_raised_as_it_is() -> None:
    pool = CopyPool([batch(0, 2)], target_error=StorageError("disk"))
    with pytest.raises(StorageError):
        await copy(pool, CopyProgress(0, 1), end=2)


async def test_the_reads_of_one_copy_are_bounded() -> None:
    pool = CopyPool([batch(i, 1) for i in range(5)], per_read=1)
    with pytest.raises(SourceFailed):
        await copy_range(RangeClient(pool), stream_id=7, range_index=2, source=SRC,
                         target=DST, end=5, progress=CopyProgress(0, 1), reads_max=3)
    assert len(pool.appended) == 3


async def test_start_append_answers_as_append_does() -> None:
    """The writer's APPEND without awaiting: the same header and timeout policy, the end or
    a typed error through the callback (a malformed end is MalformedFrame), and a timeout
    discards the connection."""
    pool = FakePool({Opcode.APPEND: {"end": 14}})
    c = RangeClient(pool, timeout_s=3.0)
    got: list[tuple[int, EstreamError | None]] = []
    done = asyncio.Event()

    def answered(end: int, error: EstreamError | None) -> None:
        got.append((end, error))
        done.set()

    async def one(**kwargs: Any) -> tuple[int, EstreamError | None]:
        done.clear()
        c.start_append("a:1", answered, server_id="s", batch=b"B", **kwargs)
        assert not done.is_set()  # never answered from within the call
        await asyncio.wait_for(done.wait(), 5)
        return got[-1]

    assert await one(deferred=True) == (14, None)
    assert pool.calls[-1] == ("a:1", Opcode.APPEND, {"deferred": True, "server_id": "s"},
                              b"B", 3.0)
    await c.append("a:1", server_id="s", batch=b"B", deferred=True)
    assert pool.calls[-1] == pool.calls[-2]  # the same request as append's
    for body in ({}, {"end": "3"}, {"end": True}):
        pool.answers[Opcode.APPEND] = body
        end, error = await one()
        assert end == -1 and isinstance(error, MalformedFrame)
    pool.answers[Opcode.APPEND] = Timeout("slow")
    end, error = await one(timeout_s=0.5)
    assert isinstance(error, Timeout) and pool.calls[-1][-1] == 0.5
    assert pool.discarded == ["a:1"]


async def test_a_listing_is_complete_or_refused_never_cut_short(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A server whose page says more follows without moving forward, or a listing past
    ``list_pages_max`` pages, is ``Unavailable``: the reclaimer takes a listing as the
    whole of the server's replicas (a cut one would read as replicas missing)."""
    from estream.net import rangerequests

    page = {"ranges": [{**IDS, **STATE}], "more": True}
    stuck = RangeClient(FakePool({Opcode.LIST_RANGES: page}))
    with pytest.raises(Unavailable, match="did not move forward"):
        await stuck.list_replicas("a:1", server_id="s1")
    empty = RangeClient(FakePool({Opcode.LIST_RANGES: {"ranges": [], "more": True}}))
    with pytest.raises(Unavailable, match="did not move forward"):
        await empty.list_ranges("a:1", server_id="s1")

    class Endless(FakePool):  # each page one key further, always "more"
        async def call(self, address: str, opcode: int, header: dict[str, Any] | None = None,
                       payload: Payload = b"", *, timeout_s: float = 5.0,
                       ) -> tuple[dict[str, Any], bytes | memoryview]:
            await super().call(address, opcode, header, payload, timeout_s=timeout_s)
            index = len(self.calls)
            return {"ranges": [{**STATE, "stream_id": 7, "range_index": index}],
                    "more": True}, b""

    monkeypatch.setattr(rangerequests, "list_pages_max", 5)
    endless = Endless()
    with pytest.raises(Unavailable, match="more than 5 pages"):
        await RangeClient(endless).list_ranges("a:1", server_id="s1")
    assert len(endless.calls) == 5
    done = RangeClient(FakePool({Opcode.LIST_RANGES: {**page, "more": False}}))
    assert len(await done.list_ranges("a:1", server_id="s1")) == 1
