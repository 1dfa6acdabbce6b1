"""The client's shared APPEND sender (estream/net/appendsender.py) over a fake pool: a lone
batch goes at once as an APPEND; batches to one server later in the same turn share one
APPEND_MANY; each gets its own result; a request's error reaches every entry."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from estream.net.appendsender import AppendSender
from estream.wire.appendmany import encode_answer
from estream.wire.errors import EstreamError, Fenced, MalformedFrame, Timeout
from estream.wire.protocol import Opcode, Payload
from tests.unit.net.test_rangeclient import FakePool, joined


class Answers:
    """Each batch's ``(end, error)`` by name; :meth:`wait` until ``count`` came."""

    def __init__(self, count: int) -> None:
        self.got: dict[str, tuple[int, EstreamError | None]] = {}
        self.count = count
        self._every = asyncio.Event()

    def to(self, name: str) -> Callable[[int, EstreamError | None], None]:
        def done(end: int, error: EstreamError | None) -> None:
            self.got[name] = (end, error)
            if len(self.got) == self.count:
                self._every.set()
        return done

    async def wait(self) -> dict[str, tuple[int, EstreamError | None]]:
        await asyncio.wait_for(self._every.wait(), 5)
        return self.got


async def test_a_lone_batch_goes_at_once_as_an_append() -> None:
    pool = FakePool({Opcode.APPEND: {"end": 7}})
    sender, answers = AppendSender(pool, timeout_s=3.0), Answers(1)
    sender.start_append("a:1", answers.to("x"), server_id="s", batch=b"B")
    assert pool.calls == [("a:1", Opcode.APPEND, {"deferred": False, "server_id": "s"}, b"B",
                           3.0)]  # written within the call: no wait for the turn's end
    got = await answers.wait()
    assert got == {"x": (7, None)}


async def test_batches_of_one_turn_to_one_server_share_an_append_many() -> None:
    pool = FakePool({Opcode.APPEND: {"end": 1}, Opcode.APPEND_MANY: encode_answer(
        [5, Fenced("fenced", epoch=1, current_epoch=2), 9])})
    sender, answers = AppendSender(pool, timeout_s=3.0), Answers(6)
    for name, address, batch in [("a0", "a:1", b"0"), ("a1", "a:1", b"11"), ("b0", "b:1", b"x"),
                                 ("a2", "a:1", b"2"), ("a3", "a:1", b"333"),
                                 ("b1", "b:1", b"y")]:
        sender.start_append(address, answers.to(name), server_id="s",
                            batch=batch)
    assert [c[1] for c in pool.calls] == [Opcode.APPEND, Opcode.APPEND]  # one per server
    got = await answers.wait()
    many = [c for c in pool.calls if c[1] == Opcode.APPEND_MANY]
    assert many == [("a:1", Opcode.APPEND_MANY,
                     {"deferred": False, "sizes": [2, 1, 3], "server_id": "s"}, b"112333", 3.0)]
    assert pool.calls[-1] == ("b:1", Opcode.APPEND, {"deferred": False, "server_id": "s"},
                              b"y", 3.0)  # a group of one is a plain APPEND
    assert got["a1"] == (5, None) and got["a3"] == (9, None)
    end, error = got["a2"]
    assert end == -1 and isinstance(error, Fenced) and error.current_epoch == 2
    assert got["a0"] == got["b0"] == got["b1"] == (1, None)


async def test_durability_and_server_id_keep_requests_apart() -> None:
    pool = FakePool({Opcode.APPEND: {"end": 1}, Opcode.APPEND_MANY: encode_answer([3, 4])})
    sender, answers = AppendSender(pool, timeout_s=3.0), Answers(6)
    for i, (sid, deferred) in enumerate([("s", False), ("t", False), ("s", True),
                                         ("s", False), ("s", True), ("s", False)]):
        sender.start_append("a:1", answers.to(str(i)), server_id=sid,
                            batch=b"b", deferred=deferred)
    await answers.wait()
    assert [(c[1], c[2]) for c in pool.calls] == [
        (Opcode.APPEND, {"deferred": False, "server_id": "s"}),
        (Opcode.APPEND, {"deferred": False, "server_id": "t"}),
        (Opcode.APPEND_MANY, {"deferred": True, "sizes": [1, 1], "server_id": "s"}),
        (Opcode.APPEND_MANY, {"deferred": False, "sizes": [1, 1], "server_id": "s"}),
    ]


