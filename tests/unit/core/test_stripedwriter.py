"""The writer core on a striped range (docs/ARCHITECTURE.md section 10): batch k goes to
its write set only, with its index; appends complete at the confirmed prefix (each batch
on ``acks`` of its own write set); a failed server keeps the range degraded while
``writable``, else the end freezes and the seal names the confirmed batch count; a roll
re-sends the unconfirmed batches with new indexes. Generated cases against naive models,
as tests/unit/core/test_striping.py does; E == replicas: today's writer, effect for effect."""

from __future__ import annotations

import random

import pytest

from estream.core.rangewriter import RangeWriter
from estream.core.writeeffects import (
    BeginSeal,
    CompleteAppends,
    Effect,
    RequestRoll,
    SendAppend,
    SendConfirm,
    WriterConfig,
)
from estream.wire.errors import Unavailable
from estream.wire.record import Record, decode_batch
from estream.wire.stripe import Stripe

SERVERS = ("a", "b", "c", "d", "e", "f")


def make(stripe: Stripe | None, servers: tuple[str, ...], **config: object) -> RangeWriter:
    """A writer whose every record is a batch of its own (``batch_bytes`` 1)."""
    cfg = {"batch_bytes": 1, "early_batches": 10**6, "inflight_batches_max": 10**6,
           "chase_backlog_batches_max": 10**6, "chase_backlog_ms_max": 10**9, **config}
    return RangeWriter(stream_id=7, epoch=3, ack_count=stripe.acks if stripe else 2,
                       range_index=0, range_start=0, replicas=servers,
                       config=WriterConfig(**cfg),  # type: ignore[arg-type]
                       stripe=stripe)


def rec(i: int) -> Record:
    return Record(f"v{i}".encode(), {}, 1000 + i)


def sends(effects: list[Effect]) -> list[SendAppend]:
    return [e for e in effects if isinstance(e, SendAppend)]


def completed(effects: list[Effect]) -> list[int]:
    return [e.upto for e in effects if isinstance(e, CompleteAppends)]


def seals(effects: list[Effect]) -> list[BeginSeal]:
    return [e for e in effects if isinstance(e, BeginSeal)]


def naive_confirmed(held: list[set[str]], stripe: Stripe, servers: tuple[str, ...]) -> int:
    """Batches confirmed: the longest prefix each held (acknowledged) by ``acks``
    servers of its write set, counted from explicit per-batch holder sets."""
    n = 0
    for k, holders in enumerate(held):
        ws = {servers[p] for p in stripe.write_set(k)}
        if len(holders & ws) < stripe.acks:
            break
        n = k + 1
    return n


def naive_writable(failed: set[str], stripe: Stripe, servers: tuple[str, ...]) -> bool:
    return all(
        sum(1 for p in stripe.write_set(k) if servers[p] not in failed) >= stripe.acks
        for k in range(stripe.ensemble))


@pytest.mark.parametrize(("e", "r", "a"), [(5, 3, 2), (4, 3, 2), (6, 3, 2), (5, 2, 1),
                                           (6, 3, 3)])
def test_each_batch_goes_to_its_write_set_with_its_index(e: int, r: int, a: int) -> None:
    stripe = Stripe(e, r, a)
    servers = SERVERS[:e]
    w = make(stripe, servers)
    for i in range(3 * e):
        _, effects = w.submit([rec(i)], now_ms=i)
        out = sends(effects)
        assert [s.replica for s in out] == [servers[p] for p in stripe.write_set(i)]
        assert {s.batch for s in out} == {i}
        assert decode_batch(out[0].payload).header.base_offset == i


@pytest.mark.parametrize("seed", range(40))
def test_appends_complete_at_the_naive_confirmed_prefix(seed: int) -> None:
    """Servers answer their batches in chain order (the log syncs in order), at random
    moments, acknowledging their chain's end so far: completions follow the model."""
    rnd = random.Random(seed)
    e = rnd.choice([4, 5, 6])
    stripe = Stripe(e, 3, rnd.choice([1, 2, 3]))
    servers = SERVERS[:e]
    w = make(stripe, servers)
    owed: dict[str, list[tuple[int, int]]] = {s: [] for s in servers}  # (index, end)
    held: list[set[str]] = []
    ends: list[int] = []
    done = 0
    for step in range(200):
        if rnd.random() < 0.4 and len(held) < 60:
            k = len(held)
            _, effects = w.submit([rec(k)], now_ms=step)
            held.append(set())
            ends.append(k + 1)
            for s in sends(effects):
                owed[s.replica].append((k, s.end))
        else:
            server = rnd.choice(servers)
            if not owed[server]:
                continue
            upto = rnd.randrange(len(owed[server]))  # a durable prefix of what it owes
            acked, owed[server] = owed[server][:upto + 1], owed[server][upto + 1:]
            for k, _ in acked:
                held[k].add(server)
            got = completed(w.on_append_ack(server, 0, acked[-1][1], step))
            n = naive_confirmed(held, stripe, servers)
            want = ends[n - 1] if n else 0
            assert (got[-1] if got else done) == want
            done = want
    assert w.completed == done


