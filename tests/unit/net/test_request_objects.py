"""What a writer's request to a replica keeps for the cyclic GC while it is out: with a
writer per stream over many streams a record is its own batch, and every object its
requests hold counts towards the next collection and is walked by the older ones
(``estream/net/rangeclient.py``'s ``_Answered``, ``estream/sdk/effects.py``'s answers)."""

from __future__ import annotations

import gc

from estream.core.writeeffects import CompleteAppends, SendAppend, SendConfirm
from estream.net.appendsender import AppendSender
from estream.net.rangeclient import ReplicaClient
from estream.sdk.effects import _AppendAnswer, _ConfirmAnswer
from tests.unit.net.test_rangeclient import FakePool


def _tracked_per_call(call: object, times: int = 100) -> float:
    """The GC-tracked objects each call leaves alive (the young generation's count)."""
    assert callable(call)
    gc.collect()
    gc.disable()
    try:
        before = gc.get_count()[0]
        for _ in range(times):
            call()
        return (gc.get_count()[0] - before) / times
    finally:
        gc.enable()


async def test_a_queued_confirm_or_append_keeps_few_objects() -> None:
    """Per queued CONFIRM: the callback (one object, not a closure's function, tuple and
    three cells), its entry and three tuples; per APPEND one tuple fewer (were 9 and 8)."""
    pool = FakePool({})
    replicas = ReplicaClient(pool, 1, appends=AppendSender(pool))  # type: ignore[arg-type]
    replicas.addresses["r"] = "a:1"
    answered: list[object] = []
    replicas.start_confirm("r", 1, 0, 5, answered.append, durable=False)  # first: at once
    confirm = _tracked_per_call(lambda: replicas.start_confirm(
        "r", 1, 0, 6, answered.append, durable=False))
    append = _tracked_per_call(lambda: replicas.start_append(
        "r", b"batch", False, lambda end, error: None))
    assert confirm <= 5.5 and append <= 4.5, (confirm, append)


def test_an_answer_callback_is_one_object() -> None:
    """The effect runner's callback per request and replica: one object where a
    ``functools.partial`` is three (itself, its arguments and keywords)."""
    effect, confirm = SendAppend("a", 0, 1, b"x"), SendConfirm("a", 0, 1)
    made: list[object] = []
    appends = _tracked_per_call(lambda: made.append(
        _AppendAnswer(None, None, effect)))  # type: ignore[arg-type]
    confirms = _tracked_per_call(lambda: made.append(
        _ConfirmAnswer(None, None, confirm)))  # type: ignore[arg-type]
    assert appends <= 1.1 and confirms <= 1.1, (appends, confirms)


def test_the_per_batch_effects_are_values_not_frozen() -> None:
    """Made once per record and replica when records are spread: a frozen dataclass sets
    each field through ``object.__setattr__`` (about five times the cost); still values,
    hashable and equal by fields."""
    for effect in (SendAppend, SendConfirm, CompleteAppends):
        assert not effect.__dataclass_params__.frozen  # type: ignore[attr-defined]
    assert hash(SendConfirm("a", 0, 3)) == hash(SendConfirm("a", 0, 3))
    assert SendAppend("a", 0, 1, b"x") == SendAppend("a", 0, 1, b"x")