async def test_confirms_go_at_once_or_ride_along_with_the_turns_batches() -> None:
    """An idle writer's CONFIRM: the first to a server in a turn is a plain CONFIRM; the
    ones after it share the turn's APPEND_MANY with the batches, or go alone together."""
    pool = FakePool({Opcode.CONFIRM: {}, Opcode.APPEND: {"end": 1},
                     Opcode.APPEND_MANY: encode_answer([7], [None, Fenced(
                         "old", epoch=1, current_epoch=2)])})
    sender, answers = AppendSender(pool, timeout_s=3.0), Answers(4)

    def confirmed(name: str) -> Callable[[EstreamError | None], None]:
        return lambda error: answers.to(name)(0, error)

    sender.start_confirm("a:1", confirmed("c0"), server_id="s", stream_id=1, range_index=0,
                         epoch=3, confirm=10)
    assert pool.calls[-1][1:3] == (Opcode.CONFIRM, {
        "stream_id": 1, "range_index": 0, "epoch": 3, "confirm": 10, "server_id": "s"})
    sender.start_confirm("a:1", confirmed("c1"), server_id="s", stream_id=2, range_index=1,
                         epoch=3, confirm=4)
    sender.start_append("a:1", answers.to("b0"), server_id="s", batch=b"xy")
    sender.start_confirm("a:1", confirmed("c2"), server_id="s", stream_id=3, range_index=0,
                         epoch=1, confirm=5)
    got = await answers.wait()
    assert pool.calls[-1][1:4] == (Opcode.APPEND_MANY, {
        "deferred": False, "sizes": [2], "confirms": [[2, 1, 3, 4], [3, 0, 1, 5]],
        "server_id": "s"}, b"xy")
    assert got["c0"] == got["c1"] == (0, None) and got["b0"] == (7, None)
    assert isinstance(got["c2"][1], Fenced)


async def test_confirms_never_wait_on_with_deferred_batches() -> None:
    """A confirm is answered once durable: riding with DEFERRED_SYNC batches would make
    their answers wait for an fsync. Two of one replica in a request are one entry."""
    pool = FakePool({Opcode.CONFIRM: {}, Opcode.APPEND: {"end": 1},
                     Opcode.APPEND_MANY: encode_answer([], [None])})
    sender, answers = AppendSender(pool, timeout_s=3.0), Answers(4)
    sender.start_append("a:1", answers.to("b0"), server_id="s", batch=b"x", deferred=True)
    sender.start_append("a:1", answers.to("b1"), server_id="s", batch=b"y", deferred=True)
    for name in ("c0", "c1"):
        sender.start_confirm("a:1", lambda error, name=name: answers.to(name)(0, error),
                             server_id="s", stream_id=1, range_index=0, epoch=1, confirm=3)
    await answers.wait()
    assert [(c[1], c[2]) for c in pool.calls[1:]] == [
        (Opcode.APPEND, {"deferred": True, "server_id": "s"}),
        (Opcode.APPEND_MANY, {"deferred": False, "sizes": [], "confirms": [[1, 0, 1, 3]],
                              "server_id": "s"})]


async def test_a_request_error_reaches_every_entry_and_a_timeout_discards() -> None:
    pool = FakePool({Opcode.APPEND: {"end": 1}, Opcode.APPEND_MANY: Timeout("slow")})
    sender, answers = AppendSender(pool, timeout_s=3.0), Answers(3)
    for name in ("0", "1", "2"):
        sender.start_append("a:1", answers.to(name), server_id=None, batch=b"b")
    got = await answers.wait()
    assert got["0"] == (1, None)
    assert all(got[n][0] == -1 and isinstance(got[n][1], Timeout) for n in ("1", "2"))
    assert pool.discarded == ["a:1"]


async def test_an_answer_without_a_result_per_entry_fails_them_all() -> None:
    pool = FakePool({Opcode.APPEND: {"end": 1}, Opcode.APPEND_MANY: {"results": [1]}})
    sender, answers = AppendSender(pool, timeout_s=3.0), Answers(3)
    for name in ("0", "1", "2"):
        sender.start_append("a:1", answers.to(name), server_id=None, batch=b"b")
    got = await answers.wait()
    assert all(isinstance(got[n][1], MalformedFrame) for n in ("1", "2"))