def test_a_batch_stays_in_memory_until_each_live_holder_has_it() -> None:
    stripe = Stripe(5, 3, 2)
    w = make(stripe, SERVERS[:5])
    w.submit([rec(0)], 0)  # batch 0: a b c
    w.on_append_ack("a", 0, 1, 1)
    assert completed(w.on_append_ack("b", 0, 1, 1)) == [1]
    assert w.inflight_batches == 1  # c still owes it (d and e never hold it)
    w.on_append_ack("c", 0, 1, 2)
    assert w.inflight_batches == 0


@pytest.mark.parametrize("seed", range(30))
def test_a_failed_server_degrades_or_freezes_as_the_naive_model_says(seed: int) -> None:
    rnd = random.Random(seed)
    e = rnd.choice([4, 5, 6])
    stripe = Stripe(e, 3, 2)
    servers = SERVERS[:e]
    w = make(stripe, servers)
    for k in range(2 * e):  # every server acknowledges its batches: all confirmed
        for s in sends(w.submit([rec(k)], k)[1]):
            w.on_append_ack(s.replica, 0, s.end, k)
    for k in range(2 * e, 2 * e + 3):  # three more, unacknowledged
        w.submit([rec(k)], k)
    failed: set[str] = set()
    for server in rnd.sample(servers, 3):
        failed.add(server)
        effects = w.on_append_error(server, 0, Unavailable("gone"), 50)
        if naive_writable(failed, stripe, servers):
            assert not w.sealing and w.degraded
            assert [type(x) for x in effects if isinstance(x, RequestRoll)] in (
                [RequestRoll], [])
            continue
        assert w.sealing  # the end froze at the confirmed prefix: 2E batches
        sealed = seals(effects)
        assert sealed == [BeginSeal(0, 2 * e, tuple(sorted(failed)),
                                    tuple(s for s in servers if s not in failed), 2 * e)]
        break
    else:
        pytest.fail("three failures of a write set of 3 must stop a range")


def test_the_seal_waits_until_each_live_server_holds_its_chain_below_the_count() -> None:
    stripe = Stripe(5, 3, 2)
    servers = SERVERS[:5]
    w = make(stripe, servers)
    for k in range(4):
        w.submit([rec(k)], k)
    # W(0) = a b c, W(1) = b c d, W(2) = c d e, W(3) = d e a; e answers nothing:
    # 0, 1 and 2 are on two of their write sets, 3 on d only: 3 confirmed.
    for server, end in [("a", 1), ("b", 2), ("c", 3), ("d", 4)]:
        w.on_append_ack(server, 0, end, 5)
    assert w.completed == 3
    w.on_append_error("b", 0, Unavailable("gone"), 6)  # degraded: writable without b
    assert w.degraded and not w.sealing
    assert seals(w.begin_roll(7)) == []  # e still owes batch 2 (its chain below 3)
    assert seals(w.on_append_ack("e", 0, 3, 8)) == [
        BeginSeal(0, 3, ("b",), ("a", "c", "d", "e"), 3)]


def test_a_roll_resends_unconfirmed_batches_with_new_indexes() -> None:
    stripe = Stripe(5, 3, 2)
    servers = SERVERS[:5]
    w = make(stripe, servers)
    for k in range(3):
        for s in sends(w.submit([rec(k)], k)[1]):
            if k == 0:
                w.on_append_ack(s.replica, 0, s.end, k)
    # batch 1 on b c d, 2 on c d e: c and d fail, so W(1) and W(2) keep one: freeze at 1.
    w.on_append_error("c", 0, Unavailable("gone"), 5)
    effects = w.on_append_error("d", 0, Unavailable("gone"), 5)
    assert seals(effects) == [BeginSeal(0, 1, ("c", "d"), ("a", "b", "e"), 1)]
    nxt = ("a", "b", "e", "f", "g")
    out = sends(w.on_range_opened(1, 1, nxt, 6))
    assert [(s.replica, s.batch, s.end) for s in out] == [
        ("a", 0, 2), ("b", 0, 2), ("e", 0, 2), ("b", 1, 3), ("e", 1, 3), ("f", 1, 3)]
    for s in out:
        w.on_append_ack(s.replica, 1, s.end, 7)
    assert w.completed == 3 and w.next_offset == 3


def test_a_server_past_its_chase_bound_is_dropped_only_while_the_range_stays_writable() -> None:
    stripe = Stripe(5, 3, 2)
    servers = SERVERS[:5]
    w = make(stripe, servers, chase_backlog_ms_max=10)
    for k in range(5):
        for s in sends(w.submit([rec(k)], 0)[1]):
            if s.replica not in ("a", "c"):
                w.on_append_ack(s.replica, 0, s.end, 0)
    # a and c answer nothing: W(0) = a b c keeps only b. Dropping a leaves W(0)'s b c
    # writable; then c cannot go too (W(0) would keep b alone).
    w.on_tick(100)
    assert w.failed == ("a",) and not w.sealing


