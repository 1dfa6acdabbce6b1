"""rangeserver/bounds.py: every number a range server takes, against its valid range."""

from __future__ import annotations

from dataclasses import replace

import pytest

from estream.wire.errors import InvalidArgument
from estream.wire.record import BatchHeader, Record, decode_header, encode_batch
from rangeserver import bounds
from rangeserver import walformat as wf

INT64_MAX = 2**63 - 1
U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1


@pytest.mark.parametrize(
    ("name", "low", "high"),
    [
        ("stream_id", 0, INT64_MAX),
        ("range_index", 0, U32_MAX),
        ("start", 0, INT64_MAX),
        ("epoch", 0, INT64_MAX),
        ("end", 0, INT64_MAX),
        ("offset", 0, INT64_MAX),
        ("confirm", 0, INT64_MAX),
        ("max_bytes", 0, INT64_MAX),
        ("wait_ms", 0, INT64_MAX),
        ("timestamp", -(2**63), INT64_MAX),
    ],
)
def test_each_field_takes_its_range_and_names_itself_outside_it(
    name: str, low: int, high: int
) -> None:
    assert bounds.check_field(name, low) == low
    assert bounds.check_field(name, high) == high
    for bad in (low - 1, high + 1, U64_MAX + 1):
        with pytest.raises(InvalidArgument) as err:
            bounds.check_field(name, bad)
        assert err.value.argument == name


def test_every_field_has_bounds() -> None:
    assert set(bounds.FIELD_BOUNDS) == {
        "stream_id", "range_index", "start", "epoch", "end", "offset", "confirm",
        "max_bytes", "wait_ms", "timestamp", "batch", "batches"}


def header(**changes: int) -> BatchHeader:
    batch = encode_batch([Record(b"v", {}, 5), Record(b"w", {}, 9)], stream_id=1,
                         range_index=0, epoch=1, base_offset=10)
    return replace(decode_header(batch), **changes)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"base_offset": INT64_MAX - 1}, "base_offset"),  # 2 records end at 2**63
        ({"base_offset": U64_MAX}, "base_offset"),
        ({"epoch": INT64_MAX + 1}, "epoch"),
        ({"confirm_offset": INT64_MAX + 1}, "confirm_offset"),
        ({"stream_id": INT64_MAX + 1}, "stream_id"),
        ({"first_timestamp": 10, "max_timestamp": 9}, "first_timestamp"),
    ],
)
def test_a_batch_header_out_of_bounds_names_its_field(changes: dict[str, int], field: str) -> None:
    error = bounds.batch_error(header(**changes))
    assert isinstance(error, InvalidArgument) and error.argument == field
    with pytest.raises(InvalidArgument):
        bounds.check_batch(header(**changes))


def test_a_batch_up_to_the_last_offset_is_in_bounds() -> None:
    assert bounds.batch_error(header()) is None
    assert bounds.batch_error(header(base_offset=INT64_MAX - 2, epoch=INT64_MAX,
                                     confirm_offset=INT64_MAX, stream_id=INT64_MAX)) is None


@pytest.mark.parametrize(
    ("control", "ok"),
    [
        (wf.CreateRange(1, 0, INT64_MAX, INT64_MAX), True),
        (wf.CreateRange(1, 0, INT64_MAX + 1, 1), False),
        (wf.CreateRange(1, 0, 0, U64_MAX), False),
        (wf.CreateRange(INT64_MAX + 1, 0, 0, 1), False),
        (wf.EpochRaised(1, 0, INT64_MAX + 1), False),
        (wf.Sealed(1, 0, 1, INT64_MAX + 1), False),
        (wf.Sealed(1, 0, 1, INT64_MAX), True),
        (wf.Confirmed(1, 0, 1, INT64_MAX + 1), False),
        (wf.Dropped(1, U32_MAX), True),
        (wf.DamageMarked(INT64_MAX + 1, 0), False),
    ],
)
def test_control_entries_are_held_to_the_same_bounds(control: wf.Control, ok: bool) -> None:
    assert bounds.control_in_bounds(control) is ok


@pytest.mark.parametrize("at", range(4))
def test_a_confirm_is_held_to_its_four_fields_bounds_and_names_the_first_outside(
    at: int,
) -> None:
    names = ("stream_id", "range_index", "epoch", "confirm")
    top = tuple(bounds.FIELD_BOUNDS[name][1] for name in names)
    assert bounds.check_confirm((0, 0, 0, 0)) == (0, 0, 0, 0)
    assert bounds.check_confirm(top) == top  # type: ignore[arg-type]
    for bad in (-1, top[at] + 1):
        confirm = tuple(bad if i == at else 1 for i in range(4))
        with pytest.raises(InvalidArgument) as err:
            bounds.check_confirm(confirm)  # type: ignore[arg-type]
        assert err.value.argument == names[at]
        with pytest.raises(InvalidArgument) as again:  # the same error as field by field
            for name, value in zip(names, confirm, strict=True):
                bounds.check_field(name, value)
        assert str(err.value) == str(again.value)
    assert bounds.check_confirm((INT64_MAX, 3, 2, 1)) == (INT64_MAX, 3, 2, 1)