async def test_a_failing_callback_or_an_abandoned_entry_keeps_no_other_from_its_answer(
) -> None:
    # The answer's fan-out calls each entry's callback itself (estream/net/appendsender.py):
    # one that raises is logged, one abandoned after the request went is not called again.
    pool = FakePool({Opcode.APPEND: {"end": 1},
                     Opcode.APPEND_MANY: encode_answer([4, 5, 6], [None])})
    sender, answers = AppendSender(pool, timeout_s=3.0), Answers(2)
    calls: list[tuple[int, EstreamError | None]] = []

    def failing(end: int, error: EstreamError | None) -> None:
        calls.append((end, error))
        raise RuntimeError("a writer's bug")

    sender.start_append("a:1", answers.to("0"), server_id=None, batch=b"b")
    sender.start_append("a:1", failing, server_id=None, batch=b"b")
    gone = sender.start_append("a:1", failing, server_id=None, batch=b"b")
    sender.start_append("a:1", answers.to("3"), server_id=None, batch=b"b")
    confirmed: list[EstreamError | None] = []
    sender.start_confirm("a:1", confirmed.append, server_id=None, stream_id=1,
                         range_index=0, epoch=1, confirm=1)
    # After the end of the turn's APPEND_MANY went, before its answer.
    asyncio.get_running_loop().call_soon(gone.abandon, Timeout("dropped"))
    got = await answers.wait()
    assert got == {"0": (1, None), "3": (6, None)} and confirmed == [None]
    assert calls[0][0] == -1 and isinstance(calls[0][1], Timeout)
    assert calls[1:] == [(4, None)]  # the abandoned one's 5 is not called


async def test_every_writers_confirm_hint_reaches_its_server_in_one_request() -> None:
    """Issue 32: a hint (``durable=False``) is a plain CONFIRM naming it, at once when first
    for its server in the turn; many idle writers' hints to one server in one turn all go,
    none dropped, in one APPEND_MANY (not a CONFIRM request each): as its durable
    ``confirms`` (issue 27: one log write for all, and no idle CONFIRM after them)."""
    writers = 50
    pool = FakePool({Opcode.CONFIRM: {}, Opcode.APPEND: {"end": 1},
                     Opcode.APPEND_MANY: encode_answer(
                         [], [Fenced("old", epoch=3, current_epoch=4)] + [None] * 49)})
    sender, answers = AppendSender(pool, timeout_s=3.0), Answers(writers + 2)
    sender.start_confirm("a:1", lambda error: answers.to("h0")(0, error), server_id="s",
                         stream_id=1, range_index=0, epoch=3, confirm=10, durable=False)
    assert pool.calls[-1][1:3] == (Opcode.CONFIRM, {
        "stream_id": 1, "range_index": 0, "epoch": 3, "confirm": 10, "durable": False,
        "server_id": "s"})
    sender.start_append("b:1", answers.to("b0"), server_id="s", batch=b"x")
    for stream in range(2, writers + 2):
        sender.start_confirm("b:1", lambda error, s=stream: answers.to(f"h{s}")(0, error),
                             server_id="s", stream_id=stream, range_index=0, epoch=3,
                             confirm=stream, durable=False)
    got = await answers.wait()
    assert isinstance(got.pop("h2")[1], Fenced)
    assert got == {"h0": (0, None), "b0": (1, None)} | {
        f"h{s}": (0, None) for s in range(3, writers + 2)}
    assert [c[1:4] for c in pool.calls[1:]] == [
        (Opcode.APPEND, {"deferred": False, "server_id": "s"}, b"x"),
        (Opcode.APPEND_MANY, {"deferred": False, "sizes": [], "server_id": "s",
                              "confirms": [[s, 0, 3, s] for s in range(2, writers + 2)]},
         b"")]


async def test_hints_ride_with_the_turns_batches_deferred_ones_too() -> None:
    """A hint is answered at once by the server (nothing logged), so it rides with any
    batches, DEFERRED_SYNC ones too; a lone hint left over goes as a plain CONFIRM."""
    pool = FakePool({Opcode.CONFIRM: {}, Opcode.APPEND: {"end": 1},
                     Opcode.APPEND_MANY: encode_answer([2], [], [None])})
    sender, answers = AppendSender(pool, timeout_s=3.0), Answers(5)
    sender.start_append("a:1", answers.to("b0"), server_id="s", batch=b"x", deferred=True)
    sender.start_append("a:1", answers.to("b1"), server_id="s", batch=b"y", deferred=True)
    sender.start_append("c:1", answers.to("b2"), server_id="s", batch=b"z")
    for name, address in (("h0", "a:1"), ("h1", "c:1")):
        sender.start_confirm(address, lambda error, name=name: answers.to(name)(0, error),
                             server_id="s", stream_id=1, range_index=0, epoch=1, confirm=3,
                             durable=False)
    got = await answers.wait()
    assert got == {"b0": (1, None), "b1": (2, None), "b2": (1, None), "h0": (0, None),
                   "h1": (0, None)}
    assert [c[:4] for c in pool.calls[2:]] == [
        ("a:1", Opcode.APPEND_MANY, {"deferred": True, "sizes": [1], "server_id": "s",
                                     "hints": [[1, 0, 1, 3]]}, b"y"),
        ("c:1", Opcode.CONFIRM, {"stream_id": 1, "range_index": 0, "epoch": 1, "confirm": 3,
                                 "durable": False, "server_id": "s"}, b"")]


