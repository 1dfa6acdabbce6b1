"""A chain READ's answer as the merge takes it (``estream/sdk/chainread.py``)."""

from __future__ import annotations

import pytest

from estream.sdk.chainread import chain_batches
from estream.sdk.reader import decode_answer
from estream.wire.errors import MalformedFrame
from estream.wire.rangeanswers import ReadAnswer
from estream.wire.record import Record, encode_batch


def batch(base: int, count: int) -> bytes:
    return encode_batch([Record(b"v%d" % (base + i), {}, 0) for i in range(count)],
                        stream_id=1, range_index=0, epoch=1, base_offset=base)


def test_a_chain_answer_is_cut_into_its_batches_clipped_to_the_read() -> None:
    payload = batch(0, 3) + batch(10, 4) + batch(20, 5)  # indexes 0, 3, 6
    got = chain_batches(ReadAnswer(25, True, payload, [0, 3, 6]), decode_answer, 2, 22)
    assert [(b.index, b.first, b.end) for b in got] == [(0, 2, 3), (3, 10, 14), (6, 20, 22)]
    assert [r.offset for b in got for r in b.items] == [2, 10, 11, 12, 13, 20, 21]
    assert chain_batches(ReadAnswer(25, True, payload, [0, 3, 6]), decode_answer, 14,
                         20) == []  # (between its batches: others' runs)


def test_an_answer_without_a_chain() -> None:
    # an older server asked past its run answers "next" and no batches: nothing from it
    assert chain_batches(ReadAnswer(25, True, b"", None, (4, 12)), decode_answer, 12, 25) == []
    with pytest.raises(MalformedFrame):
        chain_batches(ReadAnswer(25, True, batch(0, 3), None), decode_answer, 0, 25)
    with pytest.raises(MalformedFrame):
        chain_batches(ReadAnswer(25, True, batch(0, 3), [0, 3]), decode_answer, 0, 25)
