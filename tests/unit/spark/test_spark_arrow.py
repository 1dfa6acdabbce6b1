"""The Spark source's Arrow conversion of batch columns (``columns_to_arrow``) and its
cutting of undecoded batches into Arrow batches (``take_rows``): the same rows as the
records, exact batch sizes."""

from __future__ import annotations

import gc
import os

from estream.spark import source
from estream.spark.arrow import SPARK_MILLIS_MAX, columns_to_arrow, views_to_arrow
from estream.spark.source import arrow_schema, take_rows
from estream.wire.record import (
    Record,
    decode_batch,
    decode_columns,
    decode_views,
    encode_batch,
    view_batch,
)


def encode(records: list[Record], base: int) -> bytes:
    return encode_batch(records, stream_id=1, range_index=0, epoch=1, base_offset=base)


def rows_of(records: list[Record]) -> list[tuple[int, int, dict[str, str], bytes]]:
    return [(r.offset, r.timestamp, dict(r.headers), r.value) for r in records]


def test_columns_become_the_same_rows() -> None:
    value = os.urandom(300)
    mixed = [
        Record(value[: i % 50], {"k": f"v{i}"} if i % 3 == 0 else {}, 1_700_000_000_000 + i)
        for i in range(100)
    ]
    uniform = [Record(value, {}, 5 + i) for i in range(50)]
    first, second = encode(mixed, 10), encode(uniform, 110)
    columns = [decode_columns(first, start=12), decode_columns(second, end=140)]
    batch = columns_to_arrow("s", columns, arrow_schema())
    batch.validate(full=True)
    want = [r for r in decode_batch(first).records if r.offset >= 12]
    want += [r for r in decode_batch(second).records if r.offset < 140]
    got = batch.to_pydict()
    assert got["stream"] == ["s"] * len(want)
    millis = batch.column("timestamp").cast("int64").to_pylist()
    assert [m // 1000 for m in millis] == [r.timestamp for r in want]
    got_rows = list(
        zip(
            got["offset"],
            [m // 1000 for m in millis],
            map(dict, got["headers"]),
            got["value"],
            strict=True,
        )
    )
    assert got_rows == rows_of(want)


def test_batches_without_headers_have_empty_maps() -> None:
    columns = [decode_columns(encode([Record(b"ab", {}, 1)] * 4, 0))]
    batch = columns_to_arrow("s", columns, arrow_schema())
    batch.validate(full=True)
    assert batch.column("headers").to_pylist() == [[]] * 4
    assert batch.column("value").to_pylist() == [b"ab"] * 4


def test_take_rows_cuts_exact_sizes_across_batches() -> None:
    views = [
        view_batch(encode([Record(b"%d" % i, {}, i) for i in range(lo, lo + 25)], lo))
        for lo in range(0, 100, 25)
    ]
    pending, chunks = views, []
    while pending:
        chunk, pending = take_rows(pending, 30)
        chunks.append(chunk)
    assert [sum(v.count for v in chunk) for chunk in chunks] == [30, 30, 30, 10]
    batches = [columns_to_arrow("s", [decode_views(c)], arrow_schema()) for c in chunks]
    for batch in batches:
        batch.validate(full=True)
    assert [o for b in batches for o in b.column("offset").to_pylist()] == list(range(100))
    assert [v for b in batches for v in b.column("value").to_pylist()] == [
        b"%d" % i for i in range(100)
    ]
    assert take_rows(views, 0) == ([], views) and take_rows([], 5) == ([], [])


def test_views_become_the_same_rows_on_both_paths() -> None:
    """Uniform batches (numpy strided gather) and mixed ones (decode_views) give exactly
    the rows the columnar decoder gives, windows cut anywhere."""
    value = os.urandom(300)
    uniform = [
        encode([Record(value[i : i + 40], {}, 1_000 + lo + i) for i in range(60)], lo)
        for lo in range(0, 180, 60)
    ]
    empty = [encode([Record(b"", {}, 7)] * 5, 0)]
    mixed = [*uniform[:1], encode([Record(b"x" * (i % 5), {"k": "v"}, i) for i in range(60)], 60)]
    for batches in (uniform, empty, mixed):
        views = [view_batch(b) for b in batches]
        views[0] = views[0].tail(3)
        views[-1] = views[-1].head(views[-1].count - 2)
        got = views_to_arrow("s", views, arrow_schema())
        got.validate(full=True)
        want = columns_to_arrow("s", [decode_views(views)], arrow_schema())
        assert got.equals(want)
        assert got.num_rows == sum(v.count for v in views)


def test_the_worker_heap_is_frozen_once() -> None:
    saved = dict(source._heap)
    try:
        source._heap["frozen"] = False
        source.freeze_worker_heap()
        frozen = gc.get_freeze_count()
        assert frozen > 0 and source._heap["frozen"]
        later = [[i] for i in range(10)]  # tracked objects made after the freeze
        source.freeze_worker_heap()  # no second freeze: later objects stay collectable
        # (not the freeze count: it drops whenever a frozen object is freed, by any thread)
        collectable = {id(o) for o in gc.get_objects()}  # every tracked object not frozen
        assert all(id(item) in collectable for item in later)
    finally:
        gc.unfreeze()
        source._heap.update(saved)


def test_a_header_of_bytes_not_utf8_reads_with_replacement_characters() -> None:
    """A Kafka producer's header bytes that are not UTF-8 (kept as lone surrogates) failed
    every query of the stream with UnicodeEncodeError from Arrow."""
    odd = b"\x8f\x01\xff".decode("utf-8", "surrogateescape")
    columns = [decode_columns(encode([Record(b"v", {"trace": odd, "k": "ok"}, 1)], 0))]
    batch = columns_to_arrow("s", columns, arrow_schema())
    batch.validate(full=True)
    assert dict(batch.column("headers").to_pylist()[0]) == {
        "trace": "\ufffd\x01\ufffd", "k": "ok"}


def test_timestamps_past_what_spark_holds_are_clamped() -> None:
    """The SDK takes any int64 of milliseconds; Spark's microseconds end near 2**63 / 1000:
    a record stamped 2**62 ms failed every query of its stream with ArrowInvalid."""
    columns = [decode_columns(encode(
        [Record(b"a", {}, 2**62), Record(b"b", {}, 5), Record(b"c", {}, -(2**62))], 0))]
    batch = columns_to_arrow("s", columns, arrow_schema())
    batch.validate(full=True)
    micros = batch.column("timestamp").cast("int64").to_pylist()
    limit = SPARK_MILLIS_MAX * 1000
    assert micros == [limit, 5_000, -limit]