async def test_a_striped_batchs_index_goes_with_it_in_append_and_append_many() -> None:
    """APPEND ``"batch"``, APPEND_MANY ``"batches"`` (one per batch, null for an unstriped
    range's batch sharing the request); none of it when no batch has an index."""
    pool = FakePool({Opcode.APPEND: {"end": 1}, Opcode.APPEND_MANY: encode_answer([2, 3, 4])})
    sender, answers = AppendSender(pool, timeout_s=3.0), Answers(4)
    for name, index in [("s0", 7), ("s1", 8), ("p0", None), ("s2", 9)]:
        sender.start_append("a:1", answers.to(name), server_id="s", batch=name.encode(),
                            batch_index=index)
    assert pool.calls[0][2] == {"deferred": False, "server_id": "s", "batch": 7}
    await answers.wait()
    assert pool.calls[1][1:3] == (Opcode.APPEND_MANY, {
        "deferred": False, "sizes": [2, 2, 2], "batches": [8, None, 9], "server_id": "s"})
    sender.start_append("a:1", answers.to("plain"), server_id="s", batch=b"x")
    assert pool.calls[-1][2] == {"deferred": False, "server_id": "s"}  # unchanged


async def test_a_hint_riding_with_logged_batches_is_durable_and_spares_the_idle_confirm(
) -> None:
    """Issue 27: a hint queued beside batches that wait for the fsync goes as a durable
    confirm of that APPEND_MANY (its entry shares their log write); once answered, the
    writer's idle CONFIRM of that offset (same server, range and epoch) is answered at once
    without a request. A refused one, a higher offset or another epoch still goes."""
    pool = FakePool({Opcode.CONFIRM: {}, Opcode.APPEND: {"end": 1},
                     Opcode.APPEND_MANY: encode_answer([2], [None, Fenced(
                         "old", epoch=1, current_epoch=2)])})
    sender, answers = AppendSender(pool, timeout_s=3.0), Answers(4)

    def confirm(name: str, stream: int, offset: int, *, durable: bool, epoch: int = 1) -> None:
        sender.start_confirm("a:1", lambda error: answers.to(name)(0, error), server_id="s",
                             stream_id=stream, range_index=0, epoch=epoch, confirm=offset,
                             durable=durable)

    sender.start_append("a:1", answers.to("b0"), server_id="s", batch=b"x")
    sender.start_append("a:1", answers.to("b1"), server_id="s", batch=b"y")
    confirm("h1", 1, 3, durable=False)
    confirm("h2", 2, 5, durable=False)
    got = await answers.wait()
    assert pool.calls[-1][1:4] == (Opcode.APPEND_MANY, {
        "deferred": False, "sizes": [1], "confirms": [[1, 0, 1, 3], [2, 0, 1, 5]],
        "server_id": "s"}, b"y")
    assert got["h1"] == (0, None) and isinstance(got["h2"][1], Fenced)
    sent = len(pool.calls)
    answers = Answers(3)
    confirm("c1", 1, 3, durable=True)  # logged by the hint: answered without a request
    confirm("c0", 1, 2, durable=True)
    confirm("h0", 1, 3, durable=False)  # a hint it covers too
    assert await answers.wait() == {"c1": (0, None), "c0": (0, None), "h0": (0, None)}
    assert len(pool.calls) == sent
    await asyncio.sleep(0)  # a new turn
    answers = Answers(3)
    confirm("c2", 2, 5, durable=True)  # its hint was refused
    confirm("c3", 1, 4, durable=True)  # past what was logged
    confirm("c4", 1, 3, durable=True, epoch=2)  # another epoch
    await answers.wait()
    assert [c[1:3] for c in pool.calls[sent:]] == [
        (Opcode.CONFIRM, {"stream_id": 2, "range_index": 0, "epoch": 1, "confirm": 5,
                          "server_id": "s"}),
        (Opcode.APPEND_MANY, {"deferred": False, "sizes": [], "server_id": "s",
                              "confirms": [[1, 0, 1, 4], [1, 0, 2, 3]]})]


