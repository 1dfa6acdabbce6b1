"""The writer's answer to a batch its replicas refuse for what it is (records that do
not decode, a number out of bounds): the appends fail with that typed error, the writer
does not roll into range after range resending it."""

from __future__ import annotations

import pytest

from estream.core.writeeffects import BeginSeal, FailAppends, RequestRoll
from estream.wire.errors import EstreamError, InvalidArgument, MalformedBatch, Unavailable
from tests.unit.core.test_rangewriter import make, rec


@pytest.mark.parametrize(
    "error",
    [MalformedBatch("record runs past the batch"),
     InvalidArgument("batch field 'base_offset' is out of bounds", argument="base_offset")],
)
def test_a_refused_batch_fails_the_appends_and_rolls_nothing(error: EstreamError) -> None:
    w = make()
    w.submit([rec(0)], 0)
    effects = w.on_append_error("a", 0, error, 1)
    assert [type(e) for e in effects] == [FailAppends]
    assert isinstance(effects[0], FailAppends) and effects[0].error is error
    for replica in ("b", "c"):  # the others' answers change nothing more
        assert w.on_append_error(replica, 0, error, 2) == []
    with pytest.raises(type(error)):
        w.submit([rec(1)], 3)


def test_an_unavailable_replica_still_only_drops_that_replica() -> None:
    w = make()
    w.submit([rec(0)], 0)
    effects = w.on_append_error("a", 0, Unavailable("gone"), 1)
    assert not any(isinstance(e, (FailAppends, BeginSeal)) for e in effects)
    assert [e for e in effects if isinstance(e, RequestRoll)] == [RequestRoll(0, ("a",))]