@pytest.mark.parametrize("seed", range(10))
def test_e_equal_to_replicas_is_todays_writer_effect_for_effect(seed: int) -> None:
    rnd = random.Random(seed)
    plain = make(None, SERVERS[:3])
    same = make(Stripe(3, 3, 2), SERVERS[:3])
    for step in range(60):
        if rnd.random() < 0.5:
            got = [w.submit([rec(step)], step)[1] for w in (plain, same)]
        elif rnd.random() < 0.9:
            server, end = rnd.choice(SERVERS[:3]), rnd.randrange(plain.next_offset + 1)
            got = [w.on_append_ack(server, 0, end, step) for w in (plain, same)]
        else:
            got = [w.on_tick(step) for w in (plain, same)]
        assert got[0] == got[1]
        assert all(s.batch is None for s in sends(got[1]))
    assert same.stripe is None


def test_confirm_goes_to_every_live_server_of_the_ensemble() -> None:
    stripe = Stripe(5, 3, 2)
    w = make(stripe, SERVERS[:5], confirm_idle_ms=1)
    for s in sends(w.submit([rec(0)], 0)[1]):
        w.on_append_ack(s.replica, 0, s.end, 0)
    confirms = [e for e in w.on_tick(10) if isinstance(e, SendConfirm)]
    assert [c.replica for c in confirms] == list(SERVERS[:5])


def test_force_covers_the_confirmed_batches_by_the_prefix_rule() -> None:
    stripe = Stripe(5, 3, 2)
    w = make(stripe, SERVERS[:5], deferred=True)
    for k in range(2):
        for s in sends(w.submit([rec(k)], k)[1]):
            w.on_append_ack(s.replica, 0, s.end, k)  # batch 0: a b c, 1: b c d
    assert w.held_by({"b", "c"})
    assert not w.held_by({"a", "d"})  # batch 0 on a only, 1 on d only
    assert not w.held_by({"a", "b"})  # batch 1 on b only


def test_a_full_range_seals_with_its_batch_count() -> None:
    stripe = Stripe(5, 3, 2)
    w = make(stripe, SERVERS[:5], range_bytes_max=1)
    out = sends(w.submit([rec(0)], 0)[1])  # batch 0 fills the range
    assert {s.batch for s in out} == {0}
    assert sends(w.submit([rec(1)], 1)[1]) == []  # waits for the next range
    effects: list[Effect] = []
    for s in out:
        effects += w.on_append_ack(s.replica, 0, s.end, 2)
    assert seals(effects) == [BeginSeal(0, 1, (), SERVERS[:5], 1)]
    again = sends(w.on_range_opened(1, 1, SERVERS[1:6], 3))
    assert {s.batch for s in again} == {0}  # batch 1 is the next range's batch 0


def test_a_full_chase_budget_drops_the_server_owing_the_oldest_batch_while_writable() -> None:
    """Not the lowest acknowledged end (a holds only batch 0, answered: it owes nothing)
    but the first live server owing the oldest batch kept."""
    stripe = Stripe(5, 3, 2)
    w = make(stripe, SERVERS[:5], chase_backlog_batches_max=1)
    acks = [[("a", 1), ("b", 1), ("c", 1)],  # W(0) = a b c
            [("b", 2), ("d", 2)],  # W(1) = b c d: c does not answer from here on
            [("d", 3), ("e", 3)]]  # W(2) = c d e
    for k, answers in enumerate(acks):
        w.submit([rec(k)], k)
        for server, end in answers:
            w.on_append_ack(server, 0, end, k)
    assert w.failed == ("c",) and w.degraded and not w.sealing and w.completed == 3
    assert w.inflight_batches == 0  # nothing kept for c any more


def test_a_full_chase_budget_drops_a_server_holding_back_the_seals_drain() -> None:
    """One rule for a chaser's bytes (the chase budget; the chase bound is its age only):
    a server the range could not lose while appending (the budget full, appends held
    back) is dropped once the roll's drain waits on it."""
    stripe = Stripe(5, 3, 2)
    w = make(stripe, SERVERS[:5], chase_backlog_bytes_max=1)
    w.on_append_error("b", 0, Unavailable("gone"), 0)  # every write set keeps just 2
    assert w.degraded and not w.sealing
    for k in range(3):  # W(0) = a c, W(1) = c d, W(2) = c d e: e does not answer
        w.submit([rec(k)], k)
        for server in ("a", "c", "d"):
            w.on_append_ack(server, 0, k + 1, k)
    assert w.completed == 3 and w.failed == ("b",)  # e held back appends, not dropped
    assert seals(w.begin_roll(4)) == []  # the drain waits for e's batch 2
    assert seals(w.on_tick(5)) == [BeginSeal(0, 3, ("b", "e"), ("a", "c", "d"), 3)]