class HeldPool(FakePool):
    """A :class:`FakePool` whose APPEND_MANY answers wait for :meth:`answer`."""

    def __init__(self, answers: dict[Opcode, Any]) -> None:
        super().__init__(answers)
        self.held: list[Callable[..., None]] = []

    def start_call(self, address: str, opcode: int, header: dict[str, Any] | None,
                   payload: Payload, done: Any, *, timeout_s: float = 5.0) -> None:
        if opcode != Opcode.APPEND_MANY:
            return super().start_call(address, opcode, header, payload, done,
                                      timeout_s=timeout_s)
        self.calls.append((address, Opcode(opcode), dict(header or {}), joined(payload),
                           timeout_s))
        self.held.append(done)


async def test_a_confirm_covered_by_one_in_flight_waits_for_its_answer() -> None:
    """Under load the hint's APPEND_MANY is answered after the idle CONFIRM is due (50 ms):
    that CONFIRM waits for the hint's answer rather than going out; if the hint's request
    fails, it goes out itself."""
    pool = HeldPool({Opcode.CONFIRM: {}, Opcode.APPEND: {"end": 1}})
    sender, answers = AppendSender(pool, timeout_s=3.0), Answers(4)

    def confirm(name: str, stream: int, offset: int, *, durable: bool) -> None:
        sender.start_confirm("a:1", lambda error: answers.to(name)(0, error), server_id="s",
                             stream_id=stream, range_index=0, epoch=1, confirm=offset,
                             durable=durable)

    sender.start_append("a:1", answers.to("b0"), server_id="s", batch=b"x")
    confirm("h1", 1, 3, durable=False)
    confirm("h2", 2, 5, durable=False)
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # the APPEND_MANY of the two hints is out, not answered
    assert pool.calls[-1][1:3] == (Opcode.APPEND_MANY, {
        "deferred": False, "sizes": [], "confirms": [[1, 0, 1, 3], [2, 0, 1, 5]],
        "server_id": "s"})
    confirm("c1", 1, 3, durable=True)
    confirm("c2", 2, 5, durable=True)
    sent = len(pool.calls)
    await asyncio.sleep(0)
    assert len(pool.calls) == sent and "c1" not in answers.got  # waiting
    pool.held.pop()(encode_answer([], [None, None]), None)
    assert answers.got["c1"] == answers.got["c2"] == (0, None)
    assert len(pool.calls) == sent
    # Failed: the covered CONFIRM goes out after all.
    answers = Answers(4)
    sender.start_append("a:1", answers.to("b1"), server_id="s", batch=b"y")
    confirm("h3", 3, 7, durable=False)
    confirm("h4", 4, 8, durable=False)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    confirm("c3", 3, 7, durable=True)
    pool.held.pop()(None, Timeout("slow"))
    got = await answers.wait()
    assert isinstance(got["h3"][1], Timeout) and got["c3"] == (0, None)
    assert pool.calls[-1][1:3] == (Opcode.CONFIRM, {
        "stream_id": 3, "range_index": 0, "epoch": 1, "confirm": 7, "server_id": "s"})


async def test_a_hint_that_goes_durable_tells_its_writer_before_its_answer() -> None:
    """``on_durable`` is called at the turn's end for each hint that goes as a durable
    confirm (its writer then makes no idle CONFIRM of it), never for one that goes as a
    hint: first for its server in the turn, or alone in the queue."""
    pool = HeldPool({Opcode.CONFIRM: {}, Opcode.APPEND: {"end": 1}})
    sender = AppendSender(pool, timeout_s=3.0)
    told: list[str] = []

    def hint(name: str, stream: int) -> None:
        sender.start_confirm("a:1", lambda error: None, server_id="s", stream_id=stream,
                             range_index=0, epoch=1, confirm=3, durable=False,
                             on_durable=lambda: told.append(name))

    hint("first", 1)  # at once, as a hint
    hint("h2", 2)
    hint("h3", 3)
    assert told == []
    await asyncio.sleep(0)
    assert told == ["h2", "h3"]
    sender.start_append("a:1", lambda end, error: None, server_id="s", batch=b"x")
    hint("alone", 4)  # the only one queued: a hint of its own
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert told == ["h2", "h3"]
    assert pool.calls[-1][1:3] == (Opcode.CONFIRM, {
        "stream_id": 4, "range_index": 0, "epoch": 1, "confirm": 3, "durable": False,
        "server_id": "s"})
