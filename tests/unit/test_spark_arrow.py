"""The Spark source's Arrow conversion of batch columns (``columns_to_arrow``,
``arrow_pieces``): the same rows as the records, exact batch sizes."""

from __future__ import annotations

import os

from estream.record import Record, decode_batch, decode_columns, encode_batch
from estream.spark.source import arrow_pieces, arrow_schema, columns_to_arrow


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


def test_arrow_pieces_cut_exact_sizes_and_carry_the_rest() -> None:
    columns = [decode_columns(encode([Record(b"%d" % i, {}, i) for i in range(70)], 0))]
    batch = columns_to_arrow("s", columns, arrow_schema())
    pieces, carry = arrow_pieces(None, batch, 30)
    assert [p.num_rows for p in pieces] == [30, 30] and carry is not None and carry.num_rows == 10
    pieces2, carry2 = arrow_pieces(carry, batch, 40)
    assert [p.num_rows for p in pieces2] == [40, 40] and carry2 is None
    offsets = [o for p in pieces + pieces2 for o in p.column("offset").to_pylist()]
    assert offsets == list(range(70)) + list(range(70))
